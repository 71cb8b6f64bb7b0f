"""Writing debounced calls (``Flow(debounce=Debounce(...))``), on the job key.

A debounced call's row holds the job key ``debounce:<flow key>``, so at most one row of a
key waits (``ix_scheduled_functions_key``). Per call, in the caller's transaction:

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
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from .._errors import DatabaseError
from .._flow import Debounce, FlowError
from .._types import ScheduledFunctionId
from ._rows import NEW_ROW_COLUMNS
from ._statements import PENDING
from ._tables import KEY_HOLDER, sf

# ix_scheduled_functions_key: the key's one waiting row, locked.
_WAITING = select(sf.c.id, sf.c.args, sf.c.flow_until).where(sf.c.state == PENDING)


def _merged(name: str, param: str | None, old: str, new: str, first: bool = False) -> str:
    """The waiting row's arguments after a call: the call's, with ``param``'s list
    extended by it (``accumulate``) if there is one (``first``: only check the call's)."""
    if param is None:
        return new
    before, after = json.loads(old), json.loads(new)
    if first:
        before = {param: []}
    if not isinstance(before.get(param), list) or not isinstance(after.get(param), list):
        raise FlowError(
            f"Debounce(accumulate={param!r}) of {name!r}: the parameter {param!r} must be a "
            "list (its values are appended call after call)"
        )
    after[param] = before[param] + after[param]
    return json.dumps(after, separators=(",", ":"))


async def write_debounced(
    conn: AsyncConnection, insert: Callable[..., Any], rows: Sequence[dict[str, Any]]
) -> list[ScheduledFunctionId]:
    """Write debounced calls (each row with its ``debounce`` and its ``job_key``); returns,
    per row, the id of the row that will run for it."""
    return [await _write_one(conn, insert, row) for row in rows]


async def _write_one(
    conn: AsyncConnection, insert: Callable[..., Any], row: dict[str, Any]
) -> ScheduledFunctionId:
    debounce: Debounce = row["debounce"]
    key = row["job_key"]
    due = row["available_at"] + debounce.quiet
    for _ in range(3):  # a third only after a racing caller's row went meanwhile
        found = await conn.execute(_WAITING.where(sf.c.job_key == key).with_for_update())
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
        # Holders that are no longer Pending give the key up to the new row.
        given_up = update(sf).where(sf.c.job_key == key, KEY_HOLDER, sf.c.state != PENDING)
        await conn.execute(given_up.values(job_key=None))
        _merged(row["name"], debounce.accumulate, "{}", row["args"], first=True)
        values = {c: row[c] for c in NEW_ROW_COLUMNS}
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
