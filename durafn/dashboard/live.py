"""Live updates: server-sent events that a page listens to.

Each stream reads through the app, as the page did, and sends only what changed: a row's
state until it has ended (its page then reloads to show how), and the overview's rows by
state. It reads again when ``App.watch`` wakes it: on PostgreSQL at a NOTIFY from any
process (LISTEN: one connection per open stream), at this process's own writes, and
otherwise at the poll (all SQLite has between processes; and a row ending sends no
NOTIFY when its slot is taken at once).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from .._kinds import FINISHED_STATES, State
from .._models import Stats
from .surface import COUNT_BOUND, Pages

POLL = 0.5
"""Seconds between a stream's reads of a row without a wake-up (real time: the page's
viewer waits)."""
COUNTS_POLL = 2.0
"""Seconds between the overview's counts without a wake-up."""
COUNTS_SETTLE = 1.0
"""The overview's counts are read at most once a second however often work is signalled
(bounded counts: 10-20 ms a read at 10^6 rows, so at most 2% of a core per open page)."""


def routes(d: Pages) -> list[Route]:
    async def row_events(request: Request) -> Response:
        if await d.visitor(request) is None:
            return Response(status_code=403)
        id = str(request.path_params["id"])

        async def states() -> AsyncIterator[str]:
            last = None
            async with d.app.watch(poll=POLL, settle=POLL / 5) as changes:
                while not await request.is_disconnected():
                    row = await d.app.get(id)
                    state = row.state.value if row is not None else "Gone"
                    if state != last:
                        yield f"event: state\ndata: {state}\n\n"
                        last = state
                    if row is None or row.state in FINISHED_STATES:
                        return
                    await changes.changed()

        return _stream(states())

    async def count_events(request: Request) -> Response:
        if await d.visitor(request) is None:
            return Response(status_code=403)

        async def counts() -> AsyncIterator[str]:
            last = None
            async with d.app.watch(poll=COUNTS_POLL, settle=COUNTS_SETTLE) as changes:
                while not await request.is_disconnected():
                    stats = await d.app.stats(bound=COUNT_BOUND)
                    now = json.dumps({s.value: _shown(stats, s) for s in stats.counts})
                    if now != last:
                        yield f"event: counts\ndata: {now}\n\n"
                        last = now
                    await changes.changed()

        return _stream(counts())

    return [
        Route("/events/counts", count_events),
        Route("/rows/{id}/events", row_events),
    ]


def _stream(events: AsyncIterator[str]) -> StreamingResponse:
    return StreamingResponse(
        events, media_type="text/event-stream", headers={"Cache-Control": "no-store"}
    )


def _shown(stats: Stats, state: State) -> str:
    count = stats.counts[state]
    return f"{count:,}+" if state in stats.capped else f"{count:,}"
