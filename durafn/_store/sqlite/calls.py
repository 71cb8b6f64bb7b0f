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

So a claim is one call, holding the write lock only while SQLite works. A writer's
transaction, of one call or several, holds the file's turn (``sqlite/turns.py``) from
just before its BEGIN to its COMMIT or ROLLBACK, whichever call ends it.

This leans on two private parts, pinned with their versions in ``pyproject.toml``:
aiosqlite's ``Connection._execute`` (its one way to run a call on its thread) and
SQLAlchemy's aiosqlite adapter classes, which ``adopt`` subclasses. A server-side cursor
(``stream_results``) keeps the adapter's own, after a call for any BEGIN due.
"""

from __future__ import annotations

import logging
import sqlite3
from collections import deque
from collections.abc import Callable
from typing import Any, TypeVar

from sqlalchemy.dialects.sqlite.aiosqlite import (
    AsyncAdapt_aiosqlite_connection,
    AsyncAdapt_aiosqlite_cursor,
)

from .turns import Turn

logger = logging.getLogger("durafn.store")

T = TypeVar("T")


class Connection(sqlite3.Connection):
    """sqlite3's connection, with the state of durafn's transaction on it, rolling back
    before it closes, and giving its write turn back (``sqlite/turns.py``) as its
    transaction ends.

    Closing a connection whose transaction is open while a cursor still holds a statement
    (a statement cancelled half-way) leaves a "zombie" that keeps the write lock until the
    cursor is garbage-collected: every other connection then waits out its busy timeout.
    """

    begin: str | None = None
    """The BEGIN that the next call sends first: the transaction has begun, and no
    statement of it has been sent yet."""
    whole = False
    """The next call is the whole transaction: it commits at its end."""
    turn: Turn | None = None
    """The write turn on the database file (``sqlite/turns.py``)."""
    turn_wait = 30.0
    """Seconds a writer waits for the turn: the driver's busy timeout."""
    holding = False
    """This connection's transaction has the turn."""
    sent = 0
    """Calls handed to the thread (counted by the event loop)."""
    done = 0
    """Calls the thread has finished (counted by the thread); ``sent - done`` are on
    their way, queued or running, their callers perhaps cancelled."""

    def commit(self) -> None:
        try:
            super().commit()
        finally:
            _settle(self)

    def rollback(self) -> None:
        try:
            super().rollback()
        finally:
            _settle(self)

    def close(self) -> None:
        try:
            if self.in_transaction:
                self.rollback()
        except sqlite3.Error as exc:  # closing matters more; SQLite rolls back on close
            logger.debug("rollback before close failed: %s", exc)
        try:
            super().close()
        finally:
            _give_turn(self)


def _take_turn(db: sqlite3.Connection) -> bool:
    """Before a writer's BEGIN: wait for the turn (``sqlite/turns.py``), failing as
    SQLite's busy timeout does if it is not had in time; whether it was taken now."""
    if not isinstance(db, Connection) or db.turn is None or db.holding:
        return False
    if not db.turn.acquire(db.turn_wait):
        raise sqlite3.OperationalError(
            f"database is locked: another writer kept the turn for {db.turn_wait:g}s"
        )
    db.holding = True
    return True


def _give_turn(db: sqlite3.Connection) -> None:
    if isinstance(db, Connection) and db.holding:
        db.holding = False
        assert db.turn is not None
        db.turn.release()


def _settle(db: Connection) -> None:
    """After a call: a transaction that has ended (committed, rolled back, or ended by
    SQLite on an error) gives its turn back."""
    if db.holding:
        try:
            ended = not db.in_transaction
        except sqlite3.ProgrammingError:  # closed
            ended = True
        if ended:
            _give_turn(db)


def _run(db: Connection, fn: Callable[..., T], args: tuple[Any, ...]) -> T:
    """On the connection's thread: ``fn(db, *args)``, after the transaction's BEGIN if it
    is due, and then its COMMIT if this call is the whole transaction."""
    try:
        begin = db.begin
        if begin is None:
            return fn(db, *args)
        if db.whole:
            return _whole(db, begin, fn, args)
        if begin == BEGIN_WRITE:
            _take_turn(db)
        db.execute(begin)  # if it fails (busy), it is still due: ROLLBACK clears it
        db.begin = None
        return fn(db, *args)
    finally:
        _settle(db)
        db.done += 1


def _whole(db: Connection, begin: str, fn: Callable[..., T], args: tuple[Any, ...]) -> T:
    """``fn(db, *args)`` as the whole transaction."""

    def body() -> T:
        db.begin, db.whole = None, False  # BEGIN went through
        return fn(db, *args)

    return atomically(db, begin, body)


def atomically(db: sqlite3.Connection, begin: str, work: Callable[[], T]) -> T:
    """On the thread: ``begin``, ``work()``, COMMIT; ROLLBACK if either fails. A writer
    has the turn from before its BEGIN to its end."""
    took = begin == BEGIN_WRITE and _take_turn(db)
    try:
        db.execute(begin)
        try:
            result = work()
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                db.rollback()
            raise
        return result
    finally:
        if took:
            _give_turn(db)


async def call(connection: Any, fn: Callable[..., T], *args: Any) -> T:
    """``fn(db, *args)`` as one call on aiosqlite ``connection``'s thread, in the
    transaction begun on it (``begin``)."""
    db: Connection = connection._conn  # raises ValueError once the connection is closed
    db.sent += 1
    # aiosqlite's own way to run a call on its thread; it has no public name for it.
    result: T = await connection._execute(_run, db, fn, args)
    return result


BEGIN_WRITE = "BEGIN IMMEDIATE"


def begin_now(db: sqlite3.Connection, statement: str) -> None:
    """A synchronous connection's transaction begins (``sync_engine.py``): a writer
    takes the turn first, and gives it back if its BEGIN fails."""
    took = statement == BEGIN_WRITE and _take_turn(db)
    try:
        db.execute(statement)
    except BaseException:
        if took:
            _give_turn(db)
        raise


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
