"""The database's gauges in one read-only transaction, each part a bounded read: the
counts stop at ``GAUGE_BOUND`` (``Driver.count_by_state_bounded``, ``list_queues``), the
backlog is a few index probes, the workers and crons tables hold a row per worker and
cron."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

from sqlalchemy.ext.asyncio import AsyncConnection

from .._clock import Clock
from .._kinds import State
from .metrics import GAUGE_BOUND, QUEUE_SERIES, Reading


class _Runtime(Protocol):
    """What the reading needs of the ``Runtime`` (which builds this module's parts)."""

    clock: Clock
    driver: Any

    @property
    def queues(self) -> Mapping[str, Any]: ...

    async def transaction(
        self, body: Callable[[AsyncConnection], Awaitable[Any]], *, read_only: bool, doing: str
    ) -> Any: ...


async def read_gauges(rt: _Runtime) -> Reading:
    now = rt.clock.now()

    async def _read(conn: AsyncConnection) -> Reading:
        driver = rt.driver
        counts, _ = await driver.count_by_state_bounded(conn, GAUGE_BOUND)
        due, capped = await driver.count_due_bounded(conn, now, GAUGE_BOUND)
        oldest, _ = await driver.backlog(conn, now)
        # The first QUEUE_SERIES queues by name, and the app's declared ones: a queue per
        # user would make the read, and the series, grow with the users.
        queues = await driver.list_queues(conn, now, GAUGE_BOUND, limit=QUEUE_SERIES)
        listed = {q.name for q in queues}
        declared = [name for name in rt.queues if name not in listed]
        if declared:
            queues += await driver.list_queues(conn, now, GAUGE_BOUND, names=declared)
        workers = await driver.list_workers(conn)
        crons = await driver.stored_crons(conn)
        return Reading(
            at=0.0,
            due=due,
            due_capped=capped,
            oldest_due_age=_age(now, oldest),
            running=counts[State.IN_PROGRESS],
            workers=len(workers),
            queues=[
                (q.name, q.due, q.pending, q.paused, _age(now, q.oldest_due_at)) for q in queues
            ],
            # Never negative: a host whose clock is behind the tick's (skew, a fake clock)
            # reads 0, not a tick from the future.
            crons=[
                (c.name, None if c.last_run_at is None else max(0.0, now - c.last_run_at))
                for c in crons
            ],
        )

    found: Reading = await rt.transaction(_read, read_only=True, doing="reading the gauges")
    return found


def _age(now: float, due_at: float | None) -> float:
    """How long a row due at ``due_at`` has waited (0: none is due; never negative)."""
    return 0.0 if due_at is None else max(0.0, now - due_at)
