"""What a row's linked rows view reads (``app.row_links``): the rows it still waits for and
the rows still waiting for it (``_durafn_dependencies``: an edge lives until its
dependency finishes for good), the members of a group (a group's completion row holds
their ids), and the rows of its batch key still waiting. Each read is bounded (``limit``)
and names the index it reads."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import literal_column, select
from sqlalchemy.ext.asyncio import AsyncConnection

from ..._kinds import ScheduledFunctionId, State
from ..._models import LinkedRow
from ..schema.tables import dependencies, sf

_COLUMNS = (sf.c.id, sf.c.name, sf.c.state)


def _nodes(rows: Sequence[Any]) -> list[LinkedRow]:
    return [
        LinkedRow(id=ScheduledFunctionId(str(r.id)), name=r.name, state=State(r.state))
        for r in rows
    ]


class RowLinksStatements:
    async def waits_for(
        self, conn: AsyncConnection, id: ScheduledFunctionId, limit: int
    ) -> list[LinkedRow]:
        """Up to ``limit`` rows ``id`` still waits for (ix_durafn_dependencies_row)."""
        query = (
            select(*_COLUMNS)
            .join(dependencies, dependencies.c.dep_id == sf.c.id)
            .where(dependencies.c.row_id == id)
            .order_by(dependencies.c.dep_id)
            .limit(limit)
        )
        return _nodes((await conn.execute(query)).all())

    async def waited_by(
        self, conn: AsyncConnection, id: ScheduledFunctionId, limit: int
    ) -> list[LinkedRow]:
        """Up to ``limit`` rows still waiting for ``id`` (the primary key's ``dep_id``)."""
        query = (
            select(*_COLUMNS)
            .join(dependencies, dependencies.c.row_id == sf.c.id)
            .where(dependencies.c.dep_id == id)
            .order_by(dependencies.c.row_id)
            .limit(limit)
        )
        return _nodes((await conn.execute(query)).all())

    async def nodes(
        self, conn: AsyncConnection, ids: Sequence[ScheduledFunctionId]
    ) -> list[LinkedRow]:
        """These rows (the primary key), in the order given; removed ones left out."""
        found = {
            n.id: n
            for n in _nodes((await conn.execute(select(*_COLUMNS).where(sf.c.id.in_(ids)))).all())
        }
        return [found[i] for i in ids if i in found]

    async def batch_key_of(self, conn: AsyncConnection, id: ScheduledFunctionId) -> str | None:
        """A batched action's row's batch key (None: not batched; primary key)."""
        return (await conn.execute(select(sf.c.batch_key).where(sf.c.id == id))).scalar()

    async def batch_waiting(
        self, conn: AsyncConnection, name: str, key: str, limit: int
    ) -> list[LinkedRow]:
        """Up to ``limit`` Pending rows of a function's batch key, in the order a batch
        takes them (ix_scheduled_functions_batch)."""
        query = (
            select(*_COLUMNS)
            .where(
                sf.c.state == literal_column("'Pending'"),
                sf.c.batch_key.is_not(None),
                sf.c.name == name,
                sf.c.batch_key == key,
            )
            .order_by(sf.c.available_at, sf.c.seq)
            .limit(limit)
        )
        return _nodes((await conn.execute(query)).all())
