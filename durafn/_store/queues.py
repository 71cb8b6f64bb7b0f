"""Named queues in the database (``_durafn_queues``): created with their first row,
declared by an app's executors, paused and resumed by operators, listed with their rows.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import Any, ClassVar

from sqlalchemy import CursorResult, func, select, update
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.sql.selectable import ScalarSelect

from .._kinds import State
from .._models import QueueInfo
from .read.listing import at_most
from .schema.tables import KEYED, QUEUED, RUNNING_ROWS, queues, sf


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
        self,
        conn: AsyncConnection,
        concurrency: Mapping[str, int | None],
        paused: bool,
        now: float,
    ) -> int:
        """Pause or resume queues (creating any that do not exist, with these concurrencies
        as their first row would: a queue can be paused before its first row); returns how
        many changed."""
        names = concurrency.keys()
        await self.ensure_queues(conn, concurrency, now)
        result = await conn.execute(
            update(queues)
            .where(queues.c.name.in_(sorted(names)), queues.c.paused != paused)
            .values(paused=paused)
        )
        assert isinstance(result, CursorResult)
        return result.rowcount

    async def list_queues(
        self,
        conn: AsyncConnection,
        now: float,
        bound: int | None = None,
        *,
        names: Collection[str] | None = None,
        limit: int | None = None,
    ) -> list[QueueInfo]:
        """Every queue with its rows Pending (due and later) and InProgress; ``bound``:
        each count stops there (``QueueInfo.capped``). ``names``: only these queues;
        ``limit``: the first so many by name (a range of the table's primary key), so
        that a reading of an app with a queue per user stays bounded."""

        def count(*where: ColumnElement[bool]) -> ScalarSelect[int]:
            # Correlated: the queue of the outer row (a range of its partial index).
            in_queue = sf.c.queue_name == queues.c.name
            return at_most(bound, in_queue, *where, outer=queues)

        def oldest(*where: ColumnElement[bool]) -> ScalarSelect[float | None]:
            # The earliest due time among the first ``bound`` matching entries of the
            # same ranges as the counts: bounded as they are.
            some = (
                select(sf.c.available_at)
                .where(sf.c.queue_name == queues.c.name, *where)
                .correlate(queues)
                .limit(bound)
                .subquery()
            )
            return select(func.min(some.c.available_at)).scalar_subquery()

        due = sf.c.available_at <= now
        # Per queue, each count a range of a partial index: ix_scheduled_functions_queue
        # (queue_name first) for its unkeyed Pending rows; ix_scheduled_functions_running
        # for its running ones; its keyed rows (a flow key in an unlimited queue) in the
        # keyed rows' own indexes. Never the ended rows, however many the table holds.
        rows = await conn.execute(
            select(
                queues,
                count(QUEUED, due),
                count(KEYED, due),
                count(QUEUED),
                count(KEYED),
                count(RUNNING_ROWS),
                oldest(QUEUED, due),
                oldest(KEYED, due),
            )
            .where(*([] if names is None else [queues.c.name.in_(list(names))]))
            .order_by(queues.c.name)
            .limit(limit)
        )
        infos = []
        for r in rows:
            due_now, pending, running = r[4] + r[5], r[6] + r[7], r[8]
            waited = [at for at in (r[9], r[10]) if at is not None]
            capped = bound is not None and max(r[4:9]) >= bound
            if bound is not None:
                due_now, pending = min(due_now, bound), min(pending, bound)
            infos.append(
                QueueInfo(
                    name=r[0],
                    concurrency=r[1],
                    paused=bool(r[2]),
                    due=due_now,
                    pending=pending,
                    running=running,
                    capped=capped,
                    oldest_due_at=min(waited, default=None),
                )
            )
        return infos

    async def count_by_queue(self, conn: AsyncConnection) -> dict[str | None, dict[State, int]]:
        """Rows in each state per queue (None: unqueued); a full scan, like the totals."""
        rows = await conn.execute(
            select(sf.c.queue_name, sf.c.state, func.count()).group_by(sf.c.queue_name, sf.c.state)
        )
        out: dict[str | None, dict[State, int]] = {}
        for name, state, n in rows:
            out.setdefault(name, dict.fromkeys(State, 0))[State(state)] = n
        return out
