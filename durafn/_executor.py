"""The executor: claim what is due, run it, record how it ended.

Mutations (exactly once). A *lane* opens one transaction, locks up to ``batch_size`` due
rows (``FOR UPDATE SKIP LOCKED`` on PostgreSQL; SQLite's ``BEGIN IMMEDIATE`` makes the
transaction the only writer), runs each mutation on that connection, writes every row's
Success/Failed with one guarded UPDATE and commits once. Each mutation's effects and its
row's move out of Pending are in the same commit, so a crash anywhere before COMMIT leaves
the rows Pending with no effects, and a crash after leaves them finished: never twice.

Group commit is the point: one COMMIT (one fsync) per batch instead of per mutation.
Batches are large (256) but short: a batch commits once it has run mutations for
``batch_time`` (50 ms), leaving the rest of what it claimed Pending, and claims only what
fits in that time at the recent pace, so slow mutations never hold locks (on SQLite, the
write lock) for long. Measured on the 2-core machine, no-op mutations drained at 12,100 /
18,300 /s (SQLite / PostgreSQL) in batches of 64 and at 20,500 / 23,100 /s in batches of
256: the per-batch round trips and fsync are most of a no-op mutation's cost. A batch runs
*optimistically*, without savepoints, because a SAVEPOINT/RELEASE pair costs two round
trips per mutation on PostgreSQL. If one mutation raises, the batch is rolled back (nothing
of it was visible to anyone) and re-run with a savepoint around each mutation, so the
failing one is rolled back alone and recorded Failed while its neighbours commit.

Actions (at most once). The claim commits the move to InProgress *before* any action
starts; a finisher task writes outcomes in batches with ``WHERE state = 'InProgress'``, so
a cancel that landed meanwhile is never overwritten and nothing is ever started twice. The
dispatcher's claim and the outcome writes are one statement each, so on PostgreSQL they run
in autocommit (no BEGIN/COMMIT round trips). Claimed rows go to a pool of at most
``concurrency`` long-lived worker tasks. The dispatcher claims for the free slots and, when
actions are shorter than a claim's round trip, ahead by as many rows as the workers will
start during the next round trip (``_claim_ahead``): short actions then do not leave the
workers idle while a claim is on the wire, and slow ones get no look-ahead, so rows do not
wait InProgress behind them (beyond those claimed just before actions turned slow). A
worker runs its actions in one cancel scope; one task (``_deadline_watch``) cancels the
scope of an action past its time limit.

Internal faults (lost connection, deadlock, "database is locked") roll the batch back and
retry it after a capped, jittered backoff; they never turn a row Failed.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import logging
import math
import os
import socket
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, TypedDict, TypeVar

import anyio
import anyio.lowlevel
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession, AsyncTransaction

from ._context import ActionCtx, MutationCtx, SystemTable
from ._errors import (
    ArgumentError,
    DatabaseError,
    DurafnError,
    ExecutorShutdownError,
    FunctionTimeoutError,
    NotFoundError,
    UnknownFunctionError,
)
from ._invoke import Invoker, check_transaction, mutation_session, timeout_error
from ._registry import ActionRef, FunctionRef, MutationRef
from ._runtime import Runtime, one_line
from ._scheduler import BufferedWriter, Scheduler
from ._store import Claimed, LostAction, Outcome
from ._types import FunctionKind, ScheduledFunction, ScheduledFunctionId, State

logger = logging.getLogger("durafn.executor")
T = TypeVar("T")

_MAX_ERROR_MESSAGE = 8000
_OUTCOME_FLUSH_LIMIT = 30.0
"""Seconds a stopping executor keeps trying to record action outcomes if the database is
away; after that the rows stay InProgress (never re-run)."""


@dataclass(frozen=True, slots=True)
class ExecutorConfig:
    """How an executor runs. Every field has a production default."""

    concurrency: int = 10
    """Actions running at once (mutation lanes are at most this many, too)."""
    batch_size: int = 256
    """Mutations committed together in one transaction, at most."""
    batch_time: float = 0.05
    """Seconds a batch runs mutations before it commits what it has run; the rows it
    claimed but did not reach stay Pending for the next batch. It bounds how long a batch
    holds its row locks (and, on SQLite, the database's write lock) when mutations are
    slow, whatever ``batch_size`` is."""
    mutation_lanes: int | None = None
    """Mutation transactions at once; default min(concurrency, what the engine benefits from)."""
    poll_interval: float | None = None
    """Fallback poll for work no signal announced (another process on SQLite, a lost
    NOTIFY on PostgreSQL); default 0.5s on SQLite, 5s on PostgreSQL."""
    retention: float = 7 * 86400.0
    """Seconds finished rows are kept after ``completed_time``."""
    retention_interval: float = 60.0
    retention_batch: int = 1000
    grace_period: float = 10.0
    """On stop, how long running actions may take to finish before they are cancelled."""
    heartbeat_interval: float = 5.0
    """How often this executor renews its row in ``_durafn_workers`` (and looks for lost
    workers)."""
    worker_timeout: float = 30.0
    """A worker with no heartbeat for this long is lost: its InProgress actions are
    recorded Failed (``WorkerLostError``) by another worker, never re-run. Recovery after a
    crash takes at most about ``worker_timeout + heartbeat_interval``."""
    worker_name: str | None = None
    """A readable label for this executor's worker id (default ``host:pid``)."""

    def __post_init__(self) -> None:
        for name in ("concurrency", "batch_size", "retention_batch", "mutation_lanes"):
            value = getattr(self, name)
            if value is not None and (not _is_int(value) or value < 1):
                raise ArgumentError(f"{name} must be an integer of at least 1, not {value!r}")
        for name in ("retention", "grace_period"):
            value = getattr(self, name)
            if not _is_number(value) or not value >= 0:
                raise ArgumentError(
                    f"{name} must be a non-negative number of seconds, not {value!r}"
                )
        for name in (
            "retention_interval",
            "poll_interval",
            "heartbeat_interval",
            "worker_timeout",
            "batch_time",
        ):
            value = getattr(self, name)
            if value is not None and (not _is_number(value) or not value > 0):
                raise ArgumentError(f"{name} must be a positive number of seconds, not {value!r}")
        if self.worker_timeout < 3 * self.heartbeat_interval:
            # A pause shorter than the two intervals that reset a rescuer's streak leaves
            # live heartbeats at most three intervals old: still within the timeout.
            raise ArgumentError(
                f"worker_timeout ({self.worker_timeout!r}) must be at least three times "
                f"heartbeat_interval ({self.heartbeat_interval!r}), or a late heartbeat "
                "could declare a live worker lost"
            )
        if self.worker_name is not None and not isinstance(self.worker_name, str):
            raise ArgumentError(f"worker_name must be a string, not {self.worker_name!r}")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


class ExecutorOptions(TypedDict, total=False):
    """The keyword arguments of ``app.executor()``: ``ExecutorConfig``'s fields, so that
    mypy checks their names and types."""

    concurrency: int
    batch_size: int
    batch_time: float
    mutation_lanes: int | None
    poll_interval: float | None
    retention: float
    retention_interval: float
    retention_batch: int
    grace_period: float
    heartbeat_interval: float
    worker_timeout: float
    worker_name: str | None


def make_config(options: Mapping[str, Any]) -> ExecutorConfig:
    """ExecutorConfig from keyword options, with a typed error for an unknown one."""
    known = {f.name for f in dataclasses.fields(ExecutorConfig)}
    if unknown := sorted(set(options) - known):
        raise ArgumentError(
            f"unknown executor option(s) {', '.join(unknown)}; the options are "
            f"{', '.join(sorted(known))}"
        )
    return ExecutorConfig(**options)


class RunawayError(DurafnError, RuntimeError):
    """``run_until_idle`` found work still due after its round limit: a function keeps
    scheduling itself with no delay."""


class _Signal:
    """A broadcast wake-up: ``current()`` returns an event set by the next ``fire()``.

    Capture the event *before* looking for work, wait on it after: a fire in between is
    then never lost.
    """

    def __init__(self) -> None:
        self._event: anyio.Event | None = None

    def current(self) -> anyio.Event:
        if self._event is None:
            self._event = anyio.Event()
        return self._event

    def fire(self) -> None:
        if self._event is not None:
            self._event.set()
            self._event = None


class _BatchRestart(Exception):
    """A mutation raised in an optimistic batch: re-run the batch with savepoints."""


class _Mode(enum.Enum):
    """How carefully a mutation batch runs (see the module docstring)."""

    OPTIMISTIC = "optimistic"  # one transaction, no savepoints: the fast path
    SAVEPOINTS = "savepoints"  # a savepoint around each mutation, after one raised
    ALONE = "alone"  # one row per transaction, after a failure no mutation owned


@dataclass(slots=True)
class _Batch:
    outcomes: list[Outcome] = field(default_factory=list)
    written: int = 0
    """How many of ``outcomes`` are already written to the database."""
    cancelled: bool = False
    """A mutation of this batch cancelled something: check rows before running them."""


@dataclass(slots=True)
class _Running:
    """The mutation a batch is running now, to name it if the batch's time limit fires."""

    row: Claimed | None = None
    timeout: float = 0.0


@dataclass(eq=False, slots=True)
class _Slot:
    """One action worker: the cancel scope its actions run in and the one it is running."""

    scope: anyio.CancelScope | None = None
    row: Claimed | None = None
    started: float = 0.0
    deadline: float = math.inf
    expired: bool = False
    """The running action outlived its time limit and its scope was cancelled."""


@dataclass
class _Timeout(Exception):
    row: Claimed
    error: FunctionTimeoutError


def _error_fields(exc: BaseException) -> tuple[str, str]:
    cls = type(exc)
    if cls.__module__ == "builtins":
        name = cls.__qualname__
    elif cls.__module__.startswith("durafn._"):
        name = f"durafn.{cls.__qualname__}"  # the public name: every durafn error is exported
    else:
        name = f"{cls.__module__}.{cls.__qualname__}"
    # PostgreSQL text cannot hold NUL: a message with one must not make the row unwritable.
    message = str(exc).replace("\x00", "\\x00")
    if len(message) > _MAX_ERROR_MESSAGE:
        message = message[:_MAX_ERROR_MESSAGE] + "…"
    return name, message


def _failed(row: Claimed | Outcome, exc: BaseException) -> Outcome:
    error_type, message = _error_fields(exc)
    return Outcome(
        row.id, State.FAILED, error_type=error_type, error_message=message, name=row.name
    )


def _stopped(row: Claimed) -> Outcome:
    return _failed(
        row,
        ExecutorShutdownError(
            "the executor stopped while this action was running (after its grace period); "
            "it was cancelled and will not be retried"
        ),
    )


def _succeeded(row: Claimed, ref: ActionRef[Any, Any], result: Any) -> Outcome:
    try:
        encoded = ref.encode_result(result)
    except Exception as exc:  # a result that cannot be stored fails the row, not the worker
        return _failed(row, exc)
    return Outcome(row.id, State.SUCCESS, result=encoded, name=row.name)


def _recent(previous: float, sample: float, weight: float = 0.5) -> float:
    """A moving average that follows recent samples; the first sample stands alone."""
    return previous + (sample - previous) * weight if previous else sample


def _fields(kind: FunctionKind, id: str, name: str, state: State) -> dict[str, str]:
    """``extra`` for state-change log records, so a structured formatter (JSON logs) gets
    the row's fields without parsing the message."""
    return {"durafn_kind": kind, "durafn_id": id, "durafn_function": name, "durafn_state": state}


class Executor:
    """Runs due scheduled functions. Use ``async with app.run_executor():`` to run it in
    the background, or ``await executor.run_until_idle()`` to run what is due now."""

    def __init__(self, runtime: Runtime, invoker: Invoker, config: ExecutorConfig) -> None:
        self._rt = runtime
        self._invoker = invoker
        self.config = config
        self.worker_id = self._new_worker_id()
        self._members = 0  # nesting depth of _membership()
        self._member_owner = ""
        driver = runtime.driver
        self._lanes = config.mutation_lanes or min(config.concurrency, driver.max_mutation_lanes)
        self._poll = (
            config.poll_interval
            if config.poll_interval is not None
            else driver.default_poll_interval
        )
        # Per kind, so that new mutations do not send the action dispatcher into a claim
        # transaction for nothing (on SQLite it would queue for the one write lock).
        self._work = {kind: _Signal() for kind in (FunctionKind.MUTATION, FunctionKind.ACTION)}
        self._progress = _Signal()  # some row finished
        self._slot_freed = _Signal()
        self._stopping: anyio.Event | None = None  # created when started
        self._running_actions = 0  # claimed, not finished: queued or running
        # Claimed actions wait here for one of the long-lived action workers (a pool of
        # at most ``concurrency`` tasks): an anyio task per action cost ~40 us to spawn,
        # more than a no-op action's share of its claim and finish SQL.
        self._ready: deque[Claimed] = deque()
        self._idle: deque[anyio.Event] = deque()  # one per idle worker, first in first out
        self._workers = 0
        self._waking = False  # a worker is on its way to take the next queued row
        self._aborting = False  # the grace period is over: cancel, start nothing more
        self._action_scopes: set[anyio.CancelScope] = set()  # run_until_idle()'s actions
        self._slots: set[_Slot] = set()  # one per action worker
        self._unstarted: list[Claimed] = []  # claimed, never started, the stop has come
        self._deadline_changed = _Signal()
        self._watch_until = math.inf  # when _deadline_watch next looks
        # Recent seconds per action run and per claim round trip: how far to claim ahead.
        self._action_seconds = 0.0
        self._claim_seconds = 0.0
        self._mode = _Mode.OPTIMISTIC
        self._mode_batches = 0
        self._mutation_seconds = 0.0  # recent seconds per mutation run, for the claim size
        self._outcomes: list[Outcome] = []
        self._outcomes_ready = _Signal()
        # Claimed actions whose outcome is not written yet; held with _claim_lock so that
        # adopting this worker's unaccounted InProgress rows never races a claim.
        self._unrecorded: set[ScheduledFunctionId] = set()
        # fast_acquire: an uncontended acquire does not yield. The dispatcher's claim ahead
        # must be on the wire before the workers take the event loop to run the rows it
        # has just queued; with a yield here, claim and run alternated instead of overlapping.
        self._claim_lock = anyio.Lock(fast_acquire=True)
        self._claims_in_flight = 0
        self._claim_uncertain = False
        self._hurry = 0  # stop_now() calls
        self._grace_scope: anyio.CancelScope | None = None
        self._flush_scope: anyio.CancelScope | None = None
        self.stats: dict[str, int] = {"mutations": 0, "actions": 0, "failed": 0, "retries": 0}

    # -- public ------------------------------------------------------------------------

    async def __aenter__(self) -> Executor:
        self._exit_stack = self._running()
        return await self._exit_stack.__aenter__()

    async def __aexit__(self, *exc_info: Any) -> bool | None:
        return await self._exit_stack.__aexit__(*exc_info)

    async def run_until_idle(self, *, max_rounds: int = 1000) -> int:
        """Run everything due now, including what that schedules due now; return the count.

        Deterministic: returns once nothing is due at the clock's current time and every
        action it started has finished and been recorded. A round is one mutation batch
        plus one claim of actions; after ``max_rounds`` rounds that all found work it raises
        RunawayError (a function that keeps scheduling itself with no delay).
        """
        await self._rt.ensure_ready()
        total = 0
        async with AsyncExitStack() as stack:
            for _ in range(max_rounds):
                ran, _ = await self._mutation_batch_retrying(timed=False)
                rows = await self._claim_actions(self.config.concurrency)
                if rows:
                    if not self._members:
                        # Running actions: heartbeat like a worker, so that no other worker
                        # takes them for lost. (Only now: most calls run no action.)
                        await stack.enter_async_context(self._membership("run_until_idle()"))
                    outcomes: list[Outcome] = []
                    try:
                        async with anyio.create_task_group() as tg:
                            for row in rows:
                                tg.start_soon(self._run_action, row, outcomes.append)
                    finally:
                        # Also when cancelled: the actions that finished are recorded.
                        await self._write_outcomes_before_leaving(outcomes)
                    ran += len(rows)
                if ran == 0:
                    return total
                total += ran
        raise RunawayError(
            f"work was still due after {max_rounds} rounds ({total} functions run): a "
            "function probably schedules itself with no delay"
        )

    async def wait_until_idle(self) -> None:
        """Return once nothing is due at the clock's current time and every action this
        executor started has finished and been recorded (``durafn worker
        --exit-on-complete``). Work due later does not count."""
        while True:
            progress = self._progress.current()
            if self._idle_here():
                try:
                    due = await self.next_due()
                except DatabaseError as exc:
                    if not exc.transient:
                        raise
                    self._rt.health.fault(exc, "looking for due work")
                    due = self._rt.clock.now()  # unknown: not idle; look again
                # Checked again after the read: a claim may have committed during it.
                if (due is None or due > self._rt.clock.now()) and self._idle_here():
                    return
            with anyio.move_on_after(0.05):  # rows finished by other processes: no signal
                await progress.wait()

    def _idle_here(self) -> bool:
        return not (self._running_actions or self._claims_in_flight or self._unrecorded)

    def stop_now(self) -> None:
        """Cut a stop short: the first call ends the grace period (running actions are
        cancelled and recorded Failed); a second also stops waiting for those records
        to be written (rows left InProgress are later recorded lost by other workers).
        Before a stop, it makes the coming stop skip the grace period."""
        self._hurry += 1
        if self._grace_scope is not None:
            self._grace_scope.cancel()
        if self._hurry > 1 and self._flush_scope is not None:
            self._flush_scope.cancel()

    async def run_maintenance(self) -> int:
        """Delete finished rows older than the retention period; returns how many."""
        await self._rt.ensure_ready()
        cutoff = self._rt.clock.now() - self.config.retention
        deleted = 0
        while True:

            async def _delete(conn: AsyncConnection) -> int:
                return await self._rt.driver.delete_finished(
                    conn, cutoff, self.config.retention_batch
                )

            n = await self._rt.transaction(_delete, doing="deleting expired rows")
            deleted += n
            if n < self.config.retention_batch:
                break
            await anyio.lowlevel.checkpoint()  # let the executor's other tasks in between batches
        if deleted:
            logger.debug("retention deleted %d finished rows", deleted)
        return deleted

    async def next_due(self) -> float | None:
        """The earliest time (epoch seconds) any Pending row becomes due, or None."""
        driver = self._rt.driver

        async def _both(conn: AsyncConnection) -> list[float | None]:
            kinds = (FunctionKind.MUTATION, FunctionKind.ACTION)
            return [await driver.next_due(conn, kind) for kind in kinds]

        times = await self._rt.transaction(_both, read_only=True, doing="reading the next due time")
        due = [t for t in times if t is not None]
        return min(due) if due else None

    async def wait_for(
        self, id: ScheduledFunctionId | str, *, timeout: float = 30.0
    ) -> ScheduledFunction:
        """Wait (signal-driven, no polling loop) until the row has finished; return it."""
        with anyio.fail_after(timeout):
            while True:
                progress = self._progress.current()
                row = await SystemTable(self._rt, None).get(id)
                if row is None:
                    raise NotFoundError(str(id))
                if row.state.finished:
                    return row
                # Rows finished by this executor signal at once; a cancel or another
                # process does not, so look again every 100 ms as well.
                with anyio.move_on_after(0.1):
                    await progress.wait()

    # -- lifecycle ---------------------------------------------------------------------

    @asynccontextmanager
    async def _running(self) -> AsyncIterator[Executor]:
        await self._rt.ensure_ready()
        self._stopping = anyio.Event()
        self._hurry = 0
        self._aborting = False
        self._rt._wake_listeners.add(self._on_wake)
        try:
            async with (
                _single_errors_unwrapped(),
                self._membership("executor"),
                anyio.create_task_group() as tg,
            ):
                self._tg = tg
                self._dispatcher_done = anyio.Event()
                self._finisher_done = anyio.Event()
                self._finisher_scope = anyio.CancelScope(shield=True)
                # Shielded like the workers: time limits hold through a stop's grace period
                # even when the host was cancelled; cancelled once the actions are done.
                self._watch_scope = anyio.CancelScope(shield=True)
                self._unstarted = []
                tg.start_soon(self._finisher_loop)
                for _ in range(self._lanes):
                    tg.start_soon(self._mutation_lane)
                tg.start_soon(self._action_dispatcher)
                tg.start_soon(self._deadline_watch)
                tg.start_soon(self._maintenance_loop)
                try:
                    async with self._rt.driver.listen(self._rt.engine, self._on_wake):
                        yield self
                finally:
                    # On every way out (the block's end, a cancelled host, a failed listen
                    # or loop). Shielded: a cancelled host still gives running actions their
                    # grace period and records how every one of them ended.
                    with anyio.CancelScope(shield=True):
                        try:
                            await self._stop_actions()
                        finally:
                            self._watch_scope.cancel()
                tg.cancel_scope.cancel()
        finally:
            self._rt._wake_listeners.discard(self._on_wake)
            self._aborting = False  # run_until_idle() may use this executor afterwards

    async def _stop_actions(self) -> None:
        """Stop claiming, give running actions their grace period, cancel the rest, and
        record how every claimed action ended (bounded, should the database be away)."""
        assert self._stopping is not None
        self._stopping.set()
        self._on_wake(self._work)
        # A claim in flight finishes first (it is not interrupted): what it claimed must
        # get the same grace period and the same recording as everything else.
        await self._dispatcher_done.wait()
        with anyio.move_on_after(self.config.grace_period) as self._grace_scope:
            if self._hurry:
                self._grace_scope.cancel()
            while self._running_actions:
                await self._slot_freed.current().wait()
        self._grace_scope = None
        self._aborting = True
        # Each cancelled action records itself Failed (ExecutorShutdownError).
        for slot in self._slots:
            if slot.row is not None and slot.scope is not None:
                slot.scope.cancel()
        for scope in list(self._action_scopes):
            scope.cancel()
        # Queued rows are set aside unstarted (below); idle workers exit. One more worker
        # in case every worker is gone while rows are still queued.
        self._wake_all_workers()
        self._wake_a_worker()
        while self._running_actions:
            await self._slot_freed.current().wait()
        self._outcomes_ready.fire()
        with anyio.move_on_after(_OUTCOME_FLUSH_LIMIT) as self._flush_scope:
            if self._hurry > 1:
                self._flush_scope.cancel()
            await self._release_unstarted()
            await self._finisher_done.wait()
        self._flush_scope = None
        self._finisher_scope.cancel()
        await self._finisher_done.wait()
        if self._outcomes:
            self._log_unrecorded(len(self._outcomes))

    def _on_wake(self, kinds: Collection[FunctionKind]) -> None:
        for kind in kinds:
            if (signal := self._work.get(kind)) is not None:
                signal.fire()

    async def _idle_wait(self, kind: FunctionKind, signal: anyio.Event, claimed_at: float) -> None:
        """Sleep until the next row of ``kind`` is due, new work is signalled, or the poll.

        ``claimed_at`` is when the claim that found nothing ran: rows due by then are all
        taken (locked by another lane or executor), so only later ones are waited for.
        """
        assert self._stopping is not None
        if self._stopping.is_set():
            return
        try:
            next_due = await _shielded(
                self._read(functools.partial(self._rt.driver.next_due, kind=kind, after=claimed_at))
            )
        except Exception as exc:
            if not self._rt.driver.is_transient(exc):
                raise self._rt.driver.wrap(exc, f"looking for the next due {kind}") from exc
            # The database is away: the next claim will retry through the fault; wait a
            # little first rather than spin.
            self._rt.health.fault(exc, f"looking for the next due {kind}")
            await _first_of(signal.wait, functools.partial(anyio.sleep, min(self._poll, 1.0)))
            return
        deadline = self._rt.clock.now() + self._poll
        if next_due is not None:
            deadline = min(deadline, next_due)
        await _first_of(signal.wait, functools.partial(self._rt.clock.sleep_until, deadline))

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

    # -- worker membership: heartbeats and lost-worker rescue ---------------------------

    def _new_worker_id(self) -> str:
        # Unique per run of an executor: a restart never inherits its predecessor's rows.
        name = self.config.worker_name or f"{socket.gethostname()}:{os.getpid()}"
        return f"{name}:{os.urandom(4).hex()}"

    @asynccontextmanager
    async def _membership(self, owner: str) -> AsyncIterator[None]:
        """Be a registered worker for the block: a row in ``_durafn_workers`` renewed every
        ``heartbeat_interval``, removed at the end. Re-entrant only inside a running
        executor, which outlives whatever runs within it; the heartbeat belongs to the
        first holder, so any other overlap would leave the others without one."""
        if self._members and (owner == "executor" or self._member_owner != "executor"):
            raise ArgumentError(
                f"this executor is already running ({self._member_owner}); give each "
                "concurrent caller its own executor (app.executor())"
            )
        if self._members:
            self._members += 1
            try:
                yield
            finally:
                self._members -= 1
            return
        self._members = 1
        self._member_owner = owner
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._heartbeat_loop)
                try:
                    yield
                finally:
                    tg.cancel_scope.cancel()
        finally:
            self._members = 0
            await self._unregister()
            # A new identity for the next run; what this one left unrecorded is now the
            # business of the lost-worker rescue, not of the next run's idleness check.
            self.worker_id = self._new_worker_id()
            self._unrecorded.clear()
            self._claim_uncertain = False

    async def _insert_worker(self, conn: AsyncConnection, now: float) -> None:
        await self._rt.driver.register_worker(
            conn, self.worker_id, socket.gethostname(), os.getpid(), self.config.concurrency, now
        )

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
        interval = self.config.heartbeat_interval
        healthy_since: float | None = None
        last_beat: float | None = None
        registered = False
        while True:
            deadline = clock.now() + interval
            try:
                started = clock.now()
                beat = await _shielded(self._beat(registered))
                registered = True
                late = last_beat is not None and beat - last_beat > 2 * interval
                if healthy_since is None or late or beat - started > interval:
                    healthy_since = beat
                last_beat = beat
                if beat - healthy_since >= self.config.worker_timeout:
                    await _shielded(self._rescue_lost(clock.now()))
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
            await self._insert_worker(conn, written)
            return False

        existed = await rt.transaction(_renew, doing="renewing the worker heartbeat")
        if not registered:
            logger.info("worker %s started", self.worker_id)
        elif not existed:
            logger.error(
                "worker %s had been declared lost by another worker (no heartbeat for %gs: "
                "was the event loop blocked, or the database unreachable?); the actions it "
                "was running were recorded Failed and their results will be discarded; "
                "registered again",
                self.worker_id,
                self.config.worker_timeout,
            )
        return written

    async def _rescue_lost(self, now: float) -> None:
        timeout = self.config.worker_timeout
        message = (
            "the worker running this action ({worker}) sent no heartbeat for "
            f"{timeout:g}s: it was killed, crashed, or lost its database connection. The "
            "action may have run partly or fully; it is not retried"
        )

        async def _rescue(conn: AsyncConnection) -> list[LostAction]:
            return await self._rt.driver.rescue_lost(conn, now, now - timeout, message)

        lost = await self._rt.transaction(_rescue, doing="rescuing the actions of lost workers")
        for id, name, worker in lost:
            logger.warning(
                "action %s (%s) InProgress -> Failed: its worker %s was lost",
                id,
                name,
                worker,
                extra=_fields(FunctionKind.ACTION, id, name, State.FAILED),
            )
        if lost:
            self._progress.fire()

    # -- mutations ---------------------------------------------------------------------

    async def _mutation_lane(self) -> None:
        assert self._stopping is not None
        while not self._stopping.is_set():
            signal = self._work[FunctionKind.MUTATION].current()
            now = self._rt.clock.now()
            _, full = await self._mutation_batch_retrying(now)
            if not full:
                # Everything due at ``now`` that no one else holds is done: rows due since
                # then, or scheduled by this batch, are found by the next-due read (or their
                # wake-up), so a second claim that would find nothing is not needed.
                await self._idle_wait(FunctionKind.MUTATION, signal, now)

    async def _mutation_batch_retrying(
        self, now: float | None = None, *, timed: bool = True
    ) -> tuple[int, bool]:
        """One batch, retried through internal faults; returns how many rows it finished,
        and whether its claim took all it asked for (then more may be due already).

        ``now`` is the time to claim at (default: the clock's now). ``timed``: stop at
        ``batch_time`` (``run_until_idle`` does not, so that its round limit counts
        rounds of whole batches).
        """
        failures = 0
        while True:
            mode = self._mode
            claimed: list[Claimed] = []
            size = 1 if mode is _Mode.ALONE else self._claim_size(timed)
            try:
                n = await _shielded(self._mutation_batch(mode, claimed, now, size, timed))
            except _BatchRestart:
                self._escalate(_Mode.SAVEPOINTS)
                continue
            except _Timeout as timeout:
                await self._fail_alone(timeout.row, timeout.error)
                return 1, True
            except Exception as exc:
                if self._rt.driver.is_transient(exc):
                    delay = self._rt.backoff.delay(failures)
                    failures += 1
                    self.stats["retries"] += 1
                    doing = f"running a batch of {len(claimed)} mutations"
                    self._rt.health.fault(exc, doing, delay)
                    await self._count_retry(claimed)
                    await anyio.sleep(delay)
                    continue
                if isinstance(exc, DurafnError):
                    raise
                if not claimed:  # durafn's own claim failed: nothing of the user's ran
                    raise self._rt.driver.wrap(exc, "claiming due mutations") from exc
                # A statement of the batch itself failed, not a mutation: typically user
                # code left the transaction unusable (a database error it swallowed). Narrow
                # it down: savepoints, then one row per transaction, then fail that row.
                if mode is _Mode.ALONE:
                    await self._fail_alone(claimed[0], exc)
                    return 1, True
                logger.warning(
                    "mutation batch of %d failed outside any mutation (%s); re-running it %s",
                    len(claimed),
                    one_line(exc),
                    "with savepoints" if mode is _Mode.OPTIMISTIC else "one row at a time",
                )
                self._escalate(_Mode.SAVEPOINTS if mode is _Mode.OPTIMISTIC else _Mode.ALONE)
                continue
            if mode is not _Mode.OPTIMISTIC and n:
                self._mode_batches -= 1
                if self._mode_batches <= 0:
                    self._mode = _Mode.OPTIMISTIC
            # More may be due if the claim took all it asked for, or the batch stopped at
            # batch_time before running all it claimed.
            return n, len(claimed) == size or n < len(claimed)

    def _claim_size(self, timed: bool) -> int:
        """How many mutations to claim: what fits in ``batch_time`` at the recent pace.

        Claiming more than a batch will run costs twice on PostgreSQL: the surplus rows are
        locked and read for nothing, and the other lanes' SKIP LOCKED scans must step over
        them. Measured with mutations that each insert a row: claiming 256 at a time to run
        a few dozen drained 1,500 /s, claiming what fits 2,600 /s.

        The pace is wall time per mutation, other lanes' turns on the event loop included:
        that is how long the batch holds its locks.
        """
        size = self.config.batch_size
        if timed and self._mutation_seconds > 0:
            size = min(size, 1 + int(self.config.batch_time / self._mutation_seconds))
        return size

    def _escalate(self, mode: _Mode) -> None:
        """Run the next few batches more carefully (they revert to optimistic after)."""
        order = list(_Mode)  # definition order: least to most careful
        if order.index(mode) > order.index(self._mode):
            self._mode = mode
        self._mode_batches = 2

    async def _mutation_batch(
        self, mode: _Mode, claimed: list[Claimed], now: float | None, size: int, timed: bool
    ) -> int:
        rt = self._rt
        driver = rt.driver
        async with rt.engine.connect() as conn:
            root = await conn.begin()
            claim_at = rt.clock.now() if now is None else now
            rows = await driver.claim_mutations(conn, claim_at, size)
            if not rows:
                await conn.rollback()
                return 0
            claimed.extend(rows)
            # Optimistic: one session for the batch. With savepoints each mutation gets its
            # own session joined to its own savepoint. "rollback_only": a user's
            # ctx.db.commit() commits nothing of ours; a ctx.db.rollback() is detected.
            session = mutation_session(conn) if mode is _Mode.OPTIMISTIC else None
            batch = _Batch()
            outcomes = batch.outcomes
            woken: set[FunctionKind] = set()
            current = _Running()
            # One cancel scope for the whole batch, its deadline moved per mutation: a new
            # anyio scope per mutation cost ~25 us, a sixth of a no-op mutation on SQLite.
            # Real time, not the injected clock: this bounds lock holding, not a schedule.
            started = time.monotonic()
            stop_at = started + self.config.batch_time if timed else math.inf
            cut = False
            with anyio.CancelScope() as limit:
                try:
                    for row in rows:
                        if outcomes and time.monotonic() >= stop_at:
                            # The rest stay Pending: the next batch takes them, ours or, if
                            # this executor is stopping, another's (woken below).
                            cut = True
                            break
                        if (
                            batch.cancelled
                            and await driver.state(conn, row.id) is not State.PENDING
                        ):
                            continue  # cancelled by an earlier mutation of this batch
                        outcome, kinds = await self._run_mutation(
                            conn, root, session, row, limit, current, batch
                        )
                        outcomes.append(outcome)
                        woken |= kinds
                finally:
                    if session is not None and not limit.cancel_called:
                        await session.close()
            if limit.cancel_called:
                # A mutation outlived its time limit and was cancelled, possibly in the middle
                # of a statement: stop that statement, roll everything back, drop the
                # connection.
                await driver.abandon(conn)
                assert current.row is not None
                raise _Timeout(
                    current.row,
                    FunctionTimeoutError(
                        f"mutation {current.row.name!r} ran longer than its time limit of "
                        f"{current.timeout:g}s and was rolled back; raise the limit with "
                        "timeout=... on its decorator"
                    ),
                )
            if cut:
                # Executors elsewhere skipped these locked rows and may be idle until their
                # poll: tell them, at our commit, that they are free again.
                await driver.notify(conn, {FunctionKind.MUTATION})
                woken.add(FunctionKind.MUTATION)
            if outcomes:
                pace = (time.monotonic() - started) / len(outcomes)
                self._mutation_seconds = _recent(self._mutation_seconds, pace)
            await self._write_batch(conn, batch)
            await conn.commit()
        rt.health.ok()
        self._record(FunctionKind.MUTATION, outcomes)
        rt.wake(woken)
        return len(outcomes)

    async def _run_mutation(
        self,
        conn: AsyncConnection,
        root: AsyncTransaction,
        batch_session: AsyncSession | None,
        row: Claimed,
        limit: anyio.CancelScope,
        current: _Running,
        batch: _Batch,
    ) -> tuple[Outcome, set[FunctionKind]]:
        rt = self._rt
        try:
            ref = self._resolve(row, MutationRef)
            values = ref.decode_args(row.args)
        except DurafnError as exc:
            return _failed(row, exc), set()
        savepoint = await conn.begin_nested() if batch_session is None else None
        session = batch_session or mutation_session(conn)
        writer = BufferedWriter(
            rt,
            conn,
            check_parent=None,
            before_cancel=functools.partial(self._before_cancel, conn, batch),
        )
        scheduler = Scheduler(rt, writer, parent_id=row.id, own_run_id=row.id)
        ctx = MutationCtx(rt, session, scheduler, SystemTable(rt, conn, writer.flush), row.id)
        mark = batch.written
        timeout = self._invoker.timeouts.for_(ref)
        current.row, current.timeout = row, timeout
        limit.deadline = anyio.current_time() + timeout
        try:
            result = await ref.fn(ctx, **values)
            check_transaction(conn, root, savepoint, session, ref)
            if scheduler.limit_error is not None:
                raise scheduler.limit_error
            encoded = ref.encode_result(result)
            if session.new or session.dirty or session.deleted:
                await session.flush()
            await writer.flush()
            if savepoint is not None:
                await savepoint.commit()
            limit.deadline = math.inf
        except Exception as exc:
            limit.deadline = math.inf
            if rt.driver.is_transient(exc, raised_by_user=True):
                raise
            if savepoint is None:
                raise _BatchRestart() from exc
            # Closing the mutation's own session first rolls back savepoints the user left
            # open inside ours; then ours can be rolled back.
            await session.close()
            if savepoint.is_active:
                await savepoint.rollback()
            batch.written = mark  # outcomes it wrote early were rolled back with it
            writer.discard()
            return _failed(row, exc), set()
        finally:
            if batch_session is None:
                await session.close()
            elif session.identity_map:
                session.expunge_all()
        return Outcome(row.id, State.SUCCESS, result=encoded, name=row.name), writer.woken

    async def _before_cancel(self, conn: AsyncConnection, batch: _Batch) -> None:
        await self._write_batch(conn, batch)
        batch.cancelled = True

    async def _write_batch(self, conn: AsyncConnection, batch: _Batch) -> None:
        """Write the batch's outcomes not yet written.

        Called at the end of a batch, and also before a mutation of the batch cancels a
        row: then the rows the batch already ran must read as finished (as they would had
        each mutation committed alone), and the batch must skip rows cancelled under it.
        """
        pending = batch.outcomes[batch.written :]
        written = await self._rt.driver.finish_pending(conn, self._rt.clock.now(), pending)
        if written != len(pending):  # pragma: no cover - the rows are locked by this batch
            raise DatabaseError(
                f"{len(pending) - written} claimed mutations changed state under the executor"
            )
        batch.written = len(batch.outcomes)

    async def _fail_alone(self, row: Claimed, exc: BaseException) -> None:
        """Record one mutation Failed in its own transaction (after its batch rolled back)."""
        outcome = _failed(row, exc)

        async def _write(conn: AsyncConnection) -> int:
            return await self._rt.driver.finish_pending(conn, self._rt.clock.now(), [outcome])

        if await self._rt.transaction(_write, doing="recording a failure"):
            self._record(FunctionKind.MUTATION, [outcome])

    async def _count_retry(self, rows: list[Claimed]) -> None:
        # The backoff itself is the lane's sleep (real time): the rows stay due, so another
        # executor may take them meanwhile, and a fake clock does not strand them.
        if not rows:
            return

        async def _write(conn: AsyncConnection) -> None:
            await self._rt.driver.count_retry(conn, [r.id for r in rows])

        try:
            await self._rt.transaction(_write, doing="counting a retried batch")
        except Exception as exc:  # the database may still be away; the retry will tell
            logger.info("could not count the retry (%s)", one_line(exc))

    # -- actions -----------------------------------------------------------------------

    async def _claim_actions(
        self, limit: int, now: float | None = None, *, retries: int | None = None
    ) -> list[Claimed]:
        now = self._rt.clock.now() if now is None else now
        driver = self._rt.driver

        async def _claim(conn: AsyncConnection) -> list[Claimed]:
            return await driver.claim_actions(conn, now, limit - len(adopted), self.worker_id)

        async def _ours(conn: AsyncConnection) -> list[Claimed]:
            return await driver.claimed_by(conn, self.worker_id)

        async with self._claim_lock:
            self._claims_in_flight += 1
            try:
                adopted: list[Claimed] = []
                if self._claim_uncertain:
                    # A claim failed at COMMIT, which may nonetheless have taken effect: its
                    # rows would be InProgress under our id, never started. Start them now
                    # (still at most once: nobody else runs a row claimed by a live worker).
                    # ``known`` is taken before the read: a row of ours InProgress in the
                    # read's snapshot had its outcome written after it, so it was still in
                    # _unrecorded then, even if the write has removed it by now.
                    known = set(self._unrecorded)
                    ours = await self._rt.transaction(_ours, doing="checking an uncertain claim")
                    orphans = [r for r in ours if r.id not in known]
                    adopted = orphans[:limit]
                    self._claim_uncertain = len(orphans) > limit  # the rest next time
                    if adopted:
                        logger.warning(
                            "%d actions claimed by a commit whose outcome was unknown were "
                            "found InProgress under this worker; starting them",
                            len(adopted),
                        )
                rows = []
                try:
                    if len(adopted) < limit:
                        # In autocommit only without retries: a claim run again after an
                        # unseen outcome would leave the first one's rows InProgress,
                        # unstarted. The dispatcher (retries=0) recovers them by adoption.
                        rows = await self._rt.transaction(
                            _claim,
                            doing="claiming actions",
                            retries=retries,
                            single_statement=retries == 0,
                        )
                except DatabaseError:
                    self._claim_uncertain = True
                    if not adopted:
                        raise
                rows = adopted + rows
                self._unrecorded.update(r.id for r in rows)
            finally:
                self._claims_in_flight -= 1
        if logger.isEnabledFor(logging.DEBUG):
            for row in rows:
                logger.debug(
                    "action %s (%s) Pending -> InProgress",
                    row.id,
                    row.name,
                    extra=_fields(FunctionKind.ACTION, row.id, row.name, State.IN_PROGRESS),
                )
        return rows

    async def _action_dispatcher(self) -> None:
        assert self._stopping is not None
        failures = 0
        concurrency = self.config.concurrency
        try:
            while not self._stopping.is_set():
                signal = self._work[FunctionKind.ACTION].current()
                ahead = self._claim_ahead()
                free = concurrency + ahead - self._running_actions
                # A free slot is claimed for at once. Claiming ahead waits until half the
                # look-ahead is free, or short actions would make a claim per row.
                if self._running_actions >= concurrency and free < max(1, ahead // 2):
                    await _first_of(self._slot_freed.current().wait, self._stopping.wait)
                    continue
                want = min(free, concurrency)
                now = self._rt.clock.now()
                started = time.perf_counter()
                try:
                    # No retries inside: this loop backs off itself, and a stop need not
                    # wait for a claim to exhaust its retries against a database that is away.
                    rows = await self._claim_actions(want, now, retries=0)
                    failures = 0
                except DatabaseError as exc:
                    delay = self._rt.backoff.delay(failures)
                    failures += 1
                    self._rt.health.fault(exc, "claiming actions", delay)
                    await _first_of(self._stopping.wait, functools.partial(anyio.sleep, delay))
                    continue
                if rows:
                    self._claim_seconds = _recent(
                        self._claim_seconds, time.perf_counter() - started
                    )
                self._running_actions += len(rows)
                self._ready.extend(rows)
                self._wake_a_worker()
                if len(rows) < want:  # all that was due at ``now``: as for mutations
                    await self._idle_wait(FunctionKind.ACTION, signal, now)
        finally:
            self._dispatcher_done.set()
            self._wake_all_workers()  # no more rows are coming: idle workers exit

    def _claim_ahead(self) -> int:
        """How many rows to hold claimed beyond the free slots: as many as the workers will
        start during one claim's round trip at the recent pace (at most ``concurrency``).

        Actions shorter than a claim's round trip otherwise leave the workers idle while
        each claim is on the wire: no-op actions drained at ~9,000/s on PostgreSQL with
        claim and run alternating, ~13,000/s with the next claim overlapping the run (2-core
        machine, interleaved runs). A row claimed ahead waits about one round trip for its
        worker; if the process is killed meanwhile it is recorded lost, never run, like any
        claimed action (a stop returns it to Pending). Slow actions give 0: a claim only
        for slots that are free.
        """
        if self._action_seconds <= 0.0:
            return 0
        # The pace is the recent past. A slot whose action has run longer than a round trip
        # is not turning rows over now: only the other slots count.
        now = time.monotonic()
        held = sum(s.row is not None and now - s.started > self._claim_seconds for s in self._slots)
        short = self.config.concurrency - held
        return max(0, min(short, int(short * self._claim_seconds / self._action_seconds)))

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
        elif self._workers < self.config.concurrency:
            self._waking = True
            self._workers += 1
            self._tg.start_soon(self._action_worker)

    def _wake_all_workers(self) -> None:
        while self._idle:
            self._idle.popleft().set()

    async def _action_worker(self) -> None:
        """Run queued actions until the dispatcher is done and the queue is empty.
        Shielded: a cancelled host still lets running actions have their grace period;
        only ``_stop_actions`` and ``_deadline_watch`` cancel an action (its slot's scope)."""
        slot = _Slot()
        self._slots.add(slot)
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
            self._slots.discard(slot)

    async def _run_queued(self, slot: _Slot) -> None:
        """Run queued actions back to back in one cancel scope, until the queue is empty or
        the scope is cancelled (an action's time limit, or the end of a stop's grace period).

        One scope for many actions: a scope with a deadline per action cost 16 us to enter
        and leave, more than the rest of a no-op action's run in the worker (measured on the
        2-core machine). ``_deadline_watch`` keeps the time limits instead.
        """
        with anyio.CancelScope() as scope:
            slot.scope = scope
            while self._ready and not scope.cancel_called:
                row = self._ready.popleft()
                self._wake_a_worker()  # more rows: the next worker is on its way
                try:
                    await self._run_in_slot(slot, row)
                finally:
                    self._running_actions -= 1
                    self._slot_freed.fire()
        slot.scope = None

    async def _run_in_slot(self, slot: _Slot, row: Claimed) -> None:
        """Run one queued action in its worker's scope and record how it ended. A
        cancellation is recorded, then goes on for the slot's scope to absorb."""
        if self._aborting:  # the grace period is over: never start it (_release_unstarted)
            self._unstarted.append(row)
            return
        try:
            ref, values, ctx, timeout = self._prepare_action(row)
        except Exception as exc:
            self._queue_outcome(_failed(row, exc))
            return
        started = time.monotonic()
        slot.row, slot.expired, slot.started, slot.deadline = row, False, started, started + timeout
        if slot.deadline < self._watch_until:
            self._deadline_changed.fire()
        try:
            result = await ref.fn(ctx, **values)
        except anyio.get_cancelled_exc_class():
            expired = slot.expired and not self._aborting
            self._queue_outcome(
                _failed(row, timeout_error(ref, timeout)) if expired else _stopped(row)
            )
            raise
        except Exception as exc:
            self._queue_outcome(_failed(row, exc))
        except BaseException as exc:  # a group holding a cancellation, a KeyboardInterrupt
            if self._aborting:
                self._queue_outcome(_stopped(row))
            elif slot.expired:
                self._queue_outcome(_failed(row, timeout_error(ref, timeout)))
            else:
                self._queue_outcome(_failed(row, exc))
            raise
        else:
            self._queue_outcome(_succeeded(row, ref, result))
        finally:
            slot.row = None
            self._action_seconds = _recent(self._action_seconds, time.monotonic() - started, 0.1)

    async def _deadline_watch(self) -> None:
        """Cancel each running action that outlives its time limit. One task for every
        worker, woken at the soonest deadline (so, with one time limit, about once per
        limit), not a timer per action."""
        with self._watch_scope:
            while True:
                changed = self._deadline_changed.current()
                now = time.monotonic()
                soonest = math.inf
                for slot in self._slots:
                    if slot.row is None or slot.expired:
                        continue
                    if slot.deadline <= now and slot.scope is not None:
                        slot.expired = True
                        slot.scope.cancel()
                    else:
                        soonest = min(soonest, slot.deadline)
                self._watch_until = soonest
                with anyio.move_on_after(soonest - now):
                    await changed.wait()

    def _queue_outcome(self, outcome: Outcome) -> None:
        self._outcomes.append(outcome)
        self._outcomes_ready.fire()

    def _prepare_action(
        self, row: Claimed
    ) -> tuple[ActionRef[Any, Any], dict[str, Any], ActionCtx, float]:
        ref = self._resolve(row, ActionRef)
        values = ref.decode_args(row.args)
        return ref, values, self._invoker.action_ctx(row.id), self._invoker.timeouts.for_(ref)

    async def _run_action(self, row: Claimed, record: Callable[[Outcome], None]) -> None:
        """``run_until_idle``'s way to run one claimed action, in a task of its own, and
        ``record`` how it ended, whichever way that was.

        If it is cancelled (a cancelled ``run_until_idle``, or the executor stopping after
        the grace period), it is recorded Failed before the cancellation goes on: a claimed
        action is never run again.
        """
        try:
            # Cancelled before it began: never start it.
            await anyio.lowlevel.checkpoint_if_cancelled()
            if self._aborting:
                raise anyio.get_cancelled_exc_class()()
            ref, values, ctx, timeout = self._prepare_action(row)
            # One scope for both ways an action is stopped: its time limit (the deadline)
            # and the end of a stop's grace period (_stop_actions cancels it).
            finished = False
            with anyio.CancelScope(deadline=anyio.current_time() + timeout) as scope:
                self._action_scopes.add(scope)
                try:
                    result = await ref.fn(ctx, **values)
                    finished = True
                finally:
                    self._action_scopes.discard(scope)
            if not finished:
                if self._aborting:
                    raise anyio.get_cancelled_exc_class()()
                raise timeout_error(ref, timeout)
            record(_succeeded(row, ref, result))
        except anyio.get_cancelled_exc_class():
            record(_stopped(row))
            if not self._aborting:
                raise
        except Exception as exc:
            record(_failed(row, exc))

    async def _finisher_loop(self) -> None:
        """Write queued action outcomes in batches, until the executor has stopped and
        every claimed action's outcome is written."""
        assert self._stopping is not None
        try:
            # Shielded: a cancelled host still gets its actions' outcomes recorded;
            # _stop_actions cancels this scope if the database stays away too long.
            with self._finisher_scope:
                await self._finish_until_stopped()
        finally:
            self._finisher_done.set()

    async def _finish_until_stopped(self) -> None:
        assert self._stopping is not None
        while True:
            ready = self._outcomes_ready.current()
            if self._outcomes:
                batch, self._outcomes = self._outcomes, []
                try:
                    await self._write_outcomes(batch)
                except BaseException:
                    self._outcomes[:0] = batch  # cancelled between retries: keep them
                    raise
            elif (
                self._stopping.is_set()
                and self._dispatcher_done.is_set()
                and not self._running_actions
            ):
                return
            else:
                await ready.wait()

    async def _write_outcomes_before_leaving(self, outcomes: list[Outcome]) -> None:
        """Write outcomes even if the caller is being cancelled, for a bounded time."""
        with anyio.CancelScope(shield=True), anyio.move_on_after(_OUTCOME_FLUSH_LIMIT):
            await self._write_outcomes(outcomes)
            return
        self._log_unrecorded(len(outcomes))

    async def _release_unstarted(self) -> None:
        """Put the rows a stop left unstarted back to Pending, for any worker to run: they
        were claimed ahead, or queued when the grace period ended. If that cannot be
        written they stay InProgress and are recorded lost later, never run."""
        rows, self._unstarted = self._unstarted, []
        if not rows:
            return
        ids = [r.id for r in rows]
        driver = self._rt.driver

        async def _release(conn: AsyncConnection) -> int:
            released = await driver.release_unstarted(conn, ids, self.worker_id)
            # Due already: idle executors elsewhere wait only for later rows (or their poll).
            await driver.notify(conn, {FunctionKind.ACTION})
            return released

        failure = "the stop was cut short"  # unless the transaction says otherwise
        released: int | None = None
        try:
            released = await self._rt.transaction(
                _release, doing="returning unstarted actions to Pending"
            )
        except Exception as exc:  # best effort: a stop must not fail here
            failure = one_line(exc)
        finally:
            if released is None:
                logger.error(
                    "%d claimed actions never started, and could not be returned to Pending "
                    "(%s); they stay InProgress and will be recorded lost, never run",
                    len(rows),
                    failure,
                )
        if released is not None:
            self._unrecorded.difference_update(ids)
            self._rt.wake({FunctionKind.ACTION})
            logger.info("%d claimed actions never started; returned to Pending", released)

    def _log_unrecorded(self, count: int) -> None:
        logger.error(
            "%d action outcomes could not be recorded (%s unavailable); those rows stay "
            "InProgress and are never run again",
            count,
            self._rt.driver.name,
        )

    async def _write_outcomes(self, outcomes: list[Outcome]) -> None:
        """InProgress -> Success/Failed for a batch, retried until the database takes it."""
        if not outcomes:
            return
        failures = 0
        while True:

            async def _write(conn: AsyncConnection) -> int:
                return await self._rt.driver.finish_in_progress(
                    conn, self._rt.clock.now(), outcomes
                )

            stuck: set[ScheduledFunctionId] = set()
            try:
                written = await self._rt.transaction(
                    _write, doing="recording action outcomes", single_statement=True
                )
                break
            except DatabaseError as exc:
                if not exc.transient:
                    written, stuck = await self._write_outcomes_one_by_one(outcomes, exc)
                    break
                delay = self._rt.backoff.delay(failures)
                failures += 1
                self._rt.health.fault(exc, f"recording {len(outcomes)} action outcomes", delay)
                await anyio.sleep(delay)
        # A row whose outcome could not be written at all is still InProgress: it stays
        # "unrecorded", so that adopting an uncertain claim never starts it again.
        self._unrecorded.difference_update(o.id for o in outcomes if o.id not in stuck)
        if written < len(outcomes):
            logger.info(
                "%d finished actions had been finished elsewhere meanwhile (cancelled, or "
                "recorded lost); their rows are left as they are",
                len(outcomes) - written,
            )
        self._record(FunctionKind.ACTION, outcomes)

    async def _write_outcomes_one_by_one(
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
        for outcome in outcomes:
            stuck.add(outcome.id)
            for attempt in (outcome, _failed(outcome, cause)):

                async def _write(conn: AsyncConnection, o: Outcome = attempt) -> int:
                    return await self._rt.driver.finish_in_progress(conn, self._rt.clock.now(), [o])

                try:
                    written += await self._rt.transaction(
                        _write, doing="recording an action outcome"
                    )
                    stuck.discard(outcome.id)
                    break
                except DatabaseError as exc:
                    logger.error("could not record the outcome of action %s: %s", outcome.id, exc)
        return written, stuck

    def _record(self, kind: FunctionKind, outcomes: list[Outcome]) -> None:
        """Count and log committed outcomes (one line each), and wake ``wait_for``."""
        before = State.PENDING if kind is FunctionKind.MUTATION else State.IN_PROGRESS
        debug = logger.isEnabledFor(logging.DEBUG)
        failed = 0
        for o in outcomes:
            if o.state is State.FAILED:
                failed += 1
                logger.warning(
                    "%s %s (%s) %s -> Failed: %s: %s",
                    kind,
                    o.id,
                    o.name,
                    before,
                    o.error_type,
                    o.error_message,
                    extra=_fields(kind, o.id, o.name, o.state),
                )
            elif debug:
                logger.debug(
                    "%s %s (%s) %s -> %s",
                    kind,
                    o.id,
                    o.name,
                    before,
                    o.state,
                    extra=_fields(kind, o.id, o.name, o.state),
                )
        self.stats["failed"] += failed
        self.stats[f"{kind}s"] += len(outcomes) - failed
        self._progress.fire()

    # -- maintenance -------------------------------------------------------------------

    async def _maintenance_loop(self) -> None:
        assert self._stopping is not None
        while not self._stopping.is_set():
            # The interval runs from the start of a pass, so time that passes during it
            # (a real backlog, or a fake clock advanced meanwhile) is not lost.
            deadline = self._rt.clock.now() + self.config.retention_interval
            try:
                await self.run_maintenance()
            except DatabaseError as exc:
                logger.warning("retention pass failed (%s); trying again next interval", exc)
            await _first_of(
                self._stopping.wait, functools.partial(self._rt.clock.sleep_until, deadline)
            )

    # -- helpers -----------------------------------------------------------------------

    def _resolve(self, row: Claimed, kind: type[FunctionRef[Any, Any]]) -> Any:
        ref = self._rt.registry.get(row.name)
        if not isinstance(ref, kind):
            raise UnknownFunctionError(row.name)
        return ref


@asynccontextmanager
async def _single_errors_unwrapped() -> AsyncIterator[None]:
    """Raise a task group's error as itself (``except DatabaseError`` then works) when
    there is one, or when parallel loops all failed the same way; otherwise the group."""
    try:
        yield
    except BaseExceptionGroup as group:
        leaves = _leaves(group)  # nested task groups nest their groups
        if len({type(exc) for exc in leaves}) == 1:
            raise leaves[0] from None
        raise


def _leaves(group: BaseExceptionGroup[BaseException]) -> list[BaseException]:
    found: list[BaseException] = []
    for exc in group.exceptions:
        found.extend(_leaves(exc) if isinstance(exc, BaseExceptionGroup) else [exc])
    return found


async def _shielded(work: Awaitable[T]) -> T:
    """Await database work shielded from cancellation.

    A statement cancelled half-way costs its connection (SQLAlchemy invalidates it), and on
    SQLite it used to leave a task behind that hung the event loop's shutdown. So a
    stopping executor (or a cancelled caller) lets the statement finish and stops at its
    next wait instead. User code inside keeps its own time limit (an inner scope).
    """
    with anyio.CancelScope(shield=True):
        result = await work
    return result


async def _first_of(*waiters: Callable[[], Awaitable[Any]]) -> None:
    """Return as soon as any of the awaitables completes; cancel the others."""
    async with anyio.create_task_group() as tg:

        async def _run(waiter: Callable[[], Awaitable[Any]]) -> None:
            await waiter()
            tg.cancel_scope.cancel()

        for waiter in waiters:
            tg.start_soon(_run, waiter)
