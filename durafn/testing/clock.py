"""A clock that only moves when a test says so."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import anyio
import anyio.lowlevel

DEFAULT_START = datetime(2030, 1, 1, tzinfo=UTC)


class FakeClock:
    """A clock that only moves when told to. Sleepers wake when it passes their deadline."""

    def __init__(self, start: datetime | float = DEFAULT_START) -> None:
        self._now = start.timestamp() if isinstance(start, datetime) else float(start)
        self._sleepers: list[tuple[float, anyio.Event]] = []

    def now(self) -> float:
        return self._now

    def now_datetime(self) -> datetime:
        """The current fake time as an aware UTC datetime."""
        return datetime.fromtimestamp(self._now, tz=UTC)

    async def sleep_until(self, deadline: float) -> None:
        if deadline <= self._now:
            await anyio.lowlevel.checkpoint()
            return
        entry = (deadline, anyio.Event())
        self._sleepers.append(entry)
        try:
            await entry[1].wait()
        finally:
            if entry in self._sleepers:
                self._sleepers.remove(entry)

    def advance(self, by: float | timedelta) -> None:
        """Move time forward and wake every sleeper whose deadline has passed."""
        seconds = by.total_seconds() if isinstance(by, timedelta) else float(by)
        if seconds < 0:
            raise ValueError("a FakeClock only moves forward")
        self.set(self._now + seconds)

    def set(self, when: datetime | float) -> None:
        self._now = when.timestamp() if isinstance(when, datetime) else float(when)
        for deadline, event in list(self._sleepers):
            if deadline <= self._now:
                event.set()
