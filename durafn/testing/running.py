"""Running scheduled work deterministically on a fake clock (``finish_all``,
``advance``), and reading every row back (``all_rows``, ``states``)."""

from __future__ import annotations

from datetime import timedelta

from .._app import App
from .._executor import Executor, RunawayError
from .._kinds import State
from .._models import ScheduledFunction
from .clock import FakeClock
from .runaway import runaway_message


async def finish_all(executor: Executor, clock: FakeClock, *, max_steps: int = 100) -> int:
    """Run scheduled work until nothing is Pending, moving ``clock`` to each row's due time.

    A cron never moves the clock (it always has a next tick, and following them would
    never end): the ticks the clock passes on its way to a row run at their own times, as
    ``advance`` runs them, and what their runs schedule is finished too. Returns how many
    functions ran. Raises ``RunawayError`` after ``max_steps`` moves of the clock, naming
    what kept scheduling work ahead (a function that reschedules itself, a cron whose runs
    schedule work past its next tick): run such work up to a time with ``advance``.
    """
    total = await executor.run_until_idle()
    for _ in range(max_steps):
        next_due = await executor.next_due(crons=False)
        if next_due is None:
            return total
        # To the row's time, stopping at the crons' ticks on the way.
        total += await advance(executor, clock, max(0.0, next_due - clock.now()))
    raise RunawayError(await runaway_message(executor._rt, clock.now(), max_steps, total))


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
