"""The overview's last hour: runs per minute, start lag, failures by function, from the
rows that ended lately (``App.finished``: at most ``SAMPLE`` of them, a range of the
completion index, so the cost does not grow with the table)."""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from .._kinds import State
from .._models import ScheduledFunction

WINDOW = 3600.0
SAMPLE = 1000


@dataclass(frozen=True)
class Activity:
    per_minute: list[int]
    """Rows ended in each of the window's minutes, oldest first."""
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
    lags: list[float] = []
    failures: Counter[str] = Counter()
    for row in rows:
        assert row.completed_time is not None
        ago = int((now - row.completed_time.timestamp()) // 60)
        if 0 <= ago < minutes:
            per_minute[minutes - 1 - ago] += 1
        if row.started_time is not None:
            lags.append((row.started_time - row.scheduled_time).total_seconds())
        if row.state is State.FAILED:
            failures[row.name] += 1
    lags.sort()
    return Activity(
        per_minute=per_minute,
        lag_median=statistics.median(lags) if lags else None,
        lag_p99=lags[min(len(lags) - 1, int(len(lags) * 0.99))] if lags else None,
        failures=failures.most_common(),
        sampled=len(rows),
        capped=len(rows) >= SAMPLE,
    )
