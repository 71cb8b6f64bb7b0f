"""What ``app.explain`` reads about one row: the row, its queue, its flow key, the workers.

Reads only, each by primary key or a small index: the row; its queue's row
(``_durafn_queues``), the queue's running rows (``ix_scheduled_functions_running``) and the
due rows ahead of it in the queue (``ix_scheduled_functions_queue``); its key's running
rows (``ix_scheduled_functions_key_running``) and rate budget (``_durafn_flow_keys``); the
registered workers (one row each).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Integer, cast, func, literal, literal_column, select, tuple_, union_all
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql.elements import ColumnElement

from ..._kinds import ScheduledFunctionId
from ..schema.tables import BATCHED, KEYED, RUNNING_KEYED, flow_keys, queues, sf, workers
from ..sql import PENDING, RUNNING
from ..write.dependencies import awaited

HELD_SHOWN = 10
"""Running rows named per queue or key (the count is exact)."""


@dataclass(frozen=True, slots=True)
class WorkerServes:
    queues: frozenset[str] | None
    forbidden: frozenset[str]


@dataclass(frozen=True, slots=True)
class Facts:
    """Everything ``explain`` decides from, read in one transaction."""

    row: Any
    queue_concurrency: int | None
    queue_paused: bool
    queue_running: list[ScheduledFunctionId]
    queue_running_count: int
    queue_ahead: int
    key_running: list[ScheduledFunctionId]
    key_running_count: int
    key_tat: float | None
    workers: list[WorkerServes]
    awaited: list[ScheduledFunctionId]
    """The rows it was scheduled ``after=`` that have not finished for good."""
    batch_due: int = 0
    """A batched row's: how many rows of its function and key are due (at most 10,000)."""
    batch_oldest: float | None = None
    """When the oldest of them fell due."""


_ROW = select(
    sf.c.id,
    sf.c.name,
    sf.c.kind,
    sf.c.state,
    sf.c.priority,
    sf.c.available_at,
    sf.c.queue_name,
    sf.c.flags,
    sf.c.flow_key,
    sf.c.flow,
    sf.c.flow_until,
    sf.c.job_key,
    sf.c.worker_id,
    sf.c.started_time,
    sf.c.seq,
    sf.c.completed_time,
    sf.c.attempts,
    sf.c.error_type,
    sf.c.error_message,
    sf.c.awaiting,
    sf.c.batch_key,
)


async def _running(conn: AsyncConnection, where: Any) -> tuple[list[ScheduledFunctionId], int]:
    held = select(sf.c.id).where(sf.c.state == RUNNING, where).order_by(sf.c.started_time)
    found = await conn.execute(held.limit(HELD_SHOWN))
    ids = [ScheduledFunctionId(str(i)) for i in found.scalars()]
    count = select(func.count()).where(sf.c.state == RUNNING, where)
    return ids, int((await conn.execute(count)).scalar_one())


class ExplainStatements:
    """The driver's part that reads for ``explain`` (a part of ``Driver``)."""

    async def explain_facts(
        self, conn: AsyncConnection, id: ScheduledFunctionId, now: float
    ) -> Facts | None:
        row = (await conn.execute(_ROW.where(sf.c.id == id))).first()
        if row is None:
            return None
        concurrency, paused, q_count, ahead = None, False, 0, 0
        q_running: list[ScheduledFunctionId] = []
        if row.queue_name is not None:
            found = (
                await conn.execute(
                    select(queues.c.concurrency, queues.c.paused).where(
                        queues.c.name == row.queue_name
                    )
                )
            ).first()
            if found is not None:
                concurrency, paused = found.concurrency, bool(found.paused)
            q_running, q_count = await _running(conn, sf.c.queue_name == row.queue_name)
            before = tuple_(sf.c.priority, sf.c.available_at, sf.c.seq) < tuple_(
                literal(row.priority), literal(row.available_at), literal(row.seq)
            )
            ahead_of = select(func.count()).where(
                sf.c.state == PENDING,
                sf.c.flow_key.is_(None),  # ix_scheduled_functions_queue's predicate
                sf.c.queue_name == row.queue_name,
                sf.c.available_at <= now,
                before,
            )
            ahead = int((await conn.execute(ahead_of)).scalar_one())
        k_running: list[ScheduledFunctionId] = []
        k_count, tat = 0, None
        if row.flow_key is not None:
            k_running, k_count = await _running(conn, sf.c.flow_key == row.flow_key)
            tat = (
                await conn.execute(select(flow_keys.c.tat).where(flow_keys.c.key == row.flow_key))
            ).scalar()
        serving = [
            WorkerServes(
                frozenset(json.loads(w.serves)) if w.serves is not None else None,
                frozenset(json.loads(w.forbidden)) if w.forbidden is not None else frozenset(),
            )
            for w in await conn.execute(select(workers.c.serves, workers.c.forbidden))
        ]
        waits = await awaited(conn, id) if row.awaiting else []
        batch_due: int = 0
        oldest: float | None = None
        if row.batch_key is not None:
            due = (
                select(sf.c.available_at)  # ix_scheduled_functions_batch
                .where(
                    BATCHED,
                    sf.c.name == row.name,
                    sf.c.batch_key == row.batch_key,
                    sf.c.available_at <= now,
                )
                .limit(10_000)
                .subquery()
            )
            counted = await conn.execute(select(func.count(), func.min(due.c.available_at)))
            batch_due, oldest = counted.one()._tuple()
        return Facts(
            row,
            *(concurrency, paused, q_running, q_count, ahead),
            *(k_running, k_count, tat, serving, waits),
            batch_due,
            oldest,
        )


@dataclass(frozen=True, slots=True)
class KeyCounts:
    key: str
    due: int
    pending: int
    running: int
    flow: str | None
    tat: float | None


class FlowKeyStatements:
    """The driver's part that reads flow keys for ``app.flow_keys`` (a part of ``Driver``)."""

    async def flow_key_counts(
        self, conn: AsyncConnection, now: float, limit: int
    ) -> list[KeyCounts]:
        """The keys with rows Pending or InProgress, most due first: the keyed indexes
        (Pending) and the running index, never the finished rows."""
        # Two arms, each in its partial indexes' own predicate: the keyed Pending rows
        # (ix_scheduled_functions_keys) and the keyed running ones (..._key_running).
        # One filter over "Pending or InProgress" matched neither and read the table
        # (120 ms at 10^6 rows, against a few ms).
        zero: ColumnElement[int] = literal_column("0", Integer)
        arms = union_all(
            select(
                sf.c.flow_key,
                func.count().filter(sf.c.available_at <= now).label("due"),
                func.count().label("pending"),
                zero.label("running"),
                func.max(sf.c.flow).label("flow"),
            )
            .where(KEYED)
            .group_by(sf.c.flow_key),
            select(sf.c.flow_key, zero, zero, func.count(), func.max(sf.c.flow))
            .where(RUNNING_KEYED)
            .group_by(sf.c.flow_key),
        ).subquery()
        counts = (
            select(
                arms.c.flow_key,
                cast(func.sum(arms.c.due), Integer).label("due"),
                cast(func.sum(arms.c.pending), Integer).label("pending"),
                cast(func.sum(arms.c.running), Integer).label("running"),
                func.max(arms.c.flow).label("flow"),
            )
            .group_by(arms.c.flow_key)
            .subquery()
        )
        rows = await conn.execute(
            select(counts, flow_keys.c.tat)
            .outerjoin(flow_keys, flow_keys.c.key == counts.c.flow_key)
            .order_by(counts.c.due.desc(), counts.c.running.desc(), counts.c.flow_key)
            .limit(limit)
        )
        return [KeyCounts(r.flow_key, r.due, r.pending, r.running, r.flow, r.tat) for r in rows]
