"""SQLite: one file, WAL, one writer at a time, several processes allowed.

Why users never see "database is locked": every write transaction starts with
``BEGIN IMMEDIATE``, so a writer takes the lock up front (where ``busy_timeout`` waits for it)
instead of upgrading a read lock mid-transaction (where SQLite fails at once to avoid a
deadlock). Whatever still escapes (a timeout under heavy contention) is classified as
transient and retried by the caller.
"""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, ClassVar

from sqlalchemy import event
from sqlalchemy import exc as sa_exc
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from .._errors import ReadOnlyError, SchemaError
from ._driver import Driver

READ_ONLY_OPTION = "durafn_read_only"
"""Execution option: begin DEFERRED (a reader) rather than IMMEDIATE (a writer)."""


class SQLiteDriver(Driver):
    name: ClassVar[str] = "SQLite"
    max_mutation_lanes: ClassVar[int] = 1
    default_poll_interval: ClassVar[float] = 0.5

    busy_timeout: float = 30.0
    synchronous: str = "FULL"

    def create_engine(self) -> AsyncEngine:
        database = self.url.database
        if not database or database == ":memory:" or database.startswith("file::memory:"):
            raise SchemaError(
                "durafn needs a SQLite *file* (executors and callers use several "
                "connections); use a URL like sqlite+aiosqlite:///app.db"
            )
        engine = create_async_engine(
            self.url,
            connect_args={"timeout": self.busy_timeout},
            pool_size=8,
            max_overflow=8,
        )
        synchronous = self.synchronous
        busy_ms = int(self.busy_timeout * 1000)

        @event.listens_for(engine.sync_engine, "connect")
        def _on_connect(dbapi_conn: Any, _record: Any) -> None:
            # Take transaction control away from the sqlite3 module so that BEGIN is ours.
            dbapi_conn.isolation_level = None
            cursor = dbapi_conn.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute(f"PRAGMA synchronous={synchronous}")
            cursor.execute(f"PRAGMA busy_timeout={busy_ms}")
            cursor.close()

        @event.listens_for(engine.sync_engine, "begin")
        def _on_begin(conn: Any) -> None:
            mode = "DEFERRED" if conn.get_execution_options().get(READ_ONLY_OPTION) else "IMMEDIATE"
            conn.exec_driver_sql(f"BEGIN {mode}")

        return engine

    def _transient_dbapi(self, exc: sa_exc.DBAPIError) -> bool:
        if isinstance(exc.orig, sqlite3.OperationalError) or isinstance(
            exc, sa_exc.OperationalError
        ):
            message = str(exc.orig).lower()
            return "locked" in message or "busy" in message
        return False

    def translate(self, exc: BaseException) -> BaseException | None:
        orig = getattr(exc, "orig", exc)
        if "readonly" in str(orig).lower() or "read-only" in str(orig).lower():
            return ReadOnlyError("a query cannot write to the database; do the write in a mutation")
        return None

    @asynccontextmanager
    async def read_only(self, conn: AsyncConnection) -> AsyncIterator[None]:
        await conn.exec_driver_sql("PRAGMA query_only = ON")
        try:
            yield
        finally:
            await conn.exec_driver_sql("PRAGMA query_only = OFF")
