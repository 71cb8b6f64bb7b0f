"""Named queues in the database (``_durafn_queues``): created with their first row,
declared by an app's executors, paused and resumed by operators, listed with their rows.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import Any, ClassVar

from sqlalchemy import CursorResult, and_, func, literal_column, select, update
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql.elements import ColumnElement

from .._kinds import State
from .._types import QueueInfo
from .schema.tables import queues, sf


class QueueStatements:
    """The driver's statements on ``_durafn_queues`` (a part of ``Driver``)."""

    dialect_insert: ClassVar[Callable[..., Any]]
    """The dialect's ``insert`` (with ``on_conflict_do_update``/``_do_nothing``)."""

    async def ensure_queues(
        self, conn: AsyncConnection, concurrency: Mapping[str, int | None], now: float
    ) -> None:
        """Create the queues that do not exist yet, with these concurrencies (a queue's
        first row creates it; an existing queue keeps what it has)."""
        rows = [
            {"name": name, "concurrency": limit, "paused": False, "created_at": now}
            for name, limit in sorted(concurrency.items())
        ]
        await conn.execute(
            self.dialect_insert(queues)
            .values(rows)
            .on_conflict_do_nothing(index_elements=[queues.c.name])
        )

    async def declare_queues(
        self, conn: AsyncConnection, concurrency: Mapping[str, int | None], now: float
    ) -> None:
        """Create these queues, or set their concurrency (an app's ``Queue`` attributes,
        written when its executor starts); pauses are left alone."""
        if not concurrency:
            return
        stmt = self.dialect_insert(queues).values(
            [
                {"name": name, "concurrency": limit, "paused": False, "created_at": now}
                for name, limit in sorted(concurrency.items())
            ]
        )
        await conn.execute(
            stmt.on_conflict_do_update(
                index_elements=[queues.c.name],
                set_={"concurrency": stmt.excluded.concurrency},
            )
        )

    async def set_paused(
        self, conn: AsyncConnection, names: Collection[str], paused: bool, now: float
    ) -> int:
        """Pause or resume queues (creating any that do not exist, so a queue can be paused
        before its first row); returns how many changed."""
        await self.ensure_queues(conn, dict.fromkeys(names, 1), now)
        result = await conn.execute(
            update(queues)
            .where(queues.c.name.in_(sorted(names)), queues.c.paused != paused)
            .values(paused=paused)
        )
        assert isinstance(result, CursorResult)
        return result.rowcount

    async def list_queues(self, conn: AsyncConnection, now: float) -> list[QueueInfo]:
        """Every queue with its rows Pending (due and later) and InProgress."""
        pending: ColumnElement[str] = literal_column("'Pending'")
        counts = (
            select(
                sf.c.queue_name,
                func.count().filter(and_(sf.c.state == pending, sf.c.available_at <= now)),
                func.count().filter(sf.c.state == pending),
                func.count().filter(sf.c.state == literal_column("'InProgress'")),
            )
            # ix_scheduled_functions_queue and the running index; never the finished rows.
            .where(sf.c.queue_name.is_not(None), sf.c.state.in_(["Pending", "InProgress"]))
            .group_by(sf.c.queue_name)
            .subquery()
        )
        rows = await conn.execute(
            select(queues, *(func.coalesce(c, 0) for c in list(counts.c)[1:]))
            .outerjoin(counts, counts.c.queue_name == queues.c.name)
            .order_by(queues.c.name)
        )
        return [
            QueueInfo(
                name=r[0],
                concurrency=r[1],
                paused=bool(r[2]),
                due=r[4],
                pending=r[5],
                running=r[6],
            )
            for r in rows
        ]

    async def count_by_queue(self, conn: AsyncConnection) -> dict[str | None, dict[State, int]]:
        """Rows in each state per queue (None: unqueued); a full scan, like the totals."""
        rows = await conn.execute(
            select(sf.c.queue_name, sf.c.state, func.count()).group_by(sf.c.queue_name, sf.c.state)
        )
        out: dict[str | None, dict[State, int]] = {}
        for name, state, n in rows:
            out.setdefault(name, dict.fromkeys(State, 0))[State(state)] = n
        return out
