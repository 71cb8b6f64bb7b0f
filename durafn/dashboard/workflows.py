"""Durable workflows: the newest, by state; one with its journal, why it waits, and its
cancel (audited, as every action is)."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from .surface import Done, Pages, Refused

SHOWN = 100
STATES = ("Running", "Stopped", "Success", "Failed", "Canceled")


def routes(d: Pages) -> list[Route]:
    async def workflows(request: Request) -> Response:
        async def body(user: str) -> dict[str, Any]:
            state = request.query_params.get("state") or None
            if state is not None and state not in STATES:
                raise Refused(400, f"no workflow state {state!r}: one of {', '.join(STATES)}")
            found = await d.app.list_workflows(state=state, limit=SHOWN)
            return {"workflows": found, "state": state, "states": STATES, "shown": SHOWN}

        return await d.page(request, "workflows.html", body)

    async def workflow(request: Request) -> Response:
        id = str(request.path_params["id"])

        async def body(user: str) -> dict[str, Any]:
            found = await d.app.get_workflow(id)
            if found is None:
                raise Refused(404, f"no workflow {id}")
            return {"wf": found, "why": await d.app.explain_workflow(id)}

        return await d.page(request, "workflow.html", body)

    async def cancel(request: Request) -> Response:
        id = str(request.path_params["id"])

        async def act(user: str, form: Any) -> Done:
            if await d.app.get_workflow(id) is None:
                raise Refused(404, f"no workflow {id}")
            done = await d.app.cancel_workflow(id)
            said = f"workflow {id} {'cancelled' if done else 'had ended already'}"
            return Done(said, f"/workflows/{id}", "workflow cancel", id, int(done))

        return await d.act(request, act)

    return [
        Route("/workflows", workflows),
        Route("/workflows/{id}", workflow),
        Route("/workflows/{id}/cancel", cancel, methods=["POST"]),
    ]
