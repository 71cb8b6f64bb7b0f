"""What ``app.search`` reads: the row holding a job key (one probe of the key's unique
index), and the newest rows whose arguments hold a value (among the newest ``scan``
rows of the time index only: a bounded read whatever the table's size)."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import or_, select
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql.selectable import Subquery

from ..._models import ScheduledFunction
from ..rows import to_model
from ..schema.tables import KEY_HOLDER, sf


class SearchStatements:
    async def key_holder(self, conn: AsyncConnection, key: str) -> ScheduledFunction | None:
        """The row holding job key ``key`` (any state but Success: one probe of
        ix_scheduled_functions_key, whose predicate ``KEY_HOLDER`` repeats)."""
        row = (await conn.execute(select(sf).where(sf.c.job_key == key, KEY_HOLDER))).first()
        return None if row is None else to_model(row)

    async def with_key(
        self, conn: AsyncConnection, key: str, scan: int, limit: int
    ) -> list[ScheduledFunction]:
        """Up to ``limit`` rows with job key ``key`` among the newest ``scan`` (the
        Success ones the key's index leaves out)."""
        newest = _newest(scan)
        query = (
            select(newest)
            .where(newest.c.job_key == key)
            .order_by(newest.c.scheduled_time.desc(), newest.c.id.desc())
            .limit(limit)
        )
        return [to_model(r) for r in await conn.execute(query)]

    async def with_argument(
        self, conn: AsyncConnection, tokens: Sequence[str], scan: int, limit: int
    ) -> list[ScheduledFunction]:
        """Up to ``limit`` rows among the newest ``scan`` whose stored arguments (compact
        JSON text) hold one of ``tokens``, newest first."""
        newest = _newest(scan)
        holds = or_(*(newest.c.args.contains(t, autoescape=True) for t in tokens))
        query = (
            select(newest)
            .where(holds)
            .order_by(newest.c.scheduled_time.desc(), newest.c.id.desc())
            .limit(limit)
        )
        return [to_model(r) for r in await conn.execute(query)]


def _newest(scan: int) -> Subquery:
    """The newest ``scan`` rows (ix_scheduled_functions_scheduled, read backwards). Their
    whole rows, filtered outside: a LIMIT in a subquery keeps the filter out of it, so
    the read stays that range (as ``id IN (...)`` the planner was free to scan the
    table with the filter and join: 0.6 s at 10⁶ rows on PostgreSQL)."""
    return select(sf).order_by(sf.c.scheduled_time.desc(), sf.c.id.desc()).limit(scan).subquery()
