"""Running actions: the dispatcher, its look-ahead, and the pool of action workers.

The dispatcher claims (``ActionClaims``) for the free slots and, when actions are shorter
than a claim's round trip, ahead by as many rows as the workers will start during the next
round trip (``claim_ahead``). Claimed rows queue for a pool of at most ``concurrency``
long-lived worker tasks; each runs queued rows back to back in one cancel scope, which the
``DeadlineWatch`` cancels at an action's time limit, and hands every outcome to the
``Finisher``. A claimed row is started at most once, whatever happens: a row the stop
reaches before it started is handed back unstarted, never run.
"""

from __future__ import annotations

import functools
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import anyio
import anyio.abc
import anyio.lowlevel

from .._cancels import Cancellation
from .._context import ActionCtx
from .._errors import DatabaseError, FunctionTimeoutError
from .._invoke import Invoker, timeout_error
from .._kinds import FunctionKind
from .._registry import ActionRef
from .._runtime import Runtime
from .._store import Claimed, Outcome
from .action_claims import ActionClaims
from .batched import BatchClaims, BatchRunning, Unit
from .config import ExecutorConfig
from .deadlines import DeadlineWatch, Slot
from .finisher import Finisher
from .outcomes import failed, held_back, log_start, stopped, succeeded
from .tasks import Pace, Signal, first_of
from .wakeups import Wakeups

ACTION = FunctionKind.ACTION
AHEAD_HORIZON = 0.25
"""Seconds a row claimed ahead may wait for its worker (``ActionPool.claim_ahead``)."""
STRAGGLER = 4.0
"""An action running this many times the recent pace is a straggler: its slot is not
counted as turning over in the look-ahead."""


class ActionPool(BatchRunning):
    """Claims due actions, runs them on at most ``concurrency`` workers, and stops them.
    A batched action's batch is one unit of the pool: one worker, one slot."""

    def __init__(
        self,
        runtime: Runtime,
        invoker: Invoker,
        config: ExecutorConfig,
        claims: ActionClaims,
        finisher: Finisher,
        wakeups: Wakeups,
    ) -> None:
        self._rt = runtime
        self._invoker = invoker
        self._config = config
        self._claims = claims
        self.batches = BatchClaims(runtime, claims)
        """The claims of batched actions' batches, in ``claims``' ledger."""
        self._finisher = finisher
        finisher.successors = self
        self._record = finisher.queue
        self._wakeups = wakeups
        self.running = 0
        """Claimed and not finished: queued or running."""
        # Claimed actions wait here for one of the long-lived action workers (a pool of
        # at most ``concurrency`` tasks): an anyio task per action cost ~40 us to spawn,
        # more than a no-op action's share of its claim and finish SQL.
        self._ready: deque[Unit] = deque()
        self._idle: deque[anyio.Event] = deque()  # one per idle worker, first in first out
        self._workers = 0
        self._waking = False  # a worker is on its way to take the next queued row
        self._aborting = False  # the grace period is over: cancel, start nothing more
        self._scopes: set[anyio.CancelScope] = set()  # run_claimed()'s actions
        self.slots: set[Slot] = set()  # one per action worker
        self.watch = DeadlineWatch(self.slots)
        self._unstarted: list[Claimed] = []  # claimed, never started, the stop has come
        self._slot_freed = Signal()
        # Recent seconds per action run and per claim round trip: how far to claim ahead.
        self.action_pace = Pace(weight=0.1)
        self.claim_pace = Pace()
        self._dispatcher_done = anyio.Event()
        self._dispatching = False
        self._grace_over = False
        self._grace_scope: anyio.CancelScope | None = None
        self._tg: anyio.abc.TaskGroup | None = None

    def begin(self, tg: anyio.abc.TaskGroup) -> None:
        """A new run of the executor, whose task group ``tg`` the workers run in."""
        self._tg = tg
        self._aborting = self._grace_over = False
        self._dispatcher_done = anyio.Event()
        self._unstarted = []
        self.watch.begin()

    def end(self) -> None:
        """The run has ended; ``run_claimed`` may use the pool afterwards."""
        self._aborting = False

    # -- the dispatcher ------------------------------------------------------------------

    async def dispatch(self) -> None:
        """Claim and queue due actions until the executor stops."""
        stopping = self._wakeups.stopping
        failures = 0
        concurrency = self._config.concurrency
        self._dispatching = True
        try:
            while not stopping.is_set():
                signal = self._wakeups.signal(FunctionKind.ACTION)
                ahead = self.claim_ahead()
                free = concurrency + ahead - self.running
                # A free slot is claimed for at once. Claiming ahead waits until half the
                # look-ahead is free, or short actions would make a claim per row.
                if self.running >= concurrency and free < max(1, ahead // 2):
                    await first_of(self._slot_freed.current().wait, stopping.wait)
                    continue
                want = min(free, concurrency)
                now = self._rt.clock.now()
                started = time.perf_counter()
                try:
                    # No retries inside: this loop backs off itself, and a stop need not
                    # wait for a claim to exhaust its retries against a database that is away.
                    units: list[Unit] = []
                    if self.batches.worth_claiming(signal, now):
                        units += await self.batches.claim(want, now, retries=0)
                        poll = self._wakeups.poll_interval
                        self.batches.claimed(len(units), signal, now, poll)
                    if len(units) < want:
                        units += await self._claims.claim(want - len(units), now, retries=0)
                    failures = 0
                except DatabaseError as exc:
                    delay = self._rt.backoff.delay(failures)
                    failures += 1
                    self._rt.health.fault(exc, "claiming actions", delay)
                    await first_of(stopping.wait, functools.partial(anyio.sleep, delay))
                    continue
                if units:
                    self.claim_pace.add(time.perf_counter() - started)
                self.running += len(units)
                self._ready.extend(units)
                self._wake_a_worker()
                if len(units) < want:  # all that was due at ``now``: as for mutations
                    hint, ready_at = self._claims.hint, self.batches.wake_at
                    await self._wakeups.idle_wait(FunctionKind.ACTION, signal, now, hint, ready_at)
        finally:
            self._dispatching = False
            self._dispatcher_done.set()
            self._wake_all_workers()  # no more rows are coming: idle workers exit

    def room(self) -> int:
        """How many rows a finish may hand on to this pool now (``Finisher.successors``):
        what the dispatcher would claim for; none once it stops claiming."""
        if not self._dispatching or self._wakeups.stopping.is_set():
            return 0
        return max(0, self._config.concurrency + self.claim_ahead() - self.running)

    def accept(self, rows: list[Claimed]) -> bool:
        """Run rows a finish has started (a queue's next row), as if claimed; False once
        the stop has begun (the caller returns them to Pending)."""
        if not self._dispatching or self._wakeups.stopping.is_set():
            return False
        self.running += len(rows)
        self._ready.extend(rows)
        self._wake_a_worker()
        return True

    def claim_ahead(self) -> int:
        """How many rows to hold claimed beyond the free slots (at most ``concurrency``):
        what the workers will start within ``AHEAD_HORIZON`` at the recent pace, and at
        least twice what they start during one claim's round trip. The dispatcher claims
        again when half of them are left, so a claim takes many rows and lands before the
        workers run dry.

        Actions shorter than a claim's round trip otherwise leave the workers idle while
        each claim is on the wire: no-op actions drained at ~9,000/s on PostgreSQL with
        claim and run alternating, ~13,000/s with the next claim overlapping the run (2-core
        machine, interleaved runs). Longer ones too: with 100 slots of 20 ms actions and a
        3 ms round trip, 15 slots free while a claim is on the wire, and a look-ahead that
        counted none of them (it left out every slot whose action had run longer than a
        round trip) reached 0.66 of the ideal rate (issue 53's W1); and 10 slots of 100 ms
        actions made a claim per freed slot, half a commit per job (W4).

        A row claimed ahead waits at most about ``AHEAD_HORIZON`` for its worker; if the
        process is killed meanwhile it is recorded lost, never run, like any claimed action
        (a stop returns it to Pending). Actions longer than the horizon: a claim only for
        slots that are free. A straggler (an action running far past the pace) frees no
        slot soon: only the other slots count.
        """
        action_seconds = self.action_pace.seconds
        if action_seconds <= 0.0:
            return 0
        claim_seconds = self.claim_pace.seconds
        now = time.monotonic()
        straggling = max(claim_seconds, STRAGGLER * action_seconds)
        held = sum(s.row is not None and now - s.started > straggling for s in self.slots)
        turning = self._config.concurrency - held
        reach = max(AHEAD_HORIZON, 2 * claim_seconds)
        return max(0, min(turning, int(turning * reach / action_seconds)))

    # -- the workers ---------------------------------------------------------------------

    def _wake_a_worker(self) -> None:
        """Send one worker for the queued rows; it sends the next if rows remain (below).

        One at a time, not one per row: a worker whose action never waits runs queued rows
        back to back, and 100 workers woken for 100 no-op actions would find the queue
        empty; measured, those wake-ups cost more than the actions.
        """
        if self._waking or not self._ready:
            return
        if self._idle:
            self._waking = True
            self._idle.popleft().set()
        elif self._workers < self._config.concurrency:
            assert self._tg is not None
            self._waking = True
            self._workers += 1
            self._tg.start_soon(self._worker)

    def _wake_all_workers(self) -> None:
        while self._idle:
            self._idle.popleft().set()

    async def _worker(self) -> None:
        """Run queued actions until the dispatcher is done and the queue is empty.
        Shielded: a cancelled host still lets running actions have their grace period;
        only ``stop`` and the deadline watch cancel an action (its slot's scope)."""
        slot = Slot()
        self.slots.add(slot)
        try:
            with anyio.CancelScope(shield=True):
                self._waking = False
                while True:
                    if self._ready:
                        await self._run_queued(slot)
                    elif self._dispatcher_done.is_set():
                        return
                    else:
                        woken = anyio.Event()
                        self._idle.append(woken)
                        await woken.wait()
                        self._waking = False
        finally:
            self._workers -= 1
            self.slots.discard(slot)

    async def _run_queued(self, slot: Slot) -> None:
        """Run queued actions back to back in one cancel scope, until the queue is empty or
        the scope is cancelled (an action's time limit, or the end of a stop's grace period).
        """
        with anyio.CancelScope() as scope:
            slot.scope = scope
            while self._ready and not scope.cancel_called:
                unit = self._ready.popleft()
                self._wake_a_worker()  # more rows: the next worker is on its way
                try:
                    if isinstance(unit, list):
                        await self._run_batch_in_slot(slot, unit)
                    else:
                        await self._run_in_slot(slot, unit)
                finally:
                    self.running -= 1
                    self._slot_freed.fire()
        slot.scope = None

    async def _run_in_slot(self, slot: Slot, row: Claimed) -> None:
        """Run one queued action in its worker's scope and queue how it ended. A
        cancellation is recorded, then goes on for the slot's scope to absorb."""
        if self._aborting:  # the grace period is over: never start it (released by the stop)
            self._unstarted.append(row)
            return
        record = self._record
        if row.after_policy is not None:
            self._rt.dependencies_in_use = True
            if row.after_failed and (instead := held_back(row)) is not None:
                record(instead)  # a row it waited for failed: its after_policy, not a run
                return
        try:
            ref, values, ctx, timeout = self._prepare(row)
        except Exception as exc:
            record(failed(row, exc))
            return
        hooks = self._rt.hooks
        if hooks.active:  # checked here: a call that finds none still cost a coroutine
            await hooks.before(ACTION, row)
        started = time.monotonic()
        slot.row, slot.expired, slot.started, slot.deadline = row, False, started, started + timeout
        slot.interrupted = False
        self.watch.arm(slot.deadline)
        cancels = self._rt.cancels
        cancel = cancels.start(row.id, slot.interrupt if ref.cancel == "interrupt" else None)
        now, worker = self._rt.clock.now(), self._claims.worker_id()
        telemetry = self._rt.telemetry
        run = telemetry.running(ACTION, row, now, worker)
        try:
            try:
                with run:  # its span current inside the function (and its start's line)
                    log_start(row, telemetry.fields)
                    result = await ref.fn(ctx, **values)
            finally:
                cancels.end(row.id)
        except anyio.get_cancelled_exc_class():
            if slot.interrupted and not self._aborting:
                self._cancelled(row)
                raise
            expired = slot.expired and not self._aborting
            record(failed(row, timeout_error(ref, timeout)) if expired else stopped(row))
            raise
        except Exception as exc:
            if cancel.requested:  # raised on its way out after its cancel
                self._cancelled(row)
                return
            record(outcome := failed(row, exc))
            await self._after(outcome)
        except BaseException as exc:  # a group holding a cancellation, a KeyboardInterrupt
            if self._aborting:
                record(stopped(row))
            elif slot.interrupted:
                self._cancelled(row)
            elif slot.expired:
                record(failed(row, timeout_error(ref, timeout)))
            else:
                record(failed(row, exc))
            raise
        else:
            if cancel.requested:  # returned early for its cancel
                self._cancelled(row)
                return
            record(outcome := succeeded(row, ref, result))
            if hooks.active:
                await self._after(outcome)
        finally:
            slot.row = None
            self.action_pace.add(time.monotonic() - started)

    def _cancelled(self, row: Claimed) -> None:
        """An action interrupted by its row's cancel: the cancel wrote its end (Canceled),
        so there is no outcome to write."""
        self._claims.written([row.id])
        if self._rt.telemetry.on:
            self._rt.telemetry.cancelled([row.id])

    async def _after(self, outcome: Outcome) -> None:
        """The ``after`` hooks of an action that returned or raised (one stopped by its
        time limit or a stop has only its ``error`` hooks, once written)."""
        await self._rt.hooks.after(ACTION, outcome)

    def _prepare(
        self, row: Claimed
    ) -> tuple[ActionRef[Any, Any], dict[str, Any], ActionCtx, float]:
        ref = self._rt.registry.get_kind(row.name, ActionRef)
        values = ref.decode_args(row.args)
        return ref, values, self._invoker.action_ctx(row.id), self._invoker.timeouts.for_(ref)

    # -- run_until_idle ------------------------------------------------------------------

    async def run_claimed(self, units: Sequence[Unit]) -> None:
        """Run claimed actions (and batches) to the end, each in a task of its own, and
        write how each ended, also when cancelled (``run_until_idle``)."""
        outcomes: list[Outcome] = []
        try:
            async with anyio.create_task_group() as tg:
                for unit in units:
                    if isinstance(unit, list):
                        tg.start_soon(self._run_batch, unit, outcomes.append)
                    else:
                        tg.start_soon(self._run_one, unit, outcomes.append)
        finally:
            await self._finisher.write_before_leaving(outcomes)

    async def _run_one(self, row: Claimed, record: Callable[[Outcome], None]) -> None:
        """Run one claimed action and ``record`` how it ended, whichever way that was.

        If it is cancelled (a cancelled ``run_until_idle``, or the executor stopping after
        the grace period), it is recorded Failed before the cancellation goes on: a claimed
        action is never run again.
        """
        cancel: Cancellation | None = None
        try:
            # Cancelled before it began: never start it.
            await anyio.lowlevel.checkpoint_if_cancelled()
            if self._aborting:
                raise anyio.get_cancelled_exc_class()()
            if row.after_policy is not None:
                self._rt.dependencies_in_use = True
                if row.after_failed and (instead := held_back(row)) is not None:
                    record(instead)
                    return
            ref, values, ctx, timeout = self._prepare(row)
            await self._rt.hooks.before(ACTION, row)
            # One scope for both ways an action is stopped: its time limit (the deadline)
            # and the end of a stop's grace period (``stop`` cancels it).
            finished = False
            cancels = self._rt.cancels
            with anyio.CancelScope(deadline=anyio.current_time() + timeout) as scope:
                self._scopes.add(scope)
                cancel = running = cancels.start(
                    row.id, scope.cancel if ref.cancel == "interrupt" else None
                )
                now = self._rt.clock.now()
                telemetry = self._rt.telemetry
                run = telemetry.running(ACTION, row, now, self._claims.worker_id())
                try:
                    with run:  # its span current inside the function (and its start's line)
                        log_start(row, telemetry.fields)
                        result = await ref.fn(ctx, **values)
                    finished = True
                finally:
                    self._scopes.discard(scope)
                    cancels.end(row.id)
            if not finished:
                if self._aborting:
                    raise anyio.get_cancelled_exc_class()()
                if running.requested and ref.cancel == "interrupt":
                    self._cancelled(row)
                    return
                raise timeout_error(ref, timeout)
            if running.requested:  # returned early for its cancel
                self._cancelled(row)
                return
            record(outcome := succeeded(row, ref, result))
            await self._after(outcome)
        except anyio.get_cancelled_exc_class():
            record(stopped(row))
            if not self._aborting:
                raise
        except FunctionTimeoutError as exc:
            record(failed(row, exc))
        except Exception as exc:
            if cancel is not None and cancel.requested:  # raised on its way out after its cancel
                self._cancelled(row)
                return
            record(outcome := failed(row, exc))
            await self._after(outcome)

    # -- the stop ------------------------------------------------------------------------

    def end_grace(self) -> None:
        """End the stop's grace period now, or skip it if the stop has not begun."""
        self._grace_over = True
        if self._grace_scope is not None:
            self._grace_scope.cancel()

    async def stop(self, grace_period: float) -> list[Claimed]:
        """Stop claiming (``Wakeups.stop`` has been called), give running actions their
        grace period, cancel the rest; return once every claimed action has ended, with the
        rows that never started (still InProgress under this worker)."""
        # A claim in flight finishes first (it is not interrupted): what it claimed must
        # get the same grace period and the same recording as everything else.
        await self._dispatcher_done.wait()
        with anyio.move_on_after(grace_period) as self._grace_scope:
            if self._grace_over:
                self._grace_scope.cancel()
            while self.running:
                await self._slot_freed.current().wait()
        self._grace_scope = None
        self._aborting = True
        # Each cancelled action records itself Failed (ExecutorShutdownError).
        for slot in self.slots:
            if slot.row is not None and slot.scope is not None:
                slot.scope.cancel()
        for scope in list(self._scopes):
            scope.cancel()
        # Queued rows are set aside unstarted; idle workers exit. One more worker in case
        # every worker is gone while rows are still queued.
        self._wake_all_workers()
        self._wake_a_worker()
        while self.running:
            await self._slot_freed.current().wait()
        unstarted, self._unstarted = self._unstarted, []
        return unstarted
