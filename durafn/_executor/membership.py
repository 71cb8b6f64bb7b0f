"""Worker membership: this executor's row in ``_durafn_workers``, its heartbeat, and the
rescue of actions whose worker stopped heartbeating.

A running executor (or a ``run_until_idle`` that runs actions) is a worker. Its id is new
for every run, so a restarted worker never inherits its predecessor's rows. The rescue is
what keeps "at most once" honest after a crash: the lost worker's InProgress actions are
recorded Failed (``WorkerLostError``), never run again.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import anyio
from sqlalchemy.ext.asyncio import AsyncConnection

from .._errors import ArgumentError, DurafnError, WorkerLostError
from .._kinds import FunctionKind, State
from .._runtime import Runtime
from .._store import LostAction, Outcome
from .config import ExecutorConfig
from .outcomes import log_fields
from .retrying import decide
from .tasks import Signal, shielded

logger = logging.getLogger("durafn.executor")


class Membership:
    """Registration, heartbeats and lost-worker rescue for one executor.

    ``on_leave`` is called when the membership ends: what this run left unrecorded is from
    then on the business of the lost-worker rescue. ``progress`` is fired when a rescue
    finished rows.
    """

    def __init__(
        self,
        runtime: Runtime,
        config: ExecutorConfig,
        progress: Signal,
        on_leave: Callable[[], None],
    ) -> None:
        self._rt = runtime
        self._config = config
        self._progress = progress
        self._on_leave = on_leave
        self.worker_id = self._new_worker_id()
        self.depth = 0
        """How many holders the membership has now (nested ``hold`` blocks)."""
        self._owner = ""

    def _new_worker_id(self) -> str:
        # Unique per run of an executor: a restart never inherits its predecessor's rows.
        name = self._config.worker_name or f"{socket.gethostname()}:{os.getpid()}"
        return f"{name}:{os.urandom(4).hex()}"

    @asynccontextmanager
    async def hold(self, owner: str) -> AsyncIterator[None]:
        """Be a registered worker for the block: a row in ``_durafn_workers`` renewed every
        ``heartbeat_interval``, removed at the end. Re-entrant only inside a running
        executor, which outlives whatever runs within it; the heartbeat belongs to the
        first holder, so any other overlap would leave the others without one."""
        if self.depth and (owner == "executor" or self._owner != "executor"):
            raise ArgumentError(
                f"this executor is already running ({self._owner}); give each "
                "concurrent caller its own executor (app.executor())"
            )
        if self.depth:
            self.depth += 1
            try:
                yield
            finally:
                self.depth -= 1
            return
        self.depth = 1
        self._owner = owner
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._heartbeat_loop)
                try:
                    yield
                finally:
                    tg.cancel_scope.cancel()
        finally:
            self.depth = 0
            await self._unregister()
            # A new identity for the next run.
            self.worker_id = self._new_worker_id()
            self._on_leave()

    async def _unregister(self) -> None:
        """Remove our row. If the database is away, it is left to go stale: other workers
        then treat whatever this worker left InProgress as lost, which is what it is."""

        async def _delete(conn: AsyncConnection) -> None:
            await self._rt.driver.unregister_worker(conn, self.worker_id)

        with anyio.CancelScope(shield=True), anyio.move_on_after(5.0):
            try:
                await self._rt.transaction(_delete, doing="unregistering the worker")
                logger.info("worker %s stopped", self.worker_id)
            except DurafnError as exc:
                logger.warning("worker %s could not unregister (%s)", self.worker_id, exc)

    async def _heartbeat_loop(self) -> None:
        """Renew our heartbeat; once this worker's own heartbeats have all been on time
        for a whole ``worker_timeout``, also rescue the actions of workers that stopped.

        "On time" is what keeps a pause from being mistaken for dead workers: after a
        database outage, a lock held for long, or a stopped or suspended process, the
        others have not had their chance to renew yet, and neither had we. A beat that
        fails, takes longer than an interval, or comes more than two intervals after the
        previous one starts the streak again, so the window a rescue looks at
        (``now - worker_timeout`` to now) is one in which we beat on schedule.
        """
        clock = self._rt.clock
        interval = self._config.heartbeat_interval
        healthy_since: float | None = None
        last_beat: float | None = None
        registered = False
        while True:
            deadline = clock.now() + interval
            try:
                started = clock.now()
                beat = await shielded(self._beat(registered))
                registered = True
                late = last_beat is not None and beat - last_beat > 2 * interval
                if healthy_since is None or late or beat - started > interval:
                    healthy_since = beat
                last_beat = beat
                if beat - healthy_since >= self._config.worker_timeout:
                    await shielded(self._rescue_lost(clock.now()))
            except DurafnError as exc:
                healthy_since = last_beat = None
                self._rt.health.fault(exc, "renewing the worker heartbeat")
            except Exception:
                # A bug, not the database: say so loudly, but keep the worker alive.
                healthy_since = last_beat = None
                logger.exception("the heartbeat of worker %s failed", self.worker_id)
            await clock.sleep_until(deadline)

    async def _beat(self, registered: bool) -> float:
        """Renew our row, or insert it (the first beat registers the worker); returns the
        time written.

        Registering in the background lets the executor start at once. Claims made before
        it commits are safe: a row is never rescued sooner than ``worker_timeout`` after
        its claim, and the first beat is due long before that.
        """
        rt = self._rt
        written = 0.0

        async def _renew(conn: AsyncConnection) -> bool:
            nonlocal written
            # Read the time only now, with the lock held: a beat that waited for it must
            # not write an already stale time. Update first even when registering: a first
            # beat whose COMMIT was lost may have inserted the row already.
            written = rt.clock.now()
            if await rt.driver.heartbeat(conn, self.worker_id, written):
                return True
            await rt.driver.register_worker(
                conn,
                self.worker_id,
                socket.gethostname(),
                os.getpid(),
                self._config.concurrency,
                written,
                self._config.serve,
            )
            return False

        existed = await rt.transaction(_renew, doing="renewing the worker heartbeat")
        if not registered:
            logger.info(
                "worker %s started (%d actions at once, at most %d database connections)",
                self.worker_id,
                self._config.concurrency,
                rt.connections,
            )
        elif not existed:
            logger.error(
                "worker %s had been declared lost by another worker (no heartbeat for %gs: "
                "was the event loop blocked, or the database unreachable?); the actions it "
                "was running were recorded Failed and their results will be discarded; "
                "registered again",
                self.worker_id,
                self._config.worker_timeout,
            )
        return written

    async def _rescue_lost(self, now: float) -> None:
        timeout = self._config.worker_timeout
        message = (
            "the worker running this action ({worker}) sent no heartbeat for "
            f"{timeout:g}s: it was killed, crashed, or lost its database connection. The "
            "action may have run partly or fully, or not at all (claimed ahead of a free "
            "slot), and its outcome was not recorded"
        )
        rt = self._rt

        rows: list[LostAction] = []

        async def _rescue(conn: AsyncConnection) -> list[Outcome]:
            lost = await rt.driver.find_lost(conn, now - timeout, message)
            rows[:] = lost
            outcomes = [_lost_outcome(rt, now, row) for row in lost]
            # Straight from InProgress: a retried row never passes through Failed, which
            # would release the rows waiting for it (``after=``) before it ran again.
            await rt.driver.fail_lost(
                conn, now, [r for r, o in zip(lost, outcomes, strict=True) if o.retry_at is None]
            )
            # Each run into its row's history, on the worker that lost it: with its retry,
            # or as it stays Failed.
            for row, outcome in zip(lost, outcomes, strict=True):
                if outcome.retry_at is not None:
                    await rt.driver.retry_rows(
                        conn, now, [outcome], State.IN_PROGRESS, row.worker_id, failed=1
                    )
                else:
                    await rt.driver.record_failures(conn, now, [outcome], row.worker_id)
            if any(o.retry_at is not None for o in outcomes):
                await rt.driver.notify(conn, {FunctionKind.ACTION})
            final = [o for o in outcomes if o.retry_at is None]
            await rt.driver.write_completions(conn, now, final)
            # The lost workers' rows go, each recorded with what was done to its actions.
            rescued = _rescued_counts(lost, outcomes)
            gone = await rt.driver.remove_lost_workers(
                conn, now, now - timeout, self.worker_id, rescued
            )
            if gone:
                logger.warning(
                    "%d worker(s) declared lost (no heartbeat for %gs); their rows removed",
                    gone,
                    timeout,
                )
            return outcomes

        lost = await rt.transaction(_rescue, doing="rescuing the actions of lost workers")
        if any(o.retry_at is not None for o in lost):
            rt.wake({FunctionKind.ACTION})
        # Counted as lost, not as the Failed row it became; each run's rescue is a span,
        # whose fields its line carries.
        runs = rt.telemetry.lost(rows, self.worker_id) if lost and rt.telemetry.on else {}
        for o in lost:
            retried = o.retry_at is not None
            state = State.PENDING if retried else State.FAILED
            logger.warning(
                "action %s (%s) InProgress -> %s: its worker was lost (%s)",
                o.id,
                o.name,
                "Pending, to be retried" if retried else "Failed",
                o.error_message,
                extra=log_fields(FunctionKind.ACTION, o.id, o.name, state, runs.get(o.id)),
            )
        if lost:
            self._progress.fire()
            await rt.hooks.finished(FunctionKind.ACTION, lost, measured=False)


def _lost_outcome(rt: Runtime, now: float, row: LostAction) -> Outcome:
    """A lost action's outcome: Failed with a WorkerLostError, unless its retry policy
    puts it back to Pending (``decide``)."""
    outcome = Outcome(
        row.id,
        State.FAILED,
        error_type="durafn.WorkerLostError",
        error_message=row.error_message,
        name=row.name,
        # A lost keyed row frees its key's slot: wake the claimers of it.
        queue=row.queue_name or row.flow_key,
        flow_key=row.flow_key,
        error=WorkerLostError(row.error_message),
        on_complete=row.on_complete,
    )
    decide(rt, now, outcome, row.retry)
    return outcome


def _rescued_counts(
    lost: list[LostAction], outcomes: list[Outcome]
) -> dict[str | None, tuple[int, int]]:
    """(failed, retried) per lost worker, for its ``_durafn_lost_workers`` record."""
    rescued: dict[str | None, tuple[int, int]] = {}
    for row, outcome in zip(lost, outcomes, strict=True):
        failed, retried = rescued.get(row.worker_id, (0, 0))
        again = outcome.retry_at is not None
        rescued[row.worker_id] = (failed + (not again), retried + again)
    return rescued
