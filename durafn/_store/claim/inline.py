"""Claiming given rows by id, for inline mode (``App(inline=...)``): the rows a caller's
transaction has just scheduled, run in the caller's task whatever their due time.

The same guards as every claim: a mutation is read locked inside its batch's transaction
(``SKIP LOCKED``: one an executor holds is its to run), an action is moved Pending ->
InProgress under the runner's worker id. Rows of named queues are never claimed here:
their queue's order and concurrency are the executors' to keep.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from ..._kinds import FunctionKind, ScheduledFunctionId
from ..rows import Claimed
from ..schema.tables import sf
from ..sql import PENDING
from .columns import CLAIM_COLUMNS, STARTED, StartTime, claimed


class InlineStatements:
    """The driver's claims by id (a part of ``Driver``)."""

    async def claim_ids(
        self,
        conn: AsyncConnection,
        kind: FunctionKind,
        ids: Sequence[ScheduledFunctionId],
        now: float,
        worker_id: str | None = None,
        started: StartTime | float | None = None,
    ) -> list[Claimed]:
        """The rows of ``ids`` still Pending, of ``kind``, in no named queue and with no flow
        key: mutations
        locked until this transaction ends, actions started under ``worker_id`` (by
        primary key), at ``started`` (default ``now``: ``columns.StartTime``)."""
        where = (
            sf.c.id.in_(ids),
            sf.c.state == PENDING,
            sf.c.kind == kind.value,
            sf.c.queue_name.is_(None),
            sf.c.flow_key.is_(None),  # a keyed row's limits are the claim's to keep
        )
        if kind is FunctionKind.MUTATION:
            locked = select(*CLAIM_COLUMNS).where(*where).with_for_update(skip_locked=True)
            return claimed((await conn.execute(locked)).all())
        start = update(sf).where(*where).values(STARTED).returning(*CLAIM_COLUMNS)
        params = {"worker_id": worker_id, "started": now if started is None else started}
        return claimed((await conn.execute(start, params)).all())
