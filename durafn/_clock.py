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
import anyio.lowlevel

from ._public import publish


@runtime_checkable
class Clock(Protocol):
    """What the runtime needs from a clock."""

    def now(self) -> float:
        """Current time, seconds since the epoch. Also called on a database driver's
        thread: SQLite reads an action's start there, once its claim holds the write
        lock (``_store/claim/columns.StartTime``), so keep it a plain read."""
        ...

    async def sleep_until(self, deadline: float) -> None:
        """Return once ``now() >= deadline`` (may return early if cancelled, or if the
        wall clock was stepped back meanwhile: callers read ``now()`` again)."""
        ...


class SystemClock:
    """The real wall clock."""

    def now(self) -> float:
        """``time.time()``."""
        return time.time()

    async def sleep_until(self, deadline: float) -> None:
        """Sleep (anyio) until the wall clock reaches ``deadline``."""
        delay = deadline - time.time()
        end = time.monotonic() + delay
        if delay > _SPIN:
            await anyio.sleep(delay - _SPIN)
        # The event loop's timers wake up to a millisecond late (epoll waits in whole
        # milliseconds, rounded up): measured, a median 1.0 ms past the deadline. The last
        # stretch yields to other tasks instead, so a due row starts on time. On the
        # monotonic clock: a wall clock stepped back must not turn this into a long spin.
        while time.monotonic() < end:
            await anyio.lowlevel.checkpoint()


_SPIN = 0.0015


def to_datetime(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, tz=UTC)


def from_datetime(when: datetime) -> float:
    return when.timestamp()


publish(globals())
