"""Why ``finish_all`` gave up: what is still scheduled, and what keeps scheduling it (a
function that reschedules itself, or a cron whose runs schedule work past its next tick),
read from the Pending rows and the rows that scheduled them."""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncConnection

from .._clock import to_datetime
from .._context import SystemTable
from .._kinds import State
from .._models import ScheduledFunction
from .._runtime import Runtime
from .._store import tick_id

NAMED = 3
"""Functions named at most (the earliest due first)."""
HOPS = 20
"""Rows that scheduled it, at most, looked through for a cron's tick."""


async def runaway_message(rt: Runtime, now: float, steps: int, ran: int) -> str:
    """The ``RunawayError`` message of a ``finish_all`` that moved the clock ``steps`` times
    (``ran`` functions run) and still found rows Pending."""
    table = SystemTable(rt, None)
    page = await table.list(state=State.PENDING, limit=1000)
    first: dict[str, ScheduledFunction] = {}
    for row in sorted(page.items, key=_due):
        first.setdefault(row.name, row)
    crons = await _cron_names(rt)
    causes = [await _cause(table, row, crons, now) for row in list(first.values())[:NAMED]]
    more = f" (and {len(first) - NAMED} more functions)" if len(first) > NAMED else ""
    return (
        f"finish_all gave up after {steps} steps ({ran} functions run), with work still "
        f"scheduled: {'; '.join(causes) or 'nothing Pending now'}{more}. finish_all moves the "
        "clock to each row's due time until nothing is Pending, so work that schedules more "
        "work ahead forever never ends: run it up to a time with advance(seconds or "
        "timedelta) instead (durafn.testing.advance, or the harness's durafn.advance)"
    )


def _due(row: ScheduledFunction) -> float:
    return (row.due_time or row.scheduled_time).timestamp()


async def _cron_names(rt: Runtime) -> set[str]:
    """The app's crons, declared or registered at run time."""

    async def _read(conn: AsyncConnection) -> list[str]:
        return [c.name for c in await rt.driver.stored_crons(conn)]

    stored = await rt.transaction(_read, read_only=True, doing="listing crons")
    return set(rt.crons) | set(stored)


def _tick_of(row: ScheduledFunction, crons: set[str]) -> str | None:
    """The cron whose tick this row is, if any (a tick's id is made from the cron's name
    and the tick, its scheduled time)."""
    tick = row.scheduled_time.timestamp()
    return next((name for name in sorted(crons) if tick_id(name, tick) == row.id), None)


async def _cause(table: SystemTable, row: ScheduledFunction, crons: set[str], now: float) -> str:
    """``row``'s function, when it is due, and what keeps scheduling it."""
    name = f"{row.name}, due {to_datetime(_due(row)).isoformat()}"
    if _due(row) <= now:  # the clock is at its time, and it did not start
        return (
            f"{name} but not started (held by a paused queue or a flow key? "
            f"app.explain({str(row.id)!r}) says what it waits for)"
        )
    parent = await table.get(row.parent_id) if row.parent_id else None
    if parent is not None and parent.name == row.name:
        return f"{name}, reschedules itself each time it runs"
    found: ScheduledFunction | None = row
    for _ in range(HOPS):
        if found is None:
            break
        cron = _tick_of(found, crons)
        if cron is not None:
            if found is row:
                return f"{name}, a tick of cron {cron!r}"
            return (
                f"{name}, scheduled by the runs of cron {cron!r}, each scheduling work past "
                "the cron's next tick"
            )
        found = await table.get(found.parent_id) if found.parent_id else None
    if parent is not None:
        return f"{name}, scheduled by {parent.name}"
    return name
