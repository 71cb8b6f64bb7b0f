"""Running mutations: the lanes, each a loop of ``GroupCommit``es, and what a lane does
when a batch fails.

A lane claims what fits in ``batch_time`` at the recent pace, runs the batch, and goes
idle (``Wakeups.idle_wait``) once a claim took less than it asked for. Internal faults
(lost connection, deadlock, "database is locked") roll the batch back and retry it after a
capped, jittered backoff; they never turn a row Failed. A failure the batch's own
statements hit (typically user code that left the transaction unusable) is narrowed down
by escalating the ``Mode``: savepoints, then one row per transaction, then that row is
recorded Failed alone. A few batches later the lane is optimistic again.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Callable

import anyio
from sqlalchemy.ext.asyncio import AsyncConnection

from .._errors import DurafnError
from .._invoke import Invoker
from .._kinds import FunctionKind, ScheduledFunctionId
from .._runtime import Runtime, one_line
from .._store import Claimed, FastPathHint, LevelFloor
from .config import ExecutorConfig
from .group_commit import BatchRestart, BatchTimeout, GroupCommit, Mode
from .outcomes import Tally, failed
from .retrying import settle
from .tasks import Pace, first_of, shielded
from .wakeups import Wakeups

logger = logging.getLogger("durafn.executor")


class MutationLanes:
    """Runs due mutations in batches: ``lane`` in the background, ``run_batch`` once."""

    def __init__(
        self,
        runtime: Runtime,
        invoker: Invoker,
        config: ExecutorConfig,
        tally: Tally,
        wakeups: Wakeups,
        worker_id: Callable[[], str],
    ) -> None:
        self._rt = runtime
        self._worker_id = worker_id
        self._invoker = invoker
        self._config = config
        self._tally = tally
        self._wakeups = wakeups
        self._mode = Mode.OPTIMISTIC
        self._mode_batches = 0  # batches left before the mode reverts to optimistic
        self.pace = Pace()
        """Recent wall seconds per mutation run, for the claim size."""
        self.hint = FastPathHint()
        self._floor = LevelFloor(hold=config.batch_time)
        self._watching = False
        """An idle lane is in ``Wakeups.idle_wait``: the other idle lanes park."""
        self._parked: deque[anyio.Event] = deque()

    async def lane(self) -> None:
        """Run batches until the executor stops; sleep while nothing is due.

        Of the idle lanes one watches for work (``Wakeups.idle_wait``) and the others
        park, so that a wake-up sends one lane to claim, not every lane (Graphile
        Worker's nudge). Every wake-up used to send all four lanes of a PostgreSQL
        executor into a claim and a next-due read: 21.7 statements per row for mutations
        scheduled one at a time to an idle executor, 10.7 now (the scheduling's own
        included), and one serial queue of actions drained 81-107 rows/s against 111-131
        now (README). A lane whose claim took all it asked for unparks another
        (more may be due), and so does the watcher as it goes to claim: the unparked lane
        claims too, then watches in its place, so that work arriving while a long batch
        runs finds a lane.
        """
        stopping = self._wakeups.stopping
        # The lane's own: whether its last claim skipped a key or queue another held
        # decides whether its idle wait looks again soon, and a shared flag was rewritten
        # by the other lanes' claims (one that met no contention cleared it, and the lane
        # then slept until its poll). The flow keys' cursor stays one for all lanes.
        hint = FastPathHint()
        hint.flow = self.hint.flow
        while not stopping.is_set():
            signal = self._wakeups.signal(FunctionKind.MUTATION)
            now = self._rt.clock.now()
            _, full = await self.run_batch(now, hint=hint)
            if full:
                self._unpark_one()
                continue
            if signal.is_set():  # woken during the batch: claim again
                continue
            if self._watching:
                await self._park(stopping)
                continue
            # Everything due at ``now`` that no one else holds is done: rows due since
            # then, or scheduled by this batch, are found by the next-due read (or their
            # wake-up), so a second claim that would find nothing is not needed.
            self._watching = True
            try:
                await self._wakeups.idle_wait(FunctionKind.MUTATION, signal, now, hint)
            finally:
                self._watching = False
            self._unpark_one()

    async def _park(self, stopping: anyio.Event) -> None:
        """Wait until another lane sends this one to claim, or the executor stops."""
        woken = anyio.Event()
        self._parked.append(woken)
        try:
            await first_of(woken.wait, stopping.wait)
        finally:
            if not woken.is_set():
                self._parked.remove(woken)

    def _unpark_one(self) -> None:
        if self._parked:
            self._parked.popleft().set()

    async def run_batch(
        self,
        now: float | None = None,
        *,
        timed: bool = True,
        only: list[ScheduledFunctionId] | None = None,
        hint: FastPathHint | None = None,
    ) -> tuple[int, bool]:
        """One batch, retried through internal faults; returns how many rows it finished,
        and whether its claim took all it asked for (then more may be due already).

        ``now`` is the time to claim at (default: the clock's now). ``timed``: stop at
        ``batch_time`` (``run_until_idle`` does not, so that its round limit counts
        rounds of whole batches). ``only``: run these rows, due or not (inline mode).
        ``hint``: a lane's (default: ``self.hint``).
        """
        rt = self._rt
        failures = 0
        while True:
            mode = self._mode
            size = 1 if mode is Mode.ALONE else self.claim_size(timed)
            batch = GroupCommit(
                rt,
                self._invoker,
                mode,
                self.pace,
                self._config.serve,
                self.hint if hint is None else hint,
                self._worker_id(),
                # Lanes skip the levels another lane has just taken the rest of; not in
                # run_until_idle, whose claims must come out in priority order.
                self._floor if timed else None,
                only,
            )
            try:
                await shielded(batch.run(now, size, self._config.batch_time if timed else math.inf))
            except BatchRestart:
                await self._count_rolled_back(batch.begun)
                self._escalate(Mode.SAVEPOINTS)
                continue
            except BatchTimeout as timeout:
                await self._count_rolled_back([r for r in batch.begun if r is not timeout.row])
                await self._fail_alone(timeout.row, timeout.error)
                return 1, True
            except Exception as exc:
                if rt.driver.is_transient(exc):
                    await self._back_off(batch, exc, failures)
                    failures += 1
                    continue
                if await self._narrow_down(batch, exc, mode):
                    return 1, True
                continue
            return await self._committed(batch, mode, size)

    async def _back_off(self, batch: GroupCommit, exc: Exception, failures: int) -> None:
        """A fault retrying the batch can cure: its rows' runs counted, then a backoff."""
        rt = self._rt
        delay = rt.backoff.delay(failures)
        self._tally.stats["retries"] += 1
        rt.health.fault(exc, f"running a batch of {len(batch.claimed)} mutations", delay)
        await self._count_rolled_back(batch.begun)
        try:
            await anyio.sleep(delay)
        except anyio.get_cancelled_exc_class():
            # Stopped while backing off: the batch rolled back, so its rows are Pending
            # again, and this lane will not claim them. Executors that skipped them while
            # they were locked may be idle until their poll: tell them.
            with anyio.CancelScope(shield=True):
                await self._announce_given_back(batch)
            raise

    async def _announce_given_back(self, batch: GroupCommit) -> None:
        """Wake every executor of mutations (NOTIFY; this process's at once): the rows a
        stopped lane's rolled-back batch held are free."""
        if not batch.claimed:
            return
        rt = self._rt
        kinds = {FunctionKind.MUTATION}

        async def _notify(conn: AsyncConnection) -> None:
            await rt.driver.notify(conn, kinds)

        try:
            await rt.transaction(
                _notify, doing="announcing mutations given back", single_statement=True
            )
        except DurafnError as exc:  # the database is away: their poll finds them
            logger.info("could not announce the mutations given back (%s)", one_line(exc))
        rt.wake(kinds)

    async def _narrow_down(self, batch: GroupCommit, exc: Exception, mode: Mode) -> bool:
        """A statement of the batch itself failed, not a mutation: typically user code left
        the transaction unusable (a database error it swallowed). Narrow it down:
        savepoints, then one row per transaction, then fail that row (True: done so)."""
        claimed = batch.claimed
        if isinstance(exc, DurafnError):
            raise exc
        if not claimed:  # durafn's own claim failed: nothing of the user's ran
            raise self._rt.driver.wrap(exc, "claiming due mutations") from exc
        if mode is Mode.ALONE:
            await self._fail_alone(claimed[0], exc)
            return True
        await self._count_rolled_back(batch.begun)
        logger.warning(
            "mutation batch of %d failed outside any mutation (%s); re-running it %s",
            len(claimed),
            one_line(exc),
            "with savepoints" if mode is Mode.OPTIMISTIC else "one row at a time",
        )
        self._escalate(Mode.SAVEPOINTS if mode is Mode.OPTIMISTIC else Mode.ALONE)
        return False

    async def _committed(self, batch: GroupCommit, mode: Mode, size: int) -> tuple[int, bool]:
        """What a batch that ran does next: counts, wake-ups, hooks, inline rows; how many
        rows it finished, and whether more may be due already (its claim took all it asked
        for, or it stopped at ``batch_time`` before running all it claimed)."""
        rt = self._rt
        n = len(batch.outcomes)
        if batch.claimed:  # committed
            rt.health.ok()
            self._tally.record(FunctionKind.MUTATION, batch.outcomes)
            rt.wake(batch.woken)
            await rt.hooks.finished(FunctionKind.MUTATION, batch.outcomes)
            await rt.hooks.enqueued(batch.enqueued)
            await rt.run_inline(batch.inline)
        if mode is not Mode.OPTIMISTIC and n:
            self._mode_batches -= 1
            if self._mode_batches <= 0:
                self._mode = Mode.OPTIMISTIC
        return n, len(batch.claimed) == size or n < len(batch.claimed)

    def claim_size(self, timed: bool) -> int:
        """How many mutations to claim: what fits in ``batch_time`` at the recent pace.

        Claiming more than a batch will run costs twice on PostgreSQL: the surplus rows are
        locked and read for nothing, and the other lanes' SKIP LOCKED scans must step over
        them. Measured with mutations that each insert a row: claiming 256 at a time to run
        a few dozen drained 1,500 /s, claiming what fits 2,600 /s.

        The pace is wall time per mutation, other lanes' turns on the event loop included:
        that is how long the batch holds its locks.
        """
        size = self._config.batch_size
        if timed and self.pace.seconds > 0:
            size = min(size, 1 + int(self._config.batch_time / self.pace.seconds))
        return size

    def _escalate(self, mode: Mode) -> None:
        """Run the next few batches more carefully (they revert to optimistic after)."""
        order = list(Mode)  # definition order: least to most careful
        if order.index(mode) > order.index(self._mode):
            self._mode = mode
        self._mode_batches = 2

    async def _fail_alone(self, row: Claimed, exc: BaseException) -> None:
        """Record one mutation Failed in its own transaction (after its batch rolled back)."""
        outcome = failed(row, exc)

        async def _write(conn: AsyncConnection) -> int:
            now = self._rt.clock.now()
            kind = FunctionKind.MUTATION
            return await settle(self._rt, conn, now, [outcome], kind, self._worker_id())

        if await self._rt.transaction(_write, doing="recording a failure"):
            self._tally.record(FunctionKind.MUTATION, [outcome])
            if outcome.retry_at is not None:
                self._rt.wake({FunctionKind.MUTATION})
            await self._rt.hooks.finished(FunctionKind.MUTATION, [outcome])

    async def _count_rolled_back(self, rows: list[Claimed]) -> None:
        """Count the runs of a batch that rolled back: each began, so each is an attempt
        (the row's final run is counted as it finishes). Counted whatever the row's state
        is by now: on PostgreSQL another lane may have claimed and finished it already.

        The backoff itself is the lane's sleep (real time): the rows stay due, so another
        executor may take them meanwhile, and a fake clock does not strand them."""
        if not rows:
            return

        async def _write(conn: AsyncConnection) -> None:
            await self._rt.driver.count_retry(conn, [r.id for r in rows])

        try:
            await self._rt.transaction(_write, doing="counting the attempts of a batch")
        except Exception as exc:  # the database may still be away; the retry will tell
            logger.info("could not count the attempts (%s)", one_line(exc))
