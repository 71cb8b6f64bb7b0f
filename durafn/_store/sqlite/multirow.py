"""SQLite's forms of the finish statements, run as one call on the connection's thread.

aiosqlite runs each sqlite3 call on a thread of its own, each call a wake-up of that
thread and then of the event loop (~0.1 ms apiece on this machine; ``calls``
makes a statement one call). The finish of a batch whose failed runs are retried (the
plain successes, then an UPDATE per retry, with its history) is one function
run on that thread, inside the caller's transaction (``BEGIN IMMEDIATE``: the write lock
is held, so nothing moves the rows between statements). Measured in a drain of 20,000
no-op mutations with a tenth failing once (some 25 failures a batch), through SQLAlchemy
with a statement a VALUES list each (``UPDATE ... FROM (VALUES ...)``: 12 us a retried
row, against 7 us for an UPDATE a row), a batch's finish took 1.3 ms more with failures
than without; as one call, 0.1 ms more. A part of ``SQLiteDriver``.
"""

from __future__ import annotations

import functools
import sqlite3
from collections.abc import Callable, Sequence
from collections.abc import Set as AbstractSet
from typing import Any, TypeVar, cast

from sqlalchemy import exc as sa_exc
from sqlalchemy.ext.asyncio import AsyncConnection

from ..._kinds import ScheduledFunctionId, State
from ..driver import Driver
from ..rows import Outcome, mark_moved
from ..schema.tables import ERROR_KEYS
from ..write.failures import sqlite_appended
from ..write.finish import plain_or_retried
from .calls import BEGIN_WRITE, atomically, call

T = TypeVar("T")

# write/finish.FINISH_PLAIN, write/failures.RETRY_ONE and RECORD_FAILURE in sqlite3's form;
# each finds its rows by primary key and is guarded by the state it expects. A failed run
# goes into its row's history (``errors``) in the UPDATE that writes it: its attempt, then
# ``_entry``'s values bound in ERROR_KEYS' order.
_ENTRY = ("?",) * (len(ERROR_KEYS) - 1)
_FINISH_PLAIN_SQL = """
    UPDATE _scheduled_functions
       SET state = 'Success', completed_time = ?, attempts = attempts + ?,
           started_time = coalesce(?, started_time),
           error_type = NULL, error_message = NULL, error_traceback = NULL{released}
     WHERE state = ? AND id IN ({ids})
"""
# A mutation batch's rows that others wait for release their dependents themselves, as
# PostgreSQL's finish does (``schema/dependencies.py``): ``dependents = 2`` keeps the
# trigger out, and one DELETE takes the batch's edges. Only where the claim read
# ``dependents`` in this transaction (a mutation batch: SQLite's one writer held the
# lock since), so the rows that had none are known without reading them back (a
# ``RETURNING`` of every row cost a plain finish 1.2 us a row). A row awaited since its
# claim (by a mutation of the same batch) keeps the trigger. Measured on the finish of
# 10,000 rows in batches of 256 (medians of 8 interleaved rounds): 119 ms when nobody waits
# for them; awaited, 194 ms through the trigger's program per row, 162 ms released here.
_RELEASED = ", dependents = 2"
_RELEASE_SQL = "DELETE FROM _durafn_dependencies WHERE dep_id IN ({ids})"
_RETRY_SQL = f"""
    UPDATE _scheduled_functions
       SET state = 'Pending', available_at = ?, completed_time = NULL, started_time = NULL,
           worker_id = NULL, error_type = ?, error_message = ?, error_traceback = ?,
           attempts = attempts + ?, failures = failures + ?,
           errors = {sqlite_appended("errors", "failures + ?", *_ENTRY)}
     WHERE id = ? AND state = ?
"""
_RECORD_SQL = f"""
    UPDATE _scheduled_functions SET errors = {sqlite_appended("errors", "failures", *_ENTRY)}
     WHERE id = ?
"""
_BOUND = 500
"""Ids per IN list (SQLite's limit on bound parameters is 32,766 here, 999 in old builds)."""


async def in_thread(conn: AsyncConnection, work: Callable[[sqlite3.Connection], T]) -> T:
    """``work(db)`` on ``conn``'s sqlite3 connection, as one call on its thread (the
    connection's open transaction is the one ``work`` writes in). Its errors come back as
    from SQLAlchemy's ``execute``: sqlite3's wrapped, a closed connection (aiosqlite's
    ValueError) as the adapter's "no active connection", and a disconnect invalidates
    ``conn``, so that faults are classified, and retried, as usual."""
    connection: Any = (await conn.get_raw_connection()).driver_connection  # aiosqlite's
    try:
        result: T = await call(connection, work)
    except (sqlite3.Error, ValueError) as exc:
        if isinstance(exc, sqlite3.Error):
            orig: sqlite3.Error = exc
        elif "no active connection" in str(exc) or "Connection closed" in str(exc):
            orig = sqlite3.OperationalError("no active connection")
        else:
            raise
        gone = conn.dialect.is_disconnect(cast(Any, orig), None, None)
        if gone:
            await conn.invalidate()
        raise sa_exc.DBAPIError.instance(
            None, None, orig, sqlite3.Error, connection_invalidated=gone
        ) from exc
    return result


def _finish_plain(
    db: sqlite3.Connection,
    ids: Sequence[str],
    now: float,
    counted: int,
    expected: str,
    started: float | None,
    released: Sequence[str] = (),
) -> int:
    """Success, with no result, for the rows of ``ids`` still in ``expected``; those of
    ``released`` (awaited, and claimed in this transaction) release their dependents."""
    written = 0
    for rows, extra in ((ids, ""), (released, _RELEASED)):
        for start in range(0, len(rows), _BOUND):
            chunk = rows[start : start + _BOUND]
            marks = ", ".join("?" * len(chunk))
            sql = _FINISH_PLAIN_SQL.format(ids=marks, released=extra)
            written += db.execute(sql, (now, counted, started, expected, *chunk)).rowcount
            if extra:
                db.execute(_RELEASE_SQL.format(ids=marks), chunk)
    return written


def _retry(
    db: sqlite3.Connection,
    outcomes: Sequence[Outcome],
    now: float,
    worker_id: str | None,
    expected: str,
    counted: int,
    failed: int,
) -> set[str]:
    moved: set[str] = set()
    cursor = db.cursor()
    for o in outcomes:  # one statement a row: its row count says whether it moved
        error = (o.error_type, o.error_message, o.error_traceback)
        entry = _entry(o, now, worker_id)
        cursor.execute(
            _RETRY_SQL, (o.retry_at, *error, counted, failed, failed, *entry, o.id, expected)
        )
        if cursor.rowcount:
            moved.add(o.id)
    return moved


def _record(
    db: sqlite3.Connection, outcomes: Sequence[Outcome], now: float, worker_id: str | None
) -> None:
    db.executemany(_RECORD_SQL, [(*_entry(o, now, worker_id), o.id) for o in outcomes])


def _entry(o: Outcome, now: float, worker_id: str | None) -> tuple[Any, ...]:
    """A failed run's history entry after its attempt, in ERROR_KEYS' order."""
    return (now, worker_id, o.error_type, o.error_message, o.error_traceback, o.retry_at)


def _atomic(db: sqlite3.Connection, work: Callable[[sqlite3.Connection], T]) -> T:
    """``work``'s statements in one transaction: the caller's, or, where its transaction
    was one call that has committed already (``sqlite/calls.py``), one of their own."""
    if db.in_transaction:
        return work(db)
    return atomically(db, BEGIN_WRITE, functools.partial(work, db))


class SQLiteMultiRow(Driver):
    """The finish statements of ``SQLiteDriver`` (see the module docstring)."""

    def finishes_in_one_statement(
        self, outcomes: Sequence[Outcome], retrying: AbstractSet[ScheduledFunctionId]
    ) -> bool:
        # ``_finish`` below: the successes, the retries and their history in one call on
        # the thread, which is then the whole transaction (``sqlite/calls.py``).
        return plain_or_retried(outcomes, lambda o: o.id in retrying)

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
        return await in_thread(
            conn,
            lambda db: _retry(db, outcomes, now, worker_id, expected.value, counted, failed),
        )

    async def record_failures(
        self,
        conn: AsyncConnection,
        now: float,
        outcomes: Sequence[Outcome],
        worker_id: str | None,
    ) -> None:
        await in_thread(
            conn, functools.partial(_record, outcomes=outcomes, now=now, worker_id=worker_id)
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
            # Rows that need more than these statements (final failures, results,
            # completion callbacks): rare, through SQLAlchemy.
            return await super()._finish(conn, now, outcomes, expected, worker_id, started)
        retried = [o for o in outcomes if o.retry_at is not None]
        plain: list[str] = []
        released: list[str] = []
        # A mutation's claim is this transaction's: what it read of ``dependents`` holds.
        mutations = expected is State.PENDING
        for o in outcomes:
            if o.retry_at is None:
                (released if mutations and o.awaited else plain).append(o.id)
        counted = 1 if mutations else 0

        def work(db: sqlite3.Connection) -> tuple[int, set[str]]:
            written = _finish_plain(db, plain, now, counted, expected.value, started, released)
            if not retried:
                return written, set()
            moved = _retry(db, retried, now, worker_id, expected.value, counted, 1)
            return written, moved

        written, moved = await in_thread(conn, functools.partial(_atomic, work=work))
        return written + mark_moved(retried, moved)
