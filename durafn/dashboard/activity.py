"""The overview's last hour: runs per minute, start lag, failures by function, from the
rows that ended lately (``App.finished``: at most ``SAMPLE`` of them, a range of the
completion index, so the cost does not grow with the table)."""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from markupsafe import Markup

from .._clock import to_datetime
from .._kinds import State
from .._models import ScheduledFunction
from .charts import ENDED
from .svg import stacked_bars

WINDOW = 3600.0
SAMPLE = 1000


@dataclass(frozen=True)
class Activity:
    per_minute: list[int]
    """Rows ended in each of the window's minutes, oldest first."""
    by_state: list[dict[str, int]]
    """The same, by state (Success, Failed, Canceled)."""
    lag_median: float | None
    """Seconds from scheduled time to start, over the sampled rows that started."""
    lag_p99: float | None
    failures: list[tuple[str, int]]
    """Failed rows by function, most first."""
    sampled: int
    capped: bool
    """The window held more ended rows than the sample: the figures are of the latest."""


def summarize(rows: Sequence[ScheduledFunction], now: float) -> Activity:
    minutes = int(WINDOW // 60)
    per_minute = [0] * minutes
    by_state: list[dict[str, int]] = [{} for _ in range(minutes)]
    lags: list[float] = []
    failures: Counter[str] = Counter()
    for row in rows:
        assert row.completed_time is not None
        ago = int((now - row.completed_time.timestamp()) // 60)
        if 0 <= ago < minutes:
            per_minute[minutes - 1 - ago] += 1
            counts = by_state[minutes - 1 - ago]
            counts[row.state.value] = counts.get(row.state.value, 0) + 1
        if row.started_time is not None:
            lags.append((row.started_time - row.scheduled_time).total_seconds())
        if row.state is State.FAILED:
            failures[row.name] += 1
    lags.sort()
    return Activity(
        per_minute=per_minute,
        by_state=by_state,
        lag_median=statistics.median(lags) if lags else None,
        lag_p99=lags[min(len(lags) - 1, int(len(lags) * 0.99))] if lags else None,
        failures=failures.most_common(),
        sampled=len(rows),
        capped=len(rows) >= SAMPLE,
    )


def chart(summary: Activity, now: float) -> Markup:
    """The last hour's rows ended per minute by state, for the overview (live: from the
    sample, the minute under way included)."""
    minutes = len(summary.per_minute)
    first = int(now // 60) * 60 - (minutes - 1) * 60
    starts = [to_datetime(float(first + 60 * i)) for i in range(minutes)]
    return stacked_bars(
        starts,
        summary.by_state,
        ENDED,
        step=60,
        unit="rows / minute",
        label="Rows ended per minute by state, the last hour (UTC)",
        id="runs",
    )
