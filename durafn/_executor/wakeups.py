"""What wakes the executor's claiming loops, and how they sleep when nothing is due.

A loop that found no more work sleeps until the first of: the next row of its kind falls
due (read from the index, not polled), new work is signalled (this process's writes
through ``Runtime.wake``, other processes' through the driver's LISTEN), the fallback poll,
or the stop.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Collection
from typing import TypeVar

import anyio
from sqlalchemy.ext.asyncio import AsyncConnection

from .._kinds import FunctionKind
from .._runtime import Runtime
from .._store import FastPathHint
from .tasks import Signal, first_of, shielded

T = TypeVar("T")

KINDS = (FunctionKind.MUTATION, FunctionKind.ACTION)
RECHECK = 0.05
"""The first look-again delay after a claim skipped a queue or key another claim held:
about one mutation batch (``batch_time``), the longest a claim holds its locks."""


class Wakeups:
    """The work signals (one per kind), the stop, and the idle wait."""

    def __init__(self, runtime: Runtime, poll_interval: float) -> None:
        self._rt = runtime
        self.poll_interval = poll_interval
        # Per kind, so that new mutations do not send the action dispatcher into a claim
        # transaction for nothing (on SQLite it would queue for the one write lock).
        self._work = {kind: Signal() for kind in KINDS}
        self.stopping = anyio.Event()
        """Set when the running executor starts to stop: loops claim nothing more."""

    def begin(self) -> None:
        """A new run of the executor: not stopping."""
        self.stopping = anyio.Event()

    def stop(self) -> None:
        """Stop the loops: set ``stopping`` and wake every loop that sleeps."""
        self.stopping.set()
        self.on_wake(KINDS)

    def on_wake(self, kinds: Collection[FunctionKind]) -> None:
        """Rows of ``kinds`` were committed (here or, on PostgreSQL, anywhere)."""
        for kind in kinds:
            if (signal := self._work.get(kind)) is not None:
                signal.fire()

    def signal(self, kind: FunctionKind) -> anyio.Event:
        """The event the next wake-up for ``kind`` sets: take it before a claim."""
        return self._work[kind].current()

    async def idle_wait(
        self,
        kind: FunctionKind,
        signal: anyio.Event,
        claimed_at: float,
        hint: FastPathHint,
        ready_at: float | None = None,
    ) -> None:
        """Sleep until the next row of ``kind`` is due, new work is signalled, or the poll.

        ``claimed_at`` is when the claim that found nothing ran: rows due by then are all
        taken (locked by another lane or executor), so only later ones are waited for.
        ``hint``: what the claim saw. Its visit of the flow keys wakes the wait when a
        spent rate budget allows a start again, and keeps it from sleeping while keys are
        left to visit; a queue or key it skipped because another claim held it makes it
        look again after ``RECHECK`` real seconds, doubling while that goes on (a claim
        that holds a lock and takes nothing sends no wake-up). ``ready_at``: when a
        batched action's batch the claim left will be ready.
        """
        flow = hint.flow
        if self.stopping.is_set() or flow.after:
            return
        if hint.contended:
            hint.recheck = min(self.poll_interval, 2 * hint.recheck or RECHECK)
        else:
            hint.recheck = 0.0
        rt = self._rt
        try:
            next_due = await shielded(
                self._read(functools.partial(rt.driver.next_due, kind=kind, after=claimed_at))
            )
        except Exception as exc:
            if not rt.driver.is_transient(exc):
                raise rt.driver.wrap(exc, f"looking for the next due {kind}") from exc
            # The database is away: the next claim will retry through the fault; wait a
            # little first rather than spin.
            rt.health.fault(exc, f"looking for the next due {kind}")
            await first_of(
                signal.wait, functools.partial(anyio.sleep, min(self.poll_interval, 1.0))
            )
            return
        deadline = rt.clock.now() + self.poll_interval
        for at in (next_due, flow.wake_at, ready_at):
            if at is not None:
                deadline = min(deadline, at)
        until = functools.partial(rt.clock.sleep_until, deadline)
        if hint.recheck:  # real time: how long another claim holds a lock
            await first_of(signal.wait, until, functools.partial(anyio.sleep, hint.recheck))
        else:
            await first_of(signal.wait, until)

    async def _read(self, body: Callable[[AsyncConnection], Awaitable[T]]) -> T:
        # A lane goes through this read after every batch that leaves it idle, and work
        # that arrives meanwhile waits for it: on PostgreSQL one autocommit round trip, not
        # three (BEGIN, SELECT, COMMIT; measured on back-to-back start-lag probes, 0.6 ms).
        async with self._rt.engine.connect() as conn:
            await conn.execution_options(
                **self._rt.connection_options(read_only=True, single_statement=True)
            )
            async with conn.begin():
                return await body(conn)
