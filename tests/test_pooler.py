"""Many worker hosts through PgBouncer in transaction mode (``pooler=transaction`` in the
URL), LISTEN on a direct connection (``listen=HOST:PORT``), one per process.

A real PgBouncer (Debian's package) on a free port, a pool of two server connections, in
front of the test server, whose database plans every statement generically from its
first run (tests/conftest.py): an executor in this process and a real ``durafn worker``
subprocess run through it. The executors poll once an hour, so every row they run after
the first was announced by a NOTIFY on the direct connection: the tests wait on rows
finishing, in order, never on time. Skipped, with the reason, where PgBouncer is not
installed; under CI (``CI`` set) that fails instead.

Beside them, with no PgBouncer: a process's executors and watches share one LISTEN
connection; SQLAlchemy's own URL options stay off it; the URL's options are checked
(on both engines: SQLite refuses them).
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import asyncpg
import pytest
from sqlalchemy import func, select, text

import durafn
from durafn import ActionCtx, MutationCtx, State

from .conftest import BARE_DATABASE, BARE_DSN, BARE_URL, PG_ADMIN_DSN
from .support.helpers import CEILING, equals, row_of, wait_until
from .support.pgbouncer import PgBouncer, binary
from .support.processes import owned
from .test_workers import live_workers, logs_of, stop, trace_of, worker_app_on, worker_processes

pytestmark = pytest.mark.anyio

HOUR = 3600.0
"""The executors' poll: nothing in a test's time but a NOTIFY wakes them."""

_LISTENING = (
    "SELECT count(*) FROM pg_stat_activity "
    "WHERE datname = $1 AND backend_type = 'client backend' AND query LIKE 'LISTEN%'"
)
_OTHERS = (
    "SELECT count(*) FROM pg_stat_activity WHERE datname = $1 "
    "AND backend_type = 'client backend' AND pid <> pg_backend_pid() AND query NOT LIKE 'LISTEN%'"
)


async def _listening() -> bool:
    return await _count(_LISTENING) > 0


async def _no_listener_left() -> None:
    """Wait until the LISTEN connections of earlier tests on the database have gone (a
    backend leaves pg_stat_activity a moment after its client closed it)."""
    await wait_until(lambda: equals(_count(_LISTENING), 0), "no LISTEN connection left")


@pytest.fixture
async def pooler(postgres_url: str, tmp_path: Path) -> AsyncIterator[PgBouncer]:
    """PgBouncer in transaction mode with two server connections, in front of the bare
    test database (``postgres_url``: emptied)."""
    executable = binary()
    if executable is None:
        problem = "PgBouncer is not installed (Debian's pgbouncer package; .ci/run installs it)"
        if os.environ.get("CI"):
            pytest.fail(f"{problem}; CI is set, so the pooler's tests must not be skipped")
        pytest.skip(problem)
    await _no_listener_left()
    bouncer = PgBouncer(tmp_path / "pgbouncer", pool_size=2)
    async with owned() as owner:
        with (tmp_path / "pgbouncer.log").open("w") as log:
            await owner.start(bouncer.command(executable), stdout=log, stderr=log)
        await bouncer.ready(BARE_DATABASE, CEILING)
        yield bouncer


async def _count(sql: str) -> int:
    admin = await asyncpg.connect(BARE_DSN)
    try:
        return int(await admin.fetchval(sql, BARE_DATABASE))
    finally:
        await admin.close()


@pytest.mark.postgres_only  # PgBouncer pools PostgreSQL's connections: SQLite has no server
async def test_an_executor_through_pgbouncer_is_woken_through_its_direct_listen(
    pooler: PgBouncer,
) -> None:
    """Scheduling, claims, group commits, finishes, the migration: all through a pool of
    two server connections, each transaction on whichever is free; each new row wakes
    the idle executor by a NOTIFY its LISTEN hears on the server itself. Eight rounds,
    each statement run more than five times on the same server connections."""
    url = pooler.url(BARE_DATABASE)
    app = durafn.App(url)
    caller = app.using()  # the same functions, a pool of its own
    await app.migrate()  # its advisory lock and DDL: one transaction
    events: list[tuple[str, int]] = []

    @app.mutation(name="pool:step")
    async def step(ctx: MutationCtx, n: int) -> str:
        events.append(("mutation", n))
        return str(await ctx.scheduler.run_after(0, act, n))

    @app.action(name="pool:act")
    async def act(ctx: ActionCtx, n: int) -> int:
        events.append(("action", n))
        return n

    try:
        async with app.run_executor(poll_interval=HOUR) as executor:
            for n in range(8):
                # From another app: no wake-up in this process but the NOTIFY's.
                sid = await caller.scheduler().run_after(0, "pool:step", n)
                mutation = await executor.wait_for(sid, timeout=CEILING)
                assert mutation.state is State.SUCCESS, mutation.error
                action = await executor.wait_for(str(mutation.result), timeout=CEILING)
                assert (action.state, action.result) == (State.SUCCESS, n), action.error
            assert await _count(_LISTENING) == 1
            # The executor and the caller went through PgBouncer's two.
            assert await _count(_OTHERS) <= pooler.pool_size
    finally:
        await caller.aclose()
        await app.aclose()
    assert events == [(kind, n) for n in range(8) for kind in ("mutation", "action")]


@pytest.mark.postgres_only  # PgBouncer pools PostgreSQL's connections: SQLite has no server
async def test_a_durafn_worker_through_pgbouncer_runs_what_it_hears_of(
    pooler: PgBouncer, tmp_path: Path
) -> None:
    """A real ``durafn worker`` process through PgBouncer: each mutation and action this
    process schedules through PgBouncer reaches it by NOTIFY, and so does a cancel of
    an action it runs (its cancel poll is hourly too); it stops cleanly."""
    url = pooler.url(BARE_DATABASE)
    trace = tmp_path / "trace"
    logs = tmp_path / "logs"
    logs.mkdir()
    async with (
        worker_app_on(url) as (app, fns),
        worker_processes(url, 1, logs, "--poll-interval", str(HOUR)) as procs,
    ):
        await wait_until(lambda: equals(live_workers(app), 1), "the worker registered")
        for n in range(6):
            applied = await app.scheduler().run_after(0, fns.apply, n, 0.0)
            await wait_until(functools.partial(_finished, app, applied), f"mutation {n} ran")
            touched = await app.scheduler().run_after(0, fns.touch, n, str(trace), 0.0)
            await wait_until(functools.partial(_finished, app, touched), f"action {n} ran")
        waiting = await app.scheduler().run_after(0, fns.until_cancelled, 99, str(trace))
        await wait_until(lambda: _traced(trace, 99), "the action to cancel started")
        await app.cancel(waiting)
        await wait_until(lambda: _traced(trace, 1099), "the action heard its cancel")
        assert await stop(procs) == [0]
        states = [(await row_of(app, i)).state for i in (applied, touched, waiting)]
        async with app.engine.connect() as conn:
            done = await conn.scalar(
                select(func.count()).where(durafn.scheduled_functions.c.state == "Success")
            )
    assert states == [State.SUCCESS, State.SUCCESS, State.CANCELED]
    assert done == 12
    assert [n for n, _ in trace_of(trace)] == [*range(6), 99, 1099]
    assert "Traceback" not in logs_of(logs)


async def _finished(app: durafn.App, id: str) -> bool:
    row = await row_of(app, id)
    assert row.state in (State.PENDING, State.IN_PROGRESS, State.SUCCESS), row.error
    return row.state is State.SUCCESS


async def _traced(path: Path, n: int) -> bool:
    return n in [m for m, _ in trace_of(path)]


@pytest.mark.postgres_only  # PgBouncer pools PostgreSQL's connections: SQLite has no server
async def test_a_time_limit_through_pgbouncer_stops_the_statement_on_the_server(
    pooler: PgBouncer,
) -> None:
    """A mutation past its limit, mid-statement, in the executor's batch and called
    directly: the statement is stopped on the server backend that runs it (asked for
    inside the transaction: PgBouncer's process key names no backend), so its locks go
    with it and PgBouncer gets its server connection back."""
    app = durafn.App(pooler.url(BARE_DATABASE))
    await app.migrate()

    @app.mutation(name="pool:forever", timeout=0.2)
    async def forever(ctx: MutationCtx) -> None:
        await ctx.db.execute(text("SELECT pg_sleep(600)"))

    sleeping = (
        "SELECT count(*) FROM pg_stat_activity WHERE datname = $1 "
        "AND query LIKE 'SELECT pg_sleep(600)%'"
    )
    try:
        stuck = await app.scheduler().run_after(0, forever)
        with anyio.fail_after(CEILING):  # a liveness bound, far above the limit
            assert await app.executor().run_until_idle() == 1
        row = await row_of(app, stuck)
        assert row.state is State.FAILED and row.error is not None
        assert row.error.type == "durafn.FunctionTimeoutError"
        assert await _count(sleeping) == 0
        with anyio.fail_after(CEILING), pytest.raises(durafn.FunctionTimeoutError):
            await app.run_mutation(forever)
        assert await _count(sleeping) == 0
    finally:
        await app.aclose()


_COMMITS = "SELECT xact_commit FROM pg_stat_database WHERE datname = $1"


async def _server_commits() -> int:
    """The database's committed transactions, once every backend of it has exited (each
    reports its counts as it exits: PgBouncer's would keep theirs for up to a second)."""
    admin = await asyncpg.connect(PG_ADMIN_DSN)
    try:
        await admin.execute(
            "SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity "
            "WHERE datname = $1 AND backend_type = 'client backend'",
            BARE_DATABASE,
        )
        previous = None
        with anyio.fail_after(CEILING):
            while True:
                await admin.execute("SELECT pg_stat_clear_snapshot()")
                now = int(await admin.fetchval(_COMMITS, BARE_DATABASE))
                if now == previous:
                    return now
                previous = now
                await anyio.sleep(0.1)
    finally:
        await admin.close()


@pytest.mark.postgres_only  # PgBouncer pools PostgreSQL's connections: SQLite has no server
async def test_through_pgbouncer_each_transaction_is_one_on_the_server(
    pooler: PgBouncer,
) -> None:
    """PgBouncer sends the server nothing of its own between our transactions: no
    ``SET client_encoding`` before each, which it did while asyncpg asked for 'utf-8'
    and the server answered UTF8 (a statement and a commit more per transaction)."""
    app = durafn.App(pooler.url(BARE_DATABASE))
    await app.migrate()
    await app.aclose()

    @app.query(name="pool:read")
    async def read(ctx: durafn.QueryCtx) -> int:
        return int((await ctx.db.execute(text("SELECT 1"))).scalar_one())

    before = await _server_commits()
    try:
        for _ in range(40):
            assert await app.run_query(read) == 1
    finally:
        await app.aclose()
    # 40 transactions, and a few for connecting (the dialect's first statements): 42
    # here, against 84 with a SET before each.
    assert 40 <= await _server_commits() - before < 50


@pytest.mark.postgres_only  # PgBouncer pools PostgreSQL's connections: SQLite has no server
@pytest.mark.parametrize("listen", [None, "off"])
async def test_through_pgbouncer_with_no_direct_url_executors_poll(
    pooler: PgBouncer, listen: str | None, caplog: pytest.LogCaptureFixture
) -> None:
    """With no server named to LISTEN on, nothing LISTENs (through PgBouncer a LISTEN
    would hear nothing): executors find work by their poll. Left out, a warning says so
    once and names the option; ``listen=off`` says polling is meant, and is quiet."""
    caplog.set_level(logging.WARNING, logger="durafn.store")
    url = pooler.url(BARE_DATABASE, listen=listen)
    app = durafn.App(url)
    caller = app.using()
    await app.migrate()

    @app.action(name="pool:polled")
    async def polled(ctx: ActionCtx, n: int) -> int:
        return n

    try:
        async with app.run_executor(poll_interval=0.05) as executor:
            async with app.watch(poll=0.05, settle=0.01) as watching:
                assert not watching.listening
            for n in range(3):
                sid = await caller.scheduler().run_after(0, "pool:polled", n)
                assert (await executor.wait_for(sid, timeout=CEILING)).result == n
            assert await _count(_LISTENING) == 0
    finally:
        await caller.aclose()
        await app.aclose()
    warned = [r.getMessage() for r in caplog.records if "cannot carry LISTEN" in r.getMessage()]
    if listen is None:
        assert len(warned) == 1 and "listen=HOST:PORT" in warned[0]
    else:
        assert warned == []


@pytest.mark.postgres_only  # LISTEN/NOTIFY exists only on PostgreSQL; SQLite polls
async def test_one_listen_connection_serves_every_executor_and_watch_of_a_process(
    postgres_url: str,
) -> None:
    """Two apps' executors and a watch in one process LISTEN through one connection
    (through a pooler it is a direct one, outside the pool: a host's share of the
    server's max_connections); each hears every NOTIFY, the last to stop closes it."""
    await _no_listener_left()
    first = durafn.App(postgres_url)
    second, caller = first.using(), first.using()
    await first.migrate()
    ran: list[str] = []

    async def heard(ctx: ActionCtx, by: str) -> None:
        ran.append(by)

    first.action(name="pool:heard")(heard)
    try:
        async with first.run_executor(poll_interval=HOUR) as one:
            async with (
                second.run_executor(poll_interval=HOUR),
                first.watch(poll=HOUR, settle=0.01) as watching,
            ):
                assert watching.listening
                await wait_until(lambda: _listening(), "a LISTEN connection")
                sid = await caller.scheduler().run_after(0, "pool:heard", "both")
                assert (await one.wait_for(sid, timeout=CEILING)).state is State.SUCCESS
                with anyio.fail_after(CEILING):
                    await watching.changed()  # the same NOTIFY (or the finish's)
                assert await _count(_LISTENING) == 1
            sid = await caller.scheduler().run_after(0, "pool:heard", "first")
            assert (await one.wait_for(sid, timeout=CEILING)).state is State.SUCCESS
            assert await _count(_LISTENING) == 1
        await wait_until(lambda: equals(_count(_LISTENING), 0), "the LISTEN connection closed")
    finally:
        for app in (caller, second, first):
            await app.aclose()
    assert ran == ["both", "first"]


@pytest.mark.postgres_only  # LISTEN/NOTIFY exists only on PostgreSQL; SQLite polls
async def test_a_url_with_sqlalchemys_own_options_still_listens(postgres_url: str) -> None:
    """``prepared_statement_cache_size`` (SQLAlchemy's, which its documentation gives for
    PgBouncer) is the engine's: the LISTEN connection, made by asyncpg from the URL, once
    sent it to the server as a setting, was refused and retried for ever, and the
    executor heard of no other process's work."""
    await _no_listener_left()
    url = f"{postgres_url}?prepared_statement_cache_size=0"
    app = durafn.App(url)
    caller = app.using()
    await app.migrate()

    @app.action(name="pool:plain")
    async def plain(ctx: ActionCtx) -> None:
        pass

    try:
        async with app.run_executor(poll_interval=HOUR) as executor:
            await wait_until(lambda: _listening(), "a LISTEN connection")
            sid = await caller.scheduler().run_after(0, "pool:plain")
            assert (await executor.wait_for(sid, timeout=CEILING)).state is State.SUCCESS
    finally:
        await caller.aclose()
        await app.aclose()


_REFUSED = {
    "pooler=session": "session mode",
    "pooler=yes": "the one value is pooler=transaction",
    "pooler=transaction&pooler=transaction": "given 2 times",
    "listen=db.internal:port": "cannot be read",
    "listen=:5432": "cannot be read",
    "listen=db.internal:5432/a/b": "cannot be read",
}


def test_the_pooler_options_of_a_url_are_checked(engine_name: str, tmp_path: Path) -> None:
    """Refused when the app is made, with what to write instead: a bad value, a value
    given twice, and on SQLite the options themselves (it has no server to pool)."""
    if engine_name == "sqlite":
        base = f"sqlite+aiosqlite:///{tmp_path / 'app.db'}"
        for option in ("pooler=transaction", "listen=db.internal:5432"):
            with pytest.raises(durafn.DatabaseError, match="SQLite has no server"):
                durafn.App(f"{base}?{option}")
        return
    for query, problem in _REFUSED.items():
        with pytest.raises(durafn.DatabaseError, match=problem):
            durafn.App(f"{BARE_URL}?{query}")
    app = durafn.App(f"{BARE_URL}?pooler=transaction&listen=db.internal:6000/jobs")
    pooling = app._rt.driver.pooling  # type: ignore[attr-defined]
    assert pooling.transaction_mode and "pooler" not in pooling.engine_url.query
    listen = pooling.listen_url
    assert (listen.host, listen.port, listen.database) == ("db.internal", 6000, "jobs")
