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
from .surface import COUNT_BOUND, Pages, Refused

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
        async def act(user: str, form: Any) -> tuple[str, str]:
            id = await _existing(d, request)
            result = await d.app.cancel(id)
            d.record(user, f"cancel {id}", int(result.canceled))
            back = str(request.url_for("row", id=id))
            if result.canceled:
                return f"canceled (it was {result.previous_state.value})", back
            return f"not canceled: it had ended ({result.previous_state.value})", back

        return await d.act(request, act)

    async def retry(request: Request) -> Response:
        async def act(user: str, form: Any) -> tuple[str, str]:
            id = await _existing(d, request)
            moved = await d.app.retry([id])
            d.record(user, f"retry {id}", len(moved))
            back = str(request.url_for("row", id=id))
            return ("retried" if moved else "not Failed: nothing to retry"), back

        return await d.act(request, act)

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

        async def act(user: str, form: Any) -> tuple[str, str]:
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
            d.record(user, f"{verb} every {bulk.state.value} row where {shown}", count)
            query = urlencode({**shown_filters, "state": bulk.after.value})
            back = str(request.url_for("rows")) + "?" + query
            return f"{bulk.done} {count} {bulk.state.value} rows where {shown}", back

        return await d.act(request, act)

    return [
        Route("/rows", rows),
        Route("/rows/{verb}-matching", act_on_matching, methods=["GET", "POST"]),
        Route("/rows/{id}", row),
        Route("/rows/{id}/cancel", cancel, methods=["POST"]),
        Route("/rows/{id}/retry", retry, methods=["POST"]),
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
