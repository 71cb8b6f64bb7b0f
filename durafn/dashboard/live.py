"""Live updates: server-sent events that a page listens to.

Each stream reads through the app, as the page did, every ``POLL`` seconds, and sends
only what changed: a row's state until it has ended (its page then reloads to show how),
and the overview's rows by state. A poll on both engines for now: PostgreSQL's
LISTEN/NOTIFY wake-ups would let a stream sleep until something changes.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import anyio
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from .._kinds import FINISHED_STATES
from .surface import Pages

POLL = 0.5
"""Seconds between a stream's reads of a row (real time: the page's viewer waits)."""
COUNTS_POLL = 2.0
"""Seconds between the overview's counts (each a count over the table: kept rarer)."""


def routes(d: Pages) -> list[Route]:
    async def row_events(request: Request) -> Response:
        if await d.visitor(request) is None:
            return Response(status_code=403)
        id = str(request.path_params["id"])

        async def states() -> AsyncIterator[str]:
            last = None
            while not await request.is_disconnected():
                row = await d.app.get(id)
                state = row.state.value if row is not None else "Gone"
                if state != last:
                    yield f"event: state\ndata: {state}\n\n"
                    last = state
                if row is None or row.state in FINISHED_STATES:
                    return
                await anyio.sleep(POLL)

        return _stream(states())

    async def count_events(request: Request) -> Response:
        if await d.visitor(request) is None:
            return Response(status_code=403)

        async def counts() -> AsyncIterator[str]:
            last = None
            while not await request.is_disconnected():
                stats = await d.app.stats()
                now = json.dumps({s.value: n for s, n in stats.counts.items()})
                if now != last:
                    yield f"event: counts\ndata: {now}\n\n"
                    last = now
                await anyio.sleep(COUNTS_POLL)

        return _stream(counts())

    return [
        Route("/events/counts", count_events),
        Route("/rows/{id}/events", row_events),
    ]


def _stream(events: AsyncIterator[str]) -> StreamingResponse:
    return StreamingResponse(
        events, media_type="text/event-stream", headers={"Cache-Control": "no-store"}
    )
