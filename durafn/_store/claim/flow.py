"""The keyed part of a claim: flow control (``durafn/_flow.py``), enforced while rows are
chosen, inside the claim's transaction.

1. **Due keys**, from the cursor on, wrapping around: a loose scan of
   ``ix_scheduled_functions_keys`` (kind, flow_key, available_at), one probe per key
   (a recursive CTE that stops after ``:n`` keys). The cursor (``FlowCursor``) moves past
   the keys each claim visited, so that with more keys than a claim has room for, every
   key is visited in turn.
2. **Heads**: every key's first due rows in claim order (``ix_scheduled_functions_key_head``,
   one LATERAL statement on PostgreSQL), ``FOR UPDATE SKIP LOCKED``; their knobs come
   with them (``flow``).
3. **Locks of the keys with a limit** (a concurrency or a rate): each key's
   ``_durafn_flow_keys`` row, ``FOR UPDATE SKIP LOCKED`` (a key another claim is choosing
   from, or a mutation batch of that key is running, is skipped, its rows dropped, never
   waited for); the first claim to meet a key inserts its row (ON CONFLICT DO NOTHING: a
   row that exists is someone else's to lock). A key with no limit needs no lock: its
   rows are locked one by one.
4. **Running counts** of the keys with a concurrency (``ix_scheduled_functions_running``);
   each key then gives as many rows as its concurrency, its rate budget and the claim's
   room allow; the budget consumed is written back to the key's row in the same
   transaction (a claim that rolls back consumed nothing).

The claim then shares out the rows of every key round-robin, ``weight`` rows of a key per
round (``fair_order``), so one key's backlog delays another key's row by one round at most.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import (
    ARRAY,
    BigInteger,
    Double,
    Integer,
    Text,
    bindparam,
    func,
    literal,
    select,
    true,
    tuple_,
    union_all,
    update,
)
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql.elements import ColumnElement

from ..._flow import Limits, allowance, consumed, next_slot
from ..._kinds import FunctionKind
from ..rows import Claimed
from ..schema.tables import flow_keys, sf
from ..sql import PENDING, RUNNING
from .columns import CLAIM_COLUMNS, claimed

KEYS_PER_CLAIM = 16
"""Keys one claim visits at most; the next claim carries on from the last one. The loose
scan costs a probe per key visited: over 100 keys, PostgreSQL drained keyed mutations at
0.36x the plain rate visiting 64 keys a claim, 0.60x visiting 16 (0.40x at 8, where a
claim's fixed cost weighs more); SQLite 0.14x -> 0.50x. A key waits at most
``keys / 16`` claims for its turn."""


@dataclass(slots=True)
class FlowCursor:
    """Per claimer: the last key its previous claim visited, and the earliest time a key
    whose rate budget was spent can start again (the idle wait wakes for it)."""

    after: str = ""
    wake_at: float | None = None
    visited: list[str] = field(default_factory=list)


_NOW = bindparam("now", type_=Double)


def keyed() -> tuple[ColumnElement[bool], ...]:
    """Pending keyed rows of ``:b_kind`` (the keyed indexes' predicates)."""
    return (
        sf.c.state == PENDING,
        sf.c.kind == bindparam("b_kind", type_=Text),
        sf.c.flow_key.is_not(None),
    )


def _due_keys(extra: tuple[ColumnElement[bool], ...]) -> Any:
    """Up to ``:n`` keys after ``:after`` with a due row, in key order: one probe each.

    Each probe ``ORDER BY flow_key LIMIT 1`` (ix_scheduled_functions_keys), not min():
    with fresh rows and stale statistics PostgreSQL answered the first min() from
    ix_scheduled_functions_keyed_due, reading every due keyed row (20,000: 5.5 ms a
    claim, against 0.2 ms)."""

    def first_after(key: Any) -> Any:
        return (
            select(sf.c.flow_key)
            .where(*keyed(), *extra, sf.c.flow_key > key, sf.c.available_at <= _NOW)
            .order_by(sf.c.flow_key)
            .limit(1)
            .scalar_subquery()
        )

    first = select(
        first_after(bindparam("after", type_=Text)).label("k"),
        literal(1, type_=Integer).label("n"),
    )
    keys = first.cte("due_keys", recursive=True)
    keys = keys.union_all(
        select(first_after(keys.c.k), keys.c.n + 1).where(
            keys.c.k.is_not(None), keys.c.n < bindparam("n", type_=Integer)
        )
    )
    return select(keys.c.k).where(keys.c.k.is_not(None))


LOCK_KEYS = (
    select(flow_keys.c.key, flow_keys.c.tat)
    .where(flow_keys.c.key.in_(bindparam("keys", expanding=True)))
    .order_by(flow_keys.c.key)
    .with_for_update(skip_locked=True)
)
RUNNING_OF = (
    select(sf.c.flow_key, func.count())
    .where(sf.c.state == RUNNING, sf.c.flow_key.in_(bindparam("keys", expanding=True)))
    .group_by(sf.c.flow_key)
)
SET_TAT = (
    update(flow_keys)
    .where(flow_keys.c.key == bindparam("b_key", type_=Text))
    .values(tat=bindparam("tat", type_=Double))
)


def _rows_of(
    key: Any, extra: tuple[ColumnElement[bool], ...], after: bool = False, lateral: bool = True
) -> Any:
    """The first due rows of ``key`` (a bound key, or a column of the keys being joined)
    in claim order, locked; ``after``: only those after ``:after_*`` (a keyset, not an
    OFFSET: rows another claim held and released meanwhile would shift an offset onto
    rows already taken). ``lateral``: PostgreSQL's form; else SQLite's (below)."""
    # ix_scheduled_functions_key_head: (flow_key, priority, available_at, seq). SKIP LOCKED:
    # rows another claim holds are its own (a limited key's rows read here are dropped
    # if its lock, taken after, is another claim's). SQLite, without statistics, would
    # rather range over ix_scheduled_functions_keys (kind, flow_key, available_at) and
    # sort every due row of the key: a key with 20,000 due rows, 3.6 ms a read against
    # 0.04 ms. ``available_at + 0`` is no range of an index, so it reads the head's order.
    due = sf.c.available_at if lateral else sf.c.available_at + literal(0.0, Double)
    rows = select(*CLAIM_COLUMNS).where(*keyed(), *extra, sf.c.flow_key == key, due <= _NOW)
    if after:
        rows = rows.where(
            tuple_(sf.c.priority, sf.c.available_at, sf.c.seq)
            > tuple_(
                bindparam("after_p", type_=Integer),
                bindparam("after_at", type_=Double),
                bindparam("after_seq", type_=BigInteger),
            )
        )
    return (
        rows.order_by(sf.c.priority, sf.c.available_at, sf.c.seq)
        .limit(bindparam("limit", type_=Integer))
        .with_for_update(skip_locked=True)
    )


def _heads(extra: tuple[ColumnElement[bool], ...]) -> Any:
    """Every key's head in one statement: ``_rows_of`` per key of the ``:keys`` array, as
    a LATERAL subquery (PostgreSQL). A statement per key cost a round trip each: with 100
    keys, claims of 100 actions drained at 0.12x the plain rate."""
    keys = func.unnest(bindparam("keys", type_=ARRAY(Text))).table_valued("key").render_derived("k")
    head = _rows_of(keys.c.key, extra).lateral("head")
    return select(*head.c).select_from(keys.join(head, true()))


def _union_heads(extra: tuple[ColumnElement[bool], ...], n: int) -> Any:
    """The heads of ``n`` keys (``:k0`` ... ) in one statement, a UNION ALL of ``_rows_of``
    per key (SQLite, which has no LATERAL). A statement per key cost a hop to the driver's
    thread each: 16 a claim."""
    keys = [bindparam(f"k{i}", type_=Text) for i in range(n)]
    parts = [_rows_of(key, extra, lateral=False).subquery() for key in keys]
    selects = [select(*part.c) for part in parts]
    return selects[0] if n == 1 else union_all(*selects)


@dataclass(frozen=True, slots=True)
class FlowStatements:
    due_keys: Any
    head_after: Any
    heads: Any | None
    """Every key's head at once, LATERAL (PostgreSQL), or None: ``union_heads``."""
    extra: tuple[ColumnElement[bool], ...]
    unions: dict[int, Any] = field(default_factory=dict, compare=False, repr=False)

    def union_heads(self, n: int) -> Any:
        """The heads of ``n`` keys (1 to ``KEYS_PER_CLAIM``) in one UNION ALL (SQLite),
        built when first needed: all sixteen at start-up cost a worker 136 subqueries,
        about a tenth of its start on SQLite, for apps that may use no flow key."""
        found = self.unions.get(n)
        if found is None:
            found = self.unions[n] = _union_heads(self.extra, n)
        return found


def flow_statements(extra: tuple[ColumnElement[bool], ...], lateral: bool) -> FlowStatements:
    """``extra``: what the claimer serves (its queues, its flags, no paused queue)."""
    key = bindparam("b_key", type_=Text)
    return FlowStatements(
        _due_keys(extra),
        _rows_of(key, extra, after=True, lateral=lateral),
        _heads(extra) if lateral else None,
        extra,
    )


async def _first_heads(
    conn: AsyncConnection, st: FlowStatements, params: dict[str, Any], keys: list[str], limit: int
) -> dict[str, list[Any]]:
    """Up to ``limit`` head rows of each key, by key."""
    found: dict[str, list[Any]] = {}
    if st.heads is not None:
        rows = await conn.execute(st.heads, {**params, "keys": keys, "limit": limit})
    else:
        named = {f"k{i}": key for i, key in enumerate(keys)}
        rows = await conn.execute(st.union_heads(len(keys)), {**params, **named, "limit": limit})
    for row in rows:
        found.setdefault(row.flow_key, []).append(row)
    return found


async def _keys_from(
    conn: AsyncConnection, st: FlowStatements, params: dict[str, Any], after: str, n: int
) -> list[str]:
    found = await conn.execute(st.due_keys, {**params, "after": after, "n": n})
    return [k for (k,) in found]


@dataclass(slots=True)
class _Key:
    """One key while a claim chooses its rows."""

    key: str
    limits: Limits
    free: int
    rows: list[Claimed]


async def flow_heads(
    conn: AsyncConnection,
    st: FlowStatements,
    kind: FunctionKind,
    now: float,
    room: int,
    cursor: FlowCursor,
    insert: Callable[..., Any],
) -> Keyed:
    """The keyed rows this claim may run.

    Each key first gets an equal share of the room (at least its weight), then, if the
    claim still has room, the keys that filled their share get more: a single busy key
    still fills a claim, and many keys each get a start."""
    params = {"b_kind": kind.value, "now": now}
    wanted = min(max(room, 1), KEYS_PER_CLAIM)
    keys = await _keys_from(conn, st, params, cursor.after, wanted)
    if len(keys) < wanted and cursor.after:
        more = await _keys_from(conn, st, params, "", wanted - len(keys))
        keys += [k for k in more if k <= cursor.after]
    cursor.wake_at, cursor.visited = None, keys
    if not keys:
        cursor.after = ""
        return Keyed([], {}, False)
    cursor.after = keys[-1] if len(keys) >= wanted else ""
    share = max(1, -(-room // len(keys)))
    heads = await _first_heads(conn, st, params, keys, min(room, share))
    limits_of = {key: Limits.parse(rows[0].flow) for key, rows in heads.items() if rows}
    # Only keys with a limit are locked (a key with none orders rows for fairness only,
    # and its rows are locked one by one): three statements fewer per claim then.
    limited = sorted(k for k, lim in limits_of.items() if lim.concurrency or lim.rate)
    tats = await _lock_keys(conn, limited, insert) if limited else {}
    counted = [k for k in limited if k in tats and limits_of[k].concurrency]
    running = (
        dict((await conn.execute(RUNNING_OF, {"keys": counted})).tuples().all()) if counted else {}
    )
    chosen: list[_Key] = []
    skipped = False
    for key in keys:  # in cursor order
        if key in limited and key not in tats:
            skipped = True  # a key another claim is choosing from
            continue
        if key not in limits_of:
            continue  # nothing due (of this kind)
        rows, limits = heads[key], limits_of[key]
        free = room
        if limits.concurrency is not None:
            slots = limits.concurrency - running.get(key, 0)
            # A mutation batch runs its rows of a key one after another: one slot for all.
            free = min(free, slots) if kind is FunctionKind.ACTION else (room if slots > 0 else 0)
        if limits.rate is not None:
            free = min(free, allowance(limits.rate, tats[key], now))
            if free <= 0:
                _wake(cursor, next_slot(limits.rate, tats[key]))
        if free > 0:
            chosen.append(_Key(key, limits, free, claimed(rows[:free])))
    # More for the keys that filled their share: up to their weighted share of the room,
    # then, while the claim has room left, up to the room.
    weights = sum(k.limits.weight for k in chosen)
    total = sum(len(k.rows) for k in chosen)
    for k in chosen:
        total += await _more(conn, st, params, k, -(-room * k.limits.weight // weights), share)
    for k in chosen:
        if total < room:
            total += await _more(conn, st, params, k, len(k.rows) + room - total, share)
    return Keyed(chosen, tats, skipped)


async def _lock_keys(
    conn: AsyncConnection, keys: list[str], insert: Callable[..., Any]
) -> dict[str, float]:
    """Lock these keys' rows (SKIP LOCKED), inserting those that do not exist yet; the
    rate budget (``tat``) of each key locked."""
    tats = dict((await conn.execute(LOCK_KEYS, {"keys": keys})).tuples().all())
    if missing := [k for k in keys if k not in tats]:
        made = insert(flow_keys).values([{"key": k, "tat": 0.0} for k in missing])
        result = await conn.execute(
            made.on_conflict_do_nothing(index_elements=[flow_keys.c.key]).returning(flow_keys.c.key)
        )
        tats.update(dict.fromkeys(result.scalars(), 0.0))
    return tats


async def _more(
    conn: AsyncConnection,
    st: FlowStatements,
    params: dict[str, Any],
    k: _Key,
    target: int,
    share: int,
) -> int:
    """Read more rows of a key that filled its first share, up to ``target`` rows in all
    (and what its limits allow); returns how many."""
    wanted = min(k.free, target) - len(k.rows)
    if len(k.rows) < share or wanted <= 0:
        return 0
    last = k.rows[-1]
    head = {**params, "b_key": k.key, "limit": wanted}
    head |= {"after_p": last.priority, "after_at": last.available_at, "after_seq": last.seq}
    extra = claimed(list(await conn.execute(st.head_after, head)))
    k.rows += extra
    return len(extra)


@dataclass(slots=True)
class Keyed:
    """The keyed rows a claim may take, locked; ``consume`` what it took."""

    keys: list[_Key]
    tats: dict[str, float]
    skipped: bool
    """A key was skipped because another claim held its lock."""

    def ranked(self, now: float) -> list[tuple[Claimed, int, int]]:
        """Each row with its round and the priority it competes with (``fair_order``)."""
        return [
            (row, i // k.limits.weight, k.limits.priority(row.priority, row.available_at, now))
            for k in self.keys
            for i, row in enumerate(k.rows)
        ]

    async def consume(
        self, conn: AsyncConnection, taken: Sequence[Claimed], now: float, cursor: FlowCursor
    ) -> None:
        """Spend the rate budgets of the keys whose rows the claim took (in its own
        transaction: a claim rolled back spent nothing)."""
        ids = {r.id for r in taken}
        for k in self.keys:
            if (rate := k.limits.rate) is None:
                continue
            starts = sum(1 for r in k.rows if r.id in ids)
            if starts:
                tat = consumed(rate, self.tats[k.key], now, starts)
                await conn.execute(SET_TAT, {"b_key": k.key, "tat": tat})
                if allowance(rate, tat, now) == 0:  # spent: wake when it allows the next
                    _wake(cursor, next_slot(rate, tat))


def _wake(cursor: FlowCursor, at: float) -> None:
    cursor.wake_at = at if cursor.wake_at is None else min(cursor.wake_at, at)


def fair_order(
    plain: Sequence[Claimed], keyed_rows: Sequence[tuple[Claimed, int, int]], limit: int
) -> list[Claimed]:
    """Unkeyed and keyed rows in one order: priority (a keyed row's aged, ``Flow.aging``),
    then round (an unkeyed row is in the first round, a key of its own), then due time and
    the order written; the first ``limit``."""
    ranked = [(r.priority, 0, r.available_at, r.seq, r) for r in plain]
    ranked += [(p, n, r.available_at, r.seq, r) for r, n, p in keyed_rows]
    ranked.sort(key=lambda item: item[:4])
    return [item[4] for item in ranked[:limit]]
