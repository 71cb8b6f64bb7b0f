"""What ended, over time, from the rollups (``app.activity``): rows ended per minute or
hour by state, and start lag and duration as histograms (``_latency.py``), for a
function or a queue or all of them. The dashboard's charts and function pages read it.

Its cost does not grow with ``_scheduled_functions``: it reads ``_durafn_rollups``,
which the executor's maintenance fills for closed minutes (``_executor/rollups.py``):
the last hour is 60 minutes' rows, a day or a week the hours' rows plus the minutes of
the hour under way. A minute shows once it has closed and a pass has run (every
``retention_interval``, a minute by default)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from pydantic import BaseModel
from sqlalchemy.ext.asyncio import AsyncConnection

from ._checks import integer, optional, text
from ._clock import to_datetime
from ._kinds import State
from ._latency import BUCKETS, merged, percentile
from ._models import FROZEN
from ._public import publish
from ._runtime import Runtime
from ._store import HOUR, MINUTE, RollupRow

ENDED = (State.SUCCESS, State.FAILED, State.CANCELED)
GRACE = 60
"""A minute is shown once it is closed: as the rollups' pass (``_executor/rollups.py``)."""
MAX_WITHIN = 7 * 86400


class Latency(BaseModel):
    """A histogram of seconds: ``counts[i]`` values in bucket ``i`` of fixed edges, 1 ms
    to 500 s in 1-2.5-5 steps (the first holds everything below 1 ms, the last
    everything from 500 s)."""

    model_config = FROZEN

    counts: list[int]

    @property
    def total(self) -> int:
        """How many values (rows that started) it holds."""
        return sum(self.counts)

    def percentile(self, q: float) -> float | None:
        """The ``q`` quantile (0.5: the median), in seconds, placed within its bucket;
        None when no row started."""
        return percentile(self.counts, q)


class ActivityPoint(BaseModel):
    """The rows that ended in one minute or hour."""

    model_config = FROZEN

    start: datetime
    ended: dict[State, int]
    """Success, Failed and Canceled, zeros included."""
    lag: Latency
    """Start lag (started - scheduled) of the rows that started."""
    duration: Latency
    """Run time (ended - started) of the rows that started."""


class FunctionActivity(BaseModel):
    """A function's rows ended in a queue over the whole window."""

    model_config = FROZEN

    name: str
    queue: str | None
    ended: dict[State, int]


class Activity(BaseModel):
    """What ended over a window (``app.activity()``)."""

    model_config = FROZEN

    since: datetime
    until: datetime
    """The end of the last closed minute: the window is [since, until)."""
    step: int
    """Seconds per point: 60 or 3600."""
    name: str | None
    queue: str | None
    points: list[ActivityPoint]
    """Every minute or hour of the window, oldest first, zeros included."""
    functions: list[FunctionActivity]
    """Every function and queue with rows ended in the window, whatever ``name`` and
    ``queue`` chose (a filter's choices, a function's queues), most rows first."""

    @property
    def ended(self) -> dict[State, int]:
        """Rows ended over the whole window, by state."""
        return {s: sum(p.ended[s] for p in self.points) for s in ENDED}

    @property
    def lag(self) -> Latency:
        """Start lag over the whole window."""
        return Latency(counts=merged([p.lag.counts for p in self.points]))

    @property
    def duration(self) -> Latency:
        """Run time over the whole window."""
        return Latency(counts=merged([p.duration.counts for p in self.points]))


class ActivityReads:
    _rt: Runtime

    async def activity(
        self,
        *,
        within: float | timedelta = 3600.0,
        name: str | None = None,
        queue: str | None = None,
    ) -> Activity:
        """What ended in the last ``within`` (at most 7 days), per minute up to an hour
        and per hour beyond, of the function ``name`` and the queue ``queue`` if given
        (``""``: rows of no named queue), from the rollups the executor's maintenance
        writes for each closed minute."""
        seconds = within.total_seconds() if isinstance(within, timedelta) else within
        seconds = integer("within", int(seconds), low=60, high=MAX_WITHIN)
        name = optional(text, "name", name)
        queue = optional(text, "queue", queue)
        step = MINUTE if seconds <= HOUR else HOUR
        closed = int((self._rt.clock.now() - GRACE) // MINUTE) * MINUTE
        driver = self._rt.driver

        async def _read(conn: AsyncConnection) -> tuple[int, list[RollupRow], list[RollupRow]]:
            minutes, hours = await driver.rollup_marks(conn)
            # Up to the last minute rolled up (a pass runs every retention_interval): a
            # closed minute it has not reached yet is not shown as empty.
            until = closed if minutes is None else min(closed, minutes)
            since = _since(until, seconds, step)
            # An hour view reads minutes; a longer one reads the hours rolled up, then
            # the minutes after them (the hour under way's, and an hour's whose sum a
            # pass has not written yet).
            split = since if hours is None or step == MINUTE else max(since, min(until, hours))
            rows: list[RollupRow] = []
            functions: list[RollupRow] = []
            for span, start, end in ((HOUR, since, split), (MINUTE, split, until)):
                if start < end:
                    rows += await driver.read_rollups(
                        conn, span, start, end, name=name, queue=queue
                    )
                    functions += await driver.rollup_functions(conn, span, start, end)
            return until, rows, functions

        until, rows, functions = await self._rt.transaction(
            _read, read_only=True, doing="reading the rollups"
        )
        since = _since(until, seconds, step)
        return Activity(
            since=to_datetime(float(since)),
            until=to_datetime(float(until)),
            step=step,
            name=name,
            queue=queue,
            points=_points(rows, since, until, step),
            functions=_functions(functions),
        )


def _since(until: int, seconds: int, step: int) -> int:
    """The window's first point: ``seconds`` before ``until``, whole minutes, or the
    start of the hour that holds it (a day or a week by hour)."""
    if step == HOUR:
        return (until - seconds) // HOUR * HOUR
    return until - seconds // MINUTE * MINUTE


def _points(rows: Sequence[RollupRow], since: int, until: int, step: int) -> list[ActivityPoint]:
    starts = range(since, until, step)
    ended = {s: dict.fromkeys(ENDED, 0) for s in starts}
    lag = {s: [0] * BUCKETS for s in starts}
    duration = {s: [0] * BUCKETS for s in starts}
    for r in rows:
        at = r.start // step * step
        if at not in ended or r.state not in {s.value for s in ENDED}:
            continue
        ended[at][State(r.state)] += r.count
        for i in range(BUCKETS):
            lag[at][i] += r.lag[i]
            duration[at][i] += r.duration[i]
    return [
        ActivityPoint(
            start=to_datetime(float(s)),
            ended=ended[s],
            lag=Latency(counts=lag[s]),
            duration=Latency(counts=duration[s]),
        )
        for s in starts
    ]


def _functions(rows: Sequence[RollupRow]) -> list[FunctionActivity]:
    found: dict[tuple[str, str], dict[State, int]] = {}
    for r in rows:
        counts = found.setdefault((r.function_name, r.queue), dict.fromkeys(ENDED, 0))
        if r.state in {s.value for s in ENDED}:
            counts[State(r.state)] += r.count
    out = [FunctionActivity(name=n, queue=q or None, ended=c) for (n, q), c in found.items()]
    return sorted(out, key=lambda f: (-sum(f.ended.values()), f.name, f.queue or ""))


publish(globals())
