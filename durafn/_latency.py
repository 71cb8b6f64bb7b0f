"""Latency histograms of fixed buckets: how the per-minute rollups keep start lag and
duration (``_durafn_rollups``), so that SQLite and PostgreSQL give the same percentiles
(PostgreSQL's ``percentile_cont`` has no SQLite twin) and minutes add up to hours and
weeks by summing counts.

The edges follow 1-2.5-5 steps from 1 ms to 500 s: 19 buckets, the first every value
below 1 ms (a negative lag too: a clock step), the last every value of 500 s or more.
A percentile is placed inside its bucket by interpolation on a log scale: exact to the
bucket (a factor of 2-2.5), which is what a chart of p50 and p99 needs. Standard library
only."""

from __future__ import annotations

import math
from collections.abc import Sequence

EDGES: tuple[float, ...] = (
    *(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5),
    *(1.0, 2.5, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0),
)
"""Upper edges (seconds, exclusive) of every bucket but the last."""
BUCKETS = len(EDGES) + 1


def bucket_of(seconds: float) -> int:
    """The bucket a value falls in (what the rollup's SQL computes with CASE)."""
    for i, edge in enumerate(EDGES):
        if seconds < edge:
            return i
    return len(EDGES)


def percentile(counts: Sequence[int], q: float) -> float | None:
    """The ``q``-quantile (0 < q <= 1) of a histogram's values, in seconds; None if empty."""
    total = sum(counts)
    if total == 0:
        return None
    rank = q * total
    seen = 0
    for i, n in enumerate(counts):
        if n and seen + n >= rank:
            low = EDGES[i - 1] if i > 0 else EDGES[0] / 2.5
            high = EDGES[i] if i < len(EDGES) else EDGES[-1] * 2
            within = (rank - seen) / n
            return math.exp(math.log(low) + (math.log(high) - math.log(low)) * within)
        seen += n
    return EDGES[-1] * 2  # pragma: no cover - rank <= total always ends in the loop


def merged(histograms: Sequence[Sequence[int]]) -> list[int]:
    """Bucket by bucket sums."""
    out = [0] * BUCKETS
    for h in histograms:
        for i, n in enumerate(h):
            out[i] += n
    return out
