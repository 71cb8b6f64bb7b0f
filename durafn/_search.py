"""Finding rows from one piece of text, on ``App`` (``app.search``): a row's id, a job
key, or an argument's value; every read bounded (what was searched is in the result)."""

from __future__ import annotations

import itertools
import json

from pydantic import BaseModel
from sqlalchemy.ext.asyncio import AsyncConnection

from ._checks import integer, scheduled_id, text
from ._models import FROZEN, ScheduledFunction
from ._public import publish
from ._runtime import Runtime

SEARCH_SCAN = 10_000
"""The newest rows an argument (or a Success row's job key) is looked for among."""


class SearchResult(BaseModel):
    """What ``app.search(text)`` found."""

    model_config = FROZEN

    text: str
    by_id: ScheduledFunction | None
    """The row whose id it is."""
    by_key: list[ScheduledFunction]
    """Rows with it as their job key: the one holding it (any state but Success: the
    key's index), and Success ones among the newest ``scanned`` rows."""
    by_argument: list[ScheduledFunction]
    """The newest rows among the newest ``scanned`` whose arguments hold it as a value
    (a string equal to it, or the number it reads as), at any depth."""
    scanned: int
    """How many of the newest rows were searched (by the time index)."""


def argument_tokens(value: str) -> list[str]:
    """What a stored argument's compact JSON holds where ``value`` is one of its values:
    the string as JSON, and, if it reads as a number, the number between the separators
    around a value (``:42,``, ``[42]``...)."""
    tokens = [json.dumps(value, ensure_ascii=False)]
    try:
        number = json.loads(value)
    except ValueError:
        return tokens
    if isinstance(number, int | float) and not isinstance(number, bool):
        plain = json.dumps(number)
        tokens += [a + plain + b for a, b in itertools.product(":[,", ",]}")]
    return tokens


class Search:
    """``app.search`` (a base class of ``App``)."""

    _rt: Runtime

    async def search(self, query: str, *, scan: int = SEARCH_SCAN, limit: int = 20) -> SearchResult:
        """Find rows from ``query``: the row with that id, the rows with that job key,
        and the newest rows whose arguments hold it as a value, among the newest ``scan``
        rows (a bounded read: an older row is found by its id or its key only)."""
        query = text("query", query).strip()
        scan = integer("scan", scan, low=1, high=1_000_000)
        limit = integer("limit", limit, low=1, high=1000)
        driver = self._rt.driver
        id = scheduled_id(query)

        async def _read(conn: AsyncConnection) -> SearchResult:
            by_id = None if id is None else await driver.get(conn, id)
            holder = await driver.key_holder(conn, query)
            by_key = [] if holder is None else [holder]
            for row in await driver.with_key(conn, query, scan, limit):
                if holder is None or row.id != holder.id:  # Success ones, the index's gap
                    by_key.append(row)
            return SearchResult(
                text=query,
                by_id=by_id,
                by_key=by_key[:limit],
                by_argument=await driver.with_argument(conn, argument_tokens(query), scan, limit),
                scanned=scan,
            )

        return await self._rt.transaction(_read, read_only=True, doing="searching rows")


publish(globals())
