"""Failures grouped by function and error type (``app.failure_groups``: the Failed rows
among the 10,000 rows that ended last, a range of the completion index), each with its
count, first and last seen and a sample message; and each group changed as one, after a
confirmation, as an operation (``operations.py``):

* **retry**: every Failed row of the function whose last error is of that type goes back
  to Pending for a fresh set of attempts (the whole table's, not only those counted);
* **cancel**: every Pending row of the function whose last error is of that type is
  canceled: the rows waiting to be tried again after that error (a retry storm stopped
  at its source). Failed rows have ended: there is nothing of theirs to cancel, and their
  dependents were released (or canceled, by their ``after`` policy) when they failed.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from . import operations
from .surface import COUNT_BOUND, Done, Pages, Refused

VERBS = {
    "retry": (
        "Retry",
        "Every Failed row of {name} whose error is {error_type} goes back to Pending, due "
        "now, for a fresh set of attempts (its history kept)",
    ),
    "cancel": (
        "Cancel the retries of",
        "Every Pending row of {name} whose last error was {error_type} (waiting to be "
        "tried again) is canceled; Failed rows stay as they are",
    ),
}
SHOWN = 100
GROUP_SCAN = COUNT_BOUND
"""Rows that ended last among which the Failed ones are grouped."""
"""Groups the page shows, largest first."""


def routes(d: Pages) -> list[Route]:
    async def groups(request: Request) -> Response:
        async def body(user: str) -> dict[str, Any]:
            return {
                "groups": await d.app.failure_groups(scan=GROUP_SCAN, limit=SHOWN),
                "scan": GROUP_SCAN,
            }

        return await d.page(request, "failures.html", body)

    async def group_action(request: Request) -> Response:
        verb = str(request.path_params["verb"])
        if request.method == "GET":  # the confirmation: one click never changes rows

            async def confirm(user: str) -> dict[str, Any]:
                name, error_type = _group(verb, request.query_params)
                counted = [
                    g
                    for g in await d.app.failure_groups(scan=GROUP_SCAN, limit=SHOWN)
                    if (g.name, g.error_type) == (name, error_type)
                ]
                title, what = VERBS[verb]
                return {
                    "verb": verb,
                    "title": f"{title} {name} failing with {error_type}?",
                    "what": what.format(name=name, error_type=error_type),
                    "counted": counted[0].count if counted else 0,
                    "scan": GROUP_SCAN,
                    "name": name,
                    "error_type": error_type,
                }

            return await d.page(request, "failure_confirm.html", confirm)

        async def act(user: str, form: Any) -> Done:
            name, error_type = _group(verb, form)
            target = f"name={name}, error_type={error_type}"
            said = (
                f"put back to Pending: {{n}} Failed rows of {name} failing with {error_type}"
                if verb == "retry"
                else f"canceled {{n}} Pending rows of {name} retrying after {error_type}"
            )
            started = operations.Started(said, "/failures", f"{verb} failure group", target)
            return await operations.run(d, user, verb, started, name=name, error_type=error_type)

        return await d.act(request, act)

    return [
        Route("/failures", groups),
        Route("/failures/{verb}", group_action, methods=["GET", "POST"]),
    ]


def _group(verb: str, source: Any) -> tuple[str, str]:
    if verb not in VERBS:
        raise Refused(404, f"no failure group action {verb!r}: retry or cancel")
    name, error_type = str(source.get("name") or ""), str(source.get("error_type") or "")
    if not name or not error_type:
        raise Refused(400, "a failure group is a function's name and an error type: give both")
    return name, error_type
