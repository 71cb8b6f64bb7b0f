"""The hot finish statements, built once, each with the index it uses.

Constructing a Core statement costs ~0.3 ms of Python, as much as running it, so the
statements the executor runs per batch are built at import. Values arrive as bind
parameters, "now" included (the injected clock reaches the SQL). Dialects that need
another form of one (PostgreSQL's array-bound finishes) override the driver hook that
runs it, in their own folder.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from collections.abc import Set as AbstractSet
from typing import Any, TypedDict

from sqlalchemy import CursorResult, Double, bindparam, func, update
from sqlalchemy.ext.asyncio import AsyncConnection

from ..._kinds import FunctionKind, ScheduledFunctionId, State
from ..engine import EngineDriver
from ..rows import Outcome, mark_moved
from ..schema.tables import sf
from .completions import CompletionStatements
from .failures import FailureStatements, in_state


class FinishParams(TypedDict):
    """The parameters every finish statement shares."""

    now: float
    expected: str
    counted: int
    """1 for a mutation, whose run is counted as it finishes (its start was never
    committed); 0 for an action, counted when it was claimed."""
    started: float | None
    """When a mutation's batch began (its start was never committed either: written with
    its finish); None for an action, whose claim wrote it."""


# A mutation's start, written with its finish; an action's stays as its claim wrote it.
_STARTED = func.coalesce(bindparam("started", type_=Double), sf.c.started_time)
# Both finishes find their rows by primary key; ``expected`` is the state guard.
FINISH_PLAIN = (
    update(sf)
    .where(sf.c.id.in_(bindparam("ids", expanding=True)), sf.c.state == bindparam("expected"))
    .values(
        state=State.SUCCESS.value,
        started_time=_STARTED,
        completed_time=bindparam("now"),
        attempts=sf.c.attempts + bindparam("counted"),
        # A run that succeeded after failed ones: its error is history now.
        error_type=None,
        error_message=None,
        error_traceback=None,
    )
)
FINISH_ONE = (
    update(sf)
    .where(sf.c.id == bindparam("b_id"), sf.c.state == bindparam("expected"))
    .values(
        state=bindparam("b_state"),
        started_time=_STARTED,
        completed_time=bindparam("now"),
        result=bindparam("b_result"),
        error_type=bindparam("b_error_type"),
        error_message=bindparam("b_error_message"),
        error_traceback=bindparam("b_error_traceback"),
        attempts=sf.c.attempts + bindparam("counted"),
        failures=sf.c.failures + bindparam("b_failed"),
    )
)


def finish_params(o: Outcome, common: FinishParams) -> dict[str, Any]:
    """FINISH_ONE's parameters for one outcome."""
    return {
        "b_id": o.id,
        "b_state": o.state.value,
        "b_result": o.result,
        "b_error_type": o.error_type,
        "b_error_message": o.error_message,
        "b_error_traceback": o.error_traceback,
        "b_failed": int(o.state is State.FAILED),
        **common,
    }


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


class FinishStatements(FailureStatements, CompletionStatements, EngineDriver):
    """The driver's finishes: a run's outcome written to its row, guarded by the state
    the row is expected in (a part of ``Driver``; each dialect overrides the hooks its
    one-statement forms replace)."""

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

    def finishes_in_one_statement(
        self, outcomes: Sequence[Outcome], retrying: AbstractSet[ScheduledFunctionId]
    ) -> bool:
        """Whether ``finish_in_progress`` writes these outcomes (``retrying``: the failed
        runs their policies will retry) in statements that each stand alone, so that the
        caller may run it without a transaction of its own: successes only, here (a
        failure and its history, a finish and its completion callback commit together)."""
        return all(o.state is State.SUCCESS and o.on_complete is None for o in outcomes)

    async def count_retry(self, conn: AsyncConnection, ids: Sequence[ScheduledFunctionId]) -> None:
        """Count a run that began in a batch that was rolled back. Not guarded by state:
        the run began whatever has happened to the row since (finished by another lane,
        cancelled), and the count is all this writes."""
        await conn.execute(update(sf).where(sf.c.id.in_(ids)).values(attempts=sf.c.attempts + 1))

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
        # Final failures and rows with a completion callback (both rare) are written so
        # that each is known to have been moved, or not (cancelled, or recorded lost,
        # meanwhile): only a moved row gets its history entry and its callback. One pass
        # sorts the outcomes (the passes over a 256-row batch, here and in the callers,
        # were 4% of a no-op mutation's CPU in a PostgreSQL drain).
        exact: list[Outcome] = []
        plain: list[ScheduledFunctionId] = []
        other: list[Outcome] = []
        retried: list[Outcome] = []
        for o in outcomes:
            if o.retry_at is not None:
                retried.append(o)
            elif o.state is not State.SUCCESS or o.on_complete is not None:
                exact.append(o)
            elif o.result is None:
                plain.append(o.id)
            else:
                other.append(o)
        written = 0
        if exact:
            written += mark_moved(exact, await self._finish_exactly(conn, exact, common))
            await self.write_completions(conn, now, [o for o in exact if not o.unwritten])
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
