"""Failed runs in the database: a retried row back to Pending, each failure in the row's
history (``_durafn_failed_attempts``), the history read back, Failed rows retried by hand.

The decision (retry or not, when) is the executor's (``_executor/retrying.py``); these are
the statements it and the admin calls write with, guarded by the state they expect.
"""

from __future__ import annotations

import builtins
from collections.abc import Sequence
from typing import Any

from sqlalchemy import delete, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from .._clock import to_datetime
from .._types import ErrorInfo, FailedAttempt, ScheduledFunctionId, State
from ._rows import Outcome, RetryState, is_id
from ._statements import RECORD_FAILURE, RETRY_ONE
from ._tables import failed_attempts, sf

RETRY_COLUMNS = (sf.c.name, sf.c.retry, sf.c.max_attempts, sf.c.failures)
"""A row's ``RetryState``, in its order."""


async def failures_of(conn: AsyncConnection, id: str) -> list[FailedAttempt]:
    """A row's failed runs, oldest first (ix_durafn_failed_attempts_function)."""
    if not is_id(id):
        return []
    fa = failed_attempts
    rows = await conn.execute(
        select(
            fa.c.attempt,
            fa.c.failed_at,
            fa.c.worker_id,
            fa.c.error_type,
            fa.c.error_message,
            fa.c.error_traceback,
            fa.c.retry_at,
        )
        .where(fa.c.function_id == id)
        .order_by(fa.c.id)
    )
    return [
        FailedAttempt(
            attempt=attempt,
            failed_at=to_datetime(at),
            worker_id=worker,
            error=ErrorInfo(type=type_, message=message, traceback=tb),
            retry_at=to_datetime(retry) if retry is not None else None,
        )
        for attempt, at, worker, type_, message, tb, retry in rows
    ]


async def in_state(conn: AsyncConnection, ids: Sequence[str], state: State) -> set[str]:
    """Which of these rows are in ``state`` (by primary key). What a guarded UPDATE of them
    will move, with no RETURNING (sqlite3 cannot return rows from an executemany; one
    statement per row sent through SQLAlchemy, each its own calls on aiosqlite's thread,
    cost a third of a SQLite drain where a tenth of the rows failed; SQLite's retries now
    run one statement per row inside a single call, ``_sqlite_batches``): valid where the
    transaction holds the database's write lock from its start, as durafn's SQLite
    transactions do (BEGIN IMMEDIATE), so nothing moves the rows between this read and
    the UPDATE. PostgreSQL's driver uses RETURNING instead."""
    found: set[str] = set()
    for start in range(0, len(ids), 500):  # SQLite's limit on bound parameters
        stmt = select(sf.c.id).where(
            sf.c.id.in_(ids[start : start + 500]), sf.c.state == state.value
        )
        found.update(str(id) for id in (await conn.execute(stmt)).scalars())
    return found


class FailureStatements:
    """The driver's statements on failed runs (a part of ``Driver``)."""

    async def retry_rows(
        self,
        conn: AsyncConnection,
        outcomes: Sequence[Outcome],
        expected: State,
        counted: int = 0,
        failed: int = 0,
    ) -> set[str]:
        """Rows in ``expected`` back to Pending, each due at its ``retry_at`` (a failed run
        its policy tries again). ``counted``/``failed``: what to add to its run and failure
        counts (nothing, for a row a rescue has already recorded Failed). Returns the ids
        it moved (a row cancelled meanwhile is left as it is)."""
        moved = await in_state(conn, [o.id for o in outcomes], expected)
        params = [
            {
                "b_id": o.id,
                "b_at": o.retry_at,
                "b_error_type": o.error_type,
                "b_error_message": o.error_message,
                "b_error_traceback": o.error_traceback,
                "expected": expected.value,
                "counted": counted,
                "b_failed": failed,
            }
            for o in outcomes
            if o.id in moved
        ]
        if params:
            await conn.execute(RETRY_ONE, params)
        return moved

    async def retry_states(
        self, conn: AsyncConnection, ids: Sequence[ScheduledFunctionId]
    ) -> dict[ScheduledFunctionId, RetryState]:
        """What the retry of each failed row depends on (by primary key; rare: failures)."""
        found: dict[ScheduledFunctionId, RetryState] = {}
        for start in range(0, len(ids), 500):  # SQLite's limit on bound parameters
            rows = await conn.execute(
                select(*RETRY_COLUMNS, sf.c.id).where(sf.c.id.in_(ids[start : start + 500]))
            )
            for *state, id in rows:
                found[ScheduledFunctionId(str(id))] = RetryState(*state)
        return found

    async def record_failures(
        self,
        conn: AsyncConnection,
        now: float,
        outcomes: Sequence[Outcome],
        worker_id: str | None,
    ) -> None:
        """Each failed run into the rows' histories (after the finish that counted it)."""
        await conn.execute(
            RECORD_FAILURE,
            [
                {
                    "b_id": o.id,
                    "now": now,
                    "worker_id": worker_id,
                    "b_error_type": o.error_type,
                    "b_error_message": o.error_message,
                    "b_error_traceback": o.error_traceback,
                    "b_at": o.retry_at,
                }
                for o in outcomes
            ],
        )

    async def forget_failures(self, conn: AsyncConnection, ids: Sequence[Any]) -> None:
        """Delete the histories of rows being deleted (retention)."""
        fa = failed_attempts
        for start in range(0, len(ids), 500):  # SQLite's limit on bound parameters
            await conn.execute(delete(fa).where(fa.c.function_id.in_(ids[start : start + 500])))

    async def retry_failed(
        self, conn: AsyncConnection, ids: Sequence[ScheduledFunctionId], run_at: float
    ) -> builtins.list[ScheduledFunctionId]:
        """Failed -> Pending, due at ``run_at``, for a fresh set of attempts (``failures``
        back to 0; the history and the last error stay); returns the ids it moved."""
        moved: builtins.list[ScheduledFunctionId] = []
        for start in range(0, len(ids), 500):
            result = await conn.execute(
                update(sf)
                .where(sf.c.id.in_(ids[start : start + 500]), sf.c.state == State.FAILED.value)
                .values(
                    state=State.PENDING.value,
                    available_at=run_at,
                    completed_time=None,
                    started_time=None,
                    worker_id=None,
                    failures=0,
                )
                .returning(sf.c.id)
            )
            moved.extend(ScheduledFunctionId(str(id)) for (id,) in result)
        return moved
