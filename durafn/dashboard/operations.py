"""Operations: a change of every row a filter matches, tracked (``app.start_operation``).
The bulk changes (``bulk.py``) and the failure groups' (``failures.py``) start one and
run its first pages in the request (``INLINE_PAGES``): a small one ends there and is
answered as done; a larger one goes on in the workers' maintenance (a page at a time,
resumed by any worker after a restart) and the answer is its progress page, which
reloads itself while it runs (a ``Refresh`` header: no script) and offers to cancel it.
The list: the recent operations, newest first, a page at a time."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from .._errors import UnknownOperationError
from .._models import Operation
from .surface import Done, Pages, Refused

INLINE_PAGES = 20
"""Pages an action runs before it answers (each reads at most 5,000 rows): what is left
of a larger operation, the workers do."""
SHOWN = 30
"""Operations the list shows a page."""
REFRESH = 2
"""Seconds between the reloads of a running operation's page."""


@dataclass(frozen=True)
class Started:
    """What an action that starts an operation says: ``said`` once it is done
    (``{n}`` in it: the rows changed), the page to return to then, and what the audit trail
    names (``action`` on ``target``)."""

    said: str
    back: str
    action: str
    target: str


async def run(d: Pages, user: str, kind: str, started: Started, **chosen: Any) -> Done:
    """Start an operation of ``kind`` on the rows ``chosen`` selects, run its first
    pages, and answer: done (``started.said``), or its progress page."""
    op = await d.app.start_operation(kind, who=user, **chosen)
    op = await d.app.run_operation(op.id, pages=INLINE_PAGES)
    if op.state == "Done":
        return Done(
            started.said.format(n=op.done), started.back, started.action, started.target, op.done
        )
    said = (
        f"operation {op.id} started: {op.done:,} of {_total(op)} rows so far; "
        "the workers do the rest, a page at a time"
    )
    return Done(said, f"/operations/{op.id}", started.action, started.target, op.done)


def routes(d: Pages) -> list[Route]:
    async def listing(request: Request) -> Response:
        async def body(user: str) -> dict[str, Any]:
            before = request.query_params.get("before") or None
            if before is not None and not before.isdigit():
                raise Refused(400, f"before {before!r} is not an operation's id")
            found = await d.app.operations(
                limit=SHOWN + 1, before=None if before is None else int(before)
            )
            older = found[SHOWN - 1].id if len(found) > SHOWN else None
            return {"operations": found[:SHOWN], "older": older, "total": _total}

        return await d.page(request, "operations.html", body)

    async def one(request: Request) -> Response:
        running = False

        async def body(user: str) -> dict[str, Any]:
            nonlocal running
            op = await _found(d, request)
            running = op.state == "Running"
            return {"op": op, "total": _total, "filters": _filters(op)}

        response = await d.page(request, "operation.html", body)
        if running:  # the page follows it without a script
            response.headers["refresh"] = str(REFRESH)
        return response

    async def cancel(request: Request) -> Response:
        async def act(user: str, form: Any) -> Done:
            op = await _found(d, request)
            stopped = await d.app.cancel_operation(op.id)
            said = (
                f"operation {op.id} canceled: no page starts after this; rows it changed stay"
                if stopped
                else f"operation {op.id} had ended ({op.state}): nothing to cancel"
            )
            return Done(said, f"/operations/{op.id}", "cancel operation", str(op.id), 0)

        return await d.act(request, act)

    return [
        Route("/operations", listing),
        Route("/operations/{id}", one),
        Route("/operations/{id}/cancel", cancel, methods=["POST"]),
    ]


async def _found(d: Pages, request: Request) -> Operation:
    id = str(request.path_params["id"])
    if not id.isdigit() or int(id) < 1:
        raise Refused(404, f"no operation {id!r}")
    try:
        return await d.app.operation(int(id))
    except UnknownOperationError:
        raise Refused(404, f"no operation {id!r} (or retention removed it)") from None


def _total(op: Operation) -> str:
    return f"{op.total:,}+" if op.total_bounded else f"{op.total:,}"


def _filters(op: Operation) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(op.filter.items()))
