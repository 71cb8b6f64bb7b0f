"""Writing debounced and throttled calls (``Flow(debounce=...)``, ``Flow(throttle=...)``).

**Trailing edge** (``Debounce``'s default), on the job key. A debounced call's row holds
the job key ``debounce:["<function>","<flow key>"]``, so at most one row of a key waits
(``ix_scheduled_functions_key``). Per call, in the caller's transaction:

1. The key's Pending row, locked (``FOR UPDATE``). If there is one, it takes the call:
   the new arguments (or its list parameter extended, ``accumulate``) and a run time
   ``quiet`` seconds after this call, but never past its ``flow_until`` (its first call
   plus ``max_wait``). One guarded UPDATE.
2. Otherwise a holder that is no longer Pending (running, failed, cancelled) gives the key
   up, and the call's row is inserted, due ``quiet`` seconds on, with ``flow_until`` set;
   ``ON CONFLICT DO NOTHING``: if a racing caller inserted one first (PostgreSQL waits for
   it to commit), back to 1, which now finds and extends it. SQLite has one writer.

Two statements for a call that joins a waiting row, three or four for the first: debounce
is for calls that would otherwise run too often, not the hot path.

**Leading edge and throttle**, on the window of the function and key
(``_durafn_flow_windows``): made if missing and locked (``FOR UPDATE``), so the calls of
one key take turns; then, unless the window's run was cancelled (then it starts anew):

* leading edge: a call before the burst's end (``quiet_until``) and, with ``max_wait``,
  before ``last_run + max_wait`` is absorbed: the burst's end moves to the call plus
  ``quiet``, and the call returns the run's id. Otherwise its row is inserted, due at once,
  and the window starts anew.
* throttle: a call joins the window's row while it is still Pending and not running in
  the calling batch (its arguments, or its list extended). Otherwise its row is
  inserted, due at once if ``per`` seconds have passed since the last run's due time,
  else when they will have.

Both edges and throttle coalesce the calls of one function: two functions sharing a flow
key keep apart (their arguments differ). Three or four statements a call. A window is
kept after its runs end (a row of four columns per function and key ever throttled).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Sequence
from typing import Any

from sqlalchemy import and_, false, not_, or_, select, update
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql.elements import ColumnElement

from ..._errors import DatabaseError
from ..._flow import Debounce, FlowError, Throttle
from ..._kinds import ScheduledFunctionId, State
from ..rows import NewRow, column_values
from ..schema.tables import KEY_HOLDER, flow_windows, sf
from ..sql import PENDING, next_seq

# ix_scheduled_functions_key: the key's one waiting row, locked.
_WAITING = select(sf.c.id, sf.c.args, sf.c.flow_until).where(sf.c.state == PENDING)
# A window's run, by id: whether it may absorb or take a call.
_RUN = select(sf.c.id, sf.c.state)


def _merged(
    name: str,
    param: str | None,
    old: str,
    new: str,
    first: bool = False,
    rule: Debounce | Throttle | None = None,
) -> str:
    """The waiting row's arguments after a call: the call's, with ``param``'s list
    extended by it (``accumulate``) if there is one (``first``: only check the call's)."""
    if param is None:
        return new
    before, after = json.loads(old), json.loads(new)
    if first:
        before = {param: []}
    if not isinstance(before.get(param), list) or not isinstance(after.get(param), list):
        raise FlowError(
            f"{type(rule or Debounce).__name__}(accumulate={param!r}) of {name!r}: the "
            f"parameter {param!r} must be a "
            "list (its values are appended call after call)"
        )
    after[param] = before[param] + after[param]
    return json.dumps(after, separators=(",", ":"))


async def write_debounced(
    conn: AsyncConnection,
    insert: Callable[..., Any],
    rows: Sequence[NewRow],
    running: Collection[ScheduledFunctionId] = (),
) -> list[ScheduledFunctionId]:
    """Write debounced and throttled calls (each row with its ``debounce``, and a trailing
    edge's ``job_key``); returns, per row, the id of the row that will run for it.
    ``running``: the rows of the mutation batch making these calls (Pending still, in its
    transaction, but started: a call never joins one of them)."""
    written = []
    ids = {str(i) for i in running}
    started = sf.c.id.in_(sorted(ids)) if ids else false()
    for row in rows:
        rule = row["debounce"]
        assert rule is not None  # only debounced and throttled rows come here
        if isinstance(rule, Debounce) and rule.edge == "trailing":
            written.append(await _write_trailing(conn, insert, row, rule, started))
        else:
            written.append(await _write_windowed(conn, insert, row, rule, ids))
    return written


async def _write_trailing(
    conn: AsyncConnection,
    insert: Callable[..., Any],
    row: NewRow,
    debounce: Debounce,
    started: ColumnElement[bool],
) -> ScheduledFunctionId:
    key = row["job_key"]
    due = row["available_at"] + debounce.quiet
    for _ in range(3):  # a third only after a racing caller's row went meanwhile
        waiting_now = _WAITING.where(sf.c.job_key == key, not_(started))
        found = await conn.execute(waiting_now.with_for_update())
        waiting = found.first()
        if waiting is not None:
            at = due if waiting.flow_until is None else min(due, waiting.flow_until)
            args = _merged(row["name"], debounce.accumulate, waiting.args, row["args"])
            result = await conn.execute(
                update(sf)
                .where(sf.c.id == waiting.id, sf.c.state == PENDING)
                .values(args=args, available_at=at, scheduled_time=at)
            )
            if result.rowcount:
                return ScheduledFunctionId(str(waiting.id))
            continue
        # Holders that are no longer Pending (or are running in this batch) give the key up
        # to the new row.
        given_up = update(sf).where(
            sf.c.job_key == key, KEY_HOLDER, or_(sf.c.state != PENDING, started)
        )
        await conn.execute(given_up.values(job_key=None))
        _merged(row["name"], debounce.accumulate, "{}", row["args"], first=True)
        values = column_values(row) | {"seq": next_seq()}
        values.update(available_at=due, scheduled_time=due)
        if debounce.max_wait is not None:
            values["flow_until"] = row["available_at"] + debounce.max_wait
        made = (
            await conn.execute(
                insert(sf)
                .values(values)
                .on_conflict_do_nothing(index_elements=[sf.c.job_key], index_where=KEY_HOLDER)
                .returning(sf.c.id)
            )
        ).scalar()
        if made is not None:
            return ScheduledFunctionId(str(made))
    raise DatabaseError(f"could not write the debounced call of key {key!r}")  # pragma: no cover


async def _write_windowed(
    conn: AsyncConnection,
    insert: Callable[..., Any],
    row: NewRow,
    rule: Debounce | Throttle,
    running: Collection[str],
) -> ScheduledFunctionId:
    name, key, now = row["name"], row["flow_key"], row["available_at"]
    this = and_(flow_windows.c.name == name, flow_windows.c.key == key)
    made = insert(flow_windows).values(name=name, key=key)
    await conn.execute(made.on_conflict_do_nothing(index_elements=[*flow_windows.primary_key]))
    window = (await conn.execute(select(flow_windows).where(this).with_for_update())).one()
    set_window = update(flow_windows).where(this)
    # The window's run, unless it was cancelled: a cancelled run absorbs no call, and
    # holds no later one back (nothing of it ran).
    last = None
    if window.row_id is not None:
        last = (await conn.execute(_RUN.where(sf.c.id == window.row_id))).first()
    if last is not None and last.state == State.CANCELED.value:
        last = None
    if isinstance(rule, Debounce):  # the leading edge
        quiet = window.quiet_until
        in_burst = last is not None and quiet is not None and now < quiet
        if in_burst and (rule.max_wait is None or now < window.last_run + rule.max_wait):
            await conn.execute(set_window.values(quiet_until=now + rule.quiet))
            return ScheduledFunctionId(str(window.row_id))
        due, quiet_until = now, now + rule.quiet
    else:
        if last is not None and last.state == State.PENDING.value and str(last.id) not in running:
            # SKIP LOCKED: a row a claim holds is starting; waiting for that claim while
            # holding the window could deadlock with its mutation calling this key.
            held = _WAITING.where(sf.c.id == last.id).with_for_update(skip_locked=True)
            if (waiting := (await conn.execute(held)).first()) is not None:  # joins it
                args = _merged(name, rule.accumulate, waiting.args, row["args"], rule=rule)
                await conn.execute(
                    update(sf).where(sf.c.id == waiting.id, sf.c.state == PENDING).values(args=args)
                )
                return ScheduledFunctionId(str(waiting.id))
        _merged(name, rule.accumulate, "{}", row["args"], first=True, rule=rule)
        due = now if last is None else max(now, window.last_run + rule.per)
        quiet_until = None
    values = column_values(row) | {"seq": next_seq()}
    # A throttled row due later says so (``flow_until``: explain's "throttled").
    values.update(available_at=due, scheduled_time=due, flow_until=due if due > now else None)
    await conn.execute(insert(sf).values(values))
    await conn.execute(set_window.values(last_run=due, quiet_until=quiet_until, row_id=row["id"]))
    return ScheduledFunctionId(str(row["id"]))
