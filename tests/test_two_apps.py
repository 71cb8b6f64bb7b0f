"""Two apps in one process on one database (an app and its ``app.using()`` twin, each a
runtime of its own): what one writes, finishes or frees, the other's executor hears of
without its poll, on both engines.

Each test runs on the fake clock, which never moves: an executor's fallback poll never
comes, so a wake-up lost here is a hang (up to ``CEILING``), never a delay.
``make stress`` (``benchmarks/stress.py``) runs thousands of such rounds.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import pytest
from anyio.abc import TaskStatus
from sqlalchemy import text

import durafn
from durafn import ActionCtx, MutationCtx, State
from durafn._executor import Executor
from durafn._runtime import Backoff
from durafn.testing import FakeClock

from .support.helpers import CEILING

pytestmark = pytest.mark.anyio


async def test_rows_one_app_schedules_start_in_the_other_app_s_executor(app: durafn.App) -> None:
    """Only the twin runs an executor; the app schedules. On PostgreSQL the NOTIFY tells
    it; on SQLite, which has none, the app's wake-up reaches the twin in this process."""
    ran: list[str] = []

    @app.mutation(name="two:mutation")
    async def mutation(ctx: MutationCtx) -> None:
        ran.append("mutation")

    @app.action(name="two:action")
    async def action(ctx: ActionCtx) -> None:
        ran.append("action")

    twin = app.using()
    try:
        async with twin.run_executor() as executor:
            await executor.wait_until_idle()  # its first claims found nothing: it sleeps
            ids = await app.scheduler().run_many([mutation.call(), action.call()])
            for id in ids:
                assert (await executor.wait_for(id, timeout=CEILING)).state is State.SUCCESS
    finally:
        await twin.aclose()
    assert sorted(ran) == ["action", "mutation"]


@asynccontextmanager
async def stoppable(executor: durafn.Executor) -> AsyncIterator[tuple[anyio.Event, anyio.Event]]:
    """Run ``executor`` in a task of its own (so that it can stop while the caller's own
    executor runs on): yields ``leave``, which stops it, and ``stopped``, set once its
    stop sequence has run (its loops claim nothing more; a batch may still be running)."""
    leave, stopped = anyio.Event(), anyio.Event()
    stop = executor._stop

    async def _stop_then_tell() -> None:
        await stop()
        stopped.set()

    executor._stop = _stop_then_tell  # type: ignore[method-assign]

    async def _run(*, task_status: TaskStatus[None]) -> None:
        async with executor:
            task_status.started()
            await leave.wait()

    async with anyio.create_task_group() as tg:
        await tg.start(_run)
        yield leave, stopped
        leave.set()


async def test_what_a_batch_frees_as_its_executor_stops_starts_in_the_other_app(
    app: durafn.App,
) -> None:
    """The app's executor runs the part, a mutation, and stops while its batch is still
    running: the batch commits once the executor's loops have ended, and frees the join,
    which only the twin may run. Nothing of the app's executor is left to claim it, so
    the twin must be told: on PostgreSQL the release is looked at after the loops end
    (``FreedRows``, whose NOTIFY the twin hears); on SQLite the finish's wake-up reaches
    the twin. (Both were lost: the twin waited for its poll.)"""
    entered, gate = anyio.Event(), anyio.Event()

    @app.mutation(name="two:part", timeout=CEILING)  # held past the default 5 s on a slow day
    async def part(ctx: MutationCtx) -> None:
        entered.set()
        await gate.wait()

    @app.mutation(name="two:join")
    async def join(ctx: MutationCtx) -> str:
        return "joined"

    twin = app.using()
    # Mutations only: no action wake-up sends the app's dispatcher into a claim, which on
    # SQLite would wait behind the part's batch (the write lock) and hold up the stop.
    leaving = app.executor(forbidden_flags=["join"])
    try:
        async with (
            twin.run_executor(forbidden_flags=["part"]) as survivor,
            stoppable(leaving) as (leave, stopped),
        ):
            await survivor.wait_until_idle()
            await leaving.wait_until_idle()
            async with app.engine.begin() as conn:  # one commit: the part is not yet claimed
                dep = await app.scheduler(conn).run_after(0, part.options(flags=["part"]))
                joined = await app.scheduler(conn).run_after(
                    0, join.options(after=[dep], flags=["join"])
                )
            with anyio.fail_after(CEILING):
                await entered.wait()
            leave.set()
            with anyio.fail_after(CEILING):
                await stopped.wait()
            gate.set()  # the batch commits now, after the app's loops have ended
            row = await survivor.wait_for(joined, timeout=CEILING)
            assert (row.state, row.result) == (State.SUCCESS, "joined")
    finally:
        await twin.aclose()


_SQLITE_TRIGGER = """
CREATE TRIGGER two_refuse BEFORE UPDATE OF result ON _scheduled_functions
WHEN NEW.result = '"refused"'
BEGIN SELECT RAISE(ABORT, 'refused by a test trigger'); END
"""
_PG_FUNCTION = """
CREATE FUNCTION two_refuse() RETURNS trigger LANGUAGE plpgsql AS
$$ BEGIN RAISE EXCEPTION 'refused by a test trigger'; END $$
"""
_PG_TRIGGER = """
CREATE TRIGGER two_refuse BEFORE UPDATE ON _scheduled_functions
FOR EACH ROW WHEN (NEW.result = '"refused"') EXECUTE FUNCTION two_refuse()
"""


@asynccontextmanager
async def result_refused(app: durafn.App) -> AsyncIterator[None]:
    """The database refuses to store the result ``"refused"`` (a real error from the real
    engine: a trigger), until the block ends."""
    postgres = app.engine.dialect.name == "postgresql"
    async with app.engine.begin() as conn:
        for statement in (_PG_FUNCTION, _PG_TRIGGER) if postgres else (_SQLITE_TRIGGER,):
            await conn.execute(text(statement))
    try:
        yield
    finally:
        async with app.engine.begin() as conn:
            await conn.execute(
                text("DROP TRIGGER two_refuse" + (" ON _scheduled_functions" if postgres else ""))
            )
            if postgres:
                await conn.execute(text("DROP FUNCTION two_refuse()"))


async def test_a_finish_refused_part_way_still_announces_the_rows_it_freed(
    app: durafn.App, caplog: pytest.LogCaptureFixture
) -> None:
    """Two actions end at once and their outcomes are written together: the one that
    returned nothing first (on PostgreSQL, in autocommit, a statement that commits by
    itself and frees the join), then the one with a result, which the database refuses.
    The first statement's release stands, so its rows must still be announced (the
    runtime dropped what that statement had noted with the failure, and the join waited
    for the poll). The refused outcome is then written on its own, as Failed.

    The executor must be idle when they end, or a claim of its own may find the join by
    chance: a marker scheduled by the twin (on PostgreSQL only its NOTIFY tells the
    executor, after those of every earlier write) runs first, and once it has run no
    wake-up is left on its way."""
    caplog.set_level(logging.WARNING, logger="durafn")
    entered: list[str] = []
    gate = anyio.Event()

    @app.action(name="two:plain")
    async def plain(ctx: ActionCtx) -> None:
        entered.append("plain")
        await gate.wait()

    @app.action(name="two:refused")
    async def refused(ctx: ActionCtx) -> str:
        entered.append("refused")
        await gate.wait()
        return "refused"

    @app.action(name="two:join")
    async def join(ctx: ActionCtx) -> str:
        return "joined"

    @app.action(name="two:marker")
    async def marker(ctx: ActionCtx) -> None:
        pass

    twin = app.using()
    try:
        async with result_refused(app), app.run_executor() as executor:
            sched = app.scheduler()
            dep, other = await sched.run_many([plain.call(), refused.call()])
            joined = await sched.run_after(0, join.options(after=[dep]))
            with anyio.fail_after(CEILING):
                while len(entered) < 2:  # noqa: ASYNC110 - both run before the gate
                    await anyio.sleep(0.01)
            seen = await twin.scheduler().run_after(0, marker)
            assert (await executor.wait_for(seen, timeout=CEILING)).state is State.SUCCESS
            gate.set()  # both return in this turn of the loop: one batch of outcomes
            row = await executor.wait_for(joined, timeout=CEILING)
            assert (row.state, row.result) == (State.SUCCESS, "joined")
            assert (await executor.wait_for(other, timeout=CEILING)).state is State.FAILED
    finally:
        await twin.aclose()
    assert "recording 2 action outcomes failed" in caplog.text  # one batch, as meant


async def _run_until(
    app: durafn.App, done: anyio.Event, *, task_status: TaskStatus[Executor]
) -> None:
    """Run ``app``'s executor (handed to the starter) until ``done``."""
    async with app.run_executor() as executor:
        task_status.started(executor)
        await done.wait()


_PG_FLAKY_FUNCTION = """
CREATE FUNCTION two_flaky() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'a fault retrying cures' USING ERRCODE = '40001';
END $$
"""
_PG_FLAKY_TRIGGER = """
CREATE TRIGGER two_flaky BEFORE UPDATE ON _scheduled_functions FOR EACH ROW
WHEN (NEW.name = 'two:flaky' AND NEW.state = 'Success') EXECUTE FUNCTION two_flaky()
"""


@pytest.mark.postgres_only  # SKIP LOCKED: only there does another executor pass rows by
async def test_a_batch_given_back_by_a_stop_in_its_backoff_starts_in_the_other_app(
    postgres_url: str, clock: FakeClock
) -> None:
    """A mutation batch fails with a fault retrying cures (a serialization failure, from
    a trigger), and its lane backs off; the executor is stopped meanwhile. The batch
    rolled back, so its row is Pending again, and the twin's executor, which passed it by
    while it was locked, must hear of it: the stop announces it."""
    app = durafn.App(postgres_url, clock=clock)
    await app.migrate()
    entered, gate, done = anyio.Event(), anyio.Event(), anyio.Event()

    @app.mutation(name="two:flaky")
    async def flaky(ctx: MutationCtx) -> None:
        entered.set()
        await gate.wait()

    @app.action(name="two:marker")
    async def marker(ctx: ActionCtx) -> None:
        pass

    async with app.engine.begin() as conn:
        for statement in (_PG_FLAKY_FUNCTION, _PG_FLAKY_TRIGGER):
            await conn.execute(text(statement))
    app._rt.backoff = Backoff(base=CEILING, cap=CEILING)  # backs off until stopped
    twin = app.using()
    try:
        with anyio.fail_after(CEILING):
            async with anyio.create_task_group() as tg:
                async with app.run_executor() as mine:
                    sid = await app.scheduler().run_after(0, flaky)
                    await entered.wait()  # this executor holds the row, locked
                    other = await tg.start(_run_until, twin, done)
                    # The twin's executor has claimed since: it passed the locked row by.
                    seen = await twin.scheduler().run_after(0, marker)
                    await other.wait_for(seen, timeout=CEILING)
                    gate.set()
                    while mine.stats["retries"] < 1:  # noqa: ASYNC110 - the fault came
                        await anyio.sleep(0.005)
                    async with app.engine.begin() as conn:
                        await conn.execute(text("DROP TRIGGER two_flaky ON _scheduled_functions"))
                # Stopped while backing off: the twin runs the row.
                row = await other.wait_for(sid, timeout=CEILING)
                assert row.state is State.SUCCESS
                done.set()
    finally:
        await twin.aclose()
        async with app.engine.begin() as conn:
            await conn.execute(text("DROP TRIGGER IF EXISTS two_flaky ON _scheduled_functions"))
            await conn.execute(text("DROP FUNCTION two_flaky()"))
        await app.aclose()
