"""The clock: the only place durafn reads wall time.

Time is a float of seconds since the Unix epoch. Every query that compares against "now"
takes it as a parameter read from here, so a fake clock (``durafn.testing.FakeClock``)
drives SQLite and PostgreSQL alike and tests never sleep.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Protocol, runtime_checkable

import anyio


@runtime_checkable
class Clock(Protocol):
    """What the runtime needs from a clock."""

    def now(self) -> float:
        """Current time, seconds since the epoch."""
        ...

    async def sleep_until(self, deadline: float) -> None:
        """Return once ``now() >= deadline`` (may return early only if cancelled)."""
        ...


class SystemClock:
    """The real wall clock."""

    def now(self) -> float:
        """``time.time()``."""
        return time.time()

    async def sleep_until(self, deadline: float) -> None:
        """Sleep (anyio) until the wall clock reaches ``deadline``."""
        delay = deadline - time.time()
        if delay > 0:
            await anyio.sleep(delay)


def to_datetime(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, tz=UTC)


def from_datetime(when: datetime) -> float:
    return when.timestamp()
