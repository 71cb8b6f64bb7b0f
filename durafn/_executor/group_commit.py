"""One mutation batch: claim due mutations, run each on the batch's connection, write
every row's outcome with one guarded UPDATE, and commit once.

This transaction is where "exactly once" is kept: each mutation's effects and its row's
move out of Pending commit together, so a crash before COMMIT leaves the rows Pending
with no effects, and after it leaves them finished. Group commit is the point: one
COMMIT (one fsync) per batch instead of per mutation.

``Mode`` says how carefully the batch runs. OPTIMISTIC runs every mutation in one
session without savepoints (a SAVEPOINT/RELEASE pair costs two round trips per mutation
on PostgreSQL). A mutation that raises there before anything of it reached the database
(reads only: every other statement on the connection is counted) is recorded as it is
and the batch goes on; one that raises after a write raises ``BatchRestart``, and the
lane re-runs the batch in SAVEPOINTS mode, a savepoint around each mutation, so the
failing one is rolled back alone. Either way its failure is written as its retry policy
says (``retrying.settle``: Failed, or Pending again later). ALONE runs one row per
transaction, after a failure that no mutation owned. A mutation past its time limit
raises ``BatchTimeout`` once its statement is stopped and the batch rolled back.
"""

from __future__ import annotations

import asyncio
import enum
import functools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import anyio
from sqlalchemy import event
from sqlalchemy import exc as sa_exc
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession, AsyncTransaction

from .._context import MutationCtx, MutationParts
from .._errors import DatabaseError, DurafnError, FunctionTimeoutError
from .._invoke import Invoker, check_transaction, mutation_session
from .._kinds import FunctionKind, ScheduledFunctionId, State
from .._registry import MutationRef
from .._runtime import Inline, Runtime
from .._store import (
    SERVE_ALL,
    Claimed,
    ClaimFilter,
    FastPathHint,
    LevelFloor,
    Outcome,
    take_notes,
)
from .._writers import BufferedWriter, Enqueued
from .outcomes import failed, held_back, success
from .retrying import keep_trace, retried, settle
from .tasks import Pace
from .wakeups import KINDS

MUTATION = FunctionKind.MUTATION


def _no_writer() -> BufferedWriter:
    raise AssertionError("a batch's writer is made once its connection is open")


def _from_database(exc: BaseException) -> bool:
    """Whether a database error is among ``exc``'s causes (on PostgreSQL it has aborted
    the transaction, whatever statement raised it)."""
    seen: BaseException | None = exc
    for _ in range(20):
        if seen is None:
            return False
        if isinstance(seen, sa_exc.DBAPIError):
            return True
        seen = seen.__cause__ or seen.__context__
    return True


class Mode(enum.Enum):
    """How carefully a mutation batch runs (see the module docstring)."""

    OPTIMISTIC = "optimistic"  # one transaction, no savepoints: the fast path
    SAVEPOINTS = "savepoints"  # a savepoint around each mutation, after one raised
    ALONE = "alone"  # one row per transaction, after a failure no mutation owned


class BatchRestart(Exception):
    """A mutation raised in an optimistic batch: re-run the batch with savepoints."""


@dataclass
class BatchTimeout(Exception):
    """A mutation outlived its time limit; the batch was rolled back."""

    row: Claimed
    error: FunctionTimeoutError


class GroupCommit:
    """One batch's transaction. ``run`` once; then ``claimed``, ``begun``, ``outcomes``
    (committed if ``run`` returned) and ``woken`` (kinds its mutations scheduled) describe
    it. The
    wall time per mutation it ran goes to ``pace``."""

    def __init__(
        self,
        runtime: Runtime,
        invoker: Invoker,
        mode: Mode,
        pace: Pace,
        serve: ClaimFilter = SERVE_ALL,
        hint: FastPathHint | None = None,
        worker_id: str | None = None,
        floor: LevelFloor | None = None,
        only: list[ScheduledFunctionId] | None = None,
    ) -> None:
        self._rt = runtime
        self._only = only
        """Claim these rows (inline mode), whatever their due time, not the due ones."""
        self._floor = floor
        self._worker_id = worker_id
        self._serve = serve
        self._hint = hint
        self._invoker = invoker
        self._mode = mode
        self._pace = pace
        self.claimed: list[Claimed] = []
        self._running: frozenset[ScheduledFunctionId] = frozenset()
        self.begun: list[Claimed] = []
        """Rows whose function this batch started: if the batch rolls back, each of these
        runs still counts as an attempt (``MutationLanes`` records it)."""
        self.outcomes: list[Outcome] = []
        self.woken: set[FunctionKind] = set()
        self.enqueued: list[Enqueued] = []
        self.inline: list[Inline] = []
        """Rows its mutations scheduled: ``enqueue`` hooks once it commits."""
        self._written = 0
        """How many of ``outcomes`` are already written to the database."""
        self._cancelled = False
        """A mutation of this batch cancelled something: check rows before running them."""
        # The mutation running now, to name it if its time limit fires.
        self._current: Claimed | None = None
        self._timeout = 0.0
        self._writes = 0
        """Statements other than reads run on the batch's connection (optimistic mode)."""
        self._began: float | None = None
        """When its rows began to run (the injected clock)."""
        self._deadline = math.inf
        """When the mutation running is past its time limit (the event loop's clock)."""
        self._timer: asyncio.TimerHandle | None = None
        self._limit = anyio.CancelScope()
        self._loop_time = asyncio.get_running_loop().time
        self._new_writer: Callable[[], BufferedWriter] = _no_writer

    async def run(self, now: float | None, size: int, batch_time: float) -> None:
        """Claim up to ``size`` rows due at ``now`` (default: the clock's now), run them for
        at most ``batch_time`` seconds (the rest stay Pending), write and commit."""
        rt = self._rt
        async with rt.engine.connect() as conn:
            take_notes(conn)  # what a transaction rolled back may have left
            root = await conn.begin()
            rows = await self._claim(conn, rt.clock.now() if now is None else now, size)
            if not rows:
                await conn.rollback()
                return
            handle = await rt.driver.statement_handle(conn)
            self._began = rt.clock.now()  # the rows' start (written with their finish)
            self.claimed.extend(rows)
            self._running = frozenset(r.id for r in self.claimed)
            started = time.monotonic()
            limit, cut = await self._run_rows(conn, root, rows, started + batch_time)
            if limit.cancel_called:
                # A mutation outlived its time limit and was cancelled, possibly in the middle
                # of a statement: stop that statement, roll everything back, drop the
                # connection.
                await rt.driver.abandon(conn, handle)
                raise self._timed_out()
            await self._tell_others(conn, rows, cut)
            if self.outcomes:
                self._pace.add((time.monotonic() - started) / len(self.outcomes))
            await self._write(conn)
            notes = take_notes(conn)
            await conn.commit()
        self.inline += rt.after_commit(notes)

    async def _claim(self, conn: AsyncConnection, now: float, size: int) -> list[Claimed]:
        driver = self._rt.driver
        if self._only is not None:
            return await driver.claim_ids(conn, MUTATION, self._only[:size], now)
        return await driver.claim_mutations(conn, now, size, self._serve, self._hint, self._floor)

    async def _run_rows(
        self, conn: AsyncConnection, root: AsyncTransaction, rows: list[Claimed], stop_at: float
    ) -> tuple[anyio.CancelScope, bool]:
        """Run the claimed rows in order until ``stop_at`` (the rest stay Pending: then
        ``cut``), each in the batch's session or its own savepoint; the scope a mutation
        past its time limit cancelled, if one did."""
        # Optimistic: one session for the batch. With savepoints each mutation gets its
        # own session joined to its own savepoint. "rollback_only": a user's
        # ctx.db.commit() commits nothing of ours; a ctx.db.rollback() is detected.
        session = mutation_session(conn) if self._mode is Mode.OPTIMISTIC else None
        if session is not None:
            event.listen(conn.sync_connection, "before_cursor_execute", self._count_writes)
        outcomes = self.outcomes
        # One cancel scope for the whole batch, cancelled by a timer when the mutation
        # running is past its time limit; the timer is moved only when a mutation's
        # limit ends sooner than the one it is set for (``_past_limit``). A new anyio
        # scope per mutation cost ~25 us, a sixth of a no-op mutation on SQLite; moving
        # one scope's deadline per mutation (a timer cancelled and made twice) 6% of a
        # PostgreSQL drain's CPU. Real time, not the injected clock: this bounds lock
        # holding, not a schedule.
        cut = False
        self._new_writer = functools.partial(
            BufferedWriter,
            self._rt,
            conn,
            check_parent=None,
            before_cancel=functools.partial(self._before_cancel, conn),
            running=self._running,
        )
        with anyio.CancelScope() as limit:
            self._limit = limit
            try:
                for row in rows:
                    if outcomes and time.monotonic() >= stop_at:
                        # The rest stay Pending: the next batch takes them, ours or, if
                        # this executor is stopping, another's (woken below).
                        cut = True
                        break
                    if (
                        self._cancelled
                        and await self._rt.driver.state(conn, row.id) is not State.PENDING
                    ):
                        continue  # cancelled by an earlier mutation of this batch
                    outcomes.append(await self._run_one(conn, root, session, row))
            finally:
                if self._timer is not None:
                    self._timer.cancel()
                if session is not None:
                    event.remove(conn.sync_connection, "before_cursor_execute", self._count_writes)
                    if not limit.cancel_called:
                        await session.close()
        return limit, cut

    def _timed_out(self) -> BatchTimeout:
        assert self._current is not None
        return BatchTimeout(
            self._current,
            FunctionTimeoutError(
                f"mutation {self._current.name!r} ran longer than its time limit of "
                f"{self._timeout:g}s and was rolled back; raise the limit with "
                "timeout=... on its decorator"
            ),
        )

    async def _tell_others(self, conn: AsyncConnection, rows: list[Claimed], cut: bool) -> None:
        """At this commit, wake the executors that may wait for what it frees."""
        driver = self._rt.driver
        if cut:
            # Executors elsewhere skipped these locked rows and may be idle until their
            # poll: tell them, at our commit, that they are free again.
            await driver.notify(conn, {FunctionKind.MUTATION})
            self.woken.add(FunctionKind.MUTATION)
        if any(row.queue_name is not None for row in rows):
            # Our queues' locks end with this commit: their next rows (of either kind)
            # may start, and claimers that skipped them may be idle.
            await driver.notify(conn, KINDS)
            self.woken.update(KINDS)

    def _limit_from(self, deadline: float) -> None:
        """The mutation starting now is past its time limit at ``deadline`` (the event
        loop's clock): the timer is moved only if it is set for later than that. An
        asyncio timer: anyio has none that can be moved, and both drivers (asyncpg,
        aiosqlite) run on asyncio only."""
        self._deadline = deadline
        if self._timer is None or deadline < self._timer.when():
            if self._timer is not None:
                self._timer.cancel()
            self._timer = asyncio.get_running_loop().call_at(deadline, self._past_limit)

    def _past_limit(self) -> None:
        """The timer: cancel the batch if the mutation running is past its limit, or wait
        for that one's (a later mutation's limit ends later than the timer was set for)."""
        loop = asyncio.get_running_loop()
        if self._deadline <= loop.time():
            self._timer = None
            self._limit.cancel()
        elif self._deadline == math.inf:
            self._timer = None  # between mutations: the next one sets its own
        else:
            self._timer = loop.call_at(self._deadline, self._past_limit)

    async def _run_one(
        self,
        conn: AsyncConnection,
        root: AsyncTransaction,
        batch_session: AsyncSession | None,
        row: Claimed,
    ) -> Outcome:
        rt = self._rt
        if row.after_policy is not None:
            rt.dependencies_in_use = True
            if row.after_failed and (instead := held_back(row)) is not None:
                return instead  # a row it waited for failed: its after_policy, not a run
        try:
            ref = rt.registry.get_kind(row.name, MutationRef)
            values = ref.decode_args(row.args)
        except DurafnError as exc:
            return failed(row, exc)
        savepoint = await conn.begin_nested() if batch_session is None else None
        session = batch_session or mutation_session(conn)
        parts = MutationParts(
            rt, conn, session, self._new_writer, parent_id=row.id, own_run_id=row.id
        )
        mark = self._written
        writes = self._writes
        self.begun.append(row)
        timeout = self._invoker.timeouts.for_(ref)
        hooks = rt.hooks.active
        if hooks:
            await rt.hooks.before(MUTATION, row)
        self._current, self._timeout = row, timeout
        self._limit_from(self._loop_time() + timeout)
        try:
            with rt.telemetry.running(MUTATION, row, self._began, self._worker_id):
                result = await ref.fn(MutationCtx(rt, parts, row.id), **values)  # its span current
            if parts.used_db or savepoint is not None:
                check_transaction(conn, root, savepoint, session, ref)
                if session.new or session.dirty or session.deleted:
                    await session.flush()
            if parts.limit_error is not None:
                raise parts.limit_error
            encoded = ref.encode_result(result)
            if parts.writer is not None:
                await parts.writer.flush()
            if savepoint is not None:
                await savepoint.commit()
            self._deadline = math.inf  # the limit covers the run, not the hooks after it
        except Exception as exc:
            self._deadline = math.inf
            return await self._failed_run(exc, row, root, savepoint, session, parts, writes, mark)
        finally:
            if batch_session is None:
                await session.close()
            elif parts.used_db and session.identity_map:
                session.expunge_all()
        writer = parts.writer
        if writer is not None:
            self.woken |= writer.woken
            self.enqueued += writer.enqueued
            self.inline += writer.inline
        outcome = success(row, encoded)
        if hooks:
            await rt.hooks.after(MUTATION, outcome)
        return outcome

    async def _failed_run(
        self,
        exc: Exception,
        row: Claimed,
        root: AsyncTransaction,
        savepoint: AsyncTransaction | None,
        session: AsyncSession,
        parts: MutationParts,
        writes: int,
        mark: int,
    ) -> Outcome:
        """A mutation raised: the batch restarts (with savepoints) if what it did cannot be
        undone alone, else its row is recorded Failed and the batch goes on."""
        if self._rt.driver.is_transient(exc, raised_by_user=True):
            raise exc
        if savepoint is None:
            if self._writes != writes or not root.is_active or _from_database(exc):
                raise BatchRestart() from exc
            # Nothing of it reached the database (reads only): drop what it left in the
            # session and its scheduler, record it, and go on with the batch. A restart with
            # savepoints cost a batch of no-op mutations with one in ten failing 0.05x of
            # its rate.
            if session.identity_map or session.new:
                session.expunge_all()
            if parts.writer is not None:
                parts.writer.discard()
            return await self._after(failed(row, exc))
        # Closing the mutation's own session first rolls back savepoints the user left
        # open inside ours; then ours can be rolled back.
        await session.close()
        if savepoint.is_active:
            await savepoint.rollback()
        self._written = mark  # outcomes it wrote early were rolled back with it
        if parts.writer is not None:
            parts.writer.discard()
        return await self._after(failed(row, exc))

    async def _after(self, outcome: Outcome) -> Outcome:
        """The ``after`` hooks of a run that ended with ``outcome`` (not yet written)."""
        keep_trace(self._rt, outcome)
        await self._rt.hooks.after(MUTATION, outcome)
        return outcome

    def _count_writes(self, _conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        """Every statement of an optimistic batch that is not a plain read: a mutation that
        raised after one must be rolled back (the batch re-runs with savepoints)."""
        if statement.lstrip()[:6].upper() != "SELECT":
            self._writes += 1

    async def _before_cancel(self, conn: AsyncConnection) -> None:
        await self._write(conn)
        self._cancelled = True

    async def _write(self, conn: AsyncConnection) -> None:
        """Write the batch's outcomes not yet written.

        Called at the end of a batch, and also before a mutation of the batch cancels a
        row: then the rows the batch already ran must read as finished (as they would had
        each mutation committed alone), and the batch must skip rows cancelled under it.
        """
        pending = self.outcomes[self._written :]
        now = self._rt.clock.now()
        written = await settle(self._rt, conn, now, pending, MUTATION, self._worker_id, self._began)
        if retried(pending):
            self.woken.add(MUTATION)
        if self._rt.wake_on_finish:  # a finish may have released rows waiting for it
            self.woken.update(KINDS)
        if written != len(pending):  # pragma: no cover - the rows are locked by this batch
            raise DatabaseError(
                f"{len(pending) - written} claimed mutations changed state under the executor"
            )
        self._written = len(self.outcomes)
