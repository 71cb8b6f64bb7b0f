"""SQLite's calls on aiosqlite's thread (``durafn/_store/sqlite/calls.py``).

SQLite alone: each statement is one call on the connection's thread; a transaction's
BEGIN goes with its first statement, a one-statement transaction (where PostgreSQL runs
in autocommit) is one call from BEGIN to COMMIT, and COMMIT or ROLLBACK with nothing to
end makes no call. The write turns that these calls take are ``test_write_turns.py``'s.
The PostgreSQL side of one-statement transactions is the driver suite's (one statement,
no BEGIN).
"""

from __future__ import annotations

import functools
import sqlite3
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from sqlalchemy import exc as sa_exc
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from durafn._store import driver_for_url
from durafn._store.sqlite.driver import SQLiteDriver
from durafn._store.sqlite.multirow import in_thread

pytestmark = pytest.mark.anyio


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "calls.sqlite3"


@pytest.fixture
async def engine(path: Path) -> AsyncIterator[AsyncEngine]:
    driver = driver_for_url(f"sqlite+aiosqlite:///{path}")
    engine = driver.create_engine(driver.default_max_connections)
    try:
        async with engine.connect() as conn:
            await conn.exec_driver_sql("CREATE TABLE t (n INTEGER PRIMARY KEY, v TEXT)")
            await conn.commit()
        yield engine
    finally:
        await driver.dispose(engine)  # joins the thread of a connection it terminated


def _count_calls(connection: Any) -> list[object]:
    """The calls ``connection`` (aiosqlite's) makes on its thread from now on."""
    calls: list[object] = []
    own = connection._execute

    async def counted(fn: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(fn)
        return await own(fn, *args, **kwargs)

    connection._execute = counted
    return calls


async def _counted(conn: AsyncConnection) -> list[object]:
    return _count_calls((await conn.get_raw_connection()).driver_connection)


def _rows(path: Path) -> list[tuple[Any, ...]]:
    """What is committed, read by a connection of its own."""
    with sqlite3.connect(path) as db:
        return db.execute("SELECT n, v FROM t ORDER BY n").fetchall()


ONE_CALL = SQLiteDriver.single_statement_options


async def test_a_one_statement_transaction_is_one_call(engine: AsyncEngine, path: Path) -> None:
    async with engine.connect() as conn:
        calls = await _counted(conn)
        await conn.execution_options(**ONE_CALL)
        await conn.begin()
        await conn.exec_driver_sql("INSERT INTO t (v) VALUES ('a')")
        assert _rows(path) == [(1, "a")]  # committed by the call itself
        await conn.commit()
    assert len(calls) == 1  # nor COMMIT, nor the pool's ROLLBACK, made a call


async def test_a_transaction_sends_its_begin_with_its_first_statement(
    engine: AsyncEngine, path: Path
) -> None:
    async with engine.connect() as conn:
        calls = await _counted(conn)
        async with conn.begin():
            await conn.exec_driver_sql("INSERT INTO t (v) VALUES ('a')")
            await conn.exec_driver_sql("INSERT INTO t (v) VALUES ('b')")
            assert _rows(path) == []  # not committed yet
        assert len(calls) == 3  # BEGIN with the first INSERT, the second, COMMIT
        async with conn.begin():  # no statement: nothing to send
            pass
        await conn.begin()
        await conn.exec_driver_sql("INSERT INTO t (v) VALUES ('c')")
        await conn.rollback()
    assert len(calls) == 5  # the INSERT with its BEGIN, its ROLLBACK; no reset call
    assert _rows(path) == [(1, "a"), (2, "b")]


async def test_a_one_call_transaction_that_fails_rolls_back_and_frees_the_lock(
    engine: AsyncEngine, path: Path
) -> None:
    def half(db: sqlite3.Connection) -> None:
        db.execute("INSERT INTO t (v) VALUES ('kept?')")
        db.execute("INSERT INTO nowhere VALUES (1)")

    async with engine.connect() as conn:
        await conn.execution_options(**ONE_CALL)
        await conn.begin()
        with pytest.raises(sa_exc.OperationalError, match="no such table"):
            await in_thread(conn, half)
        await conn.rollback()
    assert _rows(path) == []
    with sqlite3.connect(path, timeout=0, isolation_level=None) as other:
        other.execute("BEGIN IMMEDIATE")  # the write lock is free
        other.execute("ROLLBACK")


async def test_a_cancelled_statement_leaves_no_transaction_behind(
    engine: AsyncEngine, path: Path
) -> None:
    """A caller cancelled while its first statement (and so its BEGIN) waits for the lock:
    once the lock is free, the statement runs and is rolled back, never left open holding
    the lock, nor committed."""
    blocker = sqlite3.connect(path, isolation_level=None)
    try:
        blocker.execute("BEGIN IMMEDIATE")
        async with engine.connect() as conn:
            await conn.begin()
            with anyio.move_on_after(0.05) as waited:
                await conn.exec_driver_sql("INSERT INTO t (v) VALUES ('cancelled')")
            assert waited.cancelled_caught
    finally:
        blocker.execute("COMMIT")
        blocker.close()
    async with engine.connect() as conn:  # waits in the busy handler if the lock is held
        await conn.exec_driver_sql("INSERT INTO t (v) VALUES ('next')")
        await conn.commit()
    assert _rows(path) == [(1, "next")]


async def test_a_rollback_with_a_call_on_its_way_is_sent(engine: AsyncEngine, path: Path) -> None:
    """ROLLBACK makes no call only when none of ours is on its way: a statement queued
    behind another call has not sent its BEGIN yet, and would otherwise run without one
    (committing by itself) after a ROLLBACK that was never sent."""
    go = threading.Event()
    async with engine.connect() as conn:
        connection: Any = (await conn.get_raw_connection()).driver_connection
        await conn.begin()
        async with anyio.create_task_group() as tg:
            tg.start_soon(connection._execute, functools.partial(go.wait, 30))  # busy
            await anyio.wait_all_tasks_blocked()
            tg.start_soon(in_thread, conn, lambda db: db.execute("INSERT INTO t VALUES (1, 'x')"))
            await anyio.wait_all_tasks_blocked()
            tg.start_soon(conn.run_sync, lambda sync: sync.connection.dbapi_connection.rollback())
            await anyio.wait_all_tasks_blocked()
            go.set()
        assert not connection.in_transaction
    assert _rows(path) == []


async def test_sqlite_errors_in_a_call_on_the_thread_are_classified_as_sqlalchemys(
    tmp_path: Path,
) -> None:
    """A statement run on aiosqlite's thread (``sqlite/multirow.py``'s ``in_thread``, SQLite's
    alone) fails as one run through SQLAlchemy: a lock held too long is a transient fault,
    retried; a closed connection is a disconnect, and the connection is dropped."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'locked.sqlite3'}"
    driver = driver_for_url(url)
    engine = driver.create_engine(driver.default_max_connections)
    blocker = sqlite3.connect(tmp_path / "locked.sqlite3", isolation_level=None)
    try:
        async with engine.begin() as conn:
            await conn.exec_driver_sql("CREATE TABLE _scheduled_functions (id INTEGER)")
        blocker.execute("BEGIN IMMEDIATE")
        async with engine.connect() as conn:

            def write(db: sqlite3.Connection) -> None:
                db.execute("PRAGMA busy_timeout = 10")
                db.execute("DELETE FROM _scheduled_functions")

            with pytest.raises(sa_exc.OperationalError) as raised:
                await in_thread(conn, write)
            assert "locked" in str(raised.value) and driver.is_transient(raised.value)
            with pytest.raises(sa_exc.OperationalError, match="no such table"):
                await in_thread(conn, lambda db: db.execute("SELECT * FROM nowhere"))
        async with engine.connect() as conn:
            closing: Any = (await conn.get_raw_connection()).driver_connection
            await closing.close()
            with pytest.raises(sa_exc.OperationalError, match="no active connection") as gone:
                await in_thread(conn, lambda db: db.execute("SELECT 1"))
            assert gone.value.connection_invalidated and driver.is_transient(gone.value)
            assert conn.invalidated
    finally:
        blocker.close()
        await engine.dispose()


async def test_a_sqlite_statement_is_one_call_on_its_connections_thread(tmp_path: Path) -> None:
    """SQLAlchemy's aiosqlite adapter makes four calls on aiosqlite's thread per statement
    (cursor, execute, fetch, close); durafn's makes one (``_store/sqlite/calls.py``),
    with the same rows, row counts and errors."""
    driver = driver_for_url(f"sqlite+aiosqlite:///{tmp_path / 'calls.sqlite3'}")
    engine = driver.create_engine(driver.default_max_connections)
    try:
        async with engine.connect() as conn:
            await conn.exec_driver_sql("CREATE TABLE t (n INTEGER PRIMARY KEY, v TEXT)")
            calls = await _counted(conn)
            inserted = await conn.exec_driver_sql(
                "INSERT INTO t (v) VALUES (?)", [("a",), ("b",), ("c",)]
            )
            assert (len(calls), inserted.rowcount) == (1, 3)
            rows = [tuple(r) for r in await conn.exec_driver_sql("SELECT n, v FROM t ORDER BY n")]
            assert (len(calls), rows) == (2, [(1, "a"), (2, "b"), (3, "c")])
            updated = await conn.exec_driver_sql("UPDATE t SET v = 'z' WHERE n > 1")
            assert (len(calls), updated.rowcount) == (3, 2)
            returned = await conn.exec_driver_sql("DELETE FROM t WHERE n = 1 RETURNING v")
            assert (len(calls), [tuple(r) for r in returned]) == (4, [("a",)])
            with pytest.raises(sa_exc.OperationalError, match="no such table"):
                await conn.exec_driver_sql("SELECT * FROM nowhere")
    finally:
        await engine.dispose()
