"""The scheduled functions: the list (filters, cursor pages of a bounded stretch), a row,
and the actions on one row: cancel (after a confirmation) and retry, and the download
of its whole argument or result. Every row a filter matches: ``bulk.py``."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from .._checks import argument_filters
from .._kinds import State
from .surface import COUNT_BOUND, Done, Pages, Refused
from .values import as_json

PAGE_SIZE = 50
SCAN = 10_000
"""Rows of the time order a listing page reads at most (``App.list(scan=...)``): a filter
that matches few rows costs this many index entries per page, not the whole table; the
page then says how far it searched and links to the next stretch. A filter with an index
of its own (a parent) reads only its matches and has no bound."""
CHILDREN_SHOWN = 20
"""A row's page lists the first rows it scheduled; the rest are a link away."""
LINKS_SHOWN = 20
"""Rows of each part of a row's linked rows (``row_links.html``); the rest are counted."""
TEXT_FILTERS = ("name", "queue", "key", "flag")


def routes(d: Pages) -> list[Route]:
    pages = RowPages(d)
    return [
        Route("/rows", pages.listing, name="rows"),
        Route("/rows/{id}", pages.row),
        Route("/rows/{id}/cancel", pages.cancel, methods=["GET", "POST"]),
        Route("/rows/{id}/retry", pages.retry, methods=["POST"]),
        Route("/rows/{id}/{part}.json", pages.download),
    ]


class RowPages:
    def __init__(self, d: Pages) -> None:
        self.d = d

    async def listing(self, request: Request) -> Response:
        async def body(user: str) -> dict[str, Any]:
            query = request.query_params
            chosen = text_filters(query)
            equal, contain = argument_filters([query["arg"]] if query.get("arg") else [])
            parent = query.get("parent") or None
            page = await self.d.app.list(
                state=_state(query.get("state") or None),
                limit=PAGE_SIZE,
                cursor=query.get("cursor") or None,
                newest_first=True,
                parent=parent,
                scan=None if parent else SCAN,
                args=equal or None,
                args_contain=contain or None,
                **chosen,
            )
            given = {k: v for k, v in query.items() if k != "cursor" and v}
            following = None
            if page.next_cursor is not None:
                following = "?" + urlencode({**given, "cursor": page.next_cursor})
            given_text = {k: v for k, v in chosen.items() if v}
            # Offered only where the bulk cancel selects what the page lists: it takes
            # name, queue, key and flag (``cancel_where``), not a parent or an argument.
            narrower = query.get("parent") or query.get("arg")
            return {
                "page": page,
                "given": given,
                "states": list(State),
                "next": following,
                "bulk": "?" + urlencode(given_text) if given_text and not narrower else None,
                "scan": SCAN,
                "stats": await self.d.app.stats(bound=COUNT_BOUND),
            }

        return await self.d.page(request, "rows.html", body)

    async def row(self, request: Request) -> Response:
        async def body(user: str) -> dict[str, Any]:
            found = await self._found(request)
            app = self.d.app
            why = await app.explain(found.id) if found.state is State.PENDING else None
            children = await app.list(parent=found.id, limit=CHILDREN_SHOWN)
            flow = await app.row_links(found.id, limit=LINKS_SHOWN)
            return {"row": found, "explain": why, "children": children, "links": flow}

        return await self.d.page(request, "row.html", body)

    async def cancel(self, request: Request) -> Response:
        if request.method == "GET":  # the confirmation: one click never cancels

            async def confirm(user: str) -> dict[str, Any]:
                found = await self._found(request)
                return {
                    "title": f"Cancel {found.name}?",
                    "what": f"Row {found.id}, {found.state.value}, scheduled for "
                    f"{found.scheduled_time.isoformat()}. A Pending row never runs; a running "
                    "action is told, its result discarded, and the rows it scheduled that "
                    "have not finished are canceled too.",
                    "action": f"/rows/{found.id}/cancel",
                    "button": "Cancel this row",
                    "back": f"/rows/{found.id}",
                }

            return await self.d.page(request, "confirm_one.html", confirm)

        async def act(user: str, form: Any) -> Done:
            id = str((await self._found(request)).id)
            result = await self.d.app.cancel(id)
            previous = result.previous_state.value
            said = (
                f"canceled (it was {previous})"
                if result.canceled
                else f"not canceled: it had ended ({previous})"
            )
            return Done(said, f"/rows/{id}", "cancel", id, int(result.canceled))

        return await self.d.act(request, act)

    async def retry(self, request: Request) -> Response:
        async def act(user: str, form: Any) -> Done:
            id = str((await self._found(request)).id)
            moved = await self.d.app.retry([id])
            said = "retried" if moved else "not Failed: nothing to retry"
            return Done(said, f"/rows/{id}", "retry", id, len(moved))

        return await self.d.act(request, act)

    async def download(self, request: Request) -> Response:
        """A row's whole argument or result, as a JSON file (the page shows a bound)."""
        if await self.d.visitor(request) is None:
            return Response("not allowed\n", status_code=403, media_type="text/plain")
        if self.d.hide_args:
            return Response("arguments and results are hidden\n", 403, media_type="text/plain")
        id, part = str(request.path_params["id"]), str(request.path_params["part"])
        found = await self.d.app.get(id)
        if found is None or part not in ("args", "result"):
            return Response(f"no {part} of a row {id!r}\n", 404, media_type="text/plain")
        return Response(
            as_json(getattr(found, part), indent=2),
            media_type="application/json",
            headers={"content-disposition": f'attachment; filename="{id}-{part}.json"'},
        )

    async def _found(self, request: Request) -> Any:
        id = str(request.path_params["id"])
        found = await self.d.app.get(id)
        if found is None:
            raise Refused(404, f"no scheduled function {id!r}")
        return found


def _state(value: str | None) -> State | None:
    if value is None:
        return None
    if value not in {s.value for s in State}:
        known = ", ".join(s.value for s in State)
        raise Refused(400, f"unknown state {value!r}: one of {known}")
    return State(value)


def text_filters(source: Any) -> dict[str, Any]:
    """The name, queue, key and flag a listing or a bulk change was given (None: not)."""
    return {k: (str(source.get(k)) if source.get(k) else None) for k in TEXT_FILTERS}
