"""Every row a filter matches, changed at once: cancel every Pending row, retry every
Failed one, reschedule every Pending one; each after a confirmation that says how many,
and run as an operation (``operations.py``): a page of at most 500 rows a transaction,
what the request does not finish done by the workers, its progress on a page."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from .._kinds import State
from . import operations
from .rows import text_filters
from .surface import Done, Pages, Refused


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


def routes(d: Pages) -> list[Route]:
    async def act_on_matching(request: Request) -> Response:
        verb = str(request.path_params["verb"])
        if verb not in BULK:
            return await d.page(request, "confirm.html", _unknown_bulk(verb))
        bulk = BULK[verb]
        if request.method == "GET":

            async def body(user: str) -> dict[str, Any]:
                chosen = _required(text_filters(request.query_params))
                count = await d.app.count(state=bulk.state, **chosen)
                shown = {k: v for k, v in chosen.items() if v}
                return {"filters": shown, "count": count, "bulk": bulk, "verb": verb}

            return await d.page(request, "confirm.html", body)

        async def act(user: str, form: Any) -> Done:
            return await _change(d, user, verb, bulk, form)

        return await d.act(request, act)

    return [Route("/rows/{verb}-matching", act_on_matching, methods=["GET", "POST"])]


async def _change(d: Pages, user: str, verb: str, bulk: Bulk, form: Any) -> Done:
    chosen = _required(text_filters(form))
    shown_filters = {k: v for k, v in chosen.items() if v}
    shown = ", ".join(f"{k}={v}" for k, v in shown_filters.items())
    change: dict[str, Any] = {}
    if verb == "reschedule":
        change["run_at"], change["priority"] = _new_time_and_priority(form)
        shown += f" to {_said_change(change['run_at'], change['priority'])}"
    query = urlencode({**shown_filters, "state": bulk.after.value})
    said = f"{bulk.done} {{n}} {bulk.state.value} rows where {shown}"
    action = f"{verb} every {bulk.state.value} row"
    # An operation (``operations.py``): its first pages in this request, the rest (of a
    # table too large for them) by the workers, a page of 500 rows a transaction.
    started = operations.Started(said, "/rows?" + query, action, shown)
    return await operations.run(d, user, verb, started, **chosen, **change)


def _required(chosen: dict[str, Any]) -> dict[str, Any]:
    if not any(chosen.values()):
        raise Refused(400, "a bulk change needs a filter (name, queue, key or flag)")
    return chosen


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
