"""The scheduled functions: the list (filters, cursor pages of a bounded stretch), a row,
and the actions on rows: cancel and retry one; cancel, retry or reschedule every row a
filter matches, after a confirmation that says how many."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
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


@dataclass(frozen=True)
class Bulk:
    """An action on every row a filter matches."""

    state: State
    """The rows it changes (the others it leaves alone)."""
    after: State
    """Their state after it (where the page it returns to lists them)."""
    done: str


BULK = {
    "cancel": Bulk(State.PENDING, State.CANCELED, "canceled"),
    "retry": Bulk(State.FAILED, State.PENDING, "put back to Pending:"),
    "reschedule": Bulk(State.PENDING, State.PENDING, "rescheduled"),
}
CHILDREN_SHOWN = 20
"""A row's page lists the first rows it scheduled; the rest are a link away."""
TEXT_FILTERS = ("name", "queue", "key", "flag")


def routes(d: Pages) -> list[Route]:
    async def rows(request: Request) -> Response:
        async def body(user: str) -> dict[str, Any]:
            state = _state(request.query_params.get("state") or None)
            chosen = _text_filters(request.query_params)
            arg = request.query_params.get("arg")
            equal, contain = argument_filters([arg] if arg else [])
            page = await d.app.list(
                state=state,
                limit=PAGE_SIZE,
                cursor=request.query_params.get("cursor") or None,
                newest_first=True,
                parent=(parent := request.query_params.get("parent") or None),
                scan=None if parent else SCAN,
                args=equal or None,
                args_contain=contain or None,
                **chosen,
            )
            given = {k: v for k, v in request.query_params.items() if k != "cursor" and v}
            following = None
            if page.next_cursor is not None:
                following = "?" + urlencode({**given, "cursor": page.next_cursor})
            given_text = {k: v for k, v in chosen.items() if v}
            # Offered only where the bulk cancel selects what the page lists: it takes
            # name, queue, key and flag (``cancel_where``), not a parent or an argument.
            narrower = request.query_params.get("parent") or request.query_params.get("arg")
            bulk = "?" + urlencode(given_text) if given_text and not narrower else None
            return {
                "page": page,
                "given": given,
                "states": list(State),
                "next": following,
                "bulk": bulk,
                "scan": SCAN,
                "stats": await d.app.stats(bound=COUNT_BOUND),
            }

        return await d.page(request, "rows.html", body)

    async def row(request: Request) -> Response:
        async def body(user: str) -> dict[str, Any]:
            found = await d.app.get(request.path_params["id"])
            if found is None:
                raise Refused(404, f"no scheduled function {request.path_params['id']!r}")
            why = await d.app.explain(found.id) if found.state is State.PENDING else None
            children = await d.app.list(parent=found.id, limit=CHILDREN_SHOWN)
            return {"row": found, "explain": why, "children": children}

        return await d.page(request, "row.html", body)

    async def cancel(request: Request) -> Response:
        if request.method == "GET":  # the confirmation: one click never cancels

            async def confirm(user: str) -> dict[str, Any]:
                found = await d.app.get(request.path_params["id"])
                if found is None:
                    raise Refused(404, f"no scheduled function {request.path_params['id']!r}")
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

            return await d.page(request, "confirm_one.html", confirm)

        async def act(user: str, form: Any) -> Done:
            id = await _existing(d, request)
            result = await d.app.cancel(id)
            said = (
                f"canceled (it was {result.previous_state.value})"
                if result.canceled
                else f"not canceled: it had ended ({result.previous_state.value})"
            )
            return Done(said, f"/rows/{id}", "cancel", id, int(result.canceled))

        return await d.act(request, act)

    async def retry(request: Request) -> Response:
        async def act(user: str, form: Any) -> Done:
            id = await _existing(d, request)
            moved = await d.app.retry([id])
            said = "retried" if moved else "not Failed: nothing to retry"
            return Done(said, f"/rows/{id}", "retry", id, len(moved))

        return await d.act(request, act)

    async def download(request: Request) -> Response:
        """A row's whole argument or result, as a JSON file (the page shows a bound)."""
        if await d.visitor(request) is None:
            return Response("not allowed\n", status_code=403, media_type="text/plain")
        if d.hide_args:
            return Response("arguments and results are hidden\n", 403, media_type="text/plain")
        id, part = str(request.path_params["id"]), str(request.path_params["part"])
        found = await d.app.get(id)
        if found is None or part not in ("args", "result"):
            return Response(f"no {part} of a row {id!r}\n", 404, media_type="text/plain")
        return Response(
            as_json(getattr(found, part), indent=2),
            media_type="application/json",
            headers={"content-disposition": f'attachment; filename="{id}-{part}.json"'},
        )

    async def act_on_matching(request: Request) -> Response:
        verb = str(request.path_params["verb"])
        if verb not in BULK:
            return await d.page(request, "confirm.html", _unknown_bulk(verb))
        bulk = BULK[verb]
        if request.method == "GET":

            async def body(user: str) -> dict[str, Any]:
                chosen = _text_filters(request.query_params)
                _require_filter(chosen)
                count = await d.app.count(state=bulk.state, **chosen)
                shown = {k: v for k, v in chosen.items() if v}
                return {"filters": shown, "count": count, "bulk": bulk, "verb": verb}

            return await d.page(request, "confirm.html", body)

        async def act(user: str, form: Any) -> Done:
            chosen = _text_filters(form)
            _require_filter(chosen)
            shown_filters = {k: v for k, v in chosen.items() if v}
            shown = ", ".join(f"{k}={v}" for k, v in shown_filters.items())
            # In batches of 1,000 rows, each its own transaction (``cancel_where``,
            # ``retry_where``, ``reschedule``): a million rows never hold one transaction.
            if verb == "cancel":
                count = await d.app.cancel_where(**chosen)
            elif verb == "retry":
                count = await d.app.retry_where(**chosen)
            else:
                run_at, priority = _new_time_and_priority(form)
                count = await d.app.reschedule(run_at=run_at, priority=priority, **chosen)
                shown += f" to {_said_change(run_at, priority)}"
            query = urlencode({**shown_filters, "state": bulk.after.value})
            said = f"{bulk.done} {count} {bulk.state.value} rows where {shown}"
            action = f"{verb} every {bulk.state.value} row"
            return Done(said, "/rows?" + query, action, shown, count)

        return await d.act(request, act)

    return [
        Route("/rows", rows),
        Route("/rows/{verb}-matching", act_on_matching, methods=["GET", "POST"]),
        Route("/rows/{id}", row),
        Route("/rows/{id}/cancel", cancel, methods=["GET", "POST"]),
        Route("/rows/{id}/retry", retry, methods=["POST"]),
        Route("/rows/{id}/{part}.json", download),
    ]


def _state(value: str | None) -> State | None:
    if value is None:
        return None
    if value not in {s.value for s in State}:
        known = ", ".join(s.value for s in State)
        raise Refused(400, f"unknown state {value!r}: one of {known}")
    return State(value)


def _text_filters(source: Any) -> dict[str, Any]:
    return {k: (str(source.get(k)) if source.get(k) else None) for k in TEXT_FILTERS}


def _require_filter(chosen: dict[str, Any]) -> None:
    if not any(chosen.values()):
        raise Refused(400, "a bulk change needs a filter (name, queue, key or flag)")


def _new_time_and_priority(form: Any) -> tuple[datetime | None, int | None]:
    """A reschedule's new time (``run_at``: ISO 8601, UTC unless it names a zone) and/or
    priority, from the confirmation's form."""
    run_at, priority = str(form.get("run_at") or ""), str(form.get("priority") or "")
    if not run_at and not priority:
        raise Refused(400, "a reschedule needs a new time (run_at) and/or a new priority")
    when = None
    if run_at:
        try:
            when = datetime.fromisoformat(run_at)
        except ValueError:
            raise Refused(400, f"run_at {run_at!r} is not an ISO 8601 time") from None
        when = when if when.tzinfo is not None else when.replace(tzinfo=UTC)
    if priority and not priority.lstrip("-").isdigit():
        raise Refused(400, f"priority {priority!r} is not an integer")
    return when, int(priority) if priority else None


def _said_change(run_at: datetime | None, priority: int | None) -> str:
    parts = ([f"run at {run_at.isoformat()}"] if run_at else []) + (
        [f"priority {priority}"] if priority is not None else []
    )
    return " and ".join(parts)


def _unknown_bulk(verb: str) -> Any:
    async def refuse(user: str) -> dict[str, Any]:
        raise Refused(404, f"no bulk action {verb!r}: {' or '.join(BULK)}")

    return refuse


async def _existing(d: Pages, request: Request) -> str:
    id = str(request.path_params["id"])
    if await d.app.get(id) is None:
        raise Refused(404, f"no scheduled function {id!r}")
    return id
