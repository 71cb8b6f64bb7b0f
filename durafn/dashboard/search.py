"""One search box (in every page's header): a row by its id (straight to its page), by
its job key, or by an argument's value among the newest rows (``app.search``: each read
bounded; the page says what was searched)."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from .surface import Pages, Refused

SCAN = 10_000
"""The newest rows an argument's value is looked for among."""
SHOWN = 50
MAX_TEXT = 1000


def routes(d: Pages) -> list[Route]:
    async def search(request: Request) -> Response:
        query = (request.query_params.get("q") or "").strip()
        exact: list[str] = []

        async def body(user: str) -> dict[str, Any]:
            if not query:
                raise Refused(400, "search for a row's id, a job key or an argument's value")
            if len(query) > MAX_TEXT:
                raise Refused(400, f"a search is at most {MAX_TEXT} characters")
            found = await d.app.search(query, scan=SCAN, limit=SHOWN)
            if found.by_id is not None and not found.by_key and not found.by_argument:
                exact.append(str(found.by_id.id))
            return {"found": found}

        response = await d.page(request, "search.html", body)
        if exact:  # an id: its row's page
            return RedirectResponse(f"{_root(request)}/rows/{exact[0]}", status_code=303)
        return response

    return [Route("/search", search)]


def _root(request: Request) -> str:
    return str(request.scope.get("root_path") or "").rstrip("/")
