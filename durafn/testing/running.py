"""Test helpers: a fake clock and ways to run scheduled work deterministically.

durafn's own suite uses these; they are public so that users can test their functions the
same way (advance time, run what is due, assert on rows) without sleeping.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import anyio

from ._app import App
from ._executor import Executor, RunawayError
from ._kinds import State
from ._types import ScheduledFunction

__all__ = ["FakeClock", "RunawayError", "advance", "all_rows", "finish_all", "states"]

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


async def finish_all(executor: Executor, clock: FakeClock, *, max_steps: int = 100) -> int:
    """Run scheduled work until nothing is Pending, advancing ``clock`` to each due time.

    Returns how many functions ran. Raises RunawayError after ``max_steps`` time steps,
    which catches a function that keeps rescheduling itself.
    """
    total = 0
    for _ in range(max_steps):
        total += await executor.run_until_idle()
        next_due = await executor.next_due()
        if next_due is None:
            return total
        clock.set(max(clock.now(), next_due))
    raise RunawayError(
        f"scheduled work remained after {max_steps} time steps; a function probably "
        "reschedules itself forever"
    )


async def advance(
    executor: Executor, clock: FakeClock, by: float | timedelta, *, max_steps: int = 100_000
) -> int:
    """Move ``clock`` on by ``by``, stopping at every due time on the way (rows, and the
    crons' ticks) and running what is due there, so each runs at its own time (``ctx.now()``
    is the tick's). Returns how many functions ran.

    A simulated month of a daily cron is 31 stops; of an hourly one, 744 (each stop is
    a ``run_until_idle``: a few milliseconds on PostgreSQL, more on SQLite)."""
    end = clock.now() + (by.total_seconds() if isinstance(by, timedelta) else float(by))
    total = await executor.run_until_idle()
    for _ in range(max_steps):
        next_due = await executor.next_due(after=clock.now())  # what is left now is held
        if next_due is None or next_due > end:
            clock.set(max(clock.now(), end))
            return total + await executor.run_until_idle()
        clock.set(next_due)
        total += await executor.run_until_idle()
    raise RunawayError(
        f"still due times ahead after {max_steps} stops; a function probably reschedules "
        "itself with no delay"
    )


async def all_rows(app: App) -> list[ScheduledFunction]:
    """Every row of ``_scheduled_functions`` in ``scheduled_time`` order (all pages)."""
    rows: list[ScheduledFunction] = []
    cursor: str | None = None
    while True:
        page = await app.list(limit=1000, cursor=cursor)
        rows.extend(page.items)
        if page.next_cursor is None:
            return rows
        cursor = page.next_cursor


async def states(app: App) -> dict[str, State]:
    """Durable name -> state for apps whose test schedules each name once; handy in asserts."""
    return {row.name: row.state for row in await all_rows(app)}
