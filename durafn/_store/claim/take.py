"""Which due rows a claim takes: priority order, named queues, flow keys, pauses, flags,
pools.

A claim (a mutation batch's, or an action dispatcher's) takes up to ``limit`` due rows in
the order **priority, then due time, then id**, within what its ``ClaimFilter`` lets it
serve (a worker's queues, its forbidden flags). Four reads make it, each an index range:

1. **Levels.** The priority levels present among Pending rows, by a loose index scan
   (a recursive CTE: one probe of the claim index per level). Each level is then read
   as one range ``priority = p AND available_at <= now``, ascending: no future row and no
   row of a later level is ever read to find a due one, however many there are.
2. **Unqueued rows**, level by level from ``ix_scheduled_functions_claim``, locked
   (``FOR UPDATE SKIP LOCKED`` on PostgreSQL; SQLite's write lock holds the whole claim).
3. **Queued rows**: which queues have due rows, level by level from
   ``ix_scheduled_functions_claim_queued`` (index only, no lock), skipping paused queues,
   queues at their concurrency and queues whose head (their first due row, whatever its
   kind: one probe of ``ix_scheduled_functions_queue``) is not of the claim's kind or
   carries a flag it refuses. For each such queue, in order: lock its
   ``_durafn_queues`` row (``SKIP LOCKED``: a queue another claim is choosing from, or a
   mutation batch is running, is skipped, never waited for), count its running rows, and
   read its **head** (its first due rows, whatever their kind, from
   ``ix_scheduled_functions_queue``). A claim takes only head rows it may run, so a queue
   starts its rows in queue order and never more at once than its concurrency.
4. **Keyed rows** (a flow key: ``durafn.Flow``), per key under the key's lock, as much as
   its concurrency and rate budget allow (``flow``); all the rows read are then
   ordered round-robin across keys (``fair_order``) and the first ``limit`` taken.

**The fast path** comes first (``fast.take_fast``): while no queued or keyed row
of the kind is due, one statement reads the lowest level's due rows (guarded by a probe
of ``ix_scheduled_functions_queued_due`` and one of ``ix_scheduled_functions_keyed_due``),
again from the next level while it falls short,
and reads every level at once (``fast``: a recursive CTE with a LATERAL range per level on
PostgreSQL, ``priority IN (levels)`` on SQLite) past a level with nothing due. Only a fast
path that found nothing goes on with the full claim (``take``).

A mutation batch keeps its queues' locks until it commits, so rows of one queue may run
one after another inside a batch (group commit kept), never in two batches at once. An
action claim commits its rows InProgress before releasing the locks; the count of
InProgress rows then keeps the queue busy until they finish.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    Double,
    Integer,
    Select,
    and_,
    bindparam,
    func,
    or_,
    select,
    true,
    update,
)
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql.elements import ColumnElement

from ..._kinds import FunctionKind
from ..rows import CLAIM_ORDER, Claimed
from ..schema.tables import queues, sf
from ..sql import PENDING, carries
from .columns import CLAIM_COLUMNS, STARTED, StartTime, claimed
from .flow import FlowCursor, FlowStatements, fair_order, flow_heads, flow_statements
from .hints import FastPathHint
from .levels import HIGHEST, LEVELS, NO_QUEUED, due_at_level, levels_cte, pending
from .queues import heads_only, queue_heads, queue_may_run


@dataclass(frozen=True, slots=True)
class ClaimFilter:
    """What one executor serves."""

    queues: frozenset[str] | None = None
    """Only rows of these named queues (a worker pool); None: every row, queued or not."""
    forbidden_flags: frozenset[str] = frozenset()
    """Never rows carrying any of these flags (Graphile's ``forbiddenFlags``)."""


SERVE_ALL = ClaimFilter()


def flags_allowed(forbidden: frozenset[str]) -> ColumnElement[bool]:
    if not forbidden:
        return true()
    return or_(
        sf.c.flags.is_(None),
        and_(*(~carries(f) for f in sorted(forbidden))),
    )


def _not_paused() -> ColumnElement[bool]:
    """A keyed row's queue (if any: it only routes) is not paused."""
    paused = select(queues.c.name).where(queues.c.paused)  # ix_durafn_queues_paused
    return or_(sf.c.queue_name.is_(None), ~sf.c.queue_name.in_(paused))


@dataclass(frozen=True, slots=True)
class ClaimQueries:
    """The statements of one ``ClaimFilter``, built once (see ``statements``)."""

    unqueued: Select[Any] | None
    """Due unqueued rows at ``:level``, locked; None when the filter serves queues only."""
    queued: Select[Any]
    """(queue, priority, due, id) of due queued rows at ``:level`` whose queue may run."""
    first: Select[Any] | None
    """The fast path's try: due unqueued rows of the lowest level from ``:from_level`` on,
    locked, when no queued row of the kind is due (a statement planned in microseconds,
    which matters: PostgreSQL plans it anew for every execution); None when the filter
    serves queues only."""
    first_actions: Any
    """``first``, starting the actions (Pending -> InProgress) in the same statement."""
    fast: Select[Any] | None
    """The fast path's reach past levels with nothing due, one statement: due unqueued rows
    of every level, ascending (LATERAL on PostgreSQL, ``priority IN (levels)`` on SQLite)."""
    fast_actions: Any
    """``fast``, starting the actions in the same statement."""
    flow: FlowStatements
    """The keyed rows' reads (``flow``)."""


@functools.cache
def statements(serve: ClaimFilter, lateral: bool = False) -> ClaimQueries:
    """``lateral``: the engine joins a subquery per row of another (PostgreSQL's
    LATERAL), so the fast path reads every priority level in its one statement."""
    flags_ok = flags_allowed(serve.forbidden_flags)
    served = true() if serve.queues is None else sf.c.queue_name.in_(sorted(serve.queues))
    # ix_scheduled_functions_claim_queued, read alone (queue_name is its last column),
    # then each row's queue head (ix_scheduled_functions_queue): only heads we may run.
    queued = heads_only(
        select(sf.c.queue_name, sf.c.priority, sf.c.available_at, sf.c.seq)
        .where(*due_at_level(True), served, queue_may_run(), flags_ok)
        .order_by(sf.c.available_at, sf.c.seq)
        .limit(bindparam("limit", type_=Integer))
    )
    flow = flow_statements((served, flags_ok, _not_paused()), lateral)
    if serve.queues is not None:  # queues only: no unqueued row is this claim's
        return ClaimQueries(None, queued, None, None, None, None, flow)
    # ix_scheduled_functions_claim: (kind, priority, available_at, id), one range.
    unqueued = (
        select(*CLAIM_COLUMNS)
        .where(*due_at_level(False), flags_ok)
        .order_by(sf.c.available_at, sf.c.seq)
        .limit(bindparam("limit", type_=Integer))
        .with_for_update(skip_locked=True)
    )
    first = _first_level(flags_ok)
    fast = _every_level(flags_ok) if lateral else _levels_in(flags_ok)
    return ClaimQueries(
        unqueued, queued, first, _starting(first, HIGHEST), fast, _starting(fast), flow
    )


def _first_level(flags_ok: ColumnElement[bool]) -> Select[Any]:
    """The fast path's first try: due unqueued rows of the lowest level from
    ``:from_level`` on (the lowest priority there is; a level change reruns it from the
    next level), locked."""
    lowest = (
        select(func.min(sf.c.priority))
        .where(*pending(False), sf.c.priority >= bindparam("from_level", type_=Integer))
        .scalar_subquery()
    )
    return (
        select(*CLAIM_COLUMNS, HIGHEST)
        .where(
            *pending(False),
            sf.c.priority == lowest,
            sf.c.available_at <= bindparam("now", type_=Double),
            NO_QUEUED,
            flags_ok,
        )
        .order_by(sf.c.available_at, sf.c.seq)
        .limit(bindparam("limit", type_=Integer))
        .with_for_update(skip_locked=True)
    )


def _every_level(flags_ok: ColumnElement[bool]) -> Select[Any]:
    """The second try, in one statement, with LATERAL: every level, ascending, each its
    own locked range (a LATERAL subquery per level); the outer LIMIT ends the recursion
    once it has enough."""
    levels = levels_cte(False)
    at_level = (
        select(*CLAIM_COLUMNS)
        .where(
            *pending(False),
            sf.c.priority == levels.c.p,
            sf.c.available_at <= bindparam("now", type_=Double),
            flags_ok,
        )
        .order_by(sf.c.available_at, sf.c.seq)
        .limit(bindparam("limit", type_=Integer))
        .with_for_update(skip_locked=True)
        .lateral("at_level")
    )
    return (
        select(*at_level.c)
        .select_from(levels.join(at_level, true()))
        .where(levels.c.p.is_not(None), NO_QUEUED)
        .limit(bindparam("limit", type_=Integer))
    )


def _levels_in(flags_ok: ColumnElement[bool]) -> Select[Any]:
    """The second try without LATERAL (SQLite): ``priority IN (the levels)``, which SQLite
    reads as one range per level in ascending order, so the ORDER BY needs no sort (no
    temporary B-tree in its plan) and the LIMIT ends it: 0.24 ms at 10^5 rows, where a
    statement per level cost 0.5 ms each through aiosqlite."""
    levels = levels_cte(False)
    return (
        select(*CLAIM_COLUMNS)
        .where(
            *pending(False),
            sf.c.priority.in_(select(levels.c.p).where(levels.c.p.is_not(None))),
            sf.c.available_at <= bindparam("now", type_=Double),
            NO_QUEUED,
            flags_ok,
        )
        .order_by(sf.c.priority, sf.c.available_at, sf.c.seq)
        .limit(bindparam("limit", type_=Integer))
    )


def _starting(chosen: Select[Any], *extra: Any) -> Any:
    """An UPDATE that starts the actions ``chosen`` selects (Pending -> InProgress).

    A MATERIALIZED CTE, not ``id IN (SELECT ... LIMIT n)``: PostgreSQL may re-run an
    IN-subquery per row and so claim more than ``limit`` rows (caught by
    test_actions_run_concurrently_up_to_the_limit)."""
    due = select(chosen.subquery().c.id).cte("due").prefix_with("MATERIALIZED")
    return (
        update(sf)
        .where(sf.c.id == due.c.id, sf.c.state == PENDING)
        .values(**STARTED)
        .returning(*CLAIM_COLUMNS, *extra)
    )


START_ACTIONS = (
    update(sf)
    .where(sf.c.id.in_(bindparam("ids", expanding=True)), sf.c.state == PENDING)
    .values(**STARTED)
    .returning(*CLAIM_COLUMNS)
)


async def levels(
    conn: AsyncConnection, kind: FunctionKind, now: float
) -> tuple[dict[bool, list[int]], bool]:
    """The priority levels of Pending rows of ``kind``, unqueued (False) and queued (True),
    and whether a keyed row of ``kind`` is due."""
    found: dict[bool, list[int]] = {False: [], True: []}
    keyed_due = False
    for queued, level in await conn.execute(LEVELS, {"b_kind": kind.value, "now": now}):
        if queued is None:
            keyed_due = True
        else:
            found[bool(queued)].append(level)
    return found, keyed_due


async def take(
    conn: AsyncConnection,
    kind: FunctionKind,
    now: float,
    limit: int,
    serve: ClaimFilter,
    insert: Callable[..., Any],
    hint: FastPathHint | None = None,
    lateral: bool = False,
) -> list[Claimed]:
    """Choose and lock up to ``limit`` due rows of ``kind`` (see the module docstring).
    Actions are then started by ``START_ACTIONS``; mutations run in this transaction."""
    st = statements(serve, lateral)
    present, keyed_due = await levels(conn, kind, now)
    cursor = hint.flow if hint is not None else FlowCursor()
    if hint is not None:
        hint.contended = False  # until a queue or key another claim holds is skipped
    if not keyed_due:
        cursor.after, cursor.wake_at, cursor.visited = "", None, []
        return await _take_unkeyed(conn, st, kind, now, limit, serve, hint, present, lateral)
    keyed_rows = await flow_heads(conn, st.flow, kind, now, limit, cursor, insert)
    if hint is not None:
        hint.contended = keyed_rows.skipped
    rows = await _take_unkeyed(conn, st, kind, now, limit, serve, hint, present, lateral)
    if not cursor.visited:
        return rows
    if hint is not None:
        hint.use = False  # keyed rows are due: the fast path's guard would fail
    chosen = fair_order(rows, keyed_rows.ranked(now), limit)
    await keyed_rows.consume(conn, chosen, now, cursor)
    return chosen


async def _take_unkeyed(
    conn: AsyncConnection,
    st: ClaimQueries,
    kind: FunctionKind,
    now: float,
    limit: int,
    serve: ClaimFilter,
    hint: FastPathHint | None,
    present: dict[bool, list[int]],
    lateral: bool,
) -> list[Claimed]:
    free: list[Claimed] = []
    if st.unqueued is not None:
        for level in present[False]:
            params = {"b_kind": kind.value, "level": level, "now": now, "limit": limit - len(free)}
            free.extend(claimed(list(await conn.execute(st.unqueued, params))))
            if len(free) >= limit:
                break
    waiting: list[tuple[Any, ...]] = []
    for level in present[True]:
        params = {"b_kind": kind.value, "level": level, "now": now, "limit": limit - len(waiting)}
        waiting.extend(tuple(r) for r in await conn.execute(st.queued, params))
        if len(waiting) >= limit:
            break
    if hint is not None:
        hint.use = not waiting
    if not waiting:
        return free
    # The first ``limit`` rows in claim order decide how much room the queues get.
    order = sorted(
        [(c.priority, c.available_at, c.seq, None) for c in free]
        + [(p, at, seq, q) for q, p, at, seq in waiting]
    )[:limit]
    names = list(dict.fromkeys(q for *_, q in order if q is not None))
    forbidden = serve.forbidden_flags
    heads, skipped = await queue_heads(conn, kind, now, names, limit, forbidden, lateral)
    if hint is not None and skipped:
        hint.contended = True
    return sorted(free + heads, key=CLAIM_ORDER)[:limit]


async def start_actions(
    conn: AsyncConnection,
    rows: list[Claimed],
    started: StartTime | float,
    worker_id: str,
) -> list[Claimed]:
    """Pending -> InProgress at ``started`` for chosen (locked) actions, guarded by state."""
    if not rows:
        return []
    result = await conn.execute(
        START_ACTIONS, {"ids": [r.id for r in rows], "started": started, "worker_id": worker_id}
    )
    return claimed(list(result))
