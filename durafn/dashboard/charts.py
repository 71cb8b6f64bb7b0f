"""The charts page (``/charts``): rows ended per minute or hour by state, start lag p50
and p99, failures, over the last hour, day or week, for every function or one, every
queue or one; and the figures both it and a function's page draw (``figures``).

Everything is read from the rollups (``app.activity``: at most a week's hours plus an
hour's minutes, whatever the size of ``_scheduled_functions``), and drawn on the server
(``svg.py``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from markupsafe import Markup
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from .._activity import Activity
from .._kinds import State
from .surface import Pages, Refused
from .svg import Series, log_lines, seconds, stacked_bars

RANGES = {"hour": 3600, "day": 86400, "week": 7 * 86400}
ENDED = [
    Series(State.SUCCESS.value, "Success"),
    Series(State.FAILED.value, "Failed"),
    Series(State.CANCELED.value, "Canceled"),
]
LAG = [Series("p50", "p50"), Series("p99", "p99")]
FAILED = [Series(State.FAILED.value, "Failed")]
SHOWN = 50
"""Functions (with a queue) in the table by function, most rows first."""


def routes(d: Pages) -> list[Route]:
    async def charts(request: Request) -> Response:
        async def body(user: str) -> dict[str, Any]:
            chosen = chosen_range(request)
            name = request.query_params.get("name") or None
            queue = request.query_params.get("queue")
            queue = None if queue in (None, "*") else queue
            seen = await d.app.activity(within=RANGES[chosen], name=name, queue=queue)
            return {
                "range": chosen,
                "ranges": list(RANGES),
                "name": name,
                "queue": queue,
                "names": sorted({f.name for f in seen.functions}),
                "queues": sorted({f.queue or "" for f in seen.functions}),
                "by_function": [
                    f
                    for f in seen.functions
                    if name in (None, f.name) and queue in (None, f.queue or "")
                ][:SHOWN],
                "figures": figures(seen, chosen),
                "seen": seen,
                "summary": summary(seen),
                "states": State,
            }

        return await d.page(request, "charts.html", body)

    return [Route("/charts", charts)]


def chosen_range(request: Request) -> str:
    chosen = request.query_params.get("range") or "hour"
    if chosen not in RANGES:
        raise Refused(400, f"unknown range {chosen!r}: one of {', '.join(RANGES)}")
    return chosen


@dataclass(frozen=True)
class Summary:
    """The figures at the head of a chart page."""

    ended: int
    per_minute: float
    failed: int
    failure_rate: float | None
    lag_p50: str
    lag_p99: str
    duration_p50: str
    duration_p99: str


def summary(seen: Activity) -> Summary:
    ended = seen.ended
    total = sum(ended.values())
    minutes = max(1.0, (seen.until - seen.since).total_seconds() / 60)
    ran = ended[State.SUCCESS] + ended[State.FAILED]
    lag, duration = seen.lag, seen.duration

    def shown(value: float | None) -> str:
        return "—" if value is None else seconds(value)

    return Summary(
        ended=total,
        per_minute=total / minutes,
        failed=ended[State.FAILED],
        failure_rate=ended[State.FAILED] / ran if ran else None,
        lag_p50=shown(lag.percentile(0.5)),
        lag_p99=shown(lag.percentile(0.99)),
        duration_p50=shown(duration.percentile(0.5)),
        duration_p99=shown(duration.percentile(0.99)),
    )


def figures(seen: Activity, chosen: str, *, durations: bool = False) -> list[Markup]:
    """Rows ended by state, start lag (and, for a function, duration) p50/p99, failures."""
    starts = [p.start for p in seen.points]
    per = "minute" if seen.step == 60 else "hour"
    out = [
        stacked_bars(
            starts,
            [{s.value: n for s, n in p.ended.items()} for p in seen.points],
            ENDED,
            step=seen.step,
            unit=f"rows / {per}",
            label=f"Rows ended per {per} by state, the last {chosen} (UTC)",
            id="chart-ended",
        ),
        log_lines(
            starts,
            [{"p50": p.lag.percentile(0.5), "p99": p.lag.percentile(0.99)} for p in seen.points],
            LAG,
            step=seen.step,
            label=f"Start lag (started - scheduled) per {per}, p50 and p99",
            id="chart-lag",
        ),
    ]
    if durations:
        out.append(
            log_lines(
                starts,
                [
                    {"p50": p.duration.percentile(0.5), "p99": p.duration.percentile(0.99)}
                    for p in seen.points
                ],
                LAG,
                step=seen.step,
                label=f"Duration (ended - started) per {per}, p50 and p99",
                id="chart-duration",
            )
        )
    out.append(
        stacked_bars(
            starts,
            [{State.FAILED.value: p.ended[State.FAILED]} for p in seen.points],
            FAILED,
            step=seen.step,
            unit=f"failed / {per}",
            label=f"Failures per {per}",
            id="chart-failures",
        )
    )
    return out
