"""SQLite: one file, WAL, one writer at a time, several processes allowed.

Why users never see "database is locked": every write transaction starts with
``BEGIN IMMEDIATE``, so a writer takes the lock up front instead of upgrading a read lock
mid-transaction (where SQLite fails at once to avoid a deadlock), and before it, the file's
turn (``sqlite/turns.py``): durafn's writers, of this process and of others, wait for it
in line, where SQLite's busy handler would let one process keep the lock for seconds.
Whatever still escapes (a wait past ``busy_timeout``) is classified as transient and
retried by the caller.
"""

from __future__ import annotations

import logging
import operator
import sqlite3
import threading
from collections.abc import AsyncIterator, Collection, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, ClassVar, TypeGuard

import anyio
import anyio.to_thread
from sqlalchemy import event, text
from sqlalchemy import exc as sa_exc
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import URL, Engine
from sqlalchemy.engine import Connection as SyncConnection
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from ..._errors import DatabaseError, ReadOnlyError, SchemaError
from ..._kinds import FunctionKind
from ..driver import Driver
from ..engine import pool_arguments
from ..rows import NEW_ROW_COLUMNS, NewRowColumns
from . import sql as _sql  # noqa: F401  (its SQL for the elements of ../sql.py)
from .calls import BEGIN_WRITE, Connection, adopt, begin
from .multirow import SQLiteMultiRow
from .sync_engine import READ_ONLY_OPTION as READ_ONLY_OPTION
from .sync_engine import set_up, sync_engine
from .triggers import install_release_trigger
from .turns import turn_for

logger = logging.getLogger("durafn.store")

ONE_CALL_OPTION = "durafn_one_call"
"""Execution option: the transaction is one call on aiosqlite's thread, BEGIN to COMMIT
(``sqlite/calls.py``): durafn's one-statement transactions."""

# ``seq``: the rowid the row gets (``sql.next_seq``), each row a statement.
_INSERT_SQL = (
    f"INSERT INTO _scheduled_functions ({', '.join(NEW_ROW_COLUMNS)}, seq) "
    f"VALUES ({', '.join('?' * len(NEW_ROW_COLUMNS))}, "
    "(SELECT coalesce(max(rowid), 0) + 1 FROM _scheduled_functions))"
)
# A new row's values in _INSERT_SQL's order, in C (a generator per row cost ~2 us).
_new_row_values = operator.itemgetter(*NEW_ROW_COLUMNS)


def _is_file(database: str | None) -> TypeGuard[str]:
    """Whether the URL names a file (not an in-memory database, which durafn cannot use)."""
    return (
        database is not None
        and database not in ("", ":memory:")
        and not database.startswith("file::memory:")
    )


def _file_of(url: URL) -> str:
    database = url.database
    if not _is_file(database):
        raise SchemaError(
            "durafn needs a SQLite *file* (executors and callers use several "
            "connections); use a URL like sqlite+aiosqlite:///app.db"
        )
    return database


def _thread_of(connection: Any) -> threading.Thread | None:
    """aiosqlite's worker thread (its own attribute since 0.21; the connection itself before)."""
    thread = getattr(connection, "_thread", connection)
    return thread if isinstance(thread, threading.Thread) else None


class SQLiteDriver(SQLiteMultiRow, Driver):
    dialect_insert = staticmethod(sqlite_insert)
    name: ClassVar[str] = "SQLite"
    max_mutation_lanes: ClassVar[int] = 1
    default_poll_interval: ClassVar[float] = 0.5
    auto_migrate: ClassVar[bool] = True
    default_max_connections: ClassVar[int] = 16
    single_statement_options: ClassVar[dict[str, Any]] = {ONE_CALL_OPTION: True}
    read_only_options: ClassVar[dict[str, Any]] = {READ_ONLY_OPTION: True}

    busy_timeout: float = 30.0
    synchronous: str = "FULL"

    def __init__(self, url: URL) -> None:
        super().__init__(url)
        if given := sorted({"pooler", "listen"} & set(url.query)):
            # PostgreSQL's options (postgres/pooling.py), which SQLite's driver would ignore.
            raise DatabaseError(
                f"{' and '.join(f'{name}=' for name in given)} in the database URL is "
                "for PostgreSQL through a connection pooler; SQLite has no server to pool "
                "connections to: take it out of the URL"
            )
        self._stopping: list[threading.Thread] = []

    # -- the schema's SQL (``migrations.SchemaDialect``) ----------------------------------

    def install_release_trigger(self, conn: SyncConnection) -> None:
        install_release_trigger(conn)

    def add_seq_column(self, conn: SyncConnection) -> None:
        # A new row's seq is its rowid (sql.NextSeq): the rows there are numbered so too.
        conn.execute(
            text("ALTER TABLE _scheduled_functions ADD COLUMN seq BIGINT NOT NULL DEFAULT 0")
        )
        conn.execute(text("UPDATE _scheduled_functions SET seq = rowid"))

    def require_existing(self) -> None:
        # Opening a missing file creates it, so a mistyped path would otherwise look like
        # an empty database rather than a mistake.
        database = self.url.database
        if _is_file(database) and not Path(database).expanduser().is_file():
            raise SchemaError(
                f"the SQLite database {database!r} does not exist; check the path, or "
                "create it with `durafn migrate --url ...`"
            )

    def create_engine(self, max_connections: int) -> AsyncEngine:
        database = _file_of(self.url)
        engine = create_async_engine(
            self.url,
            connect_args={"timeout": self.busy_timeout, "factory": Connection},
            **pool_arguments(max_connections),
        )
        # SQLAlchemy terminates an invalidated aiosqlite connection (one whose statement was
        # cancelled) with a graceful close in a shielded task; when the caller is cancelled
        # again meanwhile, as anyio cancel scopes do, it also stops aiosqlite's thread, and
        # the graceful close then waits forever on a thread that has exited: a leaked task
        # that hangs the event loop's shutdown. Stopping the thread without waiting is all
        # that terminating needs (closing rolls back an open transaction).
        # The threads so stopped are joined when the engine is disposed: one still running
        # when the event loop closes prints a traceback ("Event loop is closed") as it
        # hands back its last result (a failed connect's clean-up, say).
        stopping = self._stopping

        def _stop_thread(dbapi_connection: Any) -> None:
            connection = dbapi_connection.driver_connection
            connection.stop()
            stopping[:] = [t for t in stopping if t.is_alive()]
            if (thread := _thread_of(connection)) is not None:
                stopping.append(thread)

        engine.sync_engine.dialect.do_terminate = _stop_thread  # type: ignore[method-assign]
        self._listen(engine, database)
        return engine

    def create_sync_engine(self, max_connections: int) -> Engine:
        database = _file_of(self.url)
        return sync_engine(
            self.url,
            database,
            max_connections,
            busy_timeout=self.busy_timeout,
            synchronous=self.synchronous,
        )

    def _listen(self, engine: AsyncEngine, database: str) -> None:
        """What each new connection is set up with, and how each transaction begins."""
        synchronous = self.synchronous
        turn = turn_for(str(Path(database).expanduser().resolve()))
        busy = self.busy_timeout
        busy_ms = int(busy * 1000)

        @event.listens_for(engine.sync_engine, "do_connect")
        def _check_directory(*_: Any) -> None:
            # SQLite's own message ("unable to open database file") does not say why, and
            # aiosqlite's failed-connect clean-up can print a thread traceback at exit.
            directory = Path(database).expanduser().resolve().parent
            if not directory.is_dir():
                raise DatabaseError(
                    f"cannot open the SQLite database {database!r}: the directory "
                    f"{str(directory)!r} does not exist; create it or fix the URL"
                )

        @event.listens_for(engine.sync_engine, "connect")
        def _on_connect(dbapi_conn: Any, _record: Any) -> None:
            adopt(dbapi_conn)  # each statement one call on aiosqlite's thread
            raw = dbapi_conn.driver_connection._conn
            raw.turn, raw.turn_wait = turn, busy  # its writers wait in line for the turn
            set_up(dbapi_conn, synchronous, busy_ms)

        @event.listens_for(engine.sync_engine, "begin")
        def _on_begin(conn: Any) -> None:
            # Sent with the transaction's first statement, not as a call of its own; a
            # one-statement transaction commits in that call too (``sqlite/calls.py``). Not
            # SQLAlchemy's AUTOCOMMIT: returning such a connection to the pool resets
            # sqlite3's isolation_level, undoing _on_connect, and an autocommit finish of
            # several statements would pay an fsync for each.
            options = conn.get_execution_options()
            read = options.get(READ_ONLY_OPTION)
            one_call = bool(options.get(ONE_CALL_OPTION))
            begin(
                conn.connection.dbapi_connection,
                "BEGIN DEFERRED" if read else BEGIN_WRITE,
                one_call,
            )

    def _transient_dbapi(self, exc: sa_exc.DBAPIError) -> bool:
        if isinstance(exc.orig, sqlite3.OperationalError) or isinstance(
            exc, sa_exc.OperationalError
        ):
            message = str(exc.orig).lower()
            return "locked" in message or "busy" in message
        return False

    def translate(self, exc: BaseException) -> BaseException | None:
        # PRAGMA query_only makes SQLite refuse writes with "attempt to write a readonly
        # database"; only that driver error is translated, never a user's own exception.
        if isinstance(exc, sa_exc.DBAPIError) and "readonly database" in str(exc.orig):
            return ReadOnlyError("a query cannot write to the database; do the write in a mutation")
        return None

    async def statement_handle(self, conn: AsyncConnection) -> Any:
        return (await conn.get_raw_connection()).driver_connection  # aiosqlite's Connection

    async def abandon(self, conn: AsyncConnection, handle: Any) -> None:
        # The timed-out statement still runs in aiosqlite's thread, holding the write lock
        # that every process needs. sqlite3's interrupt() is thread-safe and stops it at
        # once; the thread then closes the connection (rolling back) on the stop that
        # invalidating queues, and exits. Waiting for that exit means the lock is free
        # when the caller records the failure and re-runs the batch's other rows.
        try:
            handle._conn.interrupt()
        except Exception as exc:  # the connection is closed already: nothing runs on it
            logger.debug("could not interrupt a timed-out statement: %s", exc)
        await conn.invalidate()
        await self._join(_thread_of(handle))

    async def dispose(self, engine: AsyncEngine) -> None:
        await engine.dispose()
        for thread in self._stopping:
            await self._join(thread)
        self._stopping.clear()

    async def _join(self, thread: threading.Thread | None) -> None:
        if thread is not None and thread.is_alive():
            await anyio.to_thread.run_sync(thread.join, self.busy_timeout, abandon_on_cancel=True)

    async def insert_rows(
        self,
        conn: AsyncConnection,
        rows: Sequence[NewRowColumns],
        notify: Collection[FunctionKind] = (),
    ) -> None:
        # The values are SQLite's own types already (ids are text here), so the rows go to
        # sqlite3's executemany as tuples, without SQLAlchemy's processing of each row's
        # parameters: a 1000-row schedule's CPU per row went from 16.8 to 14.1 us. Other
        # processes learn of the rows by their poll (SQLite has no NOTIFY).
        await conn.exec_driver_sql(_INSERT_SQL, list(map(_new_row_values, rows)))

    @asynccontextmanager
    async def read_only(self, conn: AsyncConnection) -> AsyncIterator[None]:
        await conn.exec_driver_sql("PRAGMA query_only = ON")
        try:
            yield
        finally:
            if not conn.invalidated:  # else the connection is dropped, pragma and all
                await conn.exec_driver_sql("PRAGMA query_only = OFF")
