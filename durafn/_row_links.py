"""A row's place in a workflow, on ``App`` (``app.row_links``): what it waits for, what
waits for it, a group's rows and a batch key's waiting rows, each read bounded."""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncConnection

from ._checks import integer, one_id
from ._errors import NotFoundError
from ._groups import GROUP_COMPLETE
from ._kinds import ScheduledFunctionId
from ._models import RowLinks
from ._runtime import Runtime


class RowLinksReads:
    """``app.row_links`` (a base class of ``App``)."""

    _rt: Runtime

    async def row_links(self, id: ScheduledFunctionId | str, *, limit: int = 20) -> RowLinks:
        """Row ``id``'s place in a workflow: the rows it still waits for, the rows still
        waiting for it, a group's rows (for a group's completion row), and the rows of
        its batch key still waiting; at most ``limit`` of each (``*_more``: there are
        more). NotFoundError for an unknown id."""
        checked = one_id(id, "row_links")
        if checked is None:
            raise NotFoundError(str(id), malformed=True)
        limit = integer("limit", limit, low=1, high=1000)
        driver = self._rt.driver

        async def _read(conn: AsyncConnection) -> RowLinks | None:
            row = await driver.get(conn, checked)  # the primary key
            if row is None:
                return None
            group_ids: list[ScheduledFunctionId] = []
            if row.name == GROUP_COMPLETE and isinstance(row.args.get("ids"), list):
                group_ids = [ScheduledFunctionId(str(i)) for i in row.args["ids"]]
            waits = await driver.waits_for(conn, checked, limit + 1)
            waited = await driver.waited_by(conn, checked, limit + 1)
            key = await driver.batch_key_of(conn, checked)
            batch = (
                [] if key is None else await driver.batch_waiting(conn, row.name, key, limit + 1)
            )
            return RowLinks(
                waits_for=waits[:limit],
                waits_for_more=len(waits) > limit,
                waited_by=waited[:limit],
                waited_by_more=len(waited) > limit,
                group=await driver.nodes(conn, group_ids[:limit]),
                group_size=len(group_ids),
                batch_key=key,
                batch=batch[:limit],
                batch_more=len(batch) > limit,
            )

        found = await self._rt.transaction(_read, read_only=True, doing="reading a row's links")
        if found is None:
            raise NotFoundError(str(id))
        return found
