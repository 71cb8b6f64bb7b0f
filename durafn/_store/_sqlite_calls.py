"""Each SQLite statement as one call on aiosqlite's thread.

aiosqlite runs every sqlite3 call on a thread of its own, and SQLAlchemy's adapter makes
four of them per statement (make a cursor, execute, fetch the rows, close the cursor).
Each is a wake-up of that thread and then of the event loop: ~0.1 ms apiece on this
machine, so a ``SELECT 1`` took 0.4 ms, and a write transaction held SQLite's one write
lock across every hop of its statements, while the executor's other connection waited
for it in SQLite's busy handler (which sleeps 1, 2, 5, 10 ms... between tries). Here the
adapter's cursor does the four as one call; what it hands back is what the four gave.

This leans on two private parts, pinned with their versions in ``pyproject.toml``:
aiosqlite's ``Connection._execute`` (its one way to run a call on its thread) and
SQLAlchemy's aiosqlite adapter classes, which ``adopt`` subclasses. A server-side cursor
(``stream_results``) keeps the adapter's own.
"""

from __future__ import annotations

import sqlite3
from collections import deque
from typing import Any

from sqlalchemy.dialects.sqlite.aiosqlite import (
    AsyncAdapt_aiosqlite_connection,
    AsyncAdapt_aiosqlite_cursor,
)


def _execute(
    db: sqlite3.Connection, operation: str, parameters: Any
) -> tuple[Any, list[Any] | None, int | None, int]:
    cursor = db.cursor()
    try:
        if parameters is None:
            cursor.execute(operation)
        else:
            cursor.execute(operation, parameters)
        description = cursor.description
        rows = cursor.fetchall() if description else None
        return description, rows, cursor.lastrowid, cursor.rowcount
    finally:
        cursor.close()


def _executemany(db: sqlite3.Connection, operation: str, parameters: Any) -> tuple[int | None, int]:
    cursor = db.cursor()
    try:
        cursor.executemany(operation, parameters)
        return cursor.lastrowid, cursor.rowcount
    finally:
        cursor.close()


class _Cursor(AsyncAdapt_aiosqlite_cursor):
    __slots__ = ()

    def execute(self, operation: Any, parameters: Any = None) -> Any:
        try:
            connection = self._connection
            description, rows, lastrowid, rowcount = self.await_(
                connection._execute(_execute, connection._conn, operation, parameters)
            )
        except Exception as error:
            self._adapt_connection._handle_exception(error)
        if description:
            self.description = description
            self.lastrowid = self.rowcount = -1
            self._rows = deque(rows or ())
        else:
            self.description = None
            self.lastrowid = lastrowid
            self.rowcount = rowcount

    def executemany(self, operation: Any, seq_of_parameters: Any) -> Any:
        try:
            connection = self._connection
            lastrowid, rowcount = self.await_(
                connection._execute(_executemany, connection._conn, operation, seq_of_parameters)
            )
        except Exception as error:
            self._adapt_connection._handle_exception(error)
        self.description = None
        self.lastrowid = lastrowid
        self.rowcount = rowcount


class _Connection(AsyncAdapt_aiosqlite_connection):
    __slots__ = ()

    def cursor(self, server_side: bool = False) -> AsyncAdapt_aiosqlite_cursor:
        if server_side:
            return super().cursor(server_side)
        return _Cursor(self)


def adopt(dbapi_connection: Any) -> None:
    """Make a new connection of SQLAlchemy's aiosqlite adapter run each statement as one
    call (same object, same state: a subclass with no fields of its own)."""
    if type(dbapi_connection) is AsyncAdapt_aiosqlite_connection:
        dbapi_connection.__class__ = _Connection
