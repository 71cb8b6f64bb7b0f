"""The store seam: every SQL statement the runtime issues, dialect-neutral where it can be.

``Driver`` holds the statements both engines share (SQLAlchemy Core, so they stay readable
and reviewable; the hot ones are built once in ``_statements``); ``SQLiteDriver`` and
``PostgresDriver`` override only what differs: how an engine is built, how rows are
locked, how other processes are woken, and which errors are transient (``EngineDriver``).
The executor and the contexts never ask which database they are on. The conformance
suite (``tests/test_driver.py``) runs this interface on both engines.

Every state change is an UPDATE guarded by the state it expects, and its row count is
checked by the caller: a lost race is explicit, never a row moved backwards.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable, Collection, Sequence
from collections.abc import Set as AbstractSet
from typing import Any

from sqlalchemy import CursorResult, and_, delete, func, select, update
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql.elements import ColumnElement

from .._errors import ArgumentError
from .._types import (
    FINISHED_STATES,
    FunctionKind,
    ScheduledFunctionId,
    State,
)
from ._cancels import CancelStatements
from ._claim_hints import FastPathHint, LevelFloor
from ._claims import SERVE_ALL, ClaimFilter, next_due, start_actions, take
from ._completions import canceled
from ._crons import CronStatements
from ._debounce import write_debounced
from ._engine import EngineDriver
from ._explain import ExplainStatements, FlowKeyStatements
from ._failures import FailureStatements, in_state
from ._fast_claims import start_fast, take_fast
from ._filters import RowFilter
from ._inline import InlineStatements
from ._keys import insert_keyed
from ._queues import QueueStatements
from ._reading import ReadStatements
from ._rows import Claimed, Outcome, mark_moved
from ._statements import (
    CANCEL,
    CANCELED_COLUMNS,
    CLAIM_COLUMNS,
    FINISH_ONE,
    FINISH_PLAIN,
    FinishParams,
    claimed,
    finish_params,
)
from ._tables import sf
from ._workers import WorkerStatements

KIND_OF = {State.PENDING: FunctionKind.MUTATION, State.IN_PROGRESS: FunctionKind.ACTION}
"""The kind of the rows a finish expects in each state."""


def plain_or_retried(
    outcomes: Sequence[Outcome],
    retried: Callable[[Outcome], bool] = lambda o: o.retry_at is not None,
) -> bool:
    """Whether every outcome is a plain success (no result, no completion callback) or a
    ``retried`` run (no callback): what the drivers' one-statement finishes write."""
    return all(
        o.on_complete is None and (retried(o) or (o.state is State.SUCCESS and o.result is None))
        for o in outcomes
    )


class Driver(
    ReadStatements,
    QueueStatements,
    FailureStatements,
    CancelStatements,
    InlineStatements,
    CronStatements,
    ExplainStatements,
    FlowKeyStatements,
    WorkerStatements,
    EngineDriver,
):
    """Dialect-neutral statements on the system tables."""

    # -- one row ---------------------------------------------------------------------------

    async def lock_for_share(self, conn: AsyncConnection, id: ScheduledFunctionId) -> State | None:
        """Read a row's state, holding it against a concurrent cancel until commit."""
        return await self.state(conn, id)

    async def state(self, conn: AsyncConnection, id: ScheduledFunctionId) -> State | None:
        value = (await conn.execute(select(sf.c.state).where(sf.c.id == id))).scalar()
        return State(value) if value is not None else None

    # -- scheduling ----------------------------------------------------------------------

    async def insert_rows(
        self,
        conn: AsyncConnection,
        rows: Sequence[dict[str, Any]],
        notify: Collection[FunctionKind] = (),
    ) -> None:
        """Insert rows (their keys are ``NEW_ROW_COLUMNS``), and ``notify`` executors of
        these kinds when this commits. Each driver has its own one-statement form."""
        raise NotImplementedError

    async def insert_keyed(
        self, conn: AsyncConnection, rows: Sequence[dict[str, Any]]
    ) -> builtins.list[ScheduledFunctionId]:
        """Write rows that carry job keys (``_keys``); returns the id that runs for each."""
        return await insert_keyed(conn, self.dialect_insert, rows)

    async def write_debounced(
        self,
        conn: AsyncConnection,
        rows: Sequence[dict[str, Any]],
        running: Collection[ScheduledFunctionId] = (),
    ) -> builtins.list[ScheduledFunctionId]:
        """Write debounced and throttled calls (``_debounce``); returns the id that runs for
        each. ``running``: rows this transaction has claimed and is running."""
        return await write_debounced(conn, self.dialect_insert, rows, running)

    async def pending_batch(
        self, conn: AsyncConnection, where: RowFilter, after: str | None, limit: int
    ) -> builtins.list[ScheduledFunctionId]:
        """Up to ``limit`` ids of Pending rows matching ``where``, in id order after
        ``after`` (keyset: a rescheduled row still matches and must not be seen twice)."""
        stmt = select(sf.c.id).where(*where.where()).order_by(sf.c.id).limit(limit)
        if after is not None:
            stmt = stmt.where(sf.c.id > after)
        return [ScheduledFunctionId(str(i)) for i in (await conn.execute(stmt)).scalars()]

    async def change_pending(
        self,
        conn: AsyncConnection,
        ids: Sequence[ScheduledFunctionId],
        values: dict[str, Any] | None,
        now: float,
    ) -> int:
        """Set ``values`` on these rows, or cancel them (None), where still Pending."""
        stmt = update(sf).where(sf.c.id.in_(ids), sf.c.state == State.PENDING.value)
        if values is not None:
            result = await conn.execute(stmt.values(**values))
            assert isinstance(result, CursorResult)
            return result.rowcount
        rows = (
            await conn.execute(stmt.values(CANCEL).returning(*CANCELED_COLUMNS), {"now": now})
        ).all()
        await self.write_completions(conn, now, canceled(rows))
        return len(rows)

    # -- executor: mutations -------------------------------------------------------------

    async def claim_mutations(
        self,
        conn: AsyncConnection,
        now: float,
        limit: int,
        serve: ClaimFilter = SERVE_ALL,
        hint: FastPathHint | None = None,
        floor: LevelFloor | None = None,
    ) -> list[Claimed]:
        """Choose due mutations inside the batch transaction (``_claims``), locked, with
        their queues, until it ends."""
        kind = FunctionKind.MUTATION
        rows: list[Claimed] = []
        if hint is None or hint.use:
            rows = await take_fast(conn, kind, now, limit, serve, self.lateral_claims, floor)
        if not rows:
            # Rows from the fast path mean its guard held (no queued row due) and it read
            # every level: the full claim could add nothing. (It ran the full claim for
            # every short claim at first: a 1-row claim cost 15 ms against a backlog at
            # seven levels.)
            rows = await take(
                conn, kind, now, limit, serve, self.dialect_insert, hint, self.lateral_claims
            )
        return rows

    async def finish_pending(
        self,
        conn: AsyncConnection,
        now: float,
        outcomes: Sequence[Outcome],
        worker_id: str | None = None,
        started: float | None = None,
    ) -> int:
        """Pending -> Success/Failed (or Pending again, retried) for mutations run in this
        transaction, which began at ``started`` (their start time, written with their end);
        returns the count. Each failed run goes into its row's history (under
        ``worker_id``), and executors are notified of rows retried."""
        return await self._finish(conn, now, outcomes, State.PENDING, worker_id, started)

    def finishes_in_one_statement(
        self, outcomes: Sequence[Outcome], retrying: AbstractSet[ScheduledFunctionId]
    ) -> bool:
        """Whether ``finish_in_progress`` writes these outcomes (``retrying``: the failed
        runs their policies will retry) in statements that each stand alone, so that the
        caller may run it without a transaction of its own: successes only, here (a
        failure and its history, a finish and its completion callback commit together)."""
        return all(o.state is State.SUCCESS and o.on_complete is None for o in outcomes)

    async def _finish(
        self,
        conn: AsyncConnection,
        now: float,
        outcomes: Sequence[Outcome],
        expected: State,
        worker_id: str | None,
        started: float | None = None,
    ) -> int:
        written = await self._finish_rows(conn, now, outcomes, expected, worker_id, started)
        # A retried run went into its row's history with its retry. A final failure goes
        # now, if its finish moved the row: one cancelled meanwhile has no failure to keep
        # (nor one recorded lost, whose rescue kept its own).
        failed = [o for o in outcomes if not o.unwritten and o.state is State.FAILED]
        if failed:
            await self.record_failures(conn, now, failed, worker_id)
        if any(not o.unwritten and o.retry_at is not None for o in outcomes):
            await self.notify(conn, {KIND_OF[expected]})
        return written

    async def _finish_rows(
        self,
        conn: AsyncConnection,
        now: float,
        outcomes: Sequence[Outcome],
        expected: State,
        worker_id: str | None,
        started: float | None,
    ) -> int:
        # The common outcome (Success, nothing returned) goes out as one statement for the
        # whole batch; only the others need a row each. On SQLite this took a 64-row
        # batch's completion from ~3 ms (executemany) to well under 1 ms.
        common = FinishParams(
            now=now,
            expected=expected.value,
            counted=1 if expected is State.PENDING else 0,
            started=started,
        )
        written = 0
        # Final failures and rows with a completion callback (both rare) are written so
        # that each is known to have been moved, or not (cancelled, or recorded lost,
        # meanwhile): only a moved row gets its history entry and its callback.
        exact = [
            o
            for o in outcomes
            if o.retry_at is None and (o.state is State.FAILED or o.on_complete is not None)
        ]
        if exact:
            written += mark_moved(exact, await self._finish_exactly(conn, exact, common))
            await self.write_completions(conn, now, [o for o in exact if not o.unwritten])
        plain = [o.id for o in outcomes if o.state is State.SUCCESS and o.result is None]
        retried = [o for o in outcomes if o.retry_at is not None]
        other = [
            o
            for o in outcomes
            if o.state is State.SUCCESS and o.result is not None and o.on_complete is None
        ]
        if plain:
            written += await self._finish_plain(conn, plain, common)
        if other:
            written += await self._finish_others(conn, other, common)
        if retried:
            moved = await self.retry_rows(
                conn, now, retried, expected, worker_id, common["counted"], 1
            )
            written += mark_moved(retried, moved)
        return written

    async def _finish_plain(
        self, conn: AsyncConnection, ids: list[ScheduledFunctionId], common: FinishParams
    ) -> int:
        """Success, with no result, for every row of ``ids`` still in ``expected``."""
        written = 0
        for start in range(0, len(ids), 500):  # SQLite's limit on bound parameters
            result = await conn.execute(FINISH_PLAIN, {**common, "ids": ids[start : start + 500]})
            assert isinstance(result, CursorResult)
            written += result.rowcount
        return written

    async def _finish_others(
        self, conn: AsyncConnection, outcomes: list[Outcome], common: FinishParams
    ) -> int:
        """Each outcome's state, result and error, for its row if still in ``expected``."""
        result = await conn.execute(FINISH_ONE, [finish_params(o, common) for o in outcomes])
        assert isinstance(result, CursorResult)
        return result.rowcount

    async def _finish_exactly(
        self, conn: AsyncConnection, outcomes: list[Outcome], common: FinishParams
    ) -> set[str]:
        """Each outcome for its row if still in ``expected``; returns the ids it moved
        (``in_state``; PostgreSQL's driver: one statement, RETURNING)."""
        moved = await in_state(conn, [o.id for o in outcomes], State(common["expected"]))
        params = [finish_params(o, common) for o in outcomes if o.id in moved]
        if params:
            await conn.execute(FINISH_ONE, params)
        return moved

    async def count_retry(self, conn: AsyncConnection, ids: Sequence[ScheduledFunctionId]) -> None:
        """Count a run that began in a batch that was rolled back. Not guarded by state:
        the run began whatever has happened to the row since (finished by another lane,
        cancelled), and the count is all this writes."""
        await conn.execute(update(sf).where(sf.c.id.in_(ids)).values(attempts=sf.c.attempts + 1))

    # -- executor: actions ---------------------------------------------------------------

    async def claim_actions(
        self,
        conn: AsyncConnection,
        now: float,
        limit: int,
        worker_id: str,
        serve: ClaimFilter = SERVE_ALL,
        hint: FastPathHint | None = None,
    ) -> list[Claimed]:
        """Pending -> InProgress for up to ``limit`` due actions (``_claims.take``, after
        ``claim_actions_fast``); commit before running them."""
        rows = await take(
            conn,
            FunctionKind.ACTION,
            now,
            limit,
            serve,
            self.dialect_insert,
            hint,
            self.lateral_claims,
        )
        return await start_actions(conn, rows, now, worker_id)

    async def claim_actions_fast(
        self,
        conn: AsyncConnection,
        now: float,
        limit: int,
        worker_id: str,
        serve: ClaimFilter = SERVE_ALL,
    ) -> list[Claimed]:
        """Pending -> InProgress for up to ``limit`` due unqueued actions, by level, when
        no queued action is due (``_claims.start_fast``); commit before running them.
        None found: ``claim_actions`` (the full claim) may find queued ones."""
        return await start_fast(conn, now, limit, worker_id, serve, self.lateral_claims)

    async def release_unstarted(
        self, conn: AsyncConnection, ids: Sequence[ScheduledFunctionId], worker_id: str
    ) -> int:
        """InProgress -> Pending for actions this worker claimed and never started (a stop
        ended before a worker was free): none of them ran, so at most once still holds.
        Guarded by state and worker, so running it again changes nothing twice."""
        released = 0
        for start in range(0, len(ids), 500):  # SQLite's limit on bound parameters
            result = await conn.execute(
                update(sf)
                .where(
                    sf.c.id.in_(ids[start : start + 500]),
                    sf.c.state == State.IN_PROGRESS.value,
                    sf.c.worker_id == worker_id,
                )
                .values(
                    state=State.PENDING.value,
                    started_time=None,
                    worker_id=None,
                    attempts=sf.c.attempts - 1,
                )
            )
            assert isinstance(result, CursorResult)
            released += result.rowcount
        return released

    async def claimed_by(self, conn: AsyncConnection, worker_id: str) -> list[Claimed]:
        """The actions InProgress under ``worker_id`` (ix_scheduled_functions_running)."""
        rows = await conn.execute(
            select(*CLAIM_COLUMNS).where(
                sf.c.state == State.IN_PROGRESS.value, sf.c.worker_id == worker_id
            )
        )
        return claimed(list(rows))

    async def finish_in_progress(
        self,
        conn: AsyncConnection,
        now: float,
        outcomes: Sequence[Outcome],
        worker_id: str | None = None,
    ) -> int:
        """InProgress -> Success/Failed (or Pending, retried), with the failures' history,
        as ``finish_pending``. A row cancelled meanwhile stays Canceled.

        Guarded by the state, so running it again (a retry after an unseen outcome) writes
        nothing twice."""
        return await self._finish(conn, now, outcomes, State.IN_PROGRESS, worker_id)

    async def next_due(
        self, conn: AsyncConnection, kind: FunctionKind, after: float | None = None
    ) -> float | None:
        """When the next Pending row of ``kind`` (due later than ``after``) becomes due.

        ``after`` lets an idle executor skip rows that are due but locked by another lane
        or executor: waiting for those would be a busy loop.
        """
        # The first entry of each priority level's range of the two claim indexes: one
        # probe per level, whatever the backlog (_claims.next_due).
        return await next_due(conn, kind, after)

    # -- retention -----------------------------------------------------------------------

    async def delete_finished(
        self,
        conn: AsyncConnection,
        cutoff: float,
        limit: int,
        states: Collection[State] = FINISHED_STATES,
        *,
        names: Collection[str] | None = None,
        excluded: Collection[str] = (),
    ) -> int:
        """Delete up to ``limit`` rows in ``states`` completed before ``cutoff``, oldest
        first: rows of the functions ``names`` only (None: any), and none of ``excluded``."""
        # Bounded so that one call never holds locks for long.
        doomed = (
            select(sf.c.id)
            .where(_finished_before(cutoff, states))
            .order_by(sf.c.completed_time)
            .limit(limit)
        )
        if names is not None:
            doomed = doomed.where(sf.c.name.in_(sorted(names)))
        if excluded:
            doomed = doomed.where(sf.c.name.not_in(sorted(excluded)))
        result = await conn.execute(
            delete(sf).where(sf.c.id.in_(doomed.scalar_subquery())).returning(sf.c.id)
        )
        return len(result.all())  # their histories with them

    async def count_rows(self, conn: AsyncConnection, where: RowFilter) -> int:
        """How many rows match ``where`` (a scan of what its filters leave)."""
        stmt = select(func.count()).select_from(sf).where(*where.where())
        return int((await conn.execute(stmt)).scalar_one())

    async def count_finished(
        self, conn: AsyncConnection, cutoff: float, states: Collection[State] = FINISHED_STATES
    ) -> int:
        """How many rows ``delete_finished`` would delete, all batches together."""
        stmt = select(func.count()).select_from(sf).where(_finished_before(cutoff, states))
        return int((await conn.execute(stmt)).scalar_one())


def _finished_before(cutoff: float, states: Collection[State]) -> ColumnElement[bool]:
    # ix_scheduled_functions_completed: "completed_time < x" implies the index's
    # "completed_time IS NOT NULL", so both engines can use the partial index.
    unfinished = sorted(State(s).value for s in states if not State(s).finished)
    if unfinished:
        raise ArgumentError(
            f"only finished rows (Success, Failed, Canceled) can be deleted, not {unfinished}"
        )
    return and_(
        sf.c.completed_time < cutoff, sf.c.state.in_(sorted(State(s).value for s in states))
    )
