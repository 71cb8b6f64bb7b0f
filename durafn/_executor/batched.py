"""Batched actions (``durafn.Batch``) in the executor: claiming their batches
(``BatchClaims``, the store's ``claim/batched.py``), and running a batch (``BatchRunning``):
one call of the function with the items of its rows, and one outcome per row: its result,
its ``ItemFailed`` error, or the call's error for every row.

A batch is one unit of the action pool: one worker, one slot of ``concurrency``, one time
limit (the function's, for the whole call). A row whose cancel was requested while its
batch ran is left Canceled (the cancel wrote it); the others keep their outcomes. Its
rows are never started twice: a batch the stop reaches before it starts is handed back
unstarted, every row of it.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from typing import Any

import anyio
import anyio.lowlevel
from sqlalchemy.ext.asyncio import AsyncConnection

from .._batching import BatchActionRef, ItemFailed, split_results
from .._cancels import Cancellation
from .._errors import DatabaseError
from .._invoke import Invoker, timeout_error
from .._kinds import FunctionKind
from .._runtime import Runtime
from .._store import BatchClaim, BatchSpec, Claimed, Outcome, StartTime
from .action_claims import ActionClaims
from .deadlines import DeadlineWatch, Slot
from .outcomes import failed, log_start, stopped, succeeded
from .tasks import Pace

ACTION = FunctionKind.ACTION


class BatchClaims:
    """Claims the app's batched actions' ready batches for one worker, in the ledger of
    its ``ActionClaims``, and knows when a claim of them is worth making."""

    def __init__(self, runtime: Runtime, claims: ActionClaims) -> None:
        self._rt = runtime
        self._claims = claims
        self.wake_at: float | None = None
        """When a batch the last claim left will be ready (the idle wait's)."""
        self._next_due: float | None = None  # the next batched row's due time, as read
        self._specs_of: tuple[int, list[BatchSpec]] = (-1, [])  # by registry version
        # The work signal an empty claim was made under, and when one is worth making
        # again with no new work signalled (``worth_claiming``).
        self._signal: object = None
        self._check_at = 0.0
        self._turn = 0  # which batched function a claim begins with

    @property
    def batching(self) -> bool:
        """The app has batched actions: claims take their batches."""
        return bool(self._specs())

    def _specs(self) -> list[BatchSpec]:
        registry = self._rt.registry
        version, specs = self._specs_of
        if version != registry.version:  # a function registered since
            specs = [
                BatchSpec(ref.name, ref.batch.max_size, ref.batch.max_wait, bool(ref.batch.key))
                for ref in registry.refs()
                if isinstance(ref, BatchActionRef)
            ]
            self._specs_of = registry.version, specs
        return specs

    def worth_claiming(self, signal: object, now: float) -> bool:
        """Whether the dispatcher should claim batches now: the app has batched actions,
        and the last claim of them took some, or work was signalled since it found none,
        or a batch it left is ready, or a batched row falls due, or the poll has come. (A
        claim of batches before every claim of other actions halved the drain of those
        on SQLite, 1,349 against 2,476 rows/s.)"""
        if not self.batching:
            return False
        return signal is not self._signal or now >= self._check_at

    def claimed(self, found: int, signal: object, now: float, poll: float) -> None:
        """What the dispatcher's claim found (``found`` batches), under the work
        ``signal`` taken before it."""
        if found:
            self._signal = None  # more may be ready: claim again
            return
        self._signal = signal
        check = now + poll
        for at in (self.wake_at, self._next_due):
            if at is not None:
                check = min(check, at)
        self._check_at = check

    async def claim(
        self, limit: int, now: float | None = None, *, retries: int | None = None
    ) -> list[list[Claimed]]:
        """Pending -> InProgress for up to ``limit`` ready batches, committed on return.
        A claim whose COMMIT failed leaves its rows to the next ``ActionClaims.claim``'s
        adoption (each then runs alone, a batch of one)."""
        specs = self._specs()
        # Each function first in turn: a claim with little room would otherwise give it
        # all to the first function registered while that has ready batches.
        self._turn = (self._turn + 1) % max(1, len(specs))
        specs = specs[self._turn :] + specs[: self._turn]
        now = self._rt.clock.now() if now is None else now
        claims, driver = self._claims, self._rt.driver
        worker_id = claims.worker_id()

        async def _claim(conn: AsyncConnection) -> BatchClaim:
            started = StartTime(self._rt.clock)  # read once the claim holds its lock
            return await driver.claim_batches(
                conn, now, worker_id, specs, limit, claims.serve, started
            )

        async with claims.claiming():
            try:
                found = await self._rt.transaction(
                    _claim, doing="claiming batched actions", retries=retries
                )
            except DatabaseError:
                claims.uncertain = True
                raise
            for rows in found.batches:
                claims.handed(rows)
        self.wake_at, self._next_due = found.wake_at, found.next_due
        return found.batches


Unit = Claimed | list[Claimed]
"""What the action pool runs: a row, or a batched action's batch of rows."""


class _Call:
    """One batch's call: the rows whose items could be read, their items, their cancels;
    and how each row's outcome is recorded."""

    def __init__(self, rt: Runtime, rows: list[Claimed], record: Callable[[Outcome], None]) -> None:
        self.record = record
        self.rows: list[Claimed] = []
        self.items: list[Any] = []
        self.cancels: list[Cancellation] = []
        try:
            self.ref = rt.registry.get_kind(rows[0].name, BatchActionRef)
        except Exception as exc:
            for row in rows:
                record(failed(row, exc))
            return
        for row in rows:
            try:
                self.items.append(self.ref.item_of(row.args))
            except Exception as exc:  # this item no longer fits: it alone fails
                record(failed(row, exc))
            else:
                self.rows.append(row)

    def fail(
        self, exc: BaseException | None, cancelled: Callable[[Claimed], None]
    ) -> list[Outcome]:
        """Every row failed with ``exc`` (None: the stop's ``ExecutorShutdownError``)."""
        outcomes = []
        for row, cancel in zip(self.rows, self.cancels, strict=True):
            if cancel.requested and exc is not None:
                cancelled(row)
            else:
                outcome = stopped(row) if exc is None else failed(row, exc)
                self.record(outcome)
                outcomes.append(outcome)
        return outcomes

    def settle(self, results: object, cancelled: Callable[[Claimed], None]) -> list[Outcome]:
        """Each row's outcome from the call's results (a ``BatchResultError`` for all if
        they are not one per item)."""
        try:
            each = split_results(results, len(self.rows), self.ref.name)
        except Exception as exc:
            each = [ItemFailed(exc)] * len(self.rows)
        outcomes = []
        for row, cancel, result in zip(self.rows, self.cancels, each, strict=True):
            if cancel.requested:
                cancelled(row)
                continue
            if isinstance(result, ItemFailed):
                outcome = failed(row, result.error)
            else:
                outcome = succeeded(row, self.ref, result)
            self.record(outcome)
            outcomes.append(outcome)
        return outcomes


class BatchRunning:
    """The action pool's part that runs batches (a base class of ``ActionPool``)."""

    _rt: Runtime
    _invoker: Invoker
    _claims: ActionClaims
    _record: Callable[[Outcome], None]
    _aborting: bool
    _unstarted: list[Claimed]
    _scopes: set[anyio.CancelScope]
    watch: DeadlineWatch
    action_pace: Pace

    def _cancelled(self, row: Claimed) -> None: ...  # ActionPool's

    async def _begin_batch(self, call: _Call) -> tuple[Any, contextlib.ExitStack, float] | None:
        """The cancels, the hooks before each row and the runs' telemetry begun: the
        context, and the timeout of the call; None if that failed (every row recorded
        failed with the error, as a run that cannot be prepared)."""
        rt, rows = self._rt, call.rows
        call.cancels = [rt.cancels.start(row.id, None) for row in rows]
        runs = contextlib.ExitStack()
        try:
            if rt.hooks.active:
                for row in rows:
                    await rt.hooks.before(ACTION, row)
            now, worker = rt.clock.now(), self._claims.worker_id()
            for row in rows:  # a span each, the call's context the last one's
                runs.enter_context(rt.telemetry.running(ACTION, row, now, worker))
                log_start(row, rt.telemetry.fields)  # in its own span's context
            ctx = self._invoker.action_ctx(rows[0].id)
            return ctx, runs, self._invoker.timeouts.for_(call.ref)
        except Exception as exc:
            runs.close()
            self._end_batch(call)
            call.fail(exc, self._cancelled)
            return None

    def _end_batch(self, call: _Call) -> None:
        for row in call.rows:
            self._rt.cancels.end(row.id)

    async def _after_batch(self, outcomes: Sequence[Outcome]) -> None:
        if self._rt.hooks.active:
            for outcome in outcomes:
                await self._rt.hooks.after(ACTION, outcome)

    async def _run_batch_in_slot(self, slot: Slot, rows: list[Claimed]) -> None:
        """Run a batch in its worker's scope (``ActionPool._run_in_slot``, for a batch)."""
        if self._aborting:
            self._unstarted.extend(rows)
            return
        call = _Call(self._rt, rows, self._record)
        if not call.rows:
            return
        if (begun := await self._begin_batch(call)) is None:
            return
        ctx, runs, timeout = begun
        started = time.monotonic()
        slot.row, slot.started, slot.deadline = call.rows[0], started, started + timeout
        slot.expired = slot.interrupted = False
        self.watch.arm(slot.deadline)
        try:
            try:
                with runs:
                    results = await call.ref.batch_fn(ctx, call.items)
            finally:
                self._end_batch(call)
        except anyio.get_cancelled_exc_class():
            expired = slot.expired and not self._aborting
            call.fail(timeout_error(call.ref, timeout) if expired else None, self._cancelled)
            raise
        except Exception as exc:
            await self._after_batch(call.fail(exc, self._cancelled))
        except BaseException as exc:  # a group holding a cancellation, a KeyboardInterrupt
            if self._aborting:
                call.fail(None, self._cancelled)
            else:
                expired = slot.expired
                call.fail(timeout_error(call.ref, timeout) if expired else exc, self._cancelled)
            raise
        else:
            await self._after_batch(call.settle(results, self._cancelled))
        finally:
            slot.row = None
            self.action_pace.add(time.monotonic() - started)

    async def _run_batch(self, rows: list[Claimed], record: Callable[[Outcome], None]) -> None:
        """Run a batch to the end in a task of its own (``run_claimed``: run_until_idle)."""
        await anyio.lowlevel.checkpoint_if_cancelled()
        if self._aborting:
            for row in rows:
                record(stopped(row))
            return
        call = _Call(self._rt, rows, record)
        if not call.rows:
            return
        if (begun := await self._begin_batch(call)) is None:
            return
        ctx, runs, timeout = begun
        error: Exception | None = None
        finished = False
        with anyio.CancelScope(deadline=anyio.current_time() + timeout) as scope:
            self._scopes.add(scope)
            try:
                with runs:
                    results = await call.ref.batch_fn(ctx, call.items)
                finished = True
            except Exception as exc:
                error = exc
            finally:
                self._scopes.discard(scope)
                self._end_batch(call)
        if error is not None:
            await self._after_batch(call.fail(error, self._cancelled))
        elif not finished:
            call.fail(None if self._aborting else timeout_error(call.ref, timeout), self._cancelled)
            if self._aborting:
                raise anyio.get_cancelled_exc_class()()
        else:
            await self._after_batch(call.settle(results, self._cancelled))
