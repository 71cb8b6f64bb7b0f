"""PostgreSQL: many executors in many processes share one database.

Claims use ``FOR UPDATE SKIP LOCKED`` (in the shared statements), cross-process wake-ups
and cancels use LISTEN/NOTIFY (one connection per process and server:
``postgres/listener.py``), and the statements that write many rows at once are one
statement each, with an exact row count (``postgres/multirow.py``).

Nothing durafn does outlives a transaction on the server: its advisory locks are
transaction-level (``pg_try_advisory_xact_lock``), ``SET TRANSACTION READ ONLY`` and the
functions' ``SET`` end with the transaction or the call, and there are no temporary
tables or cursors. Three things are the session's: asyncpg's prepared statements, the
backend a connection's process key names, and LISTEN. Through a pooler in transaction
mode (``pooler=transaction`` in the URL, ``postgres/pooling.py``) each is done another
way: statements unnamed, the backend asked for inside the transaction, LISTEN direct.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Collection, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any, ClassVar, cast

import anyio
import asyncpg
from sqlalchemy import event, text
from sqlalchemy import exc as sa_exc
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.dialects.postgresql.base import PGDialect
from sqlalchemy.engine import URL, Engine, ExceptionContext
from sqlalchemy.engine import Connection as SyncConnection
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from ..._errors import DatabaseError, ReadOnlyError
from ..._kinds import FunctionKind, ScheduledFunctionId, State
from ..driver import Driver
from ..engine import pool_arguments
from ..rows import NEW_ROW_COLUMNS, NewRowColumns
from ..schema.tables import sf
from . import sql as _sql  # noqa: F401  (its SQL for the elements of ../sql.py)
from .functions import install_release_functions, install_release_trigger
from .listener import ALL_KINDS, CANCEL_PREFIX, CONNECT_TIMEOUT, listening
from .multirow import CHANNEL, PostgresMultiRow
from .pooling import asyncpg_dsn, pooling_of
from .schedule_function import install_schedule_function

logger = logging.getLogger("durafn.store")


# sqlstates worth a retry of the whole transaction: connection exceptions (08), serialization
# failure and deadlock (40001, 40P01), lock timeout (55P03), server going away (57P0x),
# too many connections (53300).
_TRANSIENT_SQLSTATES = {"40001", "40P01", "55P03", "57P01", "57P02", "57P03", "53300"}


# The NOTIFY rides in the INSERT's statement: one round trip fewer (0.4 ms here), and a
# direct schedule is then one autocommit statement. A data-modifying CTE runs whether or
# not the outer SELECT reads it; the outer SELECT notifies only if asked (payload not '').
def _array_of(column: str) -> str:
    """The column's type as an array, for ``unnest``: ``uuid[]``, ``text[]``, ..."""
    return f"{sf.c[column].type.compile(dialect=PGDialect())}[]"  # type: ignore[no-untyped-call]


# A multi-row INSERT of arrays, one per column (``NewRowColumns``: each its own
# ``CAST(:id AS UUID[])``, ...), and the executors' NOTIFY, in one statement; its text is
# ``_INSERT_SQL.text``.
_INSERT_SQL = text(
    f"""
    WITH inserted AS (
        INSERT INTO _scheduled_functions ({", ".join(NEW_ROW_COLUMNS)})
        SELECT * FROM unnest({", ".join(f"CAST(:{c} AS {_array_of(c)})" for c in NEW_ROW_COLUMNS)})
    )
    SELECT pg_notify(:channel, CAST(:payload AS text)) WHERE CAST(:payload AS text) <> ''
    """
)


_TRY_LOCK = text("SELECT pg_try_advisory_xact_lock(hashtext(CAST(:b_lock AS text)))")

# ``wake_freed``'s statements, each its own transaction. Those of the rows that may be
# free (``schema/dependencies.py``): for nearly every finish of a fan-in, none.
_MAY_BE_FREE = text(
    "SELECT unnest(durafn_may_be_free(CAST(string_to_array(:ids, ',') AS uuid[])))::text"
)
# Their edges that a transaction in flight deletes (or locks): one per transaction, to
# wait on (``ix_durafn_dependencies_row``; xid has no ordering, hence the text).
_IN_FLIGHT = text(
    """
    SELECT DISTINCT ON (xmax::text) ctid::text FROM _durafn_dependencies
     WHERE row_id = ANY(CAST(string_to_array(:ids, ',') AS uuid[])) AND xmax <> '0'::xid
    """
)
# Waits for the transaction that deletes the edge; returns nothing if it committed.
_WAIT = text(
    "SELECT 1 FROM _durafn_dependencies WHERE ctid = CAST(CAST(:ctid AS text) AS tid) FOR KEY SHARE"
)
# Which of them have no edge left, and the NOTIFY if any has none.
_FREED = text(
    """
    WITH freed AS (
        SELECT t FROM unnest(CAST(string_to_array(:ids, ',') AS uuid[])) AS t
         WHERE NOT EXISTS (SELECT 1 FROM _durafn_dependencies AS d WHERE d.row_id = t)
    )
    SELECT count(*), CASE WHEN count(*) > 0 THEN pg_notify(:channel, :payload) END FROM freed
    """
)


def _discard_broken_connections(context: ExceptionContext) -> None:
    """Never hand out again a connection whose operation a lost server interrupted.

    SQLAlchemy's asyncpg dialect takes an error for a disconnect only once asyncpg has
    seen its socket close. A terminated backend sends its error first: the connection
    went back to the pool still consuming that reply, and the next transaction on it
    failed with ``cannot switch to state 11; another operation (2) is in progress``
    (every backend terminated every 0.3 s for 30 s: a dozen times, and once a worker
    died of it). A connection-class error marks the connection (and the pool, whose
    other connections are as likely gone) invalid: it is closed, not reused."""
    if context.is_disconnect:
        return
    error = context.original_exception
    state = _sqlstate(error)
    cause = getattr(error, "__cause__", None)
    if (state is not None and (state.startswith("08") or state.startswith("57P"))) or (
        _broken(cause) or _broken(error)
    ):
        context.is_disconnect = True


def _refuse_closed_connections(dbapi_connection: Any, record: Any, proxy: Any) -> None:
    """A pooled connection whose server closed it while it sat in the pool (asyncpg has
    seen the end of its socket) is replaced at checkout, not handed to a transaction to
    fail in. No round trip: a connection the server dropped unseen still fails its first
    statement, and is then discarded (``_discard_broken_connections``)."""
    if dbapi_connection.driver_connection.is_closed():
        raise sa_exc.DisconnectionError("the server closed this pooled connection")


def _broken(exc: BaseException | None) -> bool:
    """An asyncpg error that says the connection cannot be used again (not one about a
    statement's input, such as a value out of range: an InterfaceError and a ValueError).
    """
    if isinstance(
        exc, asyncpg.exceptions.ConnectionDoesNotExistError | asyncpg.exceptions.InternalClientError
    ):
        return True
    if isinstance(exc, asyncpg.InterfaceError) and not isinstance(exc, ValueError):
        return any(sign in str(exc) for sign in _BROKEN_SIGNS)
    return False


_BROKEN_SIGNS = ("connection is closed", "connection was closed", "another operation")


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


FILLFACTOR = 50
"""Percent of each page of ``_scheduled_functions`` that new rows fill (``set_storage``)."""
AUTOVACUUM = {
    "autovacuum_vacuum_threshold": "1000",
    "autovacuum_vacuum_scale_factor": "0.01",
    "autovacuum_vacuum_insert_scale_factor": "0.01",
    "autovacuum_analyze_scale_factor": "0.02",
}
"""``_scheduled_functions``' own autovacuum thresholds (``set_autovacuum``)."""


class PostgresDriver(PostgresMultiRow, Driver):
    dialect_insert = staticmethod(postgresql_insert)
    lateral_claims: ClassVar[bool] = True
    name: ClassVar[str] = "PostgreSQL"
    max_mutation_lanes: ClassVar[int] = 4
    default_poll_interval: ClassVar[float] = 5.0
    auto_migrate: ClassVar[bool] = False
    default_max_connections: ClassVar[int] = 10
    # Measured: a claim of 64 actions took 2.4 ms as BEGIN, UPDATE, COMMIT through
    # SQLAlchemy and 1.6 ms as one autocommit statement (the server's part is 1.0 ms).
    single_statement_options: ClassVar[dict[str, Any]] = {"isolation_level": "AUTOCOMMIT"}

    # -- the schema's SQL (``migrations.SchemaDialect``) ----------------------------------

    def install_release_trigger(self, conn: SyncConnection) -> None:
        install_release_trigger(conn)

    def install_release_functions(self, conn: SyncConnection) -> None:
        install_release_functions(conn)

    def install_schedule_function(self, conn: SyncConnection) -> None:
        install_schedule_function(conn)

    def set_storage(self, conn: SyncConnection) -> None:
        # A row is written once and updated once or twice (claimed, finished): each update
        # a new version of it, none of them HOT (the state it moves between partial
        # indexes by is in their predicates). With pages packed full the new version goes
        # to another page: one more LOCK record before it, and the whole row in the WAL
        # where a version on the same page is logged by what changed. Half of each page
        # left free for them: a no-op mutation's WAL 590 -> 470 bytes, a 20 ms action's
        # 1,115 -> 995 (benchmarks.realwork, 5,000 jobs, two interleaved rounds each;
        # fillfactor 70 gave 538 and 1,020). The cost: pages hold half as many rows once
        # they have ended, so a table of kept rows is about twice the size.
        conn.execute(text(f"ALTER TABLE _scheduled_functions SET (fillfactor = {FILLFACTOR})"))

    def set_autovacuum(self, conn: SyncConnection) -> None:
        # Every row is updated once or twice (none HOT) and deleted by the retention
        # sweep: dead rows come at two to three times the rate of new work, while the
        # table keeps the finished rows of the retention period (7 days by default).
        # PostgreSQL's default vacuums it once its dead rows pass 50 + 20% of its rows.
        # Measured (benchmarks.soak, an hour of 14 rows/s beside 200,000 kept rows,
        # autovacuum on): at the default, 2 vacuums, up to 42,220 dead rows, the heap
        # +11.2 MB; at 1,000 + 1%, 28 vacuums, at most 3,972 dead rows, the heap +5.2 MB;
        # their CPU 0.07 against 0.48 s, their WAL 3.3 against 10.7 MB (mostly full-page
        # images: a vacuum every two minutes is often a page's first change after a
        # checkpoint). Statistics are kept fresh the same way (ANALYZE at 2% of the rows
        # changed), since the claims' plans read them. docs/performance says more.
        settings = ", ".join(f"{k} = {v}" for k, v in AUTOVACUUM.items())
        conn.execute(text(f"ALTER TABLE _scheduled_functions SET ({settings})"))

    def add_seq_column(self, conn: SyncConnection) -> None:
        # Numbers the rows there are as it rewrites the table.
        conn.execute(
            text(
                "ALTER TABLE _scheduled_functions "
                "ADD COLUMN seq BIGINT GENERATED BY DEFAULT AS IDENTITY"
            )
        )

    def __init__(self, url: URL) -> None:
        super().__init__(url)
        self.pooling = pooling_of(url)
        """The URL's ``pooler`` and ``listen`` options (``pooling.py``)."""
        self._told_polling = False

    def create_engine(self, max_connections: int) -> AsyncEngine:
        # asyncpg waits 60 s for a connection by default: too long for a worker that
        # should notice an unreachable server, log it and back off.
        connect_args: dict[str, Any] = {"timeout": CONNECT_TIMEOUT}
        if self.pooling.transaction_mode:
            # No statement kept on the server: its next transaction may run on another
            # server connection. asyncpg then sends each statement unnamed, parsed again
            # with each execution (it marks them unprepared), which works through any
            # PgBouncer (1.21's max_prepared_statements is not needed: Debian 12 has
            # 1.18). SQLAlchemy's own cache of them stays: it keeps only their
            # descriptions, client-side, and spares a round trip per statement (a
            # Parse/Describe): 4 engines through PgBouncer ran 3,200 transactions in
            # 5.9 s with it, 7.3 s without (direct: 2.9 s).
            connect_args["statement_cache_size"] = 0
            # asyncpg asks for client_encoding 'utf-8'; the server calls it UTF8.
            # PgBouncer compares the two as text, finds them different, and SETs it on
            # the server connection before each transaction: a statement and a server
            # transaction more for each of ours (30 SETs for 30 one-statement
            # transactions; none when asked for as the server spells it).
            connect_args["server_settings"] = {"client_encoding": "UTF8"}
        engine = create_async_engine(
            self.pooling.engine_url,
            connect_args=connect_args,
            **pool_arguments(max_connections),
        )
        event.listen(engine.sync_engine, "handle_error", _discard_broken_connections)
        event.listen(engine.sync_engine, "checkout", _refuse_closed_connections)
        return engine

    def create_sync_engine(self, max_connections: int) -> Engine:
        from .sync_engine import sync_engine  # (sync callers only: app.sync)

        return sync_engine(self.pooling, max_connections)

    def _transient_dbapi(self, exc: sa_exc.DBAPIError) -> bool:
        state = _sqlstate(exc)
        if state is not None and (state.startswith("08") or state in _TRANSIENT_SQLSTATES):
            return True
        orig = getattr(exc, "orig", None)
        return _broken(getattr(orig, "__cause__", None))

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

    def wrap(self, exc: BaseException, doing: str) -> DatabaseError:
        wrapped = super().wrap(exc, doing)
        if _sqlstate(exc) in ("26000", "42P05") and "__asyncpg_stmt_" in str(exc):
            # A prepared statement missing, or there already, on a server connection:
            # a pooler in transaction mode handed asyncpg another one between prepare
            # and execute, or one another client had prepared on.
            return DatabaseError(
                f"{wrapped}. The URL reaches PostgreSQL through a pooler in transaction "
                "mode (PgBouncer's pool_mode = transaction): add pooler=transaction to its "
                "query, and listen=HOST:PORT naming the server itself for LISTEN",
                transient=wrapped.transient,
            )
        return wrapped

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
        if self.pooling.transaction_mode:
            # A pooler's process key names no backend (PgBouncer makes its own), and the
            # backend is the transaction's: asked inside it, it is this transaction's.
            return (await conn.execute(text("SELECT pg_backend_pid()"))).scalar_one()
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
        # On a connection of its own, outside the pool: with max_connections=1 the pool has
        # no other, and a checkout would wait while the statement kept its locks.
        try:
            with anyio.fail_after(5.0 + CONNECT_TIMEOUT):
                admin = await asyncpg.connect(
                    self.pooling.admin_dsn, timeout=CONNECT_TIMEOUT, statement_cache_size=0
                )
                try:
                    await admin.execute("SELECT pg_terminate_backend($1, 5000)", handle)
                finally:
                    admin.terminate()
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

    async def wake_freed(self, conn: AsyncConnection, ids: Collection[str]) -> int:
        candidates = (await conn.execute(_MAY_BE_FREE, {"ids": ",".join(ids)})).scalars().all()
        if not candidates:
            return 0
        # Each statement waits holding no lock (autocommit): waiting on one edge while
        # holding another could deadlock with a finish that deletes both.
        joined = ",".join(candidates)
        in_flight = (await conn.execute(_IN_FLIGHT, {"ids": joined})).scalars().all()
        for ctid in in_flight:
            await conn.execute(_WAIT, {"ctid": ctid})
        params = {"ids": joined, "channel": CHANNEL, "payload": ",".join(sorted(ALL_KINDS))}
        return int((await conn.execute(_FREED, params)).scalar_one())

    async def announce_cancels(self, conn: AsyncConnection, ids: Sequence[str]) -> None:
        await super().announce_cancels(conn, ids)
        # A NOTIFY payload holds under 8000 bytes: 200 ids (37 bytes each) per message.
        for start in range(0, len(ids), 200):
            await conn.execute(
                text("SELECT pg_notify(:channel, :payload)"),
                {"channel": CHANNEL, "payload": CANCEL_PREFIX + ",".join(ids[start : start + 200])},
            )

    async def try_lock(self, conn: AsyncConnection, name: str) -> bool:
        # A transaction-level advisory lock on the name's hash: a collision only makes two
        # names share a lock now and then.
        found = await conn.execute(_TRY_LOCK, {"b_lock": name})
        return bool(found.scalar())

    async def _lock_schema(self, conn: AsyncConnection) -> None:
        await conn.execute(text("SELECT pg_advisory_xact_lock(hashtext('durafn.migrate'))"))

    async def insert_rows(
        self,
        conn: AsyncConnection,
        rows: Sequence[NewRowColumns],
        notify: Collection[FunctionKind] = (),
    ) -> None:
        # One statement with one array per column: a 1000-row schedule is one round trip
        # and one parse (asyncpg's executemany took ~30 ms for 1000 rows here).
        by_name = cast(Sequence[Mapping[str, Any]], rows)
        params: dict[str, Any] = {
            column: [row[column] for row in by_name] for column in NEW_ROW_COLUMNS
        }
        params["channel"] = CHANNEL
        params["payload"] = ",".join(sorted(notify))
        await conn.execute(_INSERT_SQL, params)

    @asynccontextmanager
    async def listen(
        self,
        engine: AsyncEngine,
        on_wake: Callable[[Collection[FunctionKind]], None],
        on_cancel: Callable[[list[str]], None],
    ) -> AsyncIterator[bool]:
        """The process's LISTEN connection to the server (``listener.py``), unless the
        URL says there is none to have (``pooling.py``)."""
        target = self.pooling.listen_url
        if target is None:
            if not (self.pooling.listen_off or self._told_polling):
                self._told_polling = True
                logger.warning(
                    "the database URL goes through a pooler in transaction mode "
                    "(pooler=transaction), which cannot carry LISTEN, and names no server "
                    "to LISTEN on: executors find new work and other processes' cancels "
                    "by polling, every poll_interval. Add listen=HOST:PORT (the server "
                    "itself) to the URL to have them at once, or listen=off to say polling "
                    "is meant"
                )
            yield False
            return
        async with listening(asyncpg_dsn(target), on_wake, on_cancel):
            yield True
