"""PostgreSQL: many executors in many processes share one database.

Claims use ``FOR UPDATE SKIP LOCKED`` (in the shared statements), cross-process wake-ups use
LISTEN/NOTIFY, and a batch's completions are one statement each (plain successes by a list
of ids, the others with ``unnest``), with an exact row count (asyncpg's executemany reports
none).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Collection, Sequence
from contextlib import asynccontextmanager
from typing import Any, ClassVar

import anyio
import asyncpg
from sqlalchemy import CursorResult, text
from sqlalchemy import exc as sa_exc
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from .._errors import ReadOnlyError
from .._types import FunctionKind, ScheduledFunctionId, State
from ._crons import CronMove
from ._driver import Driver
from ._rows import NEW_ROW_COLUMNS, Outcome
from ._statements import FinishParams

logger = logging.getLogger("durafn.store")

CHANNEL = "durafn_wakeup"
CANCEL_PREFIX = "cancel:"
"""On CHANNEL, a payload that names rows cancelled (their running actions are told)."""
CONNECT_TIMEOUT = 10.0
_ALL_KINDS = frozenset({FunctionKind.MUTATION, FunctionKind.ACTION})

# sqlstates worth a retry of the whole transaction: connection exceptions (08), serialization
# failure and deadlock (40001, 40P01), lock timeout (55P03), server going away (57P0x),
# too many connections (53300).
_TRANSIENT_SQLSTATES = {"40001", "40P01", "55P03", "57P01", "57P02", "57P03", "53300"}

_FINISH_SQL = text(
    """
    UPDATE _scheduled_functions AS sf
       SET state = v.state,
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
_FINISH_PLAIN_SQL = text(
    """
    UPDATE _scheduled_functions
       SET state = 'Success', completed_time = :now, attempts = attempts + :counted,
           error_type = NULL, error_message = NULL, error_traceback = NULL
     WHERE id = ANY(CAST(string_to_array(:ids, ',') AS uuid[]))
       AND state = :expected
    """
)

# Failed runs their policies retry, one statement for the batch (asyncpg's executemany
# reports no row count, and costs a round trip per row).
_RETRY_SQL = text(
    """
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
           failures = sf.failures + :failed
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
# successes, the retries, their history and the NOTIFY as one statement. Each finish is
# guarded by the state it expects; a failure is kept only for a row its retry moved. Run
# again after an unseen commit it writes nothing (the rows are no longer in ``expected``).
# Measured: with a tenth of the actions failing once, a finish of a batch with failures
# took 10 ms in six round trips (BEGIN, plain, retry, history, NOTIFY, COMMIT) against
# 3 ms without; the action finisher was the drain's bottleneck.
_SETTLE_SQL = text(
    """
    WITH plain AS (
        UPDATE _scheduled_functions
           SET state = 'Success', completed_time = :now, attempts = attempts + :counted,
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
               attempts = sf.attempts + :counted, failures = sf.failures + 1
          FROM v
         WHERE sf.id = v.id AND sf.state = :expected
        RETURNING sf.id, sf.failures
    ), kept AS (
        INSERT INTO _durafn_failed_attempts
            (function_id, attempt, failed_at, worker_id, error_type, error_message,
             error_traceback, retry_at)
        SELECT r.id, r.failures, :now, :worker_id, v.error_type, v.error_message,
               v.error_traceback, v.retry_at
          FROM retried AS r JOIN v ON v.id = r.id
    )
    SELECT NULL AS id, (SELECT count(*) FROM plain) AS plain,
           CASE WHEN EXISTS (SELECT 1 FROM retried)
                THEN pg_notify(:channel, :payload)::text END AS notified
    UNION ALL
    SELECT id, NULL, NULL FROM retried
    """
)

# _crons._ADVANCE for many crons as one statement that says how many moved (asyncpg's
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

# RECORD_FAILURE (_statements.py) for many rows as one statement (asyncpg's executemany
# of the portable form cost ~15 us of this process per failed row).
_RECORD_SQL = text(
    """
    INSERT INTO _durafn_failed_attempts
        (function_id, attempt, failed_at, worker_id, error_type, error_message,
         error_traceback, retry_at)
    SELECT sf.id, sf.failures, :now, :worker_id, v.error_type, v.error_message,
           v.error_traceback, v.retry_at
      FROM unnest(CAST(:ids AS uuid[]), CAST(:error_types AS text[]),
                  CAST(:error_messages AS text[]), CAST(:error_tracebacks AS text[]),
                  CAST(:retry_ats AS float8[]))
           AS v(id, error_type, error_message, error_traceback, retry_at)
      JOIN _scheduled_functions AS sf ON sf.id = v.id
    """
)

# The NOTIFY rides in the INSERT's statement: one round trip fewer (0.4 ms here), and a
# direct schedule is then one autocommit statement. A data-modifying CTE runs whether or
# not the outer SELECT reads it; the outer SELECT notifies only if asked (payload not '').
_INSERT_SQL = text(
    """
    WITH inserted AS (
        INSERT INTO _scheduled_functions
            (id, name, kind, args, state, scheduled_time, available_at, completed_time, parent_id,
             priority, queue_name, job_key, flags, retry, max_attempts, on_complete)
        SELECT * FROM unnest(
            CAST(:id AS uuid[]), CAST(:name AS text[]), CAST(:kind AS text[]),
            CAST(:args AS text[]), CAST(:state AS text[]), CAST(:scheduled_time AS float8[]),
            CAST(:available_at AS float8[]), CAST(:completed_time AS float8[]),
            CAST(:parent_id AS uuid[]), CAST(:priority AS int[]), CAST(:queue_name AS text[]),
            CAST(:job_key AS text[]), CAST(:flags AS text[]), CAST(:retry AS text[]),
            CAST(:max_attempts AS int[]), CAST(:on_complete AS text[]))
    )
    SELECT pg_notify(:channel, CAST(:payload AS text)) WHERE CAST(:payload AS text) <> ''
    """
)


def _sqlstate(exc: BaseException) -> str | None:
    for candidate in (
        exc,
        getattr(exc, "orig", None),
        getattr(getattr(exc, "orig", None), "__cause__", None),
    ):
        state = getattr(candidate, "sqlstate", None)
        if isinstance(state, str):
            return state
    return None


class PostgresDriver(Driver):
    dialect_insert = staticmethod(postgresql_insert)
    lateral_claims: ClassVar[bool] = True
    name: ClassVar[str] = "PostgreSQL"
    max_mutation_lanes: ClassVar[int] = 4
    default_poll_interval: ClassVar[float] = 5.0
    auto_migrate: ClassVar[bool] = False
    # Measured: a claim of 64 actions took 2.4 ms as BEGIN, UPDATE, COMMIT through
    # SQLAlchemy and 1.6 ms as one autocommit statement (the server's part is 1.0 ms).
    single_statement_options: ClassVar[dict[str, Any]] = {"isolation_level": "AUTOCOMMIT"}

    def create_engine(self) -> AsyncEngine:
        # asyncpg waits 60 s for a connection by default: too long for a worker that
        # should notice an unreachable server, log it and back off.
        return create_async_engine(
            self.url, pool_size=10, max_overflow=10, connect_args={"timeout": CONNECT_TIMEOUT}
        )

    def _transient_dbapi(self, exc: sa_exc.DBAPIError) -> bool:
        state = _sqlstate(exc)
        if state is not None and (state.startswith("08") or state in _TRANSIENT_SQLSTATES):
            return True
        orig = getattr(exc, "orig", None)
        cause = getattr(orig, "__cause__", None)
        return isinstance(
            cause,
            asyncpg.exceptions.ConnectionDoesNotExistError | asyncpg.exceptions.InterfaceError,
        )

    def is_driver_error(self, exc: BaseException) -> bool:
        # asyncpg raises some connect-time errors (an unknown database, a bad password)
        # through SQLAlchemy's pool unwrapped.
        return isinstance(exc, asyncpg.PostgresError | asyncpg.InterfaceError)

    def is_disconnect(self, exc: BaseException) -> bool:
        state = _sqlstate(exc)
        if state is not None and (state.startswith("08") or state.startswith("57P")):
            return True
        return super().is_disconnect(exc) or (
            isinstance(exc, sa_exc.DBAPIError) and self._transient_dbapi(exc) and state is None
        )

    def commit_outcome_unknown(self, exc: BaseException) -> bool:
        # A serialization failure or deadlock at COMMIT is a definite rollback; a dropped
        # connection leaves the server's decision unknown to us.
        return self.is_transient(exc) and _sqlstate(exc) not in {"40001", "40P01"}

    def translate(self, exc: BaseException) -> BaseException | None:
        if _sqlstate(exc) == "25006":  # read_only_sql_transaction
            return ReadOnlyError("a query cannot write to the database; do the write in a mutation")
        return None

    @asynccontextmanager
    async def read_only(self, conn: AsyncConnection) -> AsyncIterator[None]:
        await conn.exec_driver_sql("SET TRANSACTION READ ONLY")
        yield

    async def statement_handle(self, conn: AsyncConnection) -> Any:
        # The backend's pid: the asyncpg connection itself is closed by the invalidation.
        driver_connection: asyncpg.Connection[Any] = (
            await conn.get_raw_connection()
        ).driver_connection
        return driver_connection.get_server_pid()

    async def abandon(self, conn: AsyncConnection, handle: Any) -> None:
        # Closing our socket does not stop the statement: the server notices a vanished
        # client only when it next talks to it, so a pg_sleep(20) kept its row locks for 20
        # s. pg_terminate_backend, from another connection, stops the statement now, rolls
        # its transaction back, and waits (up to 5 s) for the backend to be gone, locks
        # released. Terminate rather than cancel: the connection is dropped either way,
        # and a cancel that lands between two statements of the mutation stops nothing.
        try:
            with anyio.fail_after(5.0):
                async with conn.engine.connect() as admin:
                    await admin.execute(
                        text("SELECT pg_terminate_backend(:pid, 5000)"), {"pid": handle}
                    )
        except Exception as exc:  # the database is away: the server ends it with our socket
            logger.warning("could not stop the statement of a timed-out mutation: %s", exc)
        await conn.invalidate()

    async def lock_for_share(self, conn: AsyncConnection, id: ScheduledFunctionId) -> State | None:
        # FOR SHARE makes a concurrent cancel of the parent wait for our commit, so its
        # descendant sweep sees the row we are about to insert; or, if the cancel won,
        # we see Canceled and write the new row Canceled.
        value = (
            await conn.execute(
                text(
                    "SELECT state FROM _scheduled_functions WHERE id = CAST(:id AS uuid) FOR SHARE"
                ),
                {"id": id},
            )
        ).scalar()
        return State(value) if value is not None else None

    async def notify(self, conn: AsyncConnection, kinds: Collection[FunctionKind]) -> None:
        # Delivered at commit, never for a rolled-back transaction.
        await conn.execute(
            text("SELECT pg_notify(:channel, :payload)"),
            {"channel": CHANNEL, "payload": ",".join(sorted(kinds))},
        )

    async def announce_cancels(self, conn: AsyncConnection, ids: Sequence[str]) -> None:
        await super().announce_cancels(conn, ids)
        # A NOTIFY payload holds under 8000 bytes: 200 ids (37 bytes each) per message.
        for start in range(0, len(ids), 200):
            await conn.execute(
                text("SELECT pg_notify(:channel, :payload)"),
                {"channel": CHANNEL, "payload": CANCEL_PREFIX + ",".join(ids[start : start + 200])},
            )

    async def _lock_schema(self, conn: AsyncConnection) -> None:
        await conn.execute(text("SELECT pg_advisory_xact_lock(hashtext('durafn.migrate'))"))

    async def insert_rows(
        self,
        conn: AsyncConnection,
        rows: Sequence[dict[str, Any]],
        notify: Collection[FunctionKind] = (),
    ) -> None:
        # One statement with one array per column: a 1000-row schedule is one round trip
        # and one parse (asyncpg's executemany took ~30 ms for 1000 rows here).
        params: dict[str, Any] = {
            column: [row[column] for row in rows] for column in NEW_ROW_COLUMNS
        }
        params["channel"] = CHANNEL
        params["payload"] = ",".join(sorted(notify))
        await conn.execute(_INSERT_SQL, params)

    async def _finish_plain(
        self, conn: AsyncConnection, ids: list[ScheduledFunctionId], common: FinishParams
    ) -> int:
        result = await conn.execute(_FINISH_PLAIN_SQL, {**common, "ids": ",".join(ids)})
        assert isinstance(result, CursorResult)
        return result.rowcount

    async def _finish(
        self,
        conn: AsyncConnection,
        now: float,
        outcomes: Sequence[Outcome],
        expected: State,
        worker_id: str | None,
    ) -> int:
        if not all(
            o.on_complete is None
            and (o.retry_at is not None or (o.state is State.SUCCESS and o.result is None))
            for o in outcomes
        ):
            return await super()._finish(conn, now, outcomes, expected, worker_id)
        retried = [o for o in outcomes if o.retry_at is not None]
        if not retried:
            return await super()._finish(conn, now, outcomes, expected, worker_id)
        kind = FunctionKind.MUTATION if expected is State.PENDING else FunctionKind.ACTION
        rows = await conn.execute(
            _SETTLE_SQL,
            {
                "now": now,
                "expected": expected.value,
                "counted": 1 if expected is State.PENDING else 0,
                "worker_id": worker_id,
                "plain_ids": ",".join(o.id for o in outcomes if o.retry_at is None),
                "ids": [o.id for o in retried],
                "retry_ats": [o.retry_at for o in retried],
                "error_types": [o.error_type for o in retried],
                "error_messages": [o.error_message for o in retried],
                "error_tracebacks": [o.error_traceback for o in retried],
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
        for o in retried:
            o.unwritten = o.id not in moved
        return plain + len(moved)

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
        outcomes: Sequence[Outcome],
        expected: State,
        counted: int = 0,
        failed: int = 0,
    ) -> set[str]:
        result = await conn.execute(
            _RETRY_SQL,
            {
                "ids": [o.id for o in outcomes],
                "retry_ats": [o.retry_at for o in outcomes],
                "error_types": [o.error_type for o in outcomes],
                "error_messages": [o.error_message for o in outcomes],
                "error_tracebacks": [o.error_traceback for o in outcomes],
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
                "names": [m.b_name for m in moves],
                "expected": [m.b_expected for m in moves],
                "next": [m.b_next for m in moves],
                "last_run": [m.b_last_run for m in moves],
                "row_ids": [m.b_row for m in moves],
                "runs": [m.b_runs for m in moves],
                "skip_at": [m.b_skip_at for m in moves],
                "skip_reason": [m.b_skip_reason for m in moves],
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
            {
                "now": now,
                "worker_id": worker_id,
                "ids": [o.id for o in outcomes],
                "error_types": [o.error_type for o in outcomes],
                "error_messages": [o.error_message for o in outcomes],
                "error_tracebacks": [o.error_traceback for o in outcomes],
                "retry_ats": [o.retry_at for o in outcomes],
            },
        )

    @asynccontextmanager
    async def listen(
        self,
        engine: AsyncEngine,
        on_wake: Callable[[Collection[FunctionKind]], None],
        on_cancel: Callable[[list[str]], None],
    ) -> AsyncIterator[bool]:
        """A dedicated asyncpg connection LISTENing, reconnected with backoff if it drops."""

        def _callback(_conn: Any, _pid: int, _channel: str, payload: str) -> None:
            if payload.startswith(CANCEL_PREFIX):
                on_cancel(payload.removeprefix(CANCEL_PREFIX).split(","))
                return
            # Our own notifications are heard too. That costs an idle executor a second
            # claim after its own process's writes, but the in-process wake-up of a write
            # joined to a caller's connection fires before the COMMIT completes (SQLAlchemy's
            # "commit" event): the echo is what wakes the executor once the row is visible.
            kinds = {k for k in _ALL_KINDS if k.value in payload.split(",")}
            on_wake(kinds or _ALL_KINDS)

        dsn = self.url.set(drivername="postgresql").render_as_string(hide_password=False)

        async def _keep_listening() -> None:
            delay = 0.1
            while True:
                lost = anyio.Event()
                try:
                    conn = await asyncpg.connect(dsn, timeout=CONNECT_TIMEOUT)
                except (OSError, asyncpg.PostgresError) as exc:
                    logger.warning("LISTEN connection failed (%s); retrying in %.1fs", exc, delay)
                    await anyio.sleep(delay)
                    delay = min(delay * 2, 5.0)
                    continue
                try:
                    conn.add_termination_listener(lambda _c, lost=lost: lost.set())
                    try:
                        await conn.add_listener(CHANNEL, _callback)
                    except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
                        # The connection can drop during the LISTEN itself (seen when a
                        # server terminated it just then): retry as for a failed connect,
                        # rather than let the error end the executor.
                        logger.warning("LISTEN failed (%s); retrying in %.1fs", exc, delay)
                        await anyio.sleep(delay)
                        delay = min(delay * 2, 5.0)
                        continue
                    delay = 0.1
                    # Work may have been scheduled while we were not listening.
                    on_wake(_ALL_KINDS)
                    await lost.wait()
                    logger.warning("LISTEN connection lost; reconnecting")
                finally:
                    with anyio.CancelScope(shield=True):
                        try:
                            await conn.close(timeout=1)
                        except Exception:
                            conn.terminate()

        async with anyio.create_task_group() as tg:
            tg.start_soon(_keep_listening)
            try:
                yield True
            finally:
                tg.cancel_scope.cancel()
