"""A long-lived app, as users run one: every scheduling route called again and again on
the same pooled connections, and driver errors on every route.

PostgreSQL plans a prepared statement anew for its first five runs on a connection and
may then switch to one generic plan, in which the parameters are unknown. A statement
that only works with its parameters known (an upsert whose ``ON CONFLICT ... WHERE``
must match a partial index) then fails from its sixth run on, which no test that makes a
fresh app per case ever reaches. Two defences: the suite's PostgreSQL databases are set
to ``plan_cache_mode = force_generic_plan`` (``conftest.py``), so every statement of every
test runs under a generic plan from its first run; and these tests repeat each route past
the fifth run, which would catch it on a database set to the default too.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

import durafn
from durafn import ActionCtx, Debounce, Flow, MutationCtx, State, Throttle
from durafn.testing import FakeClock, all_rows

from .support.helpers import CEILING, count, wait_until
from .support.models import Effect

pytestmark = pytest.mark.anyio

RUNS = 8
"""More than the five custom plans PostgreSQL makes before it may go generic."""

KEY_MODES = ["replace", "preserve_run_at", "unsafe_dedupe"]


@pytest.mark.postgres_only  # SQLite has no plan cache to switch
async def test_the_suite_runs_postgresql_statements_under_generic_plans(
    postgres_url: str,
) -> None:
    """The setting the defence above relies on (a database recreated without it would
    quietly lose it)."""
    app = durafn.App(postgres_url)
    async with app.engine.connect() as conn:
        mode = (await conn.execute(text("SHOW plan_cache_mode"))).scalar()
    await app.aclose()
    assert mode == "force_generic_plan"


@pytest.mark.parametrize("mode", KEY_MODES)
async def test_keyed_schedules_keep_working_on_every_route(app: durafn.App, mode: str) -> None:
    @app.mutation(name="ll:note")
    async def note(ctx: MutationCtx, n: int) -> None:
        pass

    @app.mutation(name="ll:in_mutation")
    async def in_mutation(ctx: MutationCtx, n: int) -> str:
        return await ctx.scheduler.run_after(60, keyed(f"m{n % 2}"), n)

    @app.action(name="ll:in_action")
    async def in_action(ctx: ActionCtx, n: int) -> str:
        return await ctx.scheduler.run_after(60, keyed(f"a{n % 2}"), n)

    @app.mutation(name="ll:many_in_mutation")
    async def many_in_mutation(ctx: MutationCtx, n: int) -> list[durafn.ScheduledFunctionId]:
        return await ctx.scheduler.run_many([keyed(f"r{n % 2}").call(n), note.call(n)])

    def keyed(key: str) -> durafn.MutationRef[[int], None]:
        return note.options(key=key, key_mode=mode)  # type: ignore[arg-type]

    sessions = []
    holders: dict[str, set[str]] = {}

    def held(key: str, id: str) -> None:
        holders.setdefault(key, set()).add(id)

    for n in range(RUNS):
        held(f"d{n % 2}", await app.scheduler().run_after(60, keyed(f"d{n % 2}"), n))
        held(f"m{n % 2}", await app.run_mutation(in_mutation, n))
        held(f"a{n % 2}", await app.run_action(in_action, n))
        if mode != "unsafe_dedupe":  # a batch refuses it (Graphile's rule)
            [id] = await app.scheduler().run_many([keyed(f"b{n % 2}").call(n)])
            held(f"b{n % 2}", id)
            first, _ = await app.run_mutation(many_in_mutation, n)
            held(f"r{n % 2}", first)
        async with AsyncSession(app.engine) as session, session.begin():
            held(f"s{n % 2}", await app.scheduler(session).run_after(60, keyed(f"s{n % 2}"), n))
            sessions.append(session)
    # Each key has one Pending holder all along, whose id every call returned.
    assert all(len(ids) == 1 for ids in holders.values()), holders
    pending = [r for r in await all_rows(app) if r.key is not None]
    assert sorted(r.key or "" for r in pending) == sorted(holders)
    assert {r.state for r in pending} == {State.PENDING}
    # The last call's arguments, or the first's where a call leaves the holder as it is.
    for row in pending:
        parity = int((row.key or "")[-1])
        assert row.args["n"] == (parity if mode == "unsafe_dedupe" else RUNS - 2 + parity)


async def test_debounced_and_throttled_calls_keep_working_on_one_connection(
    app: durafn.App, clock: FakeClock
) -> None:
    @app.mutation(name="ll:debounced", flow=Flow(key="d", debounce=Debounce(quiet=10)))
    async def debounced(ctx: MutationCtx, n: int) -> None:
        ctx.db.add(Effect(key=f"debounced {n}"))

    @app.mutation(name="ll:leading", flow=Flow(key="l", debounce=Debounce(5, edge="leading")))
    async def leading(ctx: MutationCtx, n: int) -> None:
        ctx.db.add(Effect(key=f"leading {n}"))

    @app.mutation(name="ll:throttled", flow=Flow(key="t", throttle=Throttle(per=60)))
    async def throttled(ctx: MutationCtx, n: int) -> None:
        ctx.db.add(Effect(key=f"throttled {n}"))

    for n in range(RUNS):
        for ref in (debounced, leading, throttled):
            await app.scheduler().run_after(0, ref, n)
        clock.advance(1)
    await durafn.testing.finish_all(app.executor(), clock)
    runs = await all_rows(app)
    assert {r.state for r in runs} == {State.SUCCESS}
    by_name = {
        name: [r.args["n"] for r in runs if r.name == name] for name in {r.name for r in runs}
    }
    assert by_name["ll:debounced"] == [RUNS - 1]  # one run, the last call's arguments
    assert by_name["ll:leading"] == [0]  # the first call at once; the rest absorbed
    # Due at once, but joined by every call before it started: one run, the last call's.
    assert by_name["ll:throttled"] == [RUNS - 1]


async def test_a_running_executor_claims_each_new_round_of_mutations(app: durafn.App) -> None:
    """One executor, running all along on the fake clock (its poll never comes, so a lost
    wake-up hangs here), given round after round of mutations and an action after them.
    Scheduling the action locks the round's mutations until it commits (``after=``
    marks them awaited), and a claim in between skips them; that commit must wake the
    mutation lanes, not only the actions (it hung in about one run in two on PostgreSQL)."""

    @app.mutation(name="ll:part")
    async def part(ctx: MutationCtx, n: int) -> None:
        pass

    @app.action(name="ll:join")
    async def join(ctx: ActionCtx, n: int) -> None:
        pass

    async with app.run_executor() as executor:
        for n in range(RUNS):
            ids = await app.scheduler().run_many([part.call(n) for _ in range(20)])
            joined = await app.scheduler().run_after(0, join.options(after=ids), n)
            assert (await executor.wait_for(joined, timeout=CEILING)).state is State.SUCCESS
    runs = await all_rows(app)
    assert len(runs) == RUNS * 21
    assert {r.state for r in runs} == {State.SUCCESS}


async def test_a_running_executor_finishes_rounds_of_every_kind_of_row(app: durafn.App) -> None:
    """One executor, running all along on the fake clock, given round after round of
    every class of row at once (plain and keyed mutations, queued and batched actions),
    a group's callback and a join after them all, scheduled from outside, from a
    mutation and from an action in turn: each round finishes, so no wake-up is lost
    between the classes' claims, the locks the scheduling takes, and the releases."""
    completed: list[tuple[int, str]] = []

    @app.mutation(name="ll:plain")
    async def plain(ctx: MutationCtx, n: int) -> None:
        pass

    @app.mutation(name="ll:keyed", flow=Flow(key=lambda a: f"k{a['n'] % 3}", concurrency=1))
    async def keyed(ctx: MutationCtx, n: int) -> None:
        pass

    @app.action(name="ll:queued", queue="ll:q")
    async def queued(ctx: ActionCtx, n: int) -> None:
        pass

    @app.action(name="ll:batched", batch=durafn.Batch(max_size=4, max_wait=0))
    async def batched(ctx: ActionCtx, items: list[int]) -> list[None]:
        return [None for _ in items]

    @app.mutation(name="ll:done")
    async def done(ctx: MutationCtx, group: durafn.GroupCompletion) -> None:
        assert ctx.run_id is not None
        completed.append((group.succeeded, ctx.run_id))

    @app.action(name="ll:joined")
    async def joined(ctx: ActionCtx, round: int) -> None:
        pass

    async def schedule(scheduler: durafn.Scheduler, round: int) -> list[str]:
        calls = [ref.call(n) for n in range(6) for ref in (plain, keyed, queued, batched)]
        ids = await scheduler.run_many(calls)
        group = await scheduler.group(ids, on_complete=done)
        return [await scheduler.run_after(0, joined.options(after=ids), round), group]

    @app.mutation(name="ll:plan")
    async def plan(ctx: MutationCtx, round: int) -> list[str]:
        return await schedule(ctx.scheduler, round)

    @app.action(name="ll:plan_in_action")
    async def plan_in_action(ctx: ActionCtx, round: int) -> list[str]:
        return await schedule(ctx.scheduler, round)

    async with app.run_executor() as executor:
        for round in range(RUNS):
            if round % 3 == 0:
                last = await schedule(app.scheduler(), round)
            elif round % 3 == 1:
                last = await app.run_mutation(plan, round)
            else:
                last = await app.run_action(plan_in_action, round)
            for id in last:
                assert (await executor.wait_for(id, timeout=CEILING)).state is State.SUCCESS

        # Each group's row has scheduled its callback: wait for every callback's run (a
        # mutation's body may run again if its batch is rolled back: count its rows).
        async def called_back() -> bool:
            return len({id for _, id in completed}) == RUNS

        await wait_until(called_back, "every group's callback has run")
        for _, id in completed:
            assert (await executor.wait_for(id, timeout=CEILING)).state is State.SUCCESS
    assert {succeeded for succeeded, _ in completed} == {24}
    runs = await all_rows(app)
    assert {r.state for r in runs} == {State.SUCCESS}
    names = [r.name for r in runs]
    for name in ("ll:plain", "ll:keyed", "ll:queued", "ll:batched"):
        assert names.count(name) == 6 * RUNS
    for name in ("ll:joined", "durafn:group_complete", "ll:done"):
        assert names.count(name) == RUNS


# -- driver errors on every route ---------------------------------------------------------

_SQLITE_TRIGGER = """
CREATE TRIGGER ll_refuse BEFORE INSERT ON _scheduled_functions
BEGIN SELECT RAISE(ABORT, 'refused by a test trigger'); END
"""
_PG_FUNCTION = """
CREATE FUNCTION ll_refuse() RETURNS trigger LANGUAGE plpgsql AS
$$ BEGIN RAISE EXCEPTION 'refused by a test trigger'; END $$
"""
_PG_TRIGGER = """
CREATE TRIGGER ll_refuse BEFORE INSERT ON _scheduled_functions
FOR EACH ROW EXECUTE FUNCTION ll_refuse()
"""


@asynccontextmanager
async def inserts_refused(app: durafn.App) -> AsyncIterator[None]:
    """The database refuses every new row of ``_scheduled_functions`` (a real error from
    the real engine: a trigger), and accepts them again afterwards."""
    postgres = app.engine.dialect.name == "postgresql"
    async with app.engine.begin() as conn:
        if postgres:
            await conn.execute(text(_PG_FUNCTION))
            await conn.execute(text(_PG_TRIGGER))
        else:
            await conn.execute(text(_SQLITE_TRIGGER))
    try:
        yield
    finally:
        async with app.engine.begin() as conn:
            await conn.execute(
                text("DROP TRIGGER ll_refuse" + (" ON _scheduled_functions" if postgres else ""))
            )
            if postgres:
                await conn.execute(text("DROP FUNCTION ll_refuse()"))


@pytest.mark.parametrize("keyed", [False, True], ids=["plain", "keyed"])
async def test_a_driver_error_while_scheduling_is_a_database_error_on_every_route(
    app: durafn.App, keyed: bool
) -> None:
    """From outside, from a mutation (what it wrote rolls back with it), from an action,
    through the caller's session, one call or a batch: a ``DatabaseError`` that names
    what was being done, never a raw driver error, and nothing written."""

    @app.mutation(name="ll:note")
    async def note(ctx: MutationCtx, n: int) -> None:
        pass

    target = note.options(key="k") if keyed else note

    @app.mutation(name="ll:in_mutation")
    async def in_mutation(ctx: MutationCtx, n: int) -> str:
        ctx.db.add(Effect(key=f"mutation {n}"))
        return await ctx.scheduler.run_after(0, target, n)

    @app.mutation(name="ll:many_in_mutation")
    async def many_in_mutation(ctx: MutationCtx, n: int) -> list[durafn.ScheduledFunctionId]:
        ctx.db.add(Effect(key=f"many {n}"))
        return await ctx.scheduler.run_many(
            [target.call(n), target.call(n + 1)] if not keyed else [target.call(n)]
        )

    @app.action(name="ll:in_action")
    async def in_action(ctx: ActionCtx, n: int) -> str:
        return await ctx.scheduler.run_after(0, target, n)

    async def through_session(n: int) -> str:
        async with AsyncSession(app.engine) as session, session.begin():
            session.add(Effect(key=f"session {n}"))
            return await app.scheduler(session).run_after(0, target, n)

    routes = {
        "app.scheduler()": lambda n: app.scheduler().run_after(0, target, n),
        "run_many": lambda n: app.scheduler().run_many([target.call(n)]),
        "a mutation": lambda n: app.run_mutation(in_mutation, n),
        "run_many in a mutation": lambda n: app.run_mutation(many_in_mutation, n),
        "an action": lambda n: app.run_action(in_action, n),
        "your session": through_session,
    }
    async with inserts_refused(app):
        for n, (route, call) in enumerate(routes.items()):
            with pytest.raises(durafn.DatabaseError, match="refused by a test trigger") as caught:
                await call(n)
            assert "scheduling" in str(caught.value), route
    assert await all_rows(app) == []
    assert await count(app, Effect) == 0
