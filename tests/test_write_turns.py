"""Writers take turns on the database (``durafn/_store/sqlite/turns.py``), so that none
waits behind another's run of transactions: after a ``kill -9`` of one of two workers, the
survivor keeps committing, in turn with the replacement.

The worker test runs on both engines (PostgreSQL's workers never wait for each other:
the order it asserts holds there by design); the others are SQLite's, whose one write
lock is what the turns share out. Each asserts an order of commits (ids in a table
written by each transaction), never a duration.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import pytest
from sqlalchemy import exc as sa_exc
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

import durafn
from durafn._store import driver_for_url
from durafn._store.sqlite import turns
from durafn._store.sqlite.driver import READ_ONLY_OPTION

from .apps.worker_app import Applied, Functions
from .support.helpers import equals, true, wait_until
from .support.processes import owned
from .test_workers import ROOT, live_workers, logs_of, stop, worker_app_on, worker_processes

pytestmark = pytest.mark.anyio

PAUSE = 0.06
"""How long each mutation of the worker test keeps its batch open: longer than a turn's
slice (``turns.SLICE``), so that on SQLite the turn passes at every batch while the other
worker waits for it."""
ROWS = 1000
"""Enough for the survivor to drain alone however long the replacement takes to start on
a loaded machine (16 rows a second): the test ends once it has seen what it looks for."""
WINDOW = 24
"""Commits looked at once both live workers commit."""
RUN = 4
"""The most commits in a row by one of them in that window. One row at a time each, in
turn, a run is 1 or 2 (SQLite: one more if a give-way missed its moment on a loaded
machine; PostgreSQL: if one worker's process was held up for some 250 ms while the
other's was not). SQLite's busy handler used to let the worker holding the lock run on:
21 to 24 of the 24, after 9 to 383 commits of the survivor's alone before the
replacement's first (four runs)."""


async def _applied(app: durafn.App, after: int = 0) -> list[tuple[int, int]]:
    """(id, pid) of the ``Applied`` rows past id ``after``, in the order they committed
    (ids are given as each batch writes, in its transaction)."""
    async with app.engine.connect() as conn:
        found = select(Applied.id, Applied.pid).where(Applied.id > after).order_by(Applied.id)
        return [(id, pid) for id, pid in await conn.execute(found)]


async def _last_id(app: durafn.App) -> int:
    async with app.engine.connect() as conn:
        return int(
            (await conn.execute(select(func.coalesce(func.max(Applied.id), 0)))).scalar_one()
        )


async def _inside_a_batch(starts: Path, pids: set[int]) -> int:
    """The pid of a worker whose latest run began less than half a run ago: its batch is
    open (it commits ``PAUSE`` after that start at the earliest), on SQLite holding the
    write lock and the turn. The monotonic clock is the system's, the workers' too."""
    while (latest := _latest_start(starts)) is None or not (  # noqa: ASYNC110 - a file
        latest[0] in pids and time.monotonic() - latest[1] < PAUSE / 2
    ):
        await anyio.sleep(0.002)
    return latest[0]


def _longest_run(pids: Sequence[object]) -> int:
    """The most items in a row that are the same."""
    longest = run = 0
    for i, pid in enumerate(pids):
        run = run + 1 if i and pid == pids[i - 1] else 1
        longest = max(longest, run)
    return longest


def _latest_start(starts: Path) -> tuple[int, float] | None:
    """(pid, when) of the latest run to start, from the lines ``w:step`` writes."""
    lines = starts.read_text().splitlines()
    if not lines:
        return None
    _, pid, began = lines[-1].split()
    return int(pid), float(began)


async def test_after_a_kill_9_the_survivor_keeps_committing_in_turn_with_the_replacement(
    app_url: tuple[str, bool], tmp_path: Path
) -> None:
    """Two workers drain mutations that each keep their batch open for ``PAUSE``; one is
    killed inside its batch and replaced at once. The survivor commits the first row after
    the kill (it waited for nothing the dead worker left: the kernel frees its locks), and
    once the replacement commits, neither waits behind a run of the other's batches: of
    the next ``WINDOW`` commits, neither makes more than ``RUN`` in a row. Before the
    turns, SQLite's busy handler let whichever process held the lock keep it for seconds:
    the other worker (the survivor, or the replacement) committed nothing meanwhile."""
    db_url = app_url[0]
    async with worker_app_on(db_url) as (app, fns):
        await _kill_one_of_two(app, fns, db_url, tmp_path)


async def _kill_one_of_two(app: durafn.App, fns: Functions, db_url: str, tmp_path: Path) -> None:
    starts = tmp_path / "starts.txt"
    starts.touch()
    await app.scheduler().run_many([fns.step.call(n, str(starts), PAUSE) for n in range(ROWS)])
    # One lane, one row a batch: a worker commits one row per turn, on both engines.
    args = ("--concurrency", "1", "--batch-size", "1")
    (tmp_path / "replacement").mkdir()
    async with worker_processes(db_url, 2, tmp_path, *args) as procs:
        await wait_until(lambda: equals(live_workers(app), 2), "2 workers registered")
        victim = await _inside_a_batch(starts, {p.pid for p in procs})
        mark = await _last_id(app)
        os.kill(victim, signal.SIGKILL)
        [survivor] = [p for p in procs if p.pid != victim]
        async with worker_processes(db_url, 1, tmp_path / "replacement", *args) as [new]:

            async def both_seen() -> bool:
                pids = [pid for _, pid in await _applied(app, mark)]
                return new.pid in pids and len(pids) - pids.index(new.pid) >= WINDOW

            await wait_until(both_seen, f"the replacement and {WINDOW} commits from its first")
            assert await stop([survivor, new]) == [0, 0]
    # The live workers' commits (a kill that came late, on a loaded machine, may have let
    # the victim commit its batch first: the order of the others is what is asserted).
    order = [pid for _, pid in await _applied(app, mark) if pid != victim]
    assert order[0] == survivor.pid, order[:WINDOW]
    first = order.index(new.pid)
    window = order[first : first + WINDOW]
    assert survivor.pid in window and _longest_run(window) <= RUN, (survivor.pid, window)
    assert "Traceback" not in logs_of(tmp_path) + logs_of(tmp_path / "replacement")


# -- SQLite's turns ----------------------------------------------------------------------


@pytest.fixture
def file(tmp_path: Path) -> Path:
    path = tmp_path / "turns.sqlite3"
    with sqlite3.connect(path) as db:
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("CREATE TABLE t (n INTEGER PRIMARY KEY, who TEXT)")
    return path


@pytest.fixture
def turn(file: Path) -> turns.Turn:
    """This process's turn on ``file``, as its connections find it."""
    return turns.turn_for(str(file.resolve()))


@asynccontextmanager
async def _connected(engine: AsyncEngine) -> AsyncIterator[AsyncConnection]:
    """A connection of ``engine`` made already (its thread started, its pragmas set, by a
    read, which takes no turn): a write on it goes to the turn at once."""
    async with engine.connect() as conn:
        await conn.execution_options(**{READ_ONLY_OPTION: True})
        async with conn.begin():
            await conn.exec_driver_sql("SELECT count(*) FROM t")
        await conn.execution_options(**{READ_ONLY_OPTION: False})
        yield conn


def _order(path: Path) -> list[str]:
    """Who wrote each row of ``t``, in the order they committed."""
    with sqlite3.connect(path) as db:
        return [who for (who,) in db.execute("SELECT who FROM t ORDER BY n")]


async def test_writers_of_one_process_take_turns_one_transaction_each(file: Path) -> None:
    """Two connections of one process, each running transactions of several calls back to
    back (a mutation lane's batches, and a heartbeat or a finisher, say): they take turns,
    one transaction each. They used to meet in SQLite's busy handler, whose tries (1, 2, 5,
    10, ... 100 ms apart) nearly never landed in the moment between two of the other's:
    whichever had the lock kept it."""
    driver = driver_for_url(f"sqlite+aiosqlite:///{file}")
    engine = driver.create_engine(driver.default_max_connections)
    rounds = 20

    async def write(who: str, conn: AsyncConnection) -> None:
        for _ in range(rounds):
            async with conn.begin():
                await conn.exec_driver_sql(f"INSERT INTO t (who) VALUES ('{who}')")
                await anyio.sleep(0.005)  # other calls may come meanwhile

    try:
        async with (
            _connected(engine) as a,
            _connected(engine) as b,
            anyio.create_task_group() as tg,
        ):
            tg.start_soon(write, "a", a)
            tg.start_soon(write, "b", b)
        order = _order(file)
        # Both writers are in line from the second round on; the first may go twice.
        assert len(order) == 2 * rounds and _longest_run(order) <= 2, order
    finally:
        await driver.dispose(engine)


async def test_a_writer_of_another_process_gets_in_between_back_to_back_transactions(
    file: Path,
) -> None:
    """Another process runs write transactions back to back (each open ``HOLD``), as a
    worker's mutation lane does; this one writes now and then: each write is let in
    within one slice (``turns.SLICE``) of the other's transactions. Its first tries in
    SQLite's busy handler land in the moment between two now and then; five in a row
    nearly never did."""
    hold = 0.02
    url = f"sqlite+aiosqlite:///{file}"
    driver = driver_for_url(url)
    engine = driver.create_engine(driver.default_max_connections)
    command = [sys.executable, "-m", "tests.apps.busy_writer", url, "100000", str(hold)]
    waited = []
    try:
        async with owned() as owner:
            writer = await owner.start(command, cwd=ROOT)
            await wait_until(lambda: true(len(_order(file)) >= 3), "the other process writes")
            async with _connected(engine) as conn:
                for n in range(5):
                    before = len(_order(file))
                    async with conn.begin():
                        await conn.exec_driver_sql(f"INSERT INTO t (who) VALUES ('other {n}')")
                    waited.append(_order(file).index(f"other {n}") - before)
            await wait_until(lambda: true(_order(file)[-1] == "busy"), "the other goes on")
            writer.kill()
        # The other's transaction running, those of the rest of its slice, and one more
        # if a give-way missed its moment on a loaded machine.
        assert max(waited) <= int(turns.SLICE / hold) + 2, waited
    finally:
        await driver.dispose(engine)


async def test_a_process_that_waits_and_never_takes_its_turn_is_given_way_once(
    file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process that waits for the turn and never takes it (stopped with SIGSTOP, say)
    holds the others up once, for ``GIVE_WAY``, not at every slice: this one gives way
    again only once it has itself waited for the turn (the others are alive then)."""
    gave_way: list[bool] = []
    give_way = turns.Turn._give_way

    def counted(self: turns.Turn, until: float) -> bool:
        gave_way.append(give_way(self, until))
        return gave_way[-1]

    monkeypatch.setattr(turns.Turn, "_give_way", counted)
    monkeypatch.setattr(turns, "SLICE", 0.0)  # a slice ends at every write
    monkeypatch.setattr(turns, "GIVE_WAY", 0.05)
    # As a waiting process does: a shared lock on byte 1 of the turn's file.
    wait = "; ".join(
        (
            "import fcntl, os, sys, time",
            "fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)",
            "fcntl.lockf(fd, fcntl.LOCK_SH, 1, 1)",
            "print('waiting', flush=True)",
            "time.sleep(600)",
        )
    )
    driver = driver_for_url(f"sqlite+aiosqlite:///{file}")
    engine = driver.create_engine(driver.default_max_connections)
    try:
        async with owned() as owner:
            command = [sys.executable, "-c", wait, f"{file}-turn"]
            waiter = await owner.start(command, stdout=subprocess.PIPE)
            assert waiter.stdout is not None
            assert (await waiter.stdout.receive()).startswith(b"waiting")
            for n in range(10):
                async with engine.begin() as conn:
                    await conn.exec_driver_sql(f"INSERT INTO t (who) VALUES ('{n}')")
        assert gave_way == [False] and len(_order(file)) == 10
    finally:
        await driver.dispose(engine)


async def test_a_turn_not_had_in_time_fails_as_a_busy_database(
    file: Path, turn: turns.Turn
) -> None:
    """A writer that waits past the busy timeout for the turn fails as it would have on
    SQLite's lock: "database is locked", a transient fault (the executor's loops retry
    it); a reader never waits for the turn."""
    url = f"sqlite+aiosqlite:///{file}"
    driver = driver_for_url(url)
    driver.busy_timeout = 0.05  # type: ignore[attr-defined]
    engine = driver.create_engine(driver.default_max_connections)
    try:
        assert turn.acquire(5)
        try:
            async with engine.connect() as conn:
                await conn.execution_options(**{READ_ONLY_OPTION: True})
                async with conn.begin():
                    assert (await conn.exec_driver_sql("SELECT count(*) FROM t")).scalar() == 0
            with pytest.raises(sa_exc.OperationalError, match="database is locked") as raised:
                async with engine.begin() as conn:
                    await conn.exec_driver_sql("INSERT INTO t (who) VALUES ('late')")
            assert driver.is_transient(raised.value)
        finally:
            turn.release()
        async with engine.begin() as conn:
            await conn.exec_driver_sql("INSERT INTO t (who) VALUES ('in turn')")
        assert _order(file) == ["in turn"]
    finally:
        await driver.dispose(engine)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this platform")
def test_a_forked_child_has_turns_of_its_own(file: Path, turn: turns.Turn) -> None:
    """A turn a thread of the parent had as it forked would stay taken in the child for
    good (the thread is not there): the child starts with turns of its own, and waits
    for the parent's only as another process does, until the parent gives it back."""
    assert turn.acquire(5)
    try:
        pid = os.fork()
        if pid == 0:  # the child: exit at once, its verdict as its status
            fresh = turns.turn_for(str(file.resolve()))
            os._exit(0 if fresh is not turn and fresh.acquire(timeout=30) else 1)
    finally:
        turn.release()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
