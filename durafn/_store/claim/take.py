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
    Boolean,
    Double,
    Integer,
    Select,
    Text,
    and_,
    bindparam,
    exists,
    func,
    literal,
    or_,
    select,
    true,
    union_all,
    update,
)
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql.elements import ColumnElement

from ..._kinds import FunctionKind
from ..rows import CLAIM_ORDER, Claimed
from ..schema.tables import BATCHED, dependencies, queues, sf
from ..sql import PENDING, carries
from .columns import CLAIM_COLUMNS, STARTED, StartTime, claimed
from .flow import FlowCursor, FlowStatements, fair_order, flow_heads, flow_statements, keyed
from .hints import FastPathHint
from .queues import heads_only, queue_heads, queue_may_run


@dataclass(frozen=True, slots=True)
class ClaimFilter:
    """What one executor serves."""

    queues: frozenset[str] | None = None
    """Only rows of these named queues (a worker pool); None: every row, queued or not."""
    forbidden_flags: frozenset[str] = frozenset()
    """Never rows carrying any of these flags (Graphile's ``forbiddenFlags``)."""


SERVE_ALL = ClaimFilter()


def _pending(queued: bool) -> tuple[ColumnElement[bool], ...]:
    """Pending rows of ``:kind`` in one of the two claim indexes (their predicates: an
    unqueued one is also unbatched, a batched action's rows being ``batched``'s to
    claim); an unqueued one also ``ready`` (rows ``after=`` others are unqueued,
    unkeyed)."""
    return (
        sf.c.state == PENDING,
        sf.c.kind == bindparam("b_kind", type_=Text),
        sf.c.queue_name.is_not(None) if queued else sf.c.queue_name.is_(None),
        sf.c.flow_key.is_(None),
        *(() if queued else (sf.c.batch_key.is_(None), READY)),
    )


READY = or_(
    sf.c.awaiting == 0,
    ~exists().where(dependencies.c.row_id == sf.c.id),
    and_(sf.c.after_failed > 0, sf.c.after_policy.in_(("cancel", "fail"))),
)
"""A row the claim may take: it waits for nothing (``awaiting = 0``, every row not
scheduled ``after=``: the test stops there), or no edge of it is left
(``ix_durafn_dependencies_row``), or a dependency failed and its policy acts on that
(``schema/dependencies.py``)."""


def _levels_cte(queued: bool) -> Any:
    """The priority levels of Pending rows of ``:kind``, ascending: one index probe each
    (a loose index scan; neither engine skips through an index by itself)."""
    # ORDER BY ... LIMIT 1, not min(): with fresh rows and stale statistics PostgreSQL
    # answered min() from ix_scheduled_functions_queued_due, reading all of its entries
    # (20,000 queued mutations: 3.7 ms a claim, the most costly statement of that drain).
    first = select(sf.c.priority).where(*_pending(queued)).order_by(sf.c.priority).limit(1)
    levels = select(first.scalar_subquery().label("p")).cte(f"levels_{int(queued)}", recursive=True)
    following = (
        select(sf.c.priority)
        .where(*_pending(queued), sf.c.priority > levels.c.p)
        .order_by(sf.c.priority)
        .limit(1)
    )
    return levels.union_all(select(following.scalar_subquery()).where(levels.c.p.is_not(None)))


def _first_due(*where: ColumnElement[bool]) -> Any:
    """The earliest ``available_at`` of these rows, written ``ORDER BY ... LIMIT 1`` rather
    than ``min()``: the planner then reads the first entry of the index in that order
    (``ix_scheduled_functions_keyed_due``, ``_queued_due``). As ``min()``, PostgreSQL with
    fresh rows and stale statistics read every entry of ``ix_scheduled_functions_keys``
    instead: 3.4 ms a claim with 10,000 keyed actions, against 0.05 ms."""
    first = select(sf.c.available_at).where(*where).order_by(sf.c.available_at).limit(1)
    return first.scalar_subquery()


def _levels() -> Any:
    """(queued, level) of both claim indexes, and a row (None, 0) if a keyed row is due
    (ix_scheduled_functions_keyed_due), in one statement: one round trip. The keyed part
    of a claim runs only then: a statement of its own on every full claim cost a queued
    drain (1000 serial queues) about 8% on PostgreSQL."""
    parts = []
    for queued in (False, True):
        levels = _levels_cte(queued)
        parts.append(
            select(literal(queued, Boolean).label("queued"), levels.c.p).where(
                levels.c.p.is_not(None)
            )
        )
    keyed_due = _first_due(*keyed())
    parts.append(
        select(literal(None, Boolean), literal(0, Integer)).where(
            keyed_due <= bindparam("now", type_=Double)
        )
    )
    return union_all(*parts)


def _next_due(queued: bool, after: bool) -> Any:
    """The earliest ``available_at`` (later than ``:after``) over every level's range."""
    levels = _levels_cte(queued)
    first = (
        select(sf.c.available_at)
        .where(*_pending(queued), sf.c.priority == levels.c.p)
        .order_by(sf.c.available_at)
        .limit(1)
    )
    if after:
        first = first.where(sf.c.available_at > bindparam("after", type_=Double))
    return select(func.min(first.scalar_subquery())).where(levels.c.p.is_not(None))


# No queued row of the kind is due: the first entry of ix_scheduled_functions_queued_due,
# so a queued row due next week does not send every claim down the full path.
_FIRST_QUEUED_DUE = _first_due(*_pending(True))
# Nor a keyed one (flow control: claimed per key), from ix_scheduled_functions_keyed_due.
_FIRST_KEYED_DUE = _first_due(*keyed())
NO_QUEUED = and_(
    or_(_FIRST_QUEUED_DUE.is_(None), bindparam("now", type_=Double) < _FIRST_QUEUED_DUE),
    or_(_FIRST_KEYED_DUE.is_(None), bindparam("now", type_=Double) < _FIRST_KEYED_DUE),
)
# The highest unqueued level Pending (its last entry in ix_scheduled_functions_claim):
# returned with the fast path's first try, to tell whether a second could find more.
HIGHEST = select(func.max(sf.c.priority)).where(*_pending(False)).scalar_subquery()
# The second level (one probe after another): asked when the first try found nothing.
SECOND_LEVEL = select(func.min(sf.c.priority)).where(
    *_pending(False),
    sf.c.priority > select(func.min(sf.c.priority)).where(*_pending(False)).scalar_subquery(),
)
LEVELS = _levels()


def _next_keyed(after: bool) -> Any:
    later = (sf.c.available_at > bindparam("after", type_=Double),) if after else ()
    return _first_due(*keyed(), *later)


def _next_batched(after: bool) -> Any:
    """A batched action's row (``batched``): its due time, though its batch may wait
    longer (``max_wait``: the claim of batches tells the executor when)."""
    later = (sf.c.available_at > bindparam("after", type_=Double),) if after else ()
    kind = sf.c.kind == bindparam("b_kind", type_=Text)
    return _first_due(BATCHED, kind, *later)  # ix_scheduled_functions_batched


# Every class of Pending rows in one statement (one round trip: the idle wait reads it
# after every claim that came back short).
NEXT_DUE = {
    after: select(
        _next_due(False, after).scalar_subquery(),
        _next_due(True, after).scalar_subquery(),
        _next_keyed(after),
        _next_batched(after),
    )
    for after in (False, True)
}


async def next_due(conn: AsyncConnection, kind: FunctionKind, after: float | None) -> float | None:
    """When the next Pending row of ``kind`` (due later than ``after``) becomes due."""
    params = {"b_kind": kind.value, "after": after}
    found = (await conn.execute(NEXT_DUE[after is not None], params)).one()
    return min((t for t in found if t is not None), default=None)


def flags_allowed(forbidden: frozenset[str]) -> ColumnElement[bool]:
    if not forbidden:
        return true()
    return or_(
        sf.c.flags.is_(None),
        and_(*(~carries(f) for f in sorted(forbidden))),
    )


def _due_at_level(queued: bool) -> tuple[ColumnElement[bool], ...]:
    return (
        *_pending(queued),
        sf.c.priority == bindparam("level", type_=Integer),
        sf.c.available_at <= bindparam("now", type_=Double),
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
        .where(*_due_at_level(True), served, queue_may_run(), flags_ok)
        .order_by(sf.c.available_at, sf.c.seq)
        .limit(bindparam("limit", type_=Integer))
    )
    flow = flow_statements((served, flags_ok, _not_paused()), lateral)
    if serve.queues is not None:  # queues only: no unqueued row is this claim's
        return ClaimQueries(None, queued, None, None, None, None, flow)
    # ix_scheduled_functions_claim: (kind, priority, available_at, id), one range.
    unqueued = (
        select(*CLAIM_COLUMNS)
        .where(*_due_at_level(False), flags_ok)
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
        .where(*_pending(False), sf.c.priority >= bindparam("from_level", type_=Integer))
        .scalar_subquery()
    )
    return (
        select(*CLAIM_COLUMNS, HIGHEST)
        .where(
            *_pending(False),
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
    levels = _levels_cte(False)
    at_level = (
        select(*CLAIM_COLUMNS)
        .where(
            *_pending(False),
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
    levels = _levels_cte(False)
    return (
        select(*CLAIM_COLUMNS)
        .where(
            *_pending(False),
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
