"""A running action's progress on its row (``ctx.progress``): one guarded UPDATE."""

from __future__ import annotations

from sqlalchemy import update
from sqlalchemy.ext.asyncio import AsyncConnection

from ..._kinds import ScheduledFunctionId, State
from ..schema.tables import sf


class ProgressStatements:
    """The driver's statement on progress (a part of ``Driver``)."""

    async def set_progress(
        self,
        conn: AsyncConnection,
        id: ScheduledFunctionId,
        fraction: float,
        message: str | None,
    ) -> bool:
        """Store a row's progress while it is InProgress (by primary key); False: it has
        ended meanwhile (cancelled, recorded lost), and nothing was written."""
        result = await conn.execute(
            update(sf)
            .where(sf.c.id == id, sf.c.state == State.IN_PROGRESS.value)
            .values(progress=fraction, progress_message=message)
        )
        return bool(result.rowcount)
