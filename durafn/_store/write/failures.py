"""Failed runs in the database: a retried row back to Pending, each failure in the row's
history (its ``errors`` column), the history read back, Failed rows retried by hand.

The decision (retry or not, when) is the executor's (``_executor/retrying.py``); these are
the statements it and the admin calls write with, guarded by the state they expect.

The history is a JSON array on the row, one entry per failed run, appended by the same
UPDATE that writes the failure (as River keeps a job's ``errors`` on its row). It was a
table of its own until version 10, an INSERT and its index per failure: measured alone,
a finish of 250 rows with 25 retried cost 26.6-31.8 us more per retried row than 250
plain ones on PostgreSQL, 19.4-24.0 us since; 16.2-20.2 us on SQLite, 6.7-15.2 us since
(three runs each, alternating, 2026-11-26).
"""

from __future__ import annotations

import builtins
from collections.abc import Sequence
from typing import Any

from sqlalchemy import JSON, Double, Text, bindparam, select, update
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.functions import FunctionElement

from ..._kinds import ScheduledFunctionId, State
from ..._models import FailedAttempt
from ..rows import Outcome, RetryState, history, is_id
from ..schema.tables import ERROR_KEYS, sf

RETRY_COLUMNS = (sf.c.name, sf.c.retry, sf.c.max_attempts, sf.c.failures)
"""A row's ``RetryState``, in its order."""


def sqlite_appended(errors: str, *values: str) -> str:
    """SQLite's ``errors`` with one entry appended; ``values`` are SQL in ERROR_KEYS'
    order. JSON writes a REAL with 15 significant digits: a time to 10 us."""
    pairs = ", ".join(f"'{k}', {v}" for k, v in zip(ERROR_KEYS, values, strict=True))
    return f"json_insert(coalesce({errors}, '[]'), '$[#]', json_object({pairs}))"


def pg_appended(errors: str, *values: str) -> str:
    """PostgreSQL's ``errors`` with one entry appended (``values`` as for SQLite)."""
    pairs = ", ".join(f"'{k}', {v}" for k, v in zip(ERROR_KEYS, values, strict=True))
    return f"coalesce({errors}, '[]'::jsonb) || jsonb_build_array(jsonb_build_object({pairs}))"


class appended(FunctionElement[Any]):
    """The row's ``errors`` with one entry appended: the portable statements' form, its
    arguments in ERROR_KEYS' order."""

    inherit_cache = True
    type = JSON()


@compiles(appended, "sqlite")
def _sqlite(element: appended, compiler: SQLCompiler, **kw: Any) -> str:
    return sqlite_appended("errors", *(compiler.process(c, **kw) for c in element.clauses))


@compiles(appended, "postgresql")
def _postgresql(element: appended, compiler: SQLCompiler, **kw: Any) -> str:
    return pg_appended("errors", *(compiler.process(c, **kw) for c in element.clauses))


def _entry(attempt: Any) -> appended:
    """A failed run's entry, its values bound as the failure statements bind them."""
    return appended(
        attempt,
        bindparam("now", type_=Double),
        bindparam("b_worker_id", type_=Text),
        bindparam("b_error_type", type_=Text),
        bindparam("b_error_message", type_=Text),
        bindparam("b_error_traceback", type_=Text),
        bindparam("b_at", type_=Double),
    )


# A failed run its retry policy tries again: back to Pending, due at ``b_at``, with this
# run's error as the row's last and in its history (a rescue's flip of a row it recorded
# Failed: ``expected`` Failed, nothing counted twice).
RETRY_ONE = (
    update(sf)
    .where(sf.c.id == bindparam("b_id"), sf.c.state == bindparam("expected"))
    .values(
        state=State.PENDING.value,
        available_at=bindparam("b_at", type_=Double),
        completed_time=None,
        started_time=None,
        worker_id=None,
        error_type=bindparam("b_error_type"),
        error_message=bindparam("b_error_message"),
        error_traceback=bindparam("b_error_traceback"),
        attempts=sf.c.attempts + bindparam("counted"),
        failures=sf.c.failures + bindparam("b_failed"),
        errors=_entry(sf.c.failures + bindparam("b_failed")),
    )
)
# A run that ended its row Failed, into the row's history: which failure of the row's
# attempts it was is read from the row (this statement follows the finish that counted it).
RECORD_FAILURE = update(sf).where(sf.c.id == bindparam("b_id")).values(errors=_entry(sf.c.failures))


async def failures_of(conn: AsyncConnection, id: str) -> list[FailedAttempt]:
    """A row's failed runs, oldest first (by primary key)."""
    if not is_id(id):
        return []
    return history((await conn.execute(select(sf.c.errors).where(sf.c.id == id))).scalar())


async def in_state(conn: AsyncConnection, ids: Sequence[str], state: State) -> set[str]:
    """Which of these rows are in ``state`` (by primary key). What a guarded UPDATE of them
    will move, with no RETURNING (sqlite3 cannot return rows from an executemany; one
    statement per row sent through SQLAlchemy, each its own calls on aiosqlite's thread,
    cost a third of a SQLite drain where a tenth of the rows failed; SQLite's retries now
    run one statement per row inside a single call, ``sqlite/multirow.py``): valid where the
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
        now: float,
        outcomes: Sequence[Outcome],
        expected: State,
        worker_id: str | None,
        counted: int = 0,
        failed: int = 0,
    ) -> set[str]:
        """Rows in ``expected`` back to Pending, each due at its ``retry_at`` (a failed run
        its policy tries again), the run appended to the row's history (as run on
        ``worker_id``). ``counted``/``failed``: what to add to its run and failure counts
        (nothing, for a row a rescue has already recorded Failed). Returns the ids it
        moved (a row cancelled meanwhile is left as it is, its history too)."""
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
                "now": now,
                "b_worker_id": worker_id,
            }
            for o in outcomes
            if o.id in moved
        ]
        if params:
            await conn.execute(RETRY_ONE, params)
        return moved

    async def snooze_rows(
        self,
        conn: AsyncConnection,
        outcomes: Sequence[Outcome],
        expected: State,
        counted: int,
        limits: Sequence[int],
    ) -> tuple[set[str], set[str]]:
        """Rows in ``expected`` back to Pending, each due at its ``retry_at``, one more
        snooze counted (and ``counted`` runs), where the row has snoozed fewer than its
        limit (``limits``, in order). Nothing goes into the row's history: a snooze is
        not a failure. Returns the ids moved, and those left in ``expected`` because
        they reached their limit (the rest had moved on: cancelled meanwhile).

        One guarded UPDATE a row (its RETURNING says whether it moved): snoozes are
        rare next to plain finishes, and a row's limit is its own."""
        moved: set[str] = set()
        for o, limit in zip(outcomes, limits, strict=True):
            result = await conn.execute(
                update(sf)
                .where(
                    sf.c.id == o.id,
                    sf.c.state == expected.value,
                    sf.c.snoozes < limit,
                )
                .values(
                    state=State.PENDING.value,
                    available_at=o.retry_at,
                    started_time=None,
                    completed_time=None,
                    worker_id=None,
                    attempts=sf.c.attempts + counted,
                    snoozes=sf.c.snoozes + 1,
                )
                .returning(sf.c.id)
            )
            if result.first() is not None:
                moved.add(o.id)
        rest = [o.id for o in outcomes if o.id not in moved]
        limited = await in_state(conn, rest, expected) if rest else set()
        return moved, limited

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
        """Failed runs that ended their rows Failed into the rows' histories (after the
        finish that counted them; a retried run's goes with its retry)."""
        await conn.execute(
            RECORD_FAILURE,
            [
                {
                    "b_id": o.id,
                    "now": now,
                    "b_worker_id": worker_id,
                    "b_error_type": o.error_type,
                    "b_error_message": o.error_message,
                    "b_error_traceback": o.error_traceback,
                    "b_at": o.retry_at,
                }
                for o in outcomes
            ],
        )

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
