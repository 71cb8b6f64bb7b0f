"""The executor: ordering, group commit that isolates failures, time limits, internal
retries through real database faults, and wake-ups without polling."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from sqlalchemy import func, select, text, update

import durafn
from durafn import ActionCtx, HookEvent, MutationCtx, State
from durafn.testing import FakeClock, all_rows, finish_all

from .support.helpers import CEILING, count, counter, system_table_locked
from .support.models import Counter, Effect
from .support.processes import owned_sync, tagged

pytestmark = pytest.mark.anyio
ROOT = Path(__file__).resolve().parent.parent


async def test_due_rows_run_in_scheduled_time_order(app: durafn.App, clock: FakeClock) -> None:
    order: list[int] = []

    @app.mutation
    async def work(ctx: MutationCtx, n: int) -> None:
        order.append(n)

    sched = app.scheduler()
    for n, delay in [(3, 30), (1, 10), (4, 40), (2, 20)]:
        await sched.run_after(delay, work, n=n)
    clock.advance(100)
    await app.executor(batch_size=3).run_until_idle()
    assert order == [1, 2, 3, 4]


async def test_a_failing_mutation_does_not_take_its_batch_down(app: durafn.App) -> None:
    runs: list[int] = []

    @app.mutation
    async def apply(ctx: MutationCtx, n: int) -> int:
        runs.append(n)
        ctx.db.add(Effect(key=f"e{n}"))
        await ctx.db.flush()
        if n == 5:
            raise ValueError("five is right out")
        return n * 10

    ids = [await app.scheduler().run_after(0, apply, n=n) for n in range(10)]
    executor = app.executor(batch_size=64)
    assert await executor.run_until_idle() == 10
    rows = {r.id: r for r in await all_rows(app)}
    for n, sid in enumerate(ids):
        if n == 5:
            assert rows[sid].state is State.FAILED
            error = rows[sid].error
            assert error is not None
            assert (error.type, error.message) == ("ValueError", "five is right out")
        else:
            assert rows[sid].state is State.SUCCESS
            assert rows[sid].result == n * 10
    # Every successful mutation's effect is applied once; the failing one's is rolled back.
    async with app.engine.connect() as conn:
        keys = sorted((await conn.execute(select(Effect.key))).scalars())
    assert keys == sorted(f"e{n}" for n in range(10) if n != 5)
    # The optimistic batch was re-run with savepoints: the failing mutation's Failed record
    # comes from a run whose neighbours committed.
    assert runs.count(5) == 2


async def test_integrity_error_in_user_code_is_a_user_failure(app: durafn.App) -> None:
    @app.mutation
    async def insert_key(ctx: MutationCtx, key: str) -> None:
        ctx.db.add(Effect(key=key))

    first = await app.scheduler().run_after(0, insert_key, key="same")
    second = await app.scheduler().run_after(0, insert_key, key="same")
    await app.executor().run_until_idle()
    a, b = await app.get(first), await app.get(second)
    assert a is not None and b is not None
    assert a.state is State.SUCCESS
    assert b.state is State.FAILED
    assert b.error is not None and "IntegrityError" in b.error.type
    assert await count(app, Effect) == 1


async def test_mutation_time_limit(db_url: str, clock: FakeClock) -> None:
    app = durafn.App(db_url, clock=clock, mutation_timeout=0.05)
    await app.migrate()
    try:
        # Its own limit, far from the app's: on a loaded machine a flush alone has taken
        # more than 0.05 s, and the test is of the one that hangs.
        @app.mutation(timeout=60)
        async def bump(ctx: MutationCtx, n: int) -> None:
            ctx.db.add(Effect(key=f"bump{n}"))

        @app.mutation
        async def hangs(ctx: MutationCtx) -> None:
            ctx.db.add(Effect(key="hang"))
            await ctx.db.flush()
            await anyio.Event().wait()

        async with app.engine.begin() as conn:
            from .support.models import Base

            await conn.run_sync(Base.metadata.create_all)
        await app.scheduler().run_after(0, bump, n=1)
        hang_id = await app.scheduler().run_after(0, hangs)
        await app.scheduler().run_after(0, bump, n=2)
        await app.executor().run_until_idle()
        row = await app.get(hang_id)
        assert row is not None
        assert row.state is State.FAILED
        assert row.error is not None
        assert row.error.type == "durafn.FunctionTimeoutError"
        assert "time limit of 0.05s" in row.error.message
        async with app.engine.connect() as conn:
            keys = sorted((await conn.execute(select(Effect.key))).scalars())
        assert keys == ["bump1", "bump2"]
    finally:
        await app.aclose()


async def test_a_mutations_time_limit_covers_its_run_not_the_hooks_around_it(
    db_url: str, clock: FakeClock
) -> None:
    """Hooks run outside the limit: a slow ``success`` hook after one mutation and a slow
    ``before`` hook of the next fail neither (the batch's one timer once stayed armed for
    the mutation that had ended, and blamed it or the next one)."""
    app = durafn.App(db_url, clock=clock, mutation_timeout=0.05)
    await app.migrate()
    try:

        @app.on("before")
        @app.on("success")
        async def slow_metrics(event: HookEvent) -> None:
            await anyio.sleep(0.1)  # twice the limit

        @app.mutation
        async def note(ctx: MutationCtx, n: int) -> int:
            return n

        ids = [await app.scheduler().run_after(0, note, n) for n in range(3)]
        await app.executor().run_until_idle()
        rows = [await app.get(i) for i in ids]
        assert [(r.state, r.result) for r in rows if r is not None] == [
            (State.SUCCESS, 0),
            (State.SUCCESS, 1),
            (State.SUCCESS, 2),
        ]
    finally:
        await app.aclose()


# A statement that would run for minutes unless stopped.
_ENDLESS = {
    "sqlite": "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c "
    "WHERE x < 100000000000) SELECT count(*) FROM c",
    "postgresql": "SELECT pg_sleep(600)",
}


async def _still_running(app: durafn.App) -> bool:
    """Is the endless statement still running anywhere (PostgreSQL), or holding the
    write lock (SQLite: a write that may not wait fails at once)?"""
    if app.engine.dialect.name == "postgresql":
        async with app.engine.connect() as conn:
            found = await conn.scalar(
                text(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND query LIKE 'SELECT pg_sleep(600)%'"
                )
            )
        return bool(found)
    database = app.engine.url.database
    assert database is not None
    probe = sqlite3.connect(database, timeout=0, isolation_level=None)
    try:
        probe.execute("BEGIN IMMEDIATE")
        probe.execute("ROLLBACK")
        return False
    except sqlite3.OperationalError:
        return True
    finally:
        probe.close()


async def test_a_mutation_time_limit_stops_its_statement(app: durafn.App) -> None:
    """The statement is stopped at the limit, not left running with its locks: the row is
    Failed, its batch neighbours run, and no lock is left behind. (Without the interrupt,
    the bound below is hit: the statement runs for minutes.)"""
    endless = _ENDLESS[app.engine.dialect.name]

    @app.mutation(timeout=0.2)
    async def runs_forever(ctx: MutationCtx) -> None:
        await ctx.db.execute(text(endless))

    @app.mutation
    async def neighbour(ctx: MutationCtx, n: int) -> int:
        ctx.db.add(Effect(key=f"n{n}"))
        return n

    sched = app.scheduler()
    before = await sched.run_after(0, neighbour, n=1)
    stuck = await sched.run_after(0, runs_forever)
    after = await sched.run_after(0, neighbour, n=2)
    with anyio.fail_after(CEILING):  # a liveness bound, far above the limit: not a timing
        assert await app.executor().run_until_idle() == 3
    row = await app.get(stuck)
    assert row is not None and row.state is State.FAILED
    assert row.error is not None and row.error.type == "durafn.FunctionTimeoutError"
    assert [(await app.get(i)).state for i in (before, after)] == [State.SUCCESS] * 2  # type: ignore[union-attr]
    assert await count(app, Effect) == 2
    assert not await _still_running(app)


async def test_a_direct_call_time_limit_stops_its_statement(app: durafn.App) -> None:
    """run_mutation and run_query past their limits stop the statement, too."""
    endless = _ENDLESS[app.engine.dialect.name]

    @app.mutation(timeout=0.2)
    async def writes_forever(ctx: MutationCtx) -> None:
        ctx.db.add(Effect(key="never"))
        await ctx.db.flush()
        await ctx.db.execute(text(endless))

    @app.query(timeout=0.2)
    async def reads_forever(ctx: durafn.QueryCtx) -> None:
        await ctx.db.execute(text(endless))

    with anyio.fail_after(CEILING):  # a liveness bound, as above
        with pytest.raises(durafn.FunctionTimeoutError):
            await app.run_mutation(writes_forever)
        assert not await _still_running(app)
        with pytest.raises(durafn.FunctionTimeoutError):
            await app.run_query(reads_forever)
        assert not await _still_running(app)
    assert await count(app, Effect) == 0


async def test_a_stop_is_not_held_by_a_timed_out_statement(app: durafn.App) -> None:
    """Stopping while a mutation's statement runs waits for its time limit, no longer,
    and leaves the row Failed (not Pending for the next worker to stall on)."""
    endless = _ENDLESS[app.engine.dialect.name]
    started = anyio.Event()

    @app.mutation(timeout=0.3)
    async def runs_forever(ctx: MutationCtx) -> None:
        started.set()
        await ctx.db.execute(text(endless))

    with anyio.fail_after(CEILING):  # a liveness bound, as above
        async with app.run_executor():
            stuck = await app.scheduler().run_after(0, runs_forever)
            await started.wait()
    row = await app.get(stuck)
    assert row is not None and row.state is State.FAILED
    assert not await _still_running(app)


async def test_action_time_limit_and_per_function_override(app: durafn.App) -> None:
    @app.action(timeout=0.05)
    async def slow(ctx: ActionCtx) -> None:
        await anyio.Event().wait()

    sid = await app.scheduler().run_after(0, slow)
    await app.executor().run_until_idle()
    row = await app.get(sid)
    assert row is not None
    assert row.state is State.FAILED
    assert row.error is not None and row.error.type == "durafn.FunctionTimeoutError"
    assert row.attempts == 1


async def test_rows_whose_function_is_gone_fail_clearly(
    app: durafn.App, db_url: str, clock: FakeClock
) -> None:
    @app.mutation(name="renamed_later")
    async def old(ctx: MutationCtx, n: int) -> None:
        pass

    @app.action(name="action_renamed_later")
    async def old_action(ctx: ActionCtx) -> None:
        pass

    m = await app.scheduler().run_after(0, old, n=1)
    a = await app.scheduler().run_after(0, old_action)
    newer = durafn.App(db_url, clock=clock)  # the next deploy: the functions are gone

    @newer.mutation(name="other")
    async def other(ctx: MutationCtx) -> None:
        pass

    try:
        await newer.executor().run_until_idle()
        for sid in (m, a):
            row = await newer.get(sid)
            assert row is not None
            assert row.state is State.FAILED
            assert row.error is not None
            assert row.error.type == "durafn.UnknownFunctionError"
            assert "no function is registered" in row.error.message
    finally:
        await newer.aclose()


async def test_stored_arguments_that_no_longer_validate(
    app: durafn.App, db_url: str, clock: FakeClock
) -> None:
    @app.mutation(name="evolving")
    async def v1(ctx: MutationCtx, n: int) -> None:
        pass

    sid = await app.scheduler().run_after(0, v1, n=1)
    v2_app = durafn.App(db_url, clock=clock)

    @v2_app.mutation(name="evolving")
    async def v2(ctx: MutationCtx, n: int, required_now: str) -> None:
        pass

    try:
        await v2_app.executor().run_until_idle()
        row = await v2_app.get(sid)
        assert row is not None and row.state is State.FAILED
        assert row.error is not None and "required_now: Field required" in row.error.message
    finally:
        await v2_app.aclose()


class _Crowd:
    """An action whose runs wait until three are running at once; records the peak."""

    def __init__(self, app: durafn.App) -> None:
        self.running = self.peak = self.started = 0
        gate = anyio.Event()

        @app.action(name="crowd:act")
        async def act(ctx: ActionCtx, n: int) -> int:
            self.running += 1
            self.started += 1
            self.peak = max(self.peak, self.running)
            if self.started >= 3:
                gate.set()
            await gate.wait()
            self.running -= 1
            return n

        self.act = act


async def test_actions_run_concurrently_up_to_the_limit(app: durafn.App) -> None:
    crowd = _Crowd(app)
    for n in range(7):
        await app.scheduler().run_after(0, crowd.act, n=n)
    await app.executor(concurrency=3).run_until_idle()
    assert crowd.peak == 3
    assert {r.state for r in await all_rows(app)} == {State.SUCCESS}


async def test_background_executor_wakes_at_once_on_new_work(
    app: durafn.App, clock: FakeClock
) -> None:
    """With the poll an hour away and the fake clock still, only the wake signal can run it."""

    @app.mutation
    async def bump(ctx: MutationCtx) -> None:
        await ctx.db.merge(Counter(name="c", value=await _current(ctx) + 1))

    @app.mutation
    async def schedule_bump(ctx: MutationCtx) -> str:
        return await ctx.scheduler.run_after(0, bump)

    async with app.run_executor(poll_interval=3600) as executor:
        sid = await app.run_mutation(schedule_bump)
        row = await executor.wait_for(sid, timeout=CEILING)
        assert row.state is State.SUCCESS
        # A row due later: the executor sleeps until the (fake) clock reaches it.
        later = await app.scheduler().run_after(30, bump)
        clock.advance(29)
        await anyio.sleep(0.01)
        assert (await app.get(later)).state is State.PENDING  # type: ignore[union-attr]
        clock.advance(1)
        assert (await executor.wait_for(later, timeout=CEILING)).state is State.SUCCESS
    assert await counter(app) == 2


async def _current(ctx: MutationCtx) -> int:
    value = (await ctx.db.execute(select(Counter.value).where(Counter.name == "c"))).scalar()
    return int(value or 0)


async def test_work_scheduled_by_another_process_is_found(
    app: durafn.App, db_url: str, clock: FakeClock, engine_name: str
) -> None:
    """Another App (its own engine, as another process would have) schedules work. On
    PostgreSQL LISTEN/NOTIFY wakes the executor; on SQLite the (clock-driven) poll finds it."""

    @app.mutation(name="shared:noop")
    async def noop(ctx: MutationCtx) -> None:
        pass

    other = durafn.App(db_url, clock=clock)
    other.mutation(name="shared:noop")(noop.fn)
    try:
        async with app.run_executor(poll_interval=5) as executor:
            await anyio.sleep(0.05)  # let the executor settle into its idle wait
            sid = await other.scheduler().run_after(0, "shared:noop")
            if engine_name == "sqlite":
                clock.advance(5)
            row = await executor.wait_for(sid, timeout=CEILING)
            assert row.state is State.SUCCESS
    finally:
        await other.aclose()


async def test_internal_fault_is_retried_without_double_effects(
    app: durafn.App, engine_name: str, db_url: str
) -> None:
    """A real fault mid-batch: on PostgreSQL the mutation's own connection is terminated by
    the server; on SQLite another connection holds the write lock past the busy timeout.
    The batch is retried, nothing is recorded Failed, and each effect is applied once."""
    attempts = 0

    @app.mutation
    async def apply(ctx: MutationCtx, key: str) -> None:
        nonlocal attempts
        attempts += 1
        ctx.db.add(Effect(key=key))
        await ctx.db.flush()
        if engine_name == "postgres" and attempts == 1:
            await ctx.db.execute(text("SELECT pg_terminate_backend(pg_backend_pid())"))

    for key in ("a", "b", "c"):
        await app.scheduler().run_after(0, apply, key=key)

    executor = app.executor()
    if engine_name == "sqlite":
        app._rt.driver.busy_timeout = 0.05  # type: ignore[attr-defined]
        await app.aclose()  # rebuild the engine with the short timeout
        await app.migrate()
        path = Path(db_url.split("///", 1)[1])
        blocker = sqlite3.connect(path, isolation_level=None)
        blocker.execute("BEGIN IMMEDIATE")
        async with anyio.create_task_group() as tg:
            tg.start_soon(executor.run_until_idle)
            # Hold the lock until the executor has hit it twice, then let it through.
            while executor.stats["retries"] < 2:  # noqa: ASYNC110
                await anyio.sleep(0.01)
            blocker.execute("COMMIT")
        blocker.close()
    else:
        await executor.run_until_idle()

    assert executor.stats["retries"] >= 1
    rows = await all_rows(app)
    assert {r.state for r in rows} == {State.SUCCESS}
    assert await count(app, Effect) == 3
    if engine_name == "postgres":
        # The fault struck after the claim: the rolled-back attempt is counted on the rows.
        # (On SQLite it struck at BEGIN, before any row was claimed.)
        assert max(r.attempts for r in rows) == 2


def _look_up(table: dict[str, int], key: str) -> int:
    return table[key]  # the frame a traceback must lead to


async def test_a_failed_run_keeps_its_traceback(app: durafn.App) -> None:
    """A KeyError deep in user code can be traced from the row, for both kinds; an error
    durafn records itself (a time limit) has no traceback to keep."""

    @app.mutation
    async def mutation(ctx: MutationCtx, key: str) -> int:
        return _look_up({}, key)

    @app.action
    async def action(ctx: ActionCtx, key: str) -> int:
        return _look_up({}, key)

    @app.action(timeout=0.01)
    async def slow(ctx: ActionCtx) -> None:
        await anyio.sleep(5)

    ids = [
        await app.scheduler().run_after(0, mutation, key="m"),
        await app.scheduler().run_after(0, action, key="a"),
    ]
    timed_out = await app.scheduler().run_after(0, slow)
    await app.executor().run_until_idle()
    for sid in ids:
        row = await app.get(sid)
        assert row is not None and row.error is not None and row.error.type == "KeyError"
        assert row.error.traceback is not None
        assert "Traceback (most recent call last)" in row.error.traceback
        assert "in _look_up" in row.error.traceback and "return table[key]" in row.error.traceback
    row = await app.get(timed_out)
    assert row is not None and row.error is not None and row.error.traceback is None


@pytest.mark.parametrize("wrote", [True, False], ids=["after writing", "before writing"])
async def test_attempts_count_every_run_that_began(app: durafn.App, wrote: bool) -> None:
    """A mutation that raises in an optimistic batch after a write rolls the batch back
    and re-runs it with savepoints: the neighbour that ran before it ran twice, and says
    so. One that raises before anything of it reached the database (reads only) is
    recorded Failed and the batch goes on: every row ran once."""
    runs: dict[str, int] = {}

    @app.mutation
    async def apply(ctx: MutationCtx, key: str) -> None:
        runs[key] = runs.get(key, 0) + 1
        ctx.db.add(Effect(key=key))
        await ctx.db.scalar(select(func.count()).select_from(Effect))  # a read (autoflush)
        if key == "bad":
            raise ValueError("bad")  # after its Effect was flushed by the read

    @app.mutation
    async def reads_then_raises(ctx: MutationCtx) -> None:
        ctx.db.add(Effect(key="never"))  # unflushed: dropped with the failure
        await ctx.system.list()
        raise LookupError("nothing written")

    if wrote:
        keys = ("a", "bad", "c")
        ids = {key: await app.scheduler().run_after(0, apply, key=key) for key in keys}
    else:
        ids = {"a": await app.scheduler().run_after(0, apply, key="a")}
        ids["bad"] = await app.scheduler().run_after(0, reads_then_raises)
        ids["c"] = await app.scheduler().run_after(0, apply, key="c")
        runs["bad"] = 1
    await app.executor().run_until_idle()
    rows = {r.id: r for r in await all_rows(app)}
    expected = {"a": 2, "bad": 2, "c": 1} if wrote else {"a": 1, "bad": 1, "c": 1}
    assert {key: rows[i].attempts for key, i in ids.items()} == runs == expected
    assert rows[ids["bad"]].state is State.FAILED
    async with app.engine.connect() as conn:
        assert sorted((await conn.execute(select(Effect.key))).scalars()) == ["a", "c"]


@pytest.mark.postgres_only  # a connection terminated by the server, with lanes in parallel
@pytest.mark.parametrize("where", ["before a user statement", "before the finishing write"])
async def test_attempts_count_runs_cut_by_a_terminated_connection(
    postgres_url: str, where: str
) -> None:
    """The batch's connection dies mid-run; the row's next run may be another lane's, at
    once. Each run that began is counted (a count guarded by Pending missed the run when
    the other lane had finished the row first: attempts 1 for 2 runs, at random)."""
    app = durafn.App(postgres_url)
    await app.migrate()
    runs: dict[str, int] = {}

    async def terminate(pid: int) -> None:
        async with app.engine.connect() as conn:
            await conn.execute(text("SELECT pg_terminate_backend(:pid, 5000)"), {"pid": pid})

    @app.mutation
    async def apply(ctx: MutationCtx, key: str) -> None:
        runs[key] = runs.get(key, 0) + 1
        if runs[key] == 1:
            await terminate(await ctx.db.scalar(text("SELECT pg_backend_pid()")))
            if where == "before a user statement":
                await ctx.db.execute(text("SELECT 1"))

    try:
        ids = {k: await app.scheduler().run_after(0, apply, key=k) for k in ("x", "y", "z")}
        async with app.run_executor() as executor:
            for i in ids.values():
                await executor.wait_for(i, timeout=CEILING)
        rows = {r.id: r for r in await all_rows(app)}
        assert {k: rows[i].attempts for k, i in ids.items()} == runs
        assert min(runs.values()) >= 2  # every first run was cut (and so were neighbours')
    finally:
        await app.aclose()


async def test_run_until_idle_stops_runaway_self_scheduling(
    app: durafn.App, clock: FakeClock
) -> None:
    @app.mutation
    async def forever(ctx: MutationCtx) -> None:
        await ctx.scheduler.run_after(0, forever)

    @app.mutation
    async def every_minute(ctx: MutationCtx) -> None:
        await ctx.scheduler.run_after(60, every_minute)

    await app.scheduler().run_after(0, forever)
    with pytest.raises(durafn.RunawayError):
        await app.executor().run_until_idle(max_rounds=5)
    await app.cancel((await app.list(state=State.PENDING)).items[0].id)
    await app.scheduler().run_after(0, every_minute)
    with pytest.raises(durafn.RunawayError):
        await finish_all(app.executor(), clock, max_steps=5)


async def test_finish_all_finishes_an_app_with_crons(app: durafn.App, clock: FakeClock) -> None:
    """A cron always has a next tick: ``finish_all`` never moves the clock to one, but runs
    each tick the clock passes on its way to the rows, at its own time, and what the
    tick's run schedules; it ends when nothing is Pending."""
    ran: list[str] = []

    def at(ctx: MutationCtx, what: str) -> None:
        ran.append(f"{what} {ctx.now():%H:%M}")

    @app.mutation(name="fa:countdown")
    async def countdown(ctx: MutationCtx, n: int) -> None:
        at(ctx, f"countdown {n}")
        if n:
            await ctx.scheduler.run_after(25 * 60, countdown, n=n - 1)

    @app.mutation(name="fa:follow_up")
    async def follow_up(ctx: MutationCtx) -> None:
        at(ctx, "follow-up")

    @app.mutation(name="fa:ten")
    async def ten(ctx: MutationCtx) -> None:
        at(ctx, "ten")
        await ctx.scheduler.run_after(60, follow_up)  # before the next tick

    @app.mutation(name="fa:nightly")
    async def nightly(ctx: MutationCtx) -> None:
        at(ctx, "nightly")

    app.cron("fa-ten", "*/10 * * * *", ten)
    app.cron("fa-nightly", "0 2 * * *", nightly)
    start = clock.now()
    executor = app.executor()
    assert await finish_all(executor, clock) == 0  # only crons: nothing to finish
    assert clock.now() == start and ran == []

    await app.scheduler().run_after(0, countdown, n=2)
    assert await finish_all(executor, clock) == 3 + 2 * 5
    assert clock.now() == start + 51 * 60  # the last follow-up's time
    ticks = [f"ten 00:{m}0" for m in range(1, 6)]
    follow_ups = [f"follow-up 00:{m}1" for m in range(1, 6)]
    assert sorted(ran) == sorted(
        ["countdown 2 00:00", "countdown 1 00:25", "countdown 0 00:50", *ticks, *follow_ups]
    )
    assert await app.list(state=State.PENDING) == durafn.Page(items=[], next_cursor=None)
    # The next tick is still to come, at its time.
    assert await durafn.testing.advance(executor, clock, 9 * 60) == 1
    assert ran[-1] == "ten 01:00"


async def test_finish_all_names_the_function_that_reschedules_itself(
    app: durafn.App, clock: FakeClock
) -> None:
    @app.mutation(name="fa:every_minute")
    async def every_minute(ctx: MutationCtx) -> None:
        await ctx.scheduler.run_after(60, every_minute)

    await app.scheduler().run_after(0, every_minute)
    with pytest.raises(durafn.RunawayError) as raised:
        await finish_all(app.executor(), clock, max_steps=5)
    message = str(raised.value)
    assert "fa:every_minute, due 2030-01-01T00:06:00+00:00, reschedules itself" in message, message
    assert "after 5 steps (6 functions run)" in message and "advance(" in message, message


async def test_finish_all_names_the_cron_whose_ticks_keep_it_going(
    app: durafn.App, clock: FakeClock
) -> None:
    """A cron whose runs schedule work past its next tick: each step to that work passes
    another tick. The message names the cron, not only the function still scheduled."""

    @app.mutation(name="fa:reminder")
    async def reminder(ctx: MutationCtx) -> None:
        pass

    @app.mutation(name="fa:hourly")
    async def hourly(ctx: MutationCtx) -> None:
        await ctx.scheduler.run_after(2 * 3600, reminder)

    @app.mutation(name="fa:later")
    async def later(ctx: MutationCtx) -> None:
        pass

    app.cron("fa-hourly", "0 * * * *", hourly)
    await app.scheduler().run_after(90 * 60, later)
    with pytest.raises(durafn.RunawayError) as raised:
        await finish_all(app.executor(), clock, max_steps=5)
    message = str(raised.value)
    assert "fa:reminder" in message and "cron 'fa-hourly'" in message, message
    assert "advance(" in message, message


async def test_finish_all_names_a_row_held_at_its_time(app: durafn.App, clock: FakeClock) -> None:
    """A row that never starts (its queue paused) keeps the clock where it is: the message
    says it is due, and where to look, rather than blaming a function that reschedules."""

    @app.mutation(name="fa:queued")
    async def queued(ctx: MutationCtx) -> None:
        pass

    await app.pause_queue("fa-paused")
    sid = await app.scheduler().run_after(60, queued.options(queue="fa-paused"))
    with pytest.raises(durafn.RunawayError) as raised:
        await finish_all(app.executor(), clock, max_steps=5)
    message = str(raised.value)
    assert "fa:queued, due 2030-01-01T00:01:00+00:00 but not started" in message, message
    assert f"app.explain('{sid}')" in message, message


async def test_finish_all_advances_the_clock(app: durafn.App, clock: FakeClock) -> None:
    @app.mutation
    async def countdown(ctx: MutationCtx, n: int) -> None:
        if n:
            await ctx.scheduler.run_after(3600, countdown, n=n - 1)

    start = clock.now()
    await app.scheduler().run_after(0, countdown, n=3)
    assert await finish_all(app.executor(), clock) == 4
    assert clock.now() == start + 3 * 3600
    assert {r.state for r in await all_rows(app)} == {State.SUCCESS}


async def test_executor_stop_cancels_actions_after_grace(app: durafn.App) -> None:
    started = anyio.Event()

    @app.action
    async def stuck(ctx: ActionCtx) -> None:
        started.set()
        await anyio.Event().wait()

    sid = await app.scheduler().run_after(0, stuck)
    async with app.run_executor(grace_period=0.05):
        await started.wait()
    row = await app.get(sid)
    assert row is not None
    assert row.state is State.FAILED
    assert row.error is not None and row.error.type == "durafn.ExecutorShutdownError"


async def test_guarded_finish_does_not_overwrite_a_concurrent_change(app: durafn.App) -> None:
    """A row moved out of InProgress behind the executor's back keeps its new state."""
    release = anyio.Event()
    started = anyio.Event()

    @app.action
    async def act(ctx: ActionCtx) -> str:
        started.set()
        await release.wait()
        return "late"

    sid = await app.scheduler().run_after(0, act)
    async with app.run_executor() as executor:
        await started.wait()
        async with app.engine.begin() as conn:
            sf = durafn.scheduled_functions
            await conn.execute(
                update(sf)
                .where(sf.c.id == sid)
                .values(state="Failed", error_type="X", error_message="set by hand")
            )
        release.set()
        await anyio.lowlevel.checkpoint()
        row = await executor.wait_for(sid)
    assert row.state is State.FAILED
    assert row.result is None


@pytest.mark.parametrize("with_failure", [False, True], ids=["optimistic", "savepoints"])
async def test_cancelling_a_row_of_the_same_batch(
    app: durafn.App, clock: FakeClock, with_failure: bool
) -> None:
    """A mutation cancels rows its own batch has claimed. One the batch already ran reads
    as finished (the cancel is a no-op, as if each had committed alone); one it has not run
    yet is Canceled and skipped. With a failing mutation in the batch, the batch re-runs
    with savepoints and the same holds."""
    ran: list[str] = []

    @app.mutation
    async def victim(ctx: MutationCtx, tag: str) -> None:
        ran.append(tag)

    @app.mutation
    async def canceller(ctx: MutationCtx, target: str) -> bool:
        return (await ctx.scheduler.cancel(target)).canceled

    @app.mutation
    async def boom(ctx: MutationCtx) -> None:
        raise ValueError("boom")

    sched = app.scheduler()
    if with_failure:
        await sched.run_after(0.05, boom)
    earlier = await sched.run_after(0.1, victim, tag="earlier")
    later = await sched.run_after(0.3, victim, tag="later")
    cancel_later = await sched.run_after(0.2, canceller, target=later)
    cancel_earlier = await sched.run_after(0.2, canceller, target=earlier)
    await sched.run_after(0.4, victim, tag="unrelated")
    clock.advance(1)
    await app.executor(batch_size=10).run_until_idle()

    rows = {r.id: r for r in await all_rows(app)}
    assert rows[earlier].state is State.SUCCESS
    assert rows[cancel_earlier].result is False  # it had already run in this batch
    assert rows[later].state is State.CANCELED
    assert rows[cancel_later].result is True
    assert {r.args["tag"]: r.state for r in rows.values() if r.name == victim.name} == {
        "earlier": State.SUCCESS,
        "later": State.CANCELED,
        "unrelated": State.SUCCESS,
    }
    assert "later" not in ran
    if not with_failure:
        assert ran == ["earlier", "unrelated"]


class _Blocking:
    """A mutation that runs until released: ``started`` once it runs, ``release`` ends it."""

    def __init__(self, app: durafn.App) -> None:
        self.started = anyio.Event()
        self.release = anyio.Event()

        @app.mutation(timeout=30)
        async def slow(ctx: MutationCtx) -> None:
            self.started.set()
            await self.release.wait()

        self.ref = slow


async def _lanes_idle(executor: durafn.Executor, lanes: int) -> None:
    """Until every mutation lane is idle: one watching, the others parked."""
    mutations = executor._mutations
    with anyio.fail_after(CEILING):
        while not (mutations._watching and len(mutations._parked) == lanes - 1):  # noqa: ASYNC110 - no event tells it
            await anyio.sleep(0.01)


async def test_idle_lanes_do_not_spin_while_a_long_mutation_runs(app: durafn.App) -> None:
    """A due row locked by another lane's long mutation is not work for an idle lane:
    the idle lanes sleep instead of re-claiming in a loop."""
    from sqlalchemy import event

    blocking = _Blocking(app)
    statements = 0

    def _count(*_: object) -> None:
        nonlocal statements
        statements += 1

    sid = await app.scheduler().run_after(0, blocking.ref)
    async with app.run_executor(mutation_lanes=4, poll_interval=3600) as executor:
        await blocking.started.wait()
        event.listen(app.engine.sync_engine, "before_cursor_execute", _count)
        # Settled: a quiet 0.1 s. (Until the LISTEN connection is up, which can take a
        # while on a busy server, its first wake-up sends every loop to claim once.)
        with anyio.fail_after(CEILING):
            while True:
                before = statements
                await anyio.sleep(0.1)
                if statements == before:
                    break
        statements = 0
        await anyio.sleep(0.2)  # a spinning lane would issue hundreds of statements here
        event.remove(app.engine.sync_engine, "before_cursor_execute", _count)
        blocking.release.set()
        await executor.wait_for(sid)
    assert statements <= 4


async def test_a_wake_up_sends_one_idle_lane_to_claim_not_every_lane(
    app: durafn.App, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Idle lanes beyond the one that watches park: a row scheduled to an idle executor of
    sixteen lanes is claimed by the watcher, and one parked lane claims as it takes over
    the watch. Every lane used to claim (and read the next due time) on every wake-up:
    sixteen claims at least.

    Not an exact count: a wake-up that comes while the watcher runs the row (PostgreSQL's
    NOTIFY, back in this process after the scheduler's own wake-up) sends the watcher to
    claim again and wakes its successor, which unparks one more; that made five claims
    where this test once allowed four. Half the lanes is the bound: far above what the
    design makes, far below what every lane claiming makes."""
    claims = 0
    real_claim = app._rt.driver.claim_mutations

    async def counted(*args: Any, **kwargs: Any) -> Any:
        nonlocal claims
        claims += 1
        return await real_claim(*args, **kwargs)

    monkeypatch.setattr(app._rt.driver, "claim_mutations", counted)

    @app.mutation
    async def noop(ctx: MutationCtx) -> None:
        pass

    lanes = 16
    async with app.run_executor(mutation_lanes=lanes, poll_interval=3600) as executor:

        async def settled() -> None:
            """Every lane idle, and no claim for 0.1 s. (Until the LISTEN connection is up,
            which can take a while on a busy server, its first wake-up sends a lane to
            claim.)"""
            with anyio.fail_after(CEILING):
                while True:
                    before = claims
                    await _lanes_idle(executor, lanes)
                    await anyio.sleep(0.1)
                    if claims == before:
                        return

        for _ in range(3):
            await settled()
            claims = 0
            sid = await app.scheduler().run_after(0, noop)
            await executor.wait_for(sid)
            await settled()
            # One wake-up here, two on PostgreSQL: its NOTIFY comes back to this process.
            assert 1 <= claims <= lanes // 2, claims
    assert {r.state for r in await all_rows(app)} == {State.SUCCESS}


async def test_a_row_due_while_a_lane_runs_a_long_mutation_finds_another_lane(
    app: durafn.App, engine_name: str
) -> None:
    """The watching lane that goes to claim hands the watch to a parked lane: a row
    scheduled while the first runs a long mutation is claimed by another lane at once."""
    if engine_name == "sqlite":
        pytest.skip("SQLite: a running batch holds the one write lock; nothing else is written")
    blocking = _Blocking(app)

    @app.mutation
    async def quick(ctx: MutationCtx) -> None:
        pass

    async with app.run_executor(mutation_lanes=4, poll_interval=3600) as executor:
        await _lanes_idle(executor, 4)
        long = await app.scheduler().run_after(0, blocking.ref)
        with anyio.fail_after(CEILING):
            await blocking.started.wait()
        sid = await app.scheduler().run_after(0, quick)
        assert (await executor.wait_for(sid, timeout=CEILING)).state is State.SUCCESS
        assert (await app.get(long)).state is State.PENDING  # type: ignore[union-attr]
        blocking.release.set()
        assert (await executor.wait_for(long, timeout=CEILING)).state is State.SUCCESS


def test_cancelled_callers_leave_the_event_loop_free_to_exit(db_url: str) -> None:
    with owned_sync() as token:
        result = subprocess.run(
            [sys.executable, "-m", "tests.apps.cancel_app", db_url],
            cwd=ROOT,
            env=tagged(token),
            capture_output=True,
            text=True,
            timeout=CEILING,
        )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "exited"
    assert "cancelled 0" not in result.stdout  # the deadlines did cut calls short


async def test_cancelling_the_host_still_gives_actions_their_grace(app: durafn.App) -> None:
    started = anyio.Event()

    @app.action
    async def brief(ctx: ActionCtx) -> str:
        started.set()
        await anyio.sleep(0.05)
        return "done"

    sid = await app.scheduler().run_after(0, brief)
    with anyio.CancelScope() as host:
        async with app.run_executor(grace_period=30):
            await started.wait()
            host.cancel()
            await anyio.sleep_forever()
    row = await app.get(sid)
    assert row is not None
    assert (row.state, row.result) == (State.SUCCESS, "done")


async def test_time_limits_hold_through_the_grace_of_a_cancelled_host(app: durafn.App) -> None:
    """The task that keeps time limits is shielded like the workers: a cancelled host's
    grace period does not let an action outlive its own limit."""
    started = anyio.Event()

    @app.action(timeout=0.05)
    async def stuck(ctx: ActionCtx) -> None:
        started.set()
        await anyio.sleep_forever()

    sid = await app.scheduler().run_after(0, stuck)
    with anyio.fail_after(CEILING), anyio.CancelScope() as host:
        async with app.run_executor(grace_period=30):
            await started.wait()
            host.cancel()
            await anyio.sleep_forever()
    row = await app.get(sid)
    assert row is not None and row.state is State.FAILED
    assert row.error is not None and row.error.type == "durafn.FunctionTimeoutError"


async def test_a_stop_returns_claimed_actions_that_never_started_to_pending(
    app: durafn.App,
) -> None:
    """Rows claimed ahead still queued when the grace period ends were never started:
    they go back to Pending for any worker, with their attempt uncounted."""
    started = anyio.Event()

    @app.action
    async def busy(ctx: ActionCtx) -> None:
        started.set()
        await anyio.sleep_forever()

    @app.action
    async def queued(ctx: ActionCtx) -> None:
        raise AssertionError("never started")

    sched = app.scheduler()
    busy_id = await sched.run_after(0, busy)
    queued_id = await sched.run_after(0, queued)
    executor = app.executor(concurrency=1, grace_period=0)
    pool = executor._actions
    pool.claim_pace.seconds, pool.action_pace.seconds = 1.0, 1e-6  # claim one row ahead
    async with executor:
        with anyio.fail_after(CEILING):
            await started.wait()
            while (await app.get(queued_id)).state is not State.IN_PROGRESS:  # type: ignore[union-attr]  # noqa: ASYNC110
                await anyio.sleep(0.005)
    busy_row, queued_row = await app.get(busy_id), await app.get(queued_id)
    assert busy_row is not None and busy_row.state is State.FAILED
    assert busy_row.error is not None and busy_row.error.type == "durafn.ExecutorShutdownError"
    assert queued_row is not None
    assert (queued_row.state, queued_row.attempts) == (State.PENDING, 0)
    await app.executor().run_until_idle()  # and it runs later, once
    queued_row = await app.get(queued_id)
    assert queued_row is not None and queued_row.state is State.FAILED
    assert queued_row.error is not None and "never started" in queued_row.error.message


def test_executor_options_are_checked(tmp_path: Path) -> None:
    app = durafn.App(f"sqlite+aiosqlite:///{tmp_path / 'x.db'}")
    with pytest.raises(durafn.ArgumentError, match=r"unknown executor option.*lanes; the options"):
        app.executor(lanes=2)  # type: ignore[call-arg]
    for options, message in [
        ({"mutation_lanes": 0}, "mutation_lanes must be an integer between 1 and 1000"),
        ({"poll_interval": 0.0}, "poll_interval must be a positive number"),
        ({"concurrency": 0}, "concurrency must be an integer between 1 and 100000"),
        ({"grace_period": -1.0}, "grace_period must be a non-negative"),
        ({"retention_interval": 0}, "retention_interval must be a positive"),
        ({"batch_size": 2.5}, "batch_size must be an integer"),
        ({"concurrency": "4"}, "concurrency must be an integer"),
    ]:
        with pytest.raises(durafn.ArgumentError, match=message):
            app.executor(**options)  # type: ignore[arg-type]


async def test_actions_claimed_while_stopping_get_the_grace_period(app: durafn.App) -> None:
    """A claim still waiting on the database when the executor stops finishes first; what
    it claimed is then cancelled after the grace period and recorded, like any other."""
    started: list[float] = []

    @app.action
    async def slow(ctx: ActionCtx) -> None:
        started.append(anyio.current_time())
        await anyio.sleep_forever()

    sid = await app.scheduler().run_after(0, slow)
    async with system_table_locked(app) as lock, anyio.create_task_group() as tg:

        async def release_soon() -> None:
            await anyio.sleep(0.2)
            await lock.rollback()

        async with app.run_executor(grace_period=0.1):
            await anyio.sleep(0.1)  # the dispatcher's claim is now waiting on the lock
            tg.start_soon(release_soon)
    row = await app.get(sid)
    assert row is not None
    assert row.state is State.FAILED
    assert row.error is not None and row.error.type == "durafn.ExecutorShutdownError"
    assert len(started) == 1  # started within the grace period, then cancelled


async def test_a_cancelled_run_until_idle_records_the_actions_that_finished(
    app: durafn.App,
) -> None:
    fast_returning = anyio.Event()
    stuck_running = anyio.Event()

    @app.action
    async def fast(ctx: ActionCtx) -> str:
        fast_returning.set()
        return "done"

    @app.action
    async def stuck(ctx: ActionCtx) -> None:
        # Running after the fast one has returned (its outcome is taken as it returns, before
        # its task next yields), then never ending.
        await fast_returning.wait()
        stuck_running.set()
        await anyio.sleep_forever()

    fast_id = await app.scheduler().run_after(0, fast)
    stuck_id = await app.scheduler().run_after(0, stuck)
    # Cancelled on the event, not after a guessed delay (a fixed 0.2 s failed on a loaded
    # machine: the cancel came before the fast action had run).
    with anyio.fail_after(CEILING):
        async with anyio.create_task_group() as tg:
            tg.start_soon(app.executor().run_until_idle)
            await stuck_running.wait()
            tg.cancel_scope.cancel()
    fast_row, stuck_row = await app.get(fast_id), await app.get(stuck_id)
    assert fast_row is not None and stuck_row is not None
    assert (fast_row.state, fast_row.result) == (State.SUCCESS, "done")
    assert stuck_row.state is State.FAILED
    assert stuck_row.error is not None
    assert stuck_row.error.type == "durafn.ExecutorShutdownError"


async def test_an_executor_whose_loop_fails_stops_with_a_typed_error(app: durafn.App) -> None:
    """The system table disappears under a running executor: it stops, promptly, with a
    DatabaseError (not a raw driver error, not an exception group, not a hang)."""
    # Whichever loop notices first (a claim, or the look for the next due row) names it.
    with (
        anyio.fail_after(CEILING),
        pytest.raises(durafn.DatabaseError, match="_scheduled_functions"),
    ):
        async with app.run_executor(poll_interval=0.01):
            async with app.engine.begin() as conn:
                await conn.execute(text("DROP TABLE _scheduled_functions"))
            await anyio.sleep_forever()


async def test_an_error_inside_the_block_passes_through_unchanged(app: durafn.App) -> None:
    with pytest.raises(LookupError, match="mine"):
        async with app.run_executor():
            raise LookupError("mine")


def test_executor_options_mirror_the_config() -> None:
    """ExecutorOptions (for mypy) restates ExecutorConfig's fields: keep the two in step."""
    import dataclasses
    import typing

    from durafn._executor import ExecutorOptions

    config = {f.name for f in dataclasses.fields(durafn.ExecutorConfig)}
    assert set(typing.get_type_hints(ExecutorOptions)) == config


async def test_background_actions_share_a_pool_of_at_most_concurrency_workers(
    app: durafn.App,
) -> None:
    """The running executor hands claimed actions to long-lived workers: never more than
    ``concurrency`` at once, and a worker whose action timed out carries on with the next."""
    crowd = _Crowd(app)

    @app.action(timeout=0.05)
    async def stuck(ctx: ActionCtx) -> None:
        await anyio.sleep_forever()

    sched = app.scheduler()
    stuck_id = await sched.run_after(0, stuck)
    ids = [await sched.run_after(0, crowd.act, n=n) for n in range(7)]
    async with app.run_executor(concurrency=3) as executor:
        rows = [await executor.wait_for(i) for i in [stuck_id, *ids]]
    assert crowd.peak == 3
    assert rows[0].state is State.FAILED
    assert rows[0].error is not None and rows[0].error.type == "durafn.FunctionTimeoutError"
    assert [(r.state, r.result) for r in rows[1:]] == [(State.SUCCESS, n) for n in range(7)]


async def test_a_short_time_limit_fires_while_a_longer_one_is_running(app: durafn.App) -> None:
    """One task keeps every worker's time limit: an action with a short limit, started
    while another runs with a long one, is still stopped at its own limit."""
    started, release = anyio.Event(), anyio.Event()

    @app.action(timeout=60)
    async def patient(ctx: ActionCtx) -> str:
        started.set()
        await release.wait()
        return "done"

    @app.action(timeout=0.05)
    async def hasty(ctx: ActionCtx) -> None:
        await anyio.sleep_forever()

    sched = app.scheduler()
    long_id = await sched.run_after(0, patient)
    async with app.run_executor(concurrency=2) as executor:
        with anyio.fail_after(CEILING):
            await started.wait()
        short = await executor.wait_for(await sched.run_after(0, hasty), timeout=10)
        assert short.error is not None and short.error.type == "durafn.FunctionTimeoutError"
        release.set()
        assert (await executor.wait_for(long_id, timeout=CEILING)).result == "done"


async def test_an_action_that_outlives_its_limit_by_ignoring_the_cancel_counts_as_done(
    app: durafn.App,
) -> None:
    """An action that catches its time limit's cancellation and returns is recorded with
    what it returned, and its worker carries on with the next row in a fresh scope."""

    @app.action(timeout=0.05)
    async def stubborn(ctx: ActionCtx) -> str:
        try:
            await anyio.sleep_forever()
        except anyio.get_cancelled_exc_class():
            return "ignored the limit"
        return "unreachable"

    @app.action
    async def after(ctx: ActionCtx, n: int) -> int:
        await anyio.sleep(0.001)  # a scope still cancelled would stop it here
        return n

    sched = app.scheduler()
    first = await sched.run_after(0, stubborn)
    rest = [await sched.run_after(0, after, n=n) for n in range(3)]
    executor = app.executor(concurrency=1)
    # A pace at which rows are claimed ahead: the next rows wait in the worker's queue
    # and run in the scope right after ``stubborn``, not in a scope of their own.
    executor._actions.claim_pace.seconds, executor._actions.action_pace.seconds = 1.0, 1e-6
    async with executor:
        assert (await executor.wait_for(first, timeout=CEILING)).result == "ignored the limit"
        rows = [await executor.wait_for(i, timeout=CEILING) for i in rest]
    assert [(r.state, r.result) for r in rows] == [(State.SUCCESS, n) for n in range(3)]


async def test_claims_ahead_cover_one_claim_round_trip(app: durafn.App) -> None:
    """Rows claimed beyond the free slots, at most ``concurrency``: what the workers start
    within the horizon (0.25 s) at the recent pace, at least twice what they start during
    one claim's round trip; none for actions longer than the horizon. A slot counts while
    its action runs within a few times the pace: 20 ms actions, every one running longer
    than a 4 ms round trip, still free their slots soon (issue 53's W1); a straggler
    does not."""
    from durafn._executor.actions import AHEAD_HORIZON

    assert AHEAD_HORIZON == 0.25
    executor = app.executor(concurrency=10)
    pool = executor._actions
    assert pool.claim_ahead() == 0  # no pace known yet
    pool.claim_pace.seconds = 0.004
    pool.action_pace.seconds = 0.1  # 10 workers start 100 a second: 25 in the horizon
    assert pool.claim_ahead() == 10
    pool.action_pace.seconds = 0.5  # 5 in the horizon
    assert pool.claim_ahead() == 5
    pool.action_pace.seconds = 1.0
    assert pool.claim_ahead() == 2
    pool.action_pace.seconds = 5.0  # longer than the horizon: claims for free slots only
    assert pool.claim_ahead() == 0
    pool.claim_pace.seconds = 0.4  # a slow round trip covers more: two of them
    assert pool.claim_ahead() == 1
    pool.claim_pace.seconds = 0.004
    from durafn._executor.deadlines import Slot
    from durafn._store import Claimed

    row = Claimed(durafn.ScheduledFunctionId("r"), "f", "{}", 1, None, 0.0)
    pool.action_pace.seconds = 1.0
    now = time.monotonic()
    for _ in range(10):  # every slot half-way through its action: all of them count
        pool.slots.add(Slot(row=row, started=now - 0.5))
    assert pool.claim_ahead() == 2
    pool.slots.clear()
    for _ in range(5):  # five stragglers, 10 s into actions whose pace is 1 s
        pool.slots.add(Slot(row=row, started=now - 10.0))
    assert pool.claim_ahead() == 1


async def test_short_actions_claimed_ahead_each_run_once(app: durafn.App) -> None:
    """A drain of short actions, where claims run ahead of the workers: every row runs
    exactly once and ends Success after one attempt."""
    runs: list[int] = []
    overlapped = 0  # runs while the next claim was on the wire

    @app.action
    async def short(ctx: ActionCtx, n: int) -> None:
        nonlocal overlapped
        runs.append(n)
        overlapped += executor._claims.in_flight > 0

    @app.mutation
    async def fan_out(ctx: MutationCtx, count: int) -> None:
        for n in range(count):
            await ctx.scheduler.run_after(0, short, n=n)

    await app.run_mutation(fan_out, 400)
    executor = app.executor(concurrency=4)
    async with executor:
        with anyio.fail_after(CEILING):
            await executor.wait_until_idle()
    assert sorted(runs) == list(range(400))
    assert overlapped > 0
    rows = await all_rows(app)
    assert {(r.state, r.attempts) for r in rows if r.name.endswith("short")} == {(State.SUCCESS, 1)}


async def test_the_system_clock_never_wakes_before_the_deadline() -> None:
    clock = durafn.SystemClock()
    for delay in (0.0005, 0.002, 0.004):
        deadline = clock.now() + delay
        await clock.sleep_until(deadline)
        assert clock.now() >= deadline


@pytest.mark.parametrize(("batch_time", "expected"), [(1e-9, [0, 1, 2, 3]), (60.0, [0, 0, 0, 0])])
async def test_a_batch_commits_once_it_has_run_for_batch_time(
    app: durafn.App, batch_time: float, expected: list[int]
) -> None:
    """Past ``batch_time`` a batch commits what it ran and leaves the rest of its claim
    Pending for the next batch: each mutation then sees its predecessors committed."""
    seen: list[int] = []

    @app.mutation
    async def step(ctx: MutationCtx, n: int) -> None:
        # Read through another connection: only committed rows are visible there.
        seen.append(sum(r.state is State.SUCCESS for r in await all_rows(app)))

    sched = app.scheduler()
    ids = [await sched.run_after(0, step, n=n) for n in range(4)]
    async with app.run_executor(batch_time=batch_time, mutation_lanes=1) as executor:
        rows = [await executor.wait_for(i) for i in ids]
    assert seen == expected
    assert {r.state for r in rows} == {State.SUCCESS}


async def test_slow_mutations_are_claimed_a_few_at_a_time(app: durafn.App) -> None:
    """A batch claims what fits in batch_time at the recent pace, not batch_size rows it
    would lock and then leave (run_until_idle claims whole batches)."""

    @app.mutation
    async def slow(ctx: MutationCtx) -> None:
        await anyio.sleep(0.003)

    sched = app.scheduler()
    ids = [await sched.run_after(0, slow) for _ in range(3)]
    executor = app.executor(batch_time=0.01)
    assert executor._mutations.claim_size(True) == executor.config.batch_size  # no pace known yet
    async with executor:
        for i in ids:
            await executor.wait_for(i)
    assert 1 <= executor._mutations.claim_size(True) <= 4  # 10 ms at 3 ms or more each
    assert executor._mutations.claim_size(False) == executor.config.batch_size


def test_ids_do_not_follow_the_users_random_seed() -> None:
    import random
    import uuid

    from durafn._store import new_id

    low = (1 << 44) - 1
    random.seed(7)
    first = uuid.UUID(new_id(1.0)).int & low
    random.seed(7)
    second = uuid.UUID(new_id(1.0)).int & low
    assert first != second


async def test_a_wall_clock_stepped_back_does_not_stretch_a_sleep(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import time

    clock = durafn.SystemClock()
    real = time.time
    calls = 0

    def stepping() -> float:
        nonlocal calls
        calls += 1
        return real() - (100.0 if calls > 1 else 0.0)  # stepped back 100 s after 1st read

    deadline = real() + 0.002
    monkeypatch.setattr(time, "time", stepping)
    with anyio.fail_after(2):
        await clock.sleep_until(deadline)
