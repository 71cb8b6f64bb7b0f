"""A function's page (``/functions/<name>``): how often it ends and how (rate, failure
rate, start lag and duration percentiles and their charts, from the rollups), its last
errors grouped by type, its crons and its queues.

Each read is bounded: the rollups' rows of one function (``app.activity``), the last
``ERRORS_READ`` Failed rows of it (a listing newest first, its scan bounded as the rows
page's), the crons, the named queues with bounded counts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from .._kinds import State
from .._models import ScheduledFunction
from .charts import RANGES, chosen_range, figures, summary
from .functions import runnable
from .rows import SCAN
from .surface import COUNT_BOUND, Pages

ERRORS_READ = 100
"""The last Failed rows of a function its page groups by error type."""


@dataclass(frozen=True)
class ErrorGroup:
    """Failed rows of one error type, among the last read."""

    type: str
    count: int
    latest: ScheduledFunction
    """The most recent of them (its message shown, its page linked)."""


def routes(d: Pages) -> list[Route]:
    async def function(request: Request) -> Response:
        async def body(user: str) -> dict[str, Any]:
            name = str(request.path_params["name"])
            chosen = chosen_range(request)
            app = d.app
            seen = await app.activity(within=RANGES[chosen], name=name)
            failed = await app.list(
                state=State.FAILED, name=name, newest_first=True, limit=ERRORS_READ, scan=SCAN
            )
            crons = [c for c in await app.crons() if c.function == name]
            used = {f.queue for f in seen.functions if f.queue}
            queues = [q for q in await app.queues(bound=COUNT_BOUND) if q.name in used]
            return {
                "name": name,
                "function_page": True,
                "range": chosen,
                "ranges": list(RANGES),
                "queue": None,
                "seen": seen,
                "summary": summary(seen),
                "figures": figures(seen, chosen, durations=True),
                "errors": group_errors(failed.items),
                "errors_read": len(failed.items),
                "errors_partial": failed.partial,
                "crons": crons,
                "queues": queues,
                "per_queue": [f for f in seen.functions if f.name == name],
                "runnable": name in runnable(d),
                "states": State,
            }

        return await d.page(request, "function.html", body)

    return [Route("/functions/{name:path}", function)]


def group_errors(rows: list[ScheduledFunction]) -> list[ErrorGroup]:
    """Failed rows (newest first) by error type, the most frequent first."""
    groups: dict[str, list[ScheduledFunction]] = {}
    for row in rows:
        kind = row.error.type if row.error is not None else "(no error recorded)"
        groups.setdefault(kind, []).append(row)
    found = [ErrorGroup(kind, len(rows), rows[0]) for kind, rows in groups.items()]
    return sorted(found, key=lambda g: (-g.count, g.type))
