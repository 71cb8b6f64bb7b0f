"""PostgreSQL's forms of the statements that write many rows at once: each batch is one
statement, its values bound as arrays (``unnest``), where the portable forms
(``driver``, ``write/failures``, ``crons``) run an executemany, which asyncpg sends row by row
and without a row count. A part of ``PostgresDriver``.
"""

from __future__ import annotations

from collections.abc import Sequence
from collections.abc import Set as AbstractSet
from typing import Any

from sqlalchemy import CursorResult, text
from sqlalchemy.ext.asyncio import AsyncConnection

from ..._kinds import ScheduledFunctionId, State
from ..after_commit import note
from ..crons import CronMove
from ..driver import Driver
from ..rows import Outcome, mark_moved
from ..write.failures import pg_appended
from ..write.finish import KIND_OF, FinishParams, plain_or_retried

CHANNEL = "durafn_wakeup"
"""The LISTEN/NOTIFY channel of durafn's wake-ups (``postgres/driver.py`` listens on it)."""

_FINISH_SQL = text(
    """
    UPDATE _scheduled_functions AS sf
       SET state = v.state,
           started_time = coalesce(CAST(:started AS float8), sf.started_time),
           completed_time = :now,
           result = v.result,
           error_type = v.error_type,
           error_message = v.error_message,
           error_traceback = v.error_traceback
           , attempts = sf.attempts + :counted
           , failures = sf.failures + CASE WHEN v.state = 'Failed' THEN 1 ELSE 0 END
      FROM unnest(CAST(:ids AS uuid[]), CAST(:states AS text[]), CAST(:results AS text[]),
                  CAST(:error_types AS text[]), CAST(:error_messages AS text[]),
                  CAST(:error_tracebacks AS text[]))
           AS v(id, state, result, error_type, error_message, error_traceback)
     WHERE sf.id = v.id
       AND sf.state = :expected
    RETURNING sf.id
    """
)
# The common outcome, Success with nothing returned, for a whole batch. The ids go as one
# comma-joined text: asyncpg encodes an array element by element, with Python-level type
# checks; the five arrays above cost ~2.5 us per row in the worker, this ~0.05 us.
_FINISHED_PLAIN = """
        UPDATE _scheduled_functions
           SET state = 'Success', completed_time = :now, attempts = attempts + :counted,
               started_time = coalesce(CAST(:started AS float8), started_time),
               error_type = NULL, error_message = NULL, error_traceback = NULL{released}
         WHERE id = ANY(CAST(string_to_array(:ids, ',') AS uuid[]))
           AND state = :expected
"""
_RELEASED = """,
               dependents = CASE WHEN dependents = 1 THEN 2 ELSE dependents END"""
# It releases the dependents of the rows it finishes itself, in one statement for the
# batch, rather than through the trigger's statements per row (``schema/dependencies.py``:
# ``dependents = 2`` keeps the trigger out; ``durafn_release`` runs after the UPDATE). By
# primary key; returns the count of rows it moved, and the rows waiting for them whose
# edges it deleted (``durafn_release``'s: the executor looks at them after the commit).
# Measured (``benchmarks.workflows``, a fan-in of 10,000 no-op mutations against a plain
# drain): the trigger's per-row work cost about 6% of the drain.
_FINISH_PLAIN_SQL = text(
    f"""
    WITH done AS ({_FINISHED_PLAIN.format(released=_RELEASED)}
        RETURNING id, dependents
    )
    SELECT count(*),
           CASE WHEN bool_or(dependents = 2)
                THEN durafn_release(array_agg(id) FILTER (WHERE dependents = 2)) END
      FROM done
    """
)
# Without ``durafn_release`` (tables from ``durafn.metadata``, never migrated): the trigger
# releases the rows' dependents, if it was made. Returns the rows it moved.
_FINISH_PLAIN_TRIGGERED_SQL = text(
    f"""
    WITH done AS ({_FINISHED_PLAIN.format(released="")}
        RETURNING 1
    )
    SELECT count(*) FROM done
    """
)

# A failed run appended to its row's history (``write/failures.py``): ``attempt`` is SQL, the
# error and retry time come from the statement's ``v``.
_APPENDED = pg_appended(
    "sf.errors",
    "{attempt}",
    "CAST(:now AS float8)",
    "CAST(:worker_id AS text)",
    "v.error_type",
    "v.error_message",
    "v.error_traceback",
    "v.retry_at",
)
# Failed runs their policies retry, one statement for the batch (asyncpg's executemany
# reports no row count, and costs a round trip per row).
_RETRY_SQL = text(
    f"""
    UPDATE _scheduled_functions AS sf
       SET state = 'Pending',
           available_at = v.retry_at,
           completed_time = NULL,
           started_time = NULL,
           worker_id = NULL,
           error_type = v.error_type,
           error_message = v.error_message,
           error_traceback = v.error_traceback,
           attempts = sf.attempts + :counted,
           failures = sf.failures + :failed,
           errors = {_APPENDED.format(attempt="sf.failures + :failed")}
      FROM unnest(CAST(:ids AS uuid[]), CAST(:retry_ats AS float8[]),
                  CAST(:error_types AS text[]), CAST(:error_messages AS text[]),
                  CAST(:error_tracebacks AS text[]))
           AS v(id, retry_at, error_type, error_message, error_traceback)
     WHERE sf.id = v.id
       AND sf.state = :expected
    RETURNING sf.id
    """
)

# A batch's finish when its failed runs are all retried (the common failure): the plain
# successes, the retries with their history, and the NOTIFY as one statement. Each finish
# is guarded by the state it expects; a failure is kept only for a row its retry moved. Run
# again after an unseen commit it writes nothing (the rows are no longer in ``expected``).
# Measured: with a tenth of the actions failing once, a finish of a batch with failures
# took 10 ms in six round trips (BEGIN, plain, retry, history, NOTIFY, COMMIT) against
# 3 ms without; the action finisher was the drain's bottleneck.
_SETTLE_SQL = text(
    f"""
    WITH plain AS (
        UPDATE _scheduled_functions
           SET state = 'Success', completed_time = :now, attempts = attempts + :counted,
               started_time = coalesce(CAST(:started AS float8), started_time),
               error_type = NULL, error_message = NULL, error_traceback = NULL
         WHERE id = ANY(CAST(string_to_array(:plain_ids, ',') AS uuid[]))
           AND state = :expected
        RETURNING id
    ), v AS (
        SELECT * FROM unnest(CAST(:ids AS uuid[]), CAST(:retry_ats AS float8[]),
                             CAST(:error_types AS text[]), CAST(:error_messages AS text[]),
                             CAST(:error_tracebacks AS text[]))
               AS v(id, retry_at, error_type, error_message, error_traceback)
    ), retried AS (
        UPDATE _scheduled_functions AS sf
           SET state = 'Pending', available_at = v.retry_at, completed_time = NULL,
               started_time = NULL, worker_id = NULL, error_type = v.error_type,
               error_message = v.error_message, error_traceback = v.error_traceback,
               attempts = sf.attempts + :counted, failures = sf.failures + 1,
               errors = {_APPENDED.format(attempt="sf.failures + 1")}
          FROM v
         WHERE sf.id = v.id AND sf.state = :expected
        RETURNING sf.id
    )
    SELECT NULL AS id, (SELECT count(*) FROM plain) AS plain,
           CASE WHEN EXISTS (SELECT 1 FROM retried)
                THEN pg_notify(:channel, :payload)::text END AS notified
    UNION ALL
    SELECT id, NULL, NULL FROM retried
    """
)

# ../crons.py's _ADVANCE for many crons as one statement that says how many moved (asyncpg's
# executemany reports no row count).
_ADVANCE_SQL = text(
    """
    UPDATE _durafn_crons AS c
       SET next_run_at = v.next, last_run_at = coalesce(v.last_run, c.last_run_at),
           last_row_id = coalesce(v.row_id, c.last_row_id), run_count = c.run_count + v.runs,
           last_skip_at = coalesce(v.skip_at, c.last_skip_at),
           last_skip_reason = coalesce(v.skip_reason, c.last_skip_reason)
      FROM unnest(CAST(:names AS text[]), CAST(:expected AS float8[]),
                  CAST(:next AS float8[]), CAST(:last_run AS float8[]),
                  CAST(:row_ids AS text[]), CAST(:runs AS int[]), CAST(:skip_at AS float8[]),
                  CAST(:skip_reason AS text[]))
           AS v(name, expected, next, last_run, row_id, runs, skip_at, skip_reason)
     WHERE c.name = v.name AND c.next_run_at = v.expected
    """
)

# RECORD_FAILURE (_failures.py) for many rows as one statement (asyncpg's executemany
# of the portable form cost ~15 us of this process per failed row).
_RECORD_SQL = text(
    f"""
    UPDATE _scheduled_functions AS sf
       SET errors = {_APPENDED.format(attempt="sf.failures")}
      FROM unnest(CAST(:ids AS uuid[]), CAST(:error_types AS text[]),
                  CAST(:error_messages AS text[]), CAST(:error_tracebacks AS text[]),
                  CAST(:retry_ats AS float8[]))
           AS v(id, error_type, error_message, error_traceback, retry_at)
     WHERE sf.id = v.id
    """
)


def _failures(outcomes: Sequence[Outcome]) -> dict[str, list[Any]]:
    """The arrays the failure statements bind: each run's row, error and retry time."""
    return {
        "ids": [o.id for o in outcomes],
        "retry_ats": [o.retry_at for o in outcomes],
        "error_types": [o.error_type for o in outcomes],
        "error_messages": [o.error_message for o in outcomes],
        "error_tracebacks": [o.error_traceback for o in outcomes],
    }


class PostgresMultiRow(Driver):
    """The batch statements of ``PostgresDriver``."""

    async def _finish_plain(
        self, conn: AsyncConnection, ids: list[ScheduledFunctionId], common: FinishParams
    ) -> int:
        params = {**common, "ids": ",".join(ids)}
        if not self.migrated_functions:
            return int((await conn.execute(_FINISH_PLAIN_TRIGGERED_SQL, params)).scalar_one())
        moved, freed = (await conn.execute(_FINISH_PLAIN_SQL, params)).one()
        if freed:  # perhaps: the executor looks after the commit (``wake_freed``)
            note(conn).maybe_freed.update(map(str, freed))
        return int(moved)

    def finishes_in_one_statement(
        self, outcomes: Sequence[Outcome], retrying: AbstractSet[ScheduledFunctionId]
    ) -> bool:
        # _SETTLE_SQL: retries, their history and the plain successes in one statement.
        return plain_or_retried(outcomes, lambda o: o.id in retrying) or (
            super().finishes_in_one_statement(outcomes, retrying)
        )

    async def _finish(
        self,
        conn: AsyncConnection,
        now: float,
        outcomes: Sequence[Outcome],
        expected: State,
        worker_id: str | None,
        started: float | None = None,
    ) -> int:
        if not plain_or_retried(outcomes):
            return await super()._finish(conn, now, outcomes, expected, worker_id, started)
        retried = [o for o in outcomes if o.retry_at is not None]
        if not retried:
            return await super()._finish(conn, now, outcomes, expected, worker_id, started)
        kind = KIND_OF[expected]
        rows = await conn.execute(
            _SETTLE_SQL,
            {
                "now": now,
                "expected": expected.value,
                "counted": 1 if expected is State.PENDING else 0,
                "started": started,
                "worker_id": worker_id,
                "plain_ids": ",".join(o.id for o in outcomes if o.retry_at is None),
                **_failures(retried),
                "channel": CHANNEL,
                "payload": kind.value,
            },
        )
        plain, moved = 0, set()
        for id, count, _ in rows:
            if id is None:
                plain = count
            else:
                moved.add(str(id))
        return plain + mark_moved(retried, moved)

    async def _finish_others(
        self, conn: AsyncConnection, outcomes: list[Outcome], common: FinishParams
    ) -> int:
        return len(await self._finish_exactly(conn, outcomes, common))

    async def _finish_exactly(
        self, conn: AsyncConnection, outcomes: list[Outcome], common: FinishParams
    ) -> set[str]:
        result = await conn.execute(
            _FINISH_SQL,
            {
                **common,
                "ids": [o.id for o in outcomes],
                "states": [o.state.value for o in outcomes],
                "results": [o.result for o in outcomes],
                "error_types": [o.error_type for o in outcomes],
                "error_messages": [o.error_message for o in outcomes],
                "error_tracebacks": [o.error_traceback for o in outcomes],
            },
        )
        return {str(id) for id in result.scalars()}

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
        result = await conn.execute(
            _RETRY_SQL,
            {
                **_failures(outcomes),
                "now": now,
                "worker_id": worker_id,
                "expected": expected.value,
                "counted": counted,
                "failed": failed,
            },
        )
        return {str(id) for id in result.scalars()}

    async def advance_crons(self, conn: AsyncConnection, moves: Sequence[CronMove]) -> int:
        result = await conn.execute(
            _ADVANCE_SQL,
            {
                "names": [m.name for m in moves],
                "expected": [m.expected for m in moves],
                "next": [m.next_run_at for m in moves],
                "last_run": [m.last_run_at for m in moves],
                "row_ids": [m.last_row_id for m in moves],
                "runs": [m.runs for m in moves],
                "skip_at": [m.last_skip_at for m in moves],
                "skip_reason": [m.last_skip_reason for m in moves],
            },
        )
        assert isinstance(result, CursorResult)
        return result.rowcount

    async def record_failures(
        self,
        conn: AsyncConnection,
        now: float,
        outcomes: Sequence[Outcome],
        worker_id: str | None,
    ) -> None:
        await conn.execute(
            _RECORD_SQL,
            {"now": now, "worker_id": worker_id, **_failures(outcomes)},
        )
