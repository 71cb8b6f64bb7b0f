"""Recording how actions ended: InProgress -> Success/Failed, in batches.

The action workers ``queue`` outcomes; one task writes whatever has queued as one guarded
statement (``WHERE state = 'InProgress'``: a row cancelled or recorded lost meanwhile is
left as it is, never overwritten). A batch the database refuses is written one by one, so
one unstorable outcome neither blocks the others nor ends the task. Internal faults are
retried with backoff; a stopping executor keeps trying for ``FLUSH_LIMIT`` seconds.
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Protocol

import anyio
from sqlalchemy.ext.asyncio import AsyncConnection

from .._errors import DatabaseError
from .._kinds import FunctionKind, ScheduledFunctionId
from .._runtime import Runtime
from .._store import Claimed, Outcome, StartTime
from .action_claims import ActionClaims
from .outcomes import Tally, failed
from .retrying import keep_trace, retried, settle, will_retry
from .tasks import Signal
from .wakeups import KINDS

logger = logging.getLogger("durafn.executor")
ACTION = FunctionKind.ACTION

FLUSH_LIMIT = 30.0
"""Seconds a stopping executor keeps trying to record action outcomes if the database is
away; after that the rows stay InProgress (never re-run)."""


class Successors(Protocol):
    """Who runs the rows a finish hands on (``_store/claim/handoff.py``): the action pool."""

    def room(self) -> int:
        """How many rows it would take now (0: none, it is not claiming)."""

    def accept(self, rows: list[Claimed]) -> bool:
        """Run these claimed rows; False: it is stopping, and has not taken them."""


class Finisher:
    """Writes queued action outcomes until the executor's stop ``close``s it."""

    def __init__(self, runtime: Runtime, tally: Tally, claims: ActionClaims) -> None:
        self._rt = runtime
        self._tally = tally
        self._claims = claims
        self.successors: Successors | None = None
        """Where the next rows of the finished rows' queues go, if anywhere."""
        # Finish batches whose hand-off found nothing in a row, and how many batches to
        # skip it for: where a queue's next row is rarely first in claim order (1,000
        # queues of interleaved rows), a try per batch cost two statements for nothing,
        # a sixth of that drain on SQLite.
        self._misses = 0
        self._skip = 0
        self._outcomes: list[Outcome] = []
        self._ready = Signal()
        self._closing = False
        self._given_up = False
        self._done = anyio.Event()
        # Shielded: a cancelled host still gets its actions' outcomes recorded; ``close``
        # cancels this scope if the database stays away too long.
        self._scope = anyio.CancelScope(shield=True)
        self._flush_scope: anyio.CancelScope | None = None

    def begin(self) -> None:
        """A new run of the executor (before ``run`` is started)."""
        self._closing = self._given_up = False
        self._done = anyio.Event()
        self._scope = anyio.CancelScope(shield=True)

    def queue(self, outcome: Outcome) -> None:
        """An action ended: write its outcome with the next batch."""
        self._outcomes.append(keep_trace(self._rt, outcome))
        self._ready.fire()

    async def run(self) -> None:
        """Write queued outcomes in batches until closed and every one is written."""
        try:
            with self._scope:
                while True:
                    ready = self._ready.current()
                    if self._outcomes:
                        batch, self._outcomes = self._outcomes, []
                        try:
                            await self.write(batch)
                        except BaseException:
                            self._outcomes[:0] = batch  # cancelled between retries: keep them
                            raise
                    elif self._closing:
                        return
                    else:
                        await ready.wait()
        finally:
            self._done.set()

    async def close(self, unstarted: list[Claimed]) -> None:
        """Every claimed action has ended: return ``unstarted`` to Pending, write what is
        queued, and stop; for at most ``FLUSH_LIMIT`` seconds (or none after ``give_up``)."""
        self._closing = True
        self._ready.fire()
        with anyio.move_on_after(FLUSH_LIMIT) as self._flush_scope:
            if self._given_up:
                self._flush_scope.cancel()
            await self._claims.release(unstarted)
            await self._done.wait()
        self._flush_scope = None
        self._scope.cancel()
        await self._done.wait()
        if self._outcomes:
            self._log_unrecorded(len(self._outcomes))

    def give_up(self) -> None:
        """Stop waiting for outcomes to be written (``stop_now()`` a second time)."""
        self._given_up = True
        if self._flush_scope is not None:
            self._flush_scope.cancel()

    async def write_before_leaving(self, outcomes: list[Outcome]) -> None:
        """Write outcomes even if the caller is being cancelled, for a bounded time."""
        with anyio.CancelScope(shield=True), anyio.move_on_after(FLUSH_LIMIT):
            await self.write(outcomes, hand_on=False)
            return
        self._log_unrecorded(len(outcomes))

    def _log_unrecorded(self, count: int) -> None:
        logger.error(
            "%d action outcomes could not be recorded (%s unavailable); those rows stay "
            "InProgress and are never run again",
            count,
            self._rt.driver.name,
        )

    async def write(self, outcomes: list[Outcome], hand_on: bool = True) -> None:
        """InProgress -> Success/Failed for a batch, retried until the database takes it;
        ``hand_on``: and start the next rows of their queues (``handoff``) if the
        ``successors`` have room."""
        if not outcomes:
            return
        # Rows of named queues free their queues as they end: hand each queue's slot to
        # its next row, or wake the claimers that skipped those queues, here and (NOTIFY)
        # in other processes.
        ended = Counter(o.queue for o in outcomes if o.queue is not None)
        successors = self.successors if hand_on else None
        room = min(len(ended), successors.room()) if ended and successors else 0
        if room and self._skip:
            self._skip -= 1
            room = 0
        written, stuck, handed, refilled = await self._write_batch(outcomes, ended, room)
        # A row whose outcome could not be written at all is still InProgress: it stays
        # "unrecorded", so that adopting an uncertain claim never starts it again.
        self._claims.written(o.id for o in outcomes if o.id not in stuck)
        if written < len(outcomes):
            logger.info(
                "%d finished actions had been finished elsewhere meanwhile (cancelled, or "
                "recorded lost); their rows are left as they are",
                len(outcomes) - written,
            )
        self._tally.record(FunctionKind.ACTION, outcomes)
        if room:
            self._misses = 0 if handed else self._misses + 1
            self._skip = min(2**self._misses, 64) - 1 if self._misses else 0
        if handed:
            self._claims.handed(handed)
            assert successors is not None
            if not successors.accept(handed):
                await self._claims.release(handed)
        if (ended and not refilled) or self._rt.wake_on_finish:
            self._rt.wake(KINDS)
        elif retried(outcomes):
            self._rt.wake({ACTION})
        await self._rt.hooks.finished(ACTION, [o for o in outcomes if o.id not in stuck])

    async def _write_batch(
        self, outcomes: list[Outcome], ended: Counter[str], room: int
    ) -> tuple[int, set[ScheduledFunctionId], list[Claimed], bool]:
        """The batch's finish (and its queues' hand-off, for ``room`` rows), retried through
        faults, one by one if the database refuses it: how many rows it wrote, those it
        could write nothing for, the rows it handed on, and whether every freed slot was
        taken again."""
        queued = bool(ended)
        handed: list[Claimed] = []
        refilled = False
        # Which failed runs are retried, known before their transaction (once: ``settle``
        # turns them Pending, and would decide again after a fault).
        retrying = {o.id for o in outcomes if will_retry(self._rt, o)}
        worker_id = self._claims.worker_id()
        driver = self._rt.driver

        async def _write(conn: AsyncConnection) -> int:
            nonlocal handed, refilled
            now = self._rt.clock.now()
            written = await settle(self._rt, conn, now, outcomes, ACTION, worker_id)
            if room:
                # Started once the finish holds its lock, as a claim's rows are.
                started = StartTime(self._rt.clock)
                handed = await driver.hand_off(
                    conn, now, list(ended), room, worker_id, self._claims.serve, started
                )
            # Every slot these ends freed is taken again: a claimer woken now would
            # find every queue as busy as before (and a claim costs six statements).
            refilled = Counter(r.queue_name for r in handed) == ended
            if queued and not refilled:
                await driver.notify(conn, KINDS)
            return written

        # One autocommit statement unless a queue must be woken, or a run failed or a row
        # has a completion callback and the driver writes it in several statements (a
        # retry, its state and its history commit together; a callback is written with its
        # finish). On PostgreSQL a batch with retries is one statement; without BEGIN and
        # COMMIT its write took 4.1 ms instead of 5.5 (a drain of 20,000 actions, a tenth
        # failing once). A connection lost as it ran may have committed it: run again, it
        # finds the rows moved and says so (counted "finished elsewhere"), as after a
        # COMMIT lost.
        single = not queued and driver.finishes_in_one_statement(outcomes, retrying)
        failures = 0
        while True:
            try:
                written = await self._rt.transaction(
                    _write, doing="recording action outcomes", single_statement=single
                )
                return written, set(), handed, refilled
            except DatabaseError as exc:
                handed, refilled = [], False
                if room:
                    # Its COMMIT may have taken effect: rows started under this worker
                    # that it never heard of. The next claim adopts them (``ActionClaims``).
                    self._claims.uncertain = True
                if not exc.transient:
                    written, stuck = await self._write_one_by_one(outcomes, exc)
                    return written, stuck, [], False
                delay = self._rt.backoff.delay(failures)
                failures += 1
                self._rt.health.fault(exc, f"recording {len(outcomes)} action outcomes", delay)
                await anyio.sleep(delay)

    async def _write_one_by_one(
        self, outcomes: list[Outcome], cause: Exception
    ) -> tuple[int, set[ScheduledFunctionId]]:
        """A batch of outcomes the database refused: write them singly, so that one bad
        outcome (a result it cannot store) neither blocks the others nor kills the finisher.
        Returns how many rows were written and the ids nothing could be written for."""
        logger.warning(
            "recording %d action outcomes failed (%s); writing them one by one",
            len(outcomes),
            cause,
        )
        written = 0
        stuck: set[ScheduledFunctionId] = set()
        worker_id = self._claims.worker_id()
        for outcome in outcomes:
            stuck.add(outcome.id)
            unstorable = failed(outcome, cause)
            unstorable.error = None  # the action ran: this is about its outcome, not a retry
            for attempt in (outcome, unstorable):

                async def _write(conn: AsyncConnection, o: Outcome = attempt) -> int:
                    now = self._rt.clock.now()
                    return await settle(self._rt, conn, now, [o], ACTION, worker_id)

                try:
                    written += await self._rt.transaction(
                        _write, doing="recording an action outcome"
                    )
                    stuck.discard(outcome.id)
                    break
                except DatabaseError as exc:
                    logger.error("could not record the outcome of action %s: %s", outcome.id, exc)
        return written, stuck
