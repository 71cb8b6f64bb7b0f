"""The driver's reads of the system tables for operators: one row, a filtered page,
the workers, counts by state, the backlog (a part of ``Driver``)."""

from __future__ import annotations

import builtins

from sqlalchemy import and_, func, or_, select
from sqlalchemy.ext.asyncio import AsyncConnection

from ..._clock import to_datetime
from ..._kinds import FunctionKind, State
from ..._types import Page, ScheduledFunction, WorkerInfo
from ..claim.take import next_due
from ..filters import RowFilter
from ..rows import decode_cursor, encode_cursor, is_id, to_model
from ..schema.tables import sf, workers


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
    ) -> Page:
        # ix_scheduled_functions_scheduled (scheduled_time, id), read forwards or backwards.
        columns = (sf.c.scheduled_time, sf.c.id)
        order = [c.desc() for c in columns] if newest_first else list(columns)
        stmt = select(sf).where(*where.where()).order_by(*order).limit(limit + 1)
        if cursor is not None:
            at, last_id = decode_cursor(cursor, newest_first)
            if newest_first:
                later = or_(
                    sf.c.scheduled_time < at, and_(sf.c.scheduled_time == at, sf.c.id < last_id)
                )
            else:
                later = or_(
                    sf.c.scheduled_time > at, and_(sf.c.scheduled_time == at, sf.c.id > last_id)
                )
            stmt = stmt.where(later)
        rows = list(await conn.execute(stmt))
        items = [to_model(r) for r in rows[:limit]]
        next_cursor = None
        if len(rows) > limit:
            last = rows[limit - 1]
            next_cursor = encode_cursor(last.scheduled_time, last.id, newest_first)
        return Page(items=items, next_cursor=next_cursor)

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
