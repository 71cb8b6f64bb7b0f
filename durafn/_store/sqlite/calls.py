"""Each SQLite statement as one call on aiosqlite's thread, and a transaction's BEGIN,
COMMIT and ROLLBACK folded into the calls that need them.

aiosqlite runs every sqlite3 call on a thread of its own, and SQLAlchemy's adapter makes
four of them per statement (make a cursor, execute, fetch the rows, close the cursor).
Each is a wake-up of that thread and then of the event loop: ~0.1 ms apiece on this
machine, so a ``SELECT 1`` took 0.4 ms, and a write transaction held SQLite's one write
lock across every hop of its statements, while the executor's other connection waited
for it in SQLite's busy handler (which sleeps 1, 2, 5, 10 ms... between tries). Here the
adapter's cursor does the four as one call; what it hands back is what the four gave.

A transaction cost four more calls: its BEGIN, its first statement, its COMMIT, and the
ROLLBACK with which the pool resets a connection it takes back. Traced in a drain of
no-op actions, a claim of 100 rows took 3 ms, of which 1.3 ms was SQLite's work. So:

- BEGIN is sent with the transaction's first call (``Connection.begin``), not alone;
- a transaction of one call (``whole``: durafn's one-statement transactions, where
  PostgreSQL uses autocommit) commits at the end of that call;
- COMMIT and ROLLBACK make no call when SQLite has no transaction open and none of ours
  is on its way (``_settled``): after a whole call, and the pool's reset after a commit.

So a claim is one call, holding the write lock only while SQLite works.

This leans on two private parts, pinned with their versions in ``pyproject.toml``:
aiosqlite's ``Connection._execute`` (its one way to run a call on its thread) and
SQLAlchemy's aiosqlite adapter classes, which ``adopt`` subclasses. A server-side cursor
(``stream_results``) keeps the adapter's own, after a call for any BEGIN due.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
from collections import deque
from collections.abc import Callable
from typing import Any, TypeVar

from sqlalchemy.dialects.sqlite.aiosqlite import (
    AsyncAdapt_aiosqlite_connection,
    AsyncAdapt_aiosqlite_cursor,
)

logger = logging.getLogger("durafn.store")

T = TypeVar("T")


class Connection(sqlite3.Connection):
    """sqlite3's connection, with the state of durafn's transaction on it, rolling back
    before it closes.

    Closing a connection whose transaction is open while a cursor still holds a statement
    (a statement cancelled half-way) leaves a "zombie" that keeps the write lock until the
    cursor is garbage-collected: every other connection then waits out its busy timeout.
    """

    begin: str | None = None
    """The BEGIN that the next call sends first: the transaction has begun, and no
    statement of it has been sent yet."""
    whole = False
    """The next call is the whole transaction: it commits at its end."""
    turn: threading.Lock | None = None
    """This process's write turn on the database file (``turn_for``)."""
    sent = 0
    """Calls handed to the thread (counted by the event loop)."""
    done = 0
    """Calls the thread has finished (counted by the thread); ``sent - done`` are on
    their way, queued or running, their callers perhaps cancelled."""

    def close(self) -> None:
        try:
            if self.in_transaction:
                self.rollback()
        except sqlite3.Error as exc:  # closing matters more; SQLite rolls back on close
            logger.debug("rollback before close failed: %s", exc)
        super().close()


def _run(db: Connection, fn: Callable[..., T], args: tuple[Any, ...]) -> T:
    """On the connection's thread: ``fn(db, *args)``, after the transaction's BEGIN if it
    is due, and then its COMMIT if this call is the whole transaction."""
    try:
        begin = db.begin
        if begin is None:
            return fn(db, *args)
        if db.whole:
            return _whole(db, begin, fn, args)
        db.execute(begin)  # if it fails (busy), it is still due: ROLLBACK clears it
        db.begin = None
        return fn(db, *args)
    finally:
        db.done += 1


def _whole(db: Connection, begin: str, fn: Callable[..., T], args: tuple[Any, ...]) -> T:
    """``fn(db, *args)`` as the whole transaction; a writer takes this process's turn on
    the file first (``turn_for``)."""
    turn = db.turn if begin == BEGIN_WRITE else None
    if turn is not None and not turn.acquire(timeout=TURN_WAIT):
        turn = None

    def body() -> T:
        db.begin, db.whole = None, False  # BEGIN went through
        return fn(db, *args)

    try:
        return atomically(db, begin, body)
    finally:
        if turn is not None:
            turn.release()


def atomically(db: sqlite3.Connection, begin: str, work: Callable[[], T]) -> T:
    """On the thread: ``begin``, ``work()``, COMMIT; ROLLBACK if either fails."""
    db.execute(begin)
    try:
        result = work()
        db.execute("COMMIT")
    except BaseException:
        if db.in_transaction:
            db.rollback()
        raise
    return result


async def call(connection: Any, fn: Callable[..., T], *args: Any) -> T:
    """``fn(db, *args)`` as one call on aiosqlite ``connection``'s thread, in the
    transaction begun on it (``begin``)."""
    db: Connection = connection._conn  # raises ValueError once the connection is closed
    db.sent += 1
    # aiosqlite's own way to run a call on its thread; it has no public name for it.
    result: T = await connection._execute(_run, db, fn, args)
    return result


def turn_for(path: str) -> threading.Lock:
    """The write turn of this process's connections to the database file at ``path``.

    SQLite lets one writer in at a time; one that finds the lock taken waits in its busy
    handler, which sleeps 1, 2, 5, 10, 15 ms... between tries, however soon the lock is
    free. Traced in a drain of no-op actions, the finisher's write waited 36 ms while the
    claims, one call of ~1.3 ms every ~2.5 ms, took the lock in turn, and wrote 1300
    outcomes at once when it got in. A writer's whole transaction (one call) takes this
    lock first, so that the next writer of this process starts as soon as it ends; other
    processes, and transactions of several calls, still meet in the busy handler.
    """
    with _turns_lock:
        return _turns.setdefault(path, threading.Lock())


TURN_WAIT = 1.0
"""Seconds a writer waits for the turn before it goes on without it, to the busy handler
(a turn held that long is a transaction stuck on a lock of another process, or one that
a fork copied held)."""
_turns: dict[str, threading.Lock] = {}
_turns_lock = threading.Lock()


def _forget_turns() -> None:
    """In a forked child: a turn another thread of the parent held would stay held (every
    one-call write would wait out TURN_WAIT, for good). The child's engines start afresh."""
    global _turns_lock
    _turns_lock = threading.Lock()
    _turns.clear()


if hasattr(os, "register_at_fork"):  # not on Windows, which has no fork
    os.register_at_fork(after_in_child=_forget_turns)
BEGIN_WRITE = "BEGIN IMMEDIATE"


def begin(dbapi_connection: Any, statement: str, whole: bool) -> None:
    """A transaction begins on this connection of SQLAlchemy's adapter: send
    ``statement`` (``BEGIN ...``) with its first call; ``whole``: that call is all of it."""
    db: Connection = dbapi_connection.driver_connection._conn
    db.begin, db.whole = statement, whole


def _execute(
    db: sqlite3.Connection, operation: str, parameters: Any
) -> tuple[Any, list[Any] | None, Any, int]:
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


def _executemany(db: sqlite3.Connection, operation: str, parameters: Any) -> tuple[Any, int]:
    cursor = db.cursor()
    try:
        cursor.executemany(operation, parameters)
        return cursor.lastrowid, cursor.rowcount
    finally:
        cursor.close()


def _nothing(db: sqlite3.Connection) -> None:
    return None


class _Cursor(AsyncAdapt_aiosqlite_cursor):
    __slots__ = ()

    def execute(self, operation: Any, parameters: Any = None) -> Any:
        try:
            description, rows, lastrowid, rowcount = self.await_(
                call(self._connection, _execute, operation, parameters)
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
            lastrowid, rowcount = self.await_(
                call(self._connection, _executemany, operation, seq_of_parameters)
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
            # The adapter's cursor calls aiosqlite itself: a BEGIN due goes first.
            try:
                if self._connection._conn.begin is not None:
                    self.await_(call(self._connection, _nothing))
            except Exception as error:
                self._handle_exception(error)
            return super().cursor(server_side)
        return _Cursor(self)

    def _settled(self) -> bool:
        """Whether COMMIT or ROLLBACK has nothing to end: none of our calls is on its way
        (one whose caller was cancelled may still BEGIN), and either no statement has been
        sent since the BEGIN (which is then never sent) or SQLite has no transaction open
        (a whole call committed it, or it was never opened). A closed connection: no, the
        adapter's own call says what is wrong."""
        try:
            db: Connection = self._connection._conn
            if db.sent != db.done:
                return False
            if db.begin is not None:
                db.begin, db.whole = None, False
                return True
            return not db.in_transaction
        except (ValueError, sqlite3.Error):
            return False

    def commit(self) -> None:
        if not self._settled():
            super().commit()

    def rollback(self) -> None:
        if not self._settled():
            super().rollback()


def adopt(dbapi_connection: Any) -> None:
    """Make a new connection of SQLAlchemy's aiosqlite adapter run each statement as one
    call (same object, same state: a subclass with no fields of its own)."""
    if type(dbapi_connection) is AsyncAdapt_aiosqlite_connection:
        dbapi_connection.__class__ = _Connection
