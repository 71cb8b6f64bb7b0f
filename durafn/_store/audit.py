"""The audit trail's rows (``_durafn_audit``): an entry per operator action, the pages of
them newest first, and the removal of the old ones (a part of ``Driver``)."""

from __future__ import annotations

from sqlalchemy import CursorResult, delete, insert, select
from sqlalchemy.ext.asyncio import AsyncConnection

from .._clock import to_datetime
from .._models import AuditEntry
from .schema.tables import audit


class AuditStatements:
    async def record_audit(
        self,
        conn: AsyncConnection,
        *,
        at: float,
        who: str,
        via: str,
        action: str,
        target: str,
        rows: int,
        outcome: str,
    ) -> int:
        """Write an entry; its id."""
        found = await conn.execute(
            insert(audit)
            .values(
                at=at, who=who, via=via, action=action, target=target, rows=rows, outcome=outcome
            )
            .returning(audit.c.id)
        )
        return int(found.scalar_one())

    async def list_audit(
        self, conn: AsyncConnection, *, limit: int, before: int | None
    ) -> list[AuditEntry]:
        """The newest ``limit`` entries with an id below ``before`` (the primary key, read
        backwards: a page costs its own entries however long the trail)."""
        query = select(audit).order_by(audit.c.id.desc()).limit(limit)
        if before is not None:
            query = query.where(audit.c.id < before)
        return [
            AuditEntry(
                id=r.id,
                at=to_datetime(r.at),
                who=r.who,
                via=r.via,
                action=r.action,
                target=r.target,
                rows=r.rows,
                outcome=r.outcome,
            )
            for r in await conn.execute(query)
        ]

    async def delete_audit(self, conn: AsyncConnection, *, older_than: float, limit: int) -> int:
        """Remove up to ``limit`` entries written before ``older_than`` (ix_durafn_audit_at);
        how many."""
        oldest = select(audit.c.id).where(audit.c.at < older_than).order_by(audit.c.at).limit(limit)
        result = await conn.execute(delete(audit).where(audit.c.id.in_(oldest)))
        assert isinstance(result, CursorResult)
        return result.rowcount
