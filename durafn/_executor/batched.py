"""Running a batched action's batch (``durafn.Batch``): one call of the function with the
items of the rows a batch claim took (``_store/claim/batched.py``), and one outcome per
row: its result, its ``ItemFailed`` error, or the call's error for every row.

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

from .._batching import BatchActionRef, ItemFailed, split_results
from .._cancels import Cancellation
from .._invoke import Invoker, timeout_error
from .._kinds import FunctionKind
from .._runtime import Runtime
from .._store import Claimed, Outcome
from .action_claims import ActionClaims
from .deadlines import DeadlineWatch, Slot
from .outcomes import failed, stopped, succeeded
from .tasks import Pace

ACTION = FunctionKind.ACTION

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

    async def _begin_batch(self, call: _Call) -> tuple[Any, contextlib.ExitStack, float]:
        """The hooks before each row, the cancels and the runs' telemetry begun: the
        context, and the timeout of the call."""
        rt, rows = self._rt, call.rows
        if rt.hooks.active:
            for row in rows:
                await rt.hooks.before(ACTION, row)
        call.cancels = [rt.cancels.start(row.id, None) for row in rows]
        runs = contextlib.ExitStack()
        now, worker = rt.clock.now(), self._claims.worker_id()
        for row in rows:  # a span each, the call's context the last one's
            runs.enter_context(rt.telemetry.running(ACTION, row, now, worker))
        return self._invoker.action_ctx(rows[0].id), runs, self._invoker.timeouts.for_(call.ref)

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
        ctx, runs, timeout = await self._begin_batch(call)
        started = time.monotonic()
        slot.row, slot.expired, slot.started, slot.deadline = (
            call.rows[0],
            False,
            started,
            (started + timeout),
        )
        slot.interrupted = False
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
        ctx, runs, timeout = await self._begin_batch(call)
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
