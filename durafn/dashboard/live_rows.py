"""The rows list, live: a stream of the newest rows a listing's filter matches (their ids
and states, ``/rows/live?<the listing's query>``), sent when they change. The page's
script (``static/dashboard.js``) then fetches the listing again and swaps its table, or,
while the reader could not follow (more than a few changes a second), has rows selected,
or has the tab hidden, holds them and says how many are new ("paused: 3 new rows").

Only the first page of a listing is followed (no cursor): what is older does not move.
Each read is the listing's own (``app.list``, ``PAGE_SIZE`` rows of a scan of at most
``SCAN`` index entries), at most once a ``SETTLE`` however often work is signalled."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from .._checks import argument_filters
from .rows import PAGE_SIZE, SCAN, _state, text_filters
from .surface import Pages

POLL = 2.0
"""Seconds between reads without a wake-up (SQLite between processes has no other)."""
SETTLE = 1.0
"""At most a read a second per open list, however busy the table."""


def routes(d: Pages) -> list[Route]:
    async def rows_events(request: Request) -> Response:
        if await d.visitor(request) is None:
            return Response(status_code=403)
        query = request.query_params
        chosen = text_filters(query)
        equal, contain = argument_filters([query["arg"]] if query.get("arg") else [])
        parent = query.get("parent") or None
        state = _state(query.get("state") or None)

        async def changes() -> AsyncIterator[str]:
            last = None
            async with d.app.watch(poll=POLL, settle=SETTLE) as woken:
                while not await request.is_disconnected():
                    page = await d.app.list(
                        state=state,
                        limit=PAGE_SIZE,
                        newest_first=True,
                        parent=parent,
                        scan=None if parent else SCAN,
                        args=equal or None,
                        args_contain=contain or None,
                        **chosen,
                    )
                    now = json.dumps([[str(r.id), r.state.value] for r in page.items])
                    if now != last:
                        yield f"event: rows\ndata: {now}\n\n"
                        last = now
                    await woken.changed()

        return StreamingResponse(
            changes(), media_type="text/event-stream", headers={"Cache-Control": "no-store"}
        )

    return [Route("/rows/live", rows_events)]
