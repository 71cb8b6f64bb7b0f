"""The queues and flow keys (pause, resume), and the live and the lost workers."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from .surface import COUNT_BOUND, Done, Pages, Refused

LOST_SHOWN = 20


def routes(d: Pages) -> list[Route]:
    async def queues(request: Request) -> Response:
        async def body(user: str) -> dict[str, Any]:
            found = await d.app.queues(bound=COUNT_BOUND)
            return {"queues": found, "keys": await d.app.flow_keys()}

        return await d.page(request, "queues.html", body)

    async def queue_action(request: Request) -> Response:
        async def act(user: str, form: Any) -> Done:
            name, what = str(request.path_params["name"]), str(request.path_params["action"])
            if what not in ("pause", "resume"):
                raise Refused(404, f"no queue action {what!r}: pause or resume")
            if not any(q.name == name for q in await d.app.queues(bound=1)):
                raise Refused(404, f"no queue {name!r}")
            change = d.app.pause_queue if what == "pause" else d.app.resume_queue
            changed = await change(name)
            said = f"queue {name} {'paused' if what == 'pause' else 'resumed'}"
            return Done(said, "/queues", f"queue {what}", name, changed)

        return await d.act(request, act)

    async def workers(request: Request) -> Response:
        async def body(user: str) -> dict[str, Any]:
            return {
                "workers": await d.app.workers(),
                "lost": await d.app.lost_workers(limit=LOST_SHOWN),
                "now": d.app.clock.now(),
            }

        return await d.page(request, "workers.html", body)

    return [
        Route("/queues", queues),
        Route("/queues/{name}/{action}", queue_action, methods=["POST"]),
        Route("/workers", workers),
    ]
