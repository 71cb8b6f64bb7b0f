"""The driver's reads of the system tables for operators: one row, a filtered page,
the workers, counts by state, the backlog (a part of ``Driver``)."""

from __future__ import annotations

import builtins
from typing import Any

from sqlalchemy import func, literal, literal_column, select, tuple_
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql.elements import ColumnElement, Tuple
from sqlalchemy.sql.selectable import FromClause, ScalarSelect, Select

from ..._clock import to_datetime
from ..._kinds import FunctionKind, State
from ..._models import Page, ScheduledFunction, WorkerInfo
from ..claim.levels import next_due
from ..filters import RowFilter
from ..rows import decode_cursor, encode_cursor, is_id, to_model
from ..schema.tables import BATCHED, KEYED, QUEUED, RUNNING_ROWS, UNQUEUED, sf, workers


class ReadStatements:
    """Reads for ``app.get``, ``app.list``, ``app.workers`` and ``app.stats``."""

    async def get(self, conn: AsyncConnection, id: str) -> ScheduledFunction | None:
        if not is_id(id):
            return None
        row = (await conn.execute(select(sf).where(sf.c.id == id))).first()
        return None if row is None else to_model(row)

    async def list(
        self,
        conn: AsyncConnection,
        *,
        where: RowFilter,
        limit: int,
        cursor: str | None,
        newest_first: bool = False,
        scan: int | None = None,
    ) -> Page:
        # ix_scheduled_functions_scheduled (scheduled_time, id), read forwards or backwards.
        columns = (sf.c.scheduled_time, sf.c.id)
        order = [c.desc() for c in columns] if newest_first else list(columns)
        later: list[ColumnElement[bool]] = []
        digest = where.digest()
        if cursor is not None:
            later.append(_beyond(*decode_cursor(cursor, newest_first, digest), newest_first))
        # ``scan``: the page reads at most this many rows of the order. Its last one (the
        # ``scan``-th entry of the same index range, one probe) bounds the page's read, so
        # a filter that matches little costs ``scan`` index entries, not the whole table.
        bound = None
        if scan is not None:
            last = select(*columns).where(*later).order_by(*order).offset(scan - 1).limit(1)
            bound = (await conn.execute(last)).first()
        stmt = select(sf).where(*where.where(), *later).order_by(*order).limit(limit + 1)
        if bound is not None:
            stmt = stmt.where(_up_to(bound[0], bound[1], newest_first))
        rows = list(await conn.execute(stmt))
        items = [to_model(r) for r in rows[:limit]]
        if len(rows) > limit:
            last_row = rows[limit - 1]
            next_cursor = encode_cursor(last_row.scheduled_time, last_row.id, newest_first, digest)
            return Page(items=items, next_cursor=next_cursor)
        if bound is not None:  # the bound stopped the read: older rows were not looked at
            next_cursor = encode_cursor(bound[0], bound[1], newest_first, digest)
            return Page(items=items, next_cursor=next_cursor, partial=True)
        return Page(items=items, next_cursor=None)

    async def finished_since(
        self, conn: AsyncConnection, since: float, limit: int
    ) -> builtins.list[ScheduledFunction]:
        """Rows that ended at ``since`` or later, the latest first, at most ``limit``: a
        range of ix_scheduled_functions_completed, however many rows the table holds."""
        stmt = (
            select(sf)
            .where(sf.c.completed_time >= since)
            .order_by(sf.c.completed_time.desc())
            .limit(limit)
        )
        return [to_model(r) for r in await conn.execute(stmt)]

    async def list_workers(self, conn: AsyncConnection) -> builtins.list[WorkerInfo]:
        """Registered workers, with how many actions each has InProgress."""
        running = (
            select(sf.c.worker_id, func.count().label("running"))
            .where(sf.c.state == State.IN_PROGRESS.value)
            .group_by(sf.c.worker_id)
            .subquery()
        )
        rows = await conn.execute(
            select(workers, func.coalesce(running.c.running, 0))
            .outerjoin(running, running.c.worker_id == workers.c.id)
            .order_by(workers.c.started_at, workers.c.id)
        )
        return [
            WorkerInfo(
                id=r.id,
                hostname=r.hostname,
                pid=r.pid,
                concurrency=r.concurrency,
                started_at=to_datetime(r.started_at),
                heartbeat_at=to_datetime(r.heartbeat_at),
                running=r[-1],
            )
            for r in rows
        ]

    async def count_by_state(self, conn: AsyncConnection) -> dict[State, int]:
        """Rows in each state, every state present. A full scan (no index helps a GROUP BY
        over every row): fine for an operator's occasional look, not for a hot path."""
        rows = await conn.execute(select(sf.c.state, func.count()).group_by(sf.c.state))
        counts = dict.fromkeys(State, 0)
        counts.update({State(s): n for s, n in rows})
        return counts

    async def count_by_state_bounded(
        self, conn: AsyncConnection, bound: int
    ) -> tuple[dict[State, int], set[State]]:
        """Rows in each state, each count stopping at ``bound``, and the states whose count
        stopped there. Pending and InProgress: counted in their partial indexes (a range
        of at most ``bound`` entries each); the ended states: counted among the ``bound``
        rows that ended last (a range of ix_scheduled_functions_completed)."""

        # The Pending rows' four classes of partial indexes, one predicate each, as there.
        arms = (UNQUEUED, QUEUED, KEYED, BATCHED, RUNNING_ROWS)
        active = await conn.execute(select(*(at_most(bound, arm) for arm in arms)))
        *pending, running = active.one()
        latest = (
            select(sf.c.state)
            .where(sf.c.completed_time.is_not(None))
            .order_by(sf.c.completed_time.desc())
            .limit(bound)
            .subquery()
        )
        ended = await conn.execute(select(latest.c.state, func.count()).group_by(latest.c.state))
        counts = dict.fromkeys(State, 0)
        counts.update({State(s): n for s, n in ended})
        capped = {s for s in State if s.finished} if sum(counts.values()) >= bound else set()
        counts[State.PENDING] = min(sum(pending), bound)
        counts[State.IN_PROGRESS] = running
        capped |= {s for s in (State.PENDING, State.IN_PROGRESS) if counts[s] >= bound}
        return counts, capped

    async def count_due_bounded(
        self, conn: AsyncConnection, now: float, bound: int
    ) -> tuple[int, bool]:
        """Pending rows due by ``now``, counted up to ``bound`` (and whether it stopped
        there): the four classes of Pending partial indexes, each up to ``bound`` entries."""
        due = sf.c.available_at <= now
        arms = (at_most(bound, arm, due) for arm in (UNQUEUED, QUEUED, KEYED, BATCHED))
        found = sum((await conn.execute(select(*arms))).one())
        return min(found, bound), found >= bound

    async def backlog(self, conn: AsyncConnection, now: float) -> tuple[float | None, float | None]:
        """(``available_at`` of the longest-waiting due Pending row, the earliest
        ``available_at`` after ``now``): each None when there is no such row.

        Up to four ``next_due`` reads, each a few index probes, rather than a MIN over the
        Pending rows.
        """
        oldest: list[float] = []
        upcoming: list[float] = []
        for kind in (FunctionKind.MUTATION, FunctionKind.ACTION):
            first = await next_due(conn, kind, None)
            if first is not None and first <= now:
                oldest.append(first)
                first = await next_due(conn, kind, now)
            if first is not None:
                upcoming.append(first)
        return min(oldest, default=None), min(upcoming, default=None)


def _beyond(at: float, id: str, newest_first: bool) -> ColumnElement[bool]:
    """Rows after (``scheduled_time``, ``id``) in the listing's order: a row-value
    comparison, which both engines read as a range of ix_scheduled_functions_scheduled
    (SQLite reads ``t < x OR (t = x AND id < y)`` as a filter over the whole index)."""
    position, mark = tuple_(sf.c.scheduled_time, sf.c.id), _mark(at, id)
    return position < mark if newest_first else position > mark


def _up_to(at: float, id: str, newest_first: bool) -> ColumnElement[bool]:
    """Rows up to (``scheduled_time``, ``id``) in the listing's order, it included."""
    position, mark = tuple_(sf.c.scheduled_time, sf.c.id), _mark(at, id)
    return position >= mark if newest_first else position <= mark


def _mark(at: float, id: str) -> Tuple:
    # Typed as the columns: PostgreSQL compares a uuid with a uuid, not with text.
    return tuple_(literal(at, sf.c.scheduled_time.type), literal(id, sf.c.id.type))


def at_most(
    bound: int | None, *where: ColumnElement[bool], outer: FromClause | None = None
) -> ScalarSelect[int]:
    """How many rows match ``where``, counted up to ``bound`` (None: all): a range of
    the index ``where`` names, of at most ``bound`` entries (the bounded counts of
    ``stats``, the gauges and the queues). ``outer``: a table of the enclosing query
    that ``where`` refers to (a per-row count)."""
    rows: Select[Any] = select(literal_column("1")).where(*where)
    if outer is not None:
        rows = rows.correlate(outer)
    some = rows.limit(bound).subquery()
    return select(func.count()).select_from(some).scalar_subquery()
