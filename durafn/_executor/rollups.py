"""The rollups' pass (a part of maintenance): what ended in each closed minute, then in
each closed hour, written once into ``_durafn_rollups`` for the dashboard's charts; and
the rollups older than retention keeps rows removed, a page at a time.

Nothing here runs on a job's path: a pass reads the rows that ended since the last one
(a range of ``ix_scheduled_functions_completed``) every ``retention_interval``. A minute
is closed ``GRACE`` seconds after it ends: a row's end time is read from the clock before
its transaction commits, and the pass must not roll up a minute whose rows are still
being written. Two workers' passes at once write the same rows, and the second's are
dropped by the primary key (``_store/rollups.py``). A pass starts where the marks say
the last one ended (``_durafn_rollup_marks``, moved forward with each batch, in its
transaction); the first, at the earliest row kept."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import TypeVar

import anyio.lowlevel
from sqlalchemy.ext.asyncio import AsyncConnection

from .._runtime import Runtime

T = TypeVar("T")
Step = Callable[[AsyncConnection, int, int], Awaitable[int]]
MINUTE, HOUR = 60, 3600
GRACE = 60.0
"""Seconds after a minute ends before it is rolled up."""
BATCH_MINUTES = 60
"""Minutes rolled up per statement: a first pass over a week of rows is 168 statements,
each over an hour's rows, so no transaction holds the table (or SQLite's write lock)
for long."""


class RollUps:
    def __init__(self, runtime: Runtime) -> None:
        self._rt = runtime

    async def run_once(self, now: float, keep: float) -> int:
        """Roll up the closed minutes and hours not rolled up yet (none older than
        ``keep`` seconds), then prune the older rollups; the groups written."""
        driver = self._rt.driver
        closed = int((now - GRACE) // MINUTE) * MINUTE
        oldest_kept = int((now - keep) // HOUR) * HOUR
        minutes, hours = await self._read(driver.rollup_marks)
        if minutes is None:  # the first pass: from the earliest kept row's minute
            first = await self._read(driver.oldest_finished)
            minutes = closed if first is None else int(first // MINUTE) * MINUTE
        written = 0
        start = max(minutes, oldest_kept)
        while start < closed:
            # Over a stretch where nothing ended (a worker stopped for a while, a test's
            # clock moved on by a year) in one step: the next row that ended says where
            # the next batch begins (8,760 empty hours were 8,760 statements, 12 s).
            found = await self._read(functools.partial(driver.oldest_finished, since=start))
            start = closed if found is None else max(start, int(found // MINUTE) * MINUTE)
            end = min(start + BATCH_MINUTES * MINUTE, closed)
            written += await self._write(driver.roll_up_minutes, MINUTE, start, end)
            start = end
            await anyio.lowlevel.checkpoint()
        # The hours whose every minute is rolled up now.
        last_hour = closed // HOUR * HOUR
        if hours is None:  # the first pass: from the earliest minute's hour
            first = await self._read(lambda c: driver.oldest_rollup(c, MINUTE))
            hours = last_hour if first is None else first // HOUR * HOUR
        hour = max(hours, oldest_kept)
        while hour < last_hour:
            found = await self._read(
                functools.partial(driver.oldest_rollup, span=MINUTE, since=hour)
            )
            hour = last_hour if found is None else max(hour, found // HOUR * HOUR)
            end = min(hour + 24 * HOUR, last_hour)
            written += await self._write(driver.roll_up_hours, HOUR, hour, end)
            hour = end
        await self._prune(oldest_kept)
        return written

    async def _prune(self, before: int) -> None:
        """Remove the rollups starting before ``before``, an hour's minutes (or a day's
        hours) a transaction."""
        driver = self._rt.driver
        for span, page in ((MINUTE, HOUR), (HOUR, 24 * HOUR)):

            async def _delete(conn: AsyncConnection, start: int, end: int, s: int = span) -> int:
                return await driver.delete_rollups(conn, s, start, end)

            async def _oldest(conn: AsyncConnection, s: int = span) -> int | None:
                return await driver.oldest_rollup(conn, s)

            oldest = await self._read(_oldest)
            while oldest is not None and oldest < before:
                end = min(oldest + page, before)
                await self._rt.transaction(
                    functools.partial(_delete, start=oldest, end=end), doing="pruning rollups"
                )
                # The next one kept, not the next page: across a gap, a probe, not a
                # statement per empty page.
                oldest = await self._read(_oldest)
                await anyio.lowlevel.checkpoint()

    async def _read(self, read: Callable[[AsyncConnection], Awaitable[T]]) -> T:
        return await self._rt.transaction(read, read_only=True, doing="reading the rollups")

    async def _write(self, step: Step, span: int, start: int, end: int) -> int:
        """``step`` over ``start`` to ``end``, and the span's mark moved to ``end``, in
        one transaction: the mark never names a minute whose rows are not in."""

        async def _run(conn: AsyncConnection) -> int:
            written = await step(conn, start, end)
            await self._rt.driver.advance_rollup_mark(conn, span, end)
            return written

        return await self._rt.transaction(_run, doing="rolling up what ended")
