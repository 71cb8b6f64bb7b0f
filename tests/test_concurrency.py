"""Several executors on one database (each with its own engine, as separate processes
would have), direct calls through faults, and the LISTEN connection recovering."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
from collections import Counter as Tally
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

import durafn
from durafn import ActionCtx, MutationCtx, State
from durafn.testing import FakeClock, all_rows

from .conftest import BARE_DSN
from .support.helpers import CEILING, count
from .support.models import Effect

pytestmark = pytest.mark.anyio


def _register(app: durafn.App, mutation_runs: Tally[int], action_runs: Tally[int]) -> None:
    @app.mutation(name="many:apply")
    async def apply(ctx: MutationCtx, n: int) -> None:
        mutation_runs[n] += 1
        ctx.db.add(Effect(key=f"m{n}"))

    @app.action(name="many:act")
    async def act(ctx: ActionCtx, n: int) -> None:
        action_runs[n] += 1
        await anyio.lowlevel.checkpoint()


async def _unfinished(app: durafn.App) -> int:
    page = await app.list(state=[State.PENDING, State.IN_PROGRESS], limit=1)
    return len(page.items)


async def test_each_row_runs_once_across_executors(
    app: durafn.App, db_url: str, clock: FakeClock, engine_name: str
) -> None:
    mutation_runs: Tally[int] = Tally()
    action_runs: Tally[int] = Tally()
    _register(app, mutation_runs, action_runs)
    second = durafn.App(db_url, clock=clock)
    _register(second, mutation_runs, action_runs)
    sched = app.scheduler()
    for n in range(300):
        await sched.run_after(0, "many:apply", n=n)
    for n in range(60):
        await sched.run_after(0, "many:act", n=n)
    try:
        async with (
            app.run_executor(batch_size=8) as one,
            second.run_executor(batch_size=8) as two,
        ):
            with anyio.fail_after(CEILING):
                # Completion of a whole backlog has no single signal: poll it.
                while await _unfinished(app):  # noqa: ASYNC110
                    await anyio.sleep(0.01)
        assert mutation_runs == Tally(range(300))
        assert action_runs == Tally(range(60))
        assert {r.state for r in await all_rows(app)} == {State.SUCCESS}
        assert await count(app, Effect) == 300
        done = [ex.stats["mutations"] + ex.stats["actions"] for ex in (one, two)]
        assert sum(done) == 360
        if engine_name == "postgres":
            assert min(done) > 0, f"one executor did all the work: {done}"
    finally:
        await second.aclose()


async def test_direct_mutation_retries_a_dropped_connection(
    app: durafn.App, engine_name: str, db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    runs = 0

    @app.mutation
    async def apply(ctx: MutationCtx) -> str:
        nonlocal runs
        runs += 1
        ctx.db.add(Effect(key="once"))
        await ctx.db.flush()
        if engine_name == "postgres" and runs == 1:
            await ctx.db.execute(text("SELECT pg_terminate_backend(pg_backend_pid())"))
        return "applied"

    caplog.set_level(logging.INFO, logger="durafn")
    if engine_name == "postgres":
        assert await app.run_mutation(apply) == "applied"
    else:
        app._rt.driver.busy_timeout = 0.05  # type: ignore[attr-defined]
        await app.aclose()
        await app.migrate()
        blocker = sqlite3.connect(Path(db_url.split("///", 1)[1]), isolation_level=None)
        blocker.execute("BEGIN IMMEDIATE")
        result: list[str] = []

        async def _call() -> None:
            result.append(await app.run_mutation(apply))

        async with anyio.create_task_group() as tg:
            tg.start_soon(_call)
            with anyio.fail_after(CEILING):
                while "transient database fault" not in caplog.text:  # noqa: ASYNC110
                    await anyio.sleep(0.01)
            blocker.execute("COMMIT")
        blocker.close()
        assert result == ["applied"]
    if engine_name == "postgres":
        # One line when the connection goes, one when it is back: not one per retry.
        assert "lost the connection to PostgreSQL" in caplog.text
        assert "reconnected to PostgreSQL" in caplog.text
    else:
        assert "transient database fault" in caplog.text  # busy, not unreachable
    assert await count(app, Effect) == 1


@pytest.mark.postgres_only  # LISTEN/NOTIFY exists only on PostgreSQL; SQLite polls
async def test_listen_connection_recovers(postgres_url: str, clock: FakeClock) -> None:
    import asyncpg

    app = durafn.App(postgres_url, clock=clock)
    await app.migrate()

    @app.mutation(name="listen:noop")
    async def noop(ctx: MutationCtx) -> None:
        pass

    other = durafn.App(postgres_url, clock=clock)
    other.mutation(name="listen:noop")(noop.fn)
    admin = await asyncpg.connect(BARE_DSN)
    listening = (
        "SELECT pid FROM pg_stat_activity WHERE query LIKE 'LISTEN%' "
        "AND datname = current_database()"
    )
    try:
        async with app.run_executor(poll_interval=3600) as executor:
            with anyio.fail_after(CEILING):
                while not (pids := await admin.fetch(listening)):  # noqa: ASYNC110
                    await anyio.sleep(0.01)
            old = pids[0]["pid"]
            await admin.execute("SELECT pg_terminate_backend($1)", old)
            with anyio.fail_after(CEILING):
                # Wait for the executor to LISTEN again on a new connection.
                while [r["pid"] for r in await admin.fetch(listening)] in ([], [old]):  # noqa: ASYNC110
                    await anyio.sleep(0.01)
            sid = await other.scheduler().run_after(0, "listen:noop")
            assert (await executor.wait_for(sid, timeout=CEILING)).state is State.SUCCESS
    finally:
        await admin.close()
        await other.aclose()
        await app.aclose()


async def test_a_single_statement_whose_connection_dies(postgres_url: str) -> None:
    """A one-statement write runs in autocommit on PostgreSQL: the statement is its own
    commit. A fault is retried like any other (its callers make it safe to run again); with
    ``retries=0`` it reaches the caller as a transient DatabaseError, which is how the
    action dispatcher learns that a claim's outcome is unknown."""
    app = durafn.App(postgres_url)
    await app.migrate()
    calls = {0: 0, 3: 0}

    def body(retries: int) -> Callable[[AsyncConnection], Awaitable[None]]:
        async def _run(conn: AsyncConnection) -> None:
            calls[retries] += 1
            if calls[retries] == 1:
                await conn.execute(text("SELECT pg_terminate_backend(pg_backend_pid())"))

        return _run

    try:
        with pytest.raises(durafn.DatabaseError) as info:
            await app._rt.transaction(body(0), single_statement=True, retries=0)
        assert info.value.transient
        assert calls[0] == 1
        await app._rt.transaction(body(3), single_statement=True, retries=3)
        assert calls[3] == 2
    finally:
        await app.aclose()


async def test_a_direct_schedule_survives_a_dropped_connection(postgres_url: str) -> None:
    """The one-statement schedule runs in autocommit; a pooled connection the server has
    dropped is retried, and the row is written once."""
    import asyncpg

    app = durafn.App(postgres_url)
    await app.migrate()

    @app.mutation(name="dropped:noop")
    async def noop(ctx: MutationCtx) -> None:
        pass

    admin = await asyncpg.connect(BARE_DSN)
    try:
        await app.scheduler().run_after(60, noop)  # a pooled connection now exists
        await admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        sid = await app.scheduler().run_after(60, noop)
        rows = [r for r in await all_rows(app) if r.id == sid]
        assert [r.state for r in rows] == [State.PENDING]
    finally:
        await admin.close()
        await app.aclose()


async def test_an_id_taken_by_another_row_is_an_error_not_a_success(
    app: durafn.App, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only a retry may take an existing row with our id for its own earlier attempt."""
    import durafn._scheduler as scheduler_module

    @app.mutation
    async def one(ctx: MutationCtx) -> None:
        pass

    @app.mutation
    async def two(ctx: MutationCtx) -> None:
        pass

    taken = await app.scheduler().run_after(60, one)
    monkeypatch.setattr(scheduler_module, "new_id", lambda now: taken)
    with pytest.raises(durafn.DatabaseError):
        await app.scheduler().run_after(60, two)
    assert [r.name for r in await all_rows(app)] == [one.name]


async def test_a_cut_short_batch_wakes_other_executors(postgres_url: str) -> None:
    """Rows a batch claimed but left for later (batch_time) are announced at its commit:
    another executor that skipped them while they were locked need not wait its poll."""
    import asyncpg

    app = durafn.App(postgres_url)
    await app.migrate()

    @app.mutation(name="cut:noop")
    async def noop(ctx: MutationCtx) -> None:
        pass

    sched = app.scheduler()
    ids = [await sched.run_after(0, noop) for _ in range(3)]
    heard: list[str] = []
    listener = await asyncpg.connect(BARE_DSN)
    try:
        await listener.add_listener("durafn_wakeup", lambda *args: heard.append(args[3]))
        async with app.run_executor(batch_time=1e-9, mutation_lanes=1) as executor:
            for i in ids:
                await executor.wait_for(i)
        with anyio.fail_after(CEILING):
            while not heard:  # noqa: ASYNC110 - asyncpg delivers by callback
                await anyio.sleep(0.01)
        assert set(heard) == {"mutation"}
    finally:
        await listener.close()
        await app.aclose()


@pytest.mark.postgres_only  # SKIP LOCKED: on SQLite a claim waits for the one write lock
@pytest.mark.parametrize("held", ["queue", "flow key"])
async def test_a_claim_that_skipped_a_held_queue_or_key_looks_again(
    postgres_url: str, held: str
) -> None:
    """A claim skips a queue (or a flow key) that another transaction holds, as it would
    another claim's. When that holder ends without taking the row and without a wake-up
    (a claim that found nothing it could take sends none), the claimer must not sleep
    until its poll (an hour here): it looks again on its own."""
    import asyncpg

    app = durafn.App(postgres_url)
    await app.migrate()

    @app.action(name="held:act")
    async def act(ctx: ActionCtx) -> None:
        pass

    options: dict[str, Any] = (
        {"queue": "q"} if held == "queue" else {"flow": durafn.Flow(key="k", concurrency=1)}
    )
    lock = (
        "SELECT 1 FROM _durafn_queues WHERE name = 'q' FOR UPDATE"
        if held == "queue"
        else "SELECT 1 FROM _durafn_flow_keys WHERE key = 'k' FOR UPDATE"
    )
    admin = await asyncpg.connect(BARE_DSN)
    try:
        if held == "flow key":  # the key's row is made by the first claim that meets it
            await admin.execute("INSERT INTO _durafn_flow_keys (key, tat) VALUES ('k', 0)")
        sid = await app.scheduler().run_after(0, act.options(**options))
        holder = admin.transaction()
        await holder.start()
        assert await admin.fetchval(lock) == 1
        async with app.run_executor(poll_interval=3600) as executor:
            hint = executor._claims.hint
            # Three idle waits in a row after contended claims (the look-again delay
            # doubles each time): any wake-up of the start is spent by then.
            with anyio.fail_after(CEILING):
                while hint.recheck < 0.2:  # noqa: ASYNC110
                    await anyio.sleep(0.01)
            await holder.rollback()  # no NOTIFY: only the claimer's own look again finds it
            assert (await executor.wait_for(sid, timeout=CEILING)).state is State.SUCCESS
    finally:
        await admin.close()
        await app.aclose()


@pytest.mark.postgres_only  # a server that ends connections: SQLite has none
@pytest.mark.parametrize("when", ["idle in the pool", "during a statement"])
async def test_a_connection_the_server_ended_is_never_handed_out_again(
    postgres_url: str, when: str
) -> None:
    """A backend terminated while its connection sits in the pool, or while a statement
    runs on it: the transaction that meets it is retried on another connection, and the
    dead one is dropped, never checked out again (asyncpg's "another operation is in
    progress", from a connection still consuming the server's last error, killed a
    worker under repeated terminations)."""
    import asyncpg

    app = durafn.App(postgres_url)
    await app.migrate()
    admin = await asyncpg.connect(BARE_DSN)

    async def driver_connection() -> Any:
        async with app.engine.connect() as conn:
            return (await conn.get_raw_connection()).driver_connection

    try:
        dead = await driver_connection()
        pid = dead.get_server_pid()
        tries: list[int] = []

        async def body(conn: AsyncConnection) -> int:
            tries.append(1)
            if when == "during a statement" and len(tries) == 1:
                # Ended from outside once it runs: the length matters only to a hang.
                await conn.execute(text(f"SELECT pg_sleep({CEILING})"))
            return int((await conn.execute(text("SELECT pg_backend_pid()"))).scalar_one())

        async with anyio.create_task_group() as tg:
            if when == "idle in the pool":
                assert await admin.fetchval("SELECT pg_terminate_backend($1, 5000)", pid)
            else:
                tg.start_soon(_end_once_running, admin, pid)
            served_by = await app._rt.transaction(body, doing="a test")
        assert served_by != pid
        for _ in range(3):  # the pool has one live connection now, never the dead one
            assert await driver_connection() is not dead
    finally:
        await admin.close()
        await app.aclose()


async def _end_once_running(admin: Any, pid: int) -> None:
    """Terminate backend ``pid`` once it runs a statement (waits on the event, not a
    guess at how long the statement takes to start on a loaded machine)."""
    running = "SELECT state = 'active' FROM pg_stat_activity WHERE pid = $1"
    with anyio.fail_after(CEILING):
        while not await admin.fetchval(running, pid):  # noqa: ASYNC110 (the server's state)
            await anyio.sleep(0.01)
    assert await admin.fetchval("SELECT pg_terminate_backend($1, 5000)", pid)


@pytest.mark.postgres_only  # asyncpg's protocol states: SQLite has none
async def test_a_connection_left_busy_is_dropped_and_the_transaction_retried(
    postgres_url: str,
) -> None:
    """A pooled connection that an interrupted operation left busy (here: an operation
    still running on it) fails its next statement with asyncpg's "another operation is in
    progress": durafn takes that for a lost connection (retried elsewhere, transient),
    and the pool never hands the connection out again."""
    import asyncpg

    app = durafn.App(postgres_url)
    await app.migrate()
    try:
        async with app.engine.connect() as conn:
            busy: Any = (await conn.get_raw_connection()).driver_connection
        # Busy for as long as a hang lasts: a loaded machine's delays can't end it first.
        sleeping = asyncio.ensure_future(busy.execute(f"SELECT pg_sleep({CEILING})"))
        # One turn of the loop puts it on the wire: the connection is busy, back in the pool.
        await anyio.lowlevel.checkpoint()
        tries: list[int] = []

        async def body(conn: AsyncConnection) -> Any:
            tries.append(1)
            return (await conn.get_raw_connection()).driver_connection, (
                await conn.execute(text("SELECT 1"))
            ).scalar_one()

        served_by, one = await app._rt.transaction(body, doing="a test")
        assert (served_by is not busy, one, len(tries)) == (True, 1, 2)
        async with app.engine.connect() as conn:
            assert (await conn.get_raw_connection()).driver_connection is not busy
        sleeping.cancel()
        with contextlib.suppress(
            asyncio.CancelledError, asyncpg.PostgresError, asyncpg.InterfaceError, OSError
        ):
            await sleeping
    finally:
        await app.aclose()
