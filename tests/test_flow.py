"""Flow control in one process, on both engines: per-key concurrency, rate limits (GCRA
with bursts, over a simulated hour), fairness across keys, debounce, ``explain`` for every
reason, and bad flow options. Across 4 racing worker processes: test_queue_workers.py."""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

import anyio
import pytest
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy import text

import durafn
from durafn import ActionCtx, Debounce, Flow, MutationCtx, Queue, Rate, State, Throttle
from durafn.testing import FakeClock, finish_all

from .support.helpers import effects, row_of, wait_until
from .support.models import Effect
from .test_cli import invoke, invoke_json

pytestmark = pytest.mark.anyio


def by_user(args: Any) -> str:
    return f"user:{args['user']}"


async def a_worker(app: durafn.App) -> None:
    """A registered worker that serves every row (as a running ``durafn worker`` is)."""
    async with app.engine.begin() as conn:
        await conn.execute(
            text(
                "INSERT INTO _durafn_workers (id, hostname, pid, concurrency, started_at, "
                "heartbeat_at) VALUES ('w', 'h', 1, 1, 0, 0)"
            )
        )


async def all_done(app: durafn.App, ids: list[durafn.ScheduledFunctionId]) -> bool:
    return {(await row_of(app, i)).state for i in ids} == {State.SUCCESS}


async def has_workers(app: durafn.App) -> bool:
    return bool(await app.workers())


async def running(app: durafn.App, id: durafn.ScheduledFunctionId) -> bool:
    return (await row_of(app, id)).state is State.IN_PROGRESS


# -- concurrency -------------------------------------------------------------------------


async def test_at_most_n_rows_of_a_key_run_at_once(app: durafn.App, clock: FakeClock) -> None:
    running: Counter[str] = Counter()
    most: Counter[str] = Counter()

    @app.action(flow=Flow(key=by_user, concurrency=2))
    async def sync(ctx: ActionCtx, user: int, n: int) -> None:
        key = f"user:{user}"
        running[key] += 1
        most[key] = max(most[key], running[key])
        await anyio.sleep(0.01)  # long enough for the other claims to land meanwhile
        running[key] -= 1

    calls = [sync.call(1, n) for n in range(8)] + [sync.call(2, n) for n in range(3)]
    ids = await app.scheduler().run_many(calls)
    async with app.run_executor(concurrency=10, poll_interval=0.01):
        await wait_until(lambda: all_done(app, ids), "every row ran")
    assert most == {"user:1": 2, "user:2": 2}
    row = await row_of(app, ids[0])
    assert row.flow_key == "user:1"


async def test_a_key_of_concurrency_1_runs_its_mutations_one_after_another(
    app: durafn.App, clock: FakeClock
) -> None:
    @app.mutation(flow=Flow(key="ledger", concurrency=1))
    async def post(ctx: MutationCtx, n: int) -> None:
        ctx.db.add(Effect(key=f"p{n}"))

    await app.scheduler().run_many([post.call(n) for n in range(5)])
    await app.executor(batch_size=10).run_until_idle()
    assert await effects(app) == [f"p{n}" for n in range(5)]  # one batch, in order


# -- rate --------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["mutation", "action"])
async def test_a_rate_holds_over_a_simulated_hour_with_bursts(
    app: durafn.App, clock: FakeClock, kind: str
) -> None:
    """2 per 3 minutes with bursts of 3, for an hour: starts spaced 90 s apart after the
    first three, and no window of w seconds with more than 3 + w / 90 starts."""
    starts: list[float] = []
    flow = Flow(key="api", rate=Rate(2, per=180, burst=3))
    if kind == "mutation":

        @app.mutation(flow=flow, name="call")
        async def call_m(ctx: MutationCtx, n: int) -> None:
            starts.append(clock.now())

        fn: Any = call_m
    else:

        @app.action(flow=flow, name="call")
        async def call_a(ctx: ActionCtx, n: int) -> None:
            starts.append(clock.now())

        fn = call_a
    t0 = clock.now()
    await app.scheduler().run_many([fn.call(n) for n in range(43)])
    # As a worker would: run what is due, sleep until the budget allows the next start.
    executor = app.executor(concurrency=10, batch_size=10)
    assert await finish_all(executor, clock, max_steps=100) == 43
    offsets = [round(s - t0, 3) for s in starts]
    assert offsets[:3] == [0, 0, 0]  # the burst
    assert offsets[3:6] == [90, 180, 270]  # then one per interval
    assert offsets[-1] == 3600
    for i, start in enumerate(offsets):
        for j in range(i, len(offsets)):
            window = offsets[j] - start
            assert j - i + 1 <= 3 + window / 90 + 1e-9, (start, offsets[j])


async def test_a_spent_budget_sleeps_until_the_next_slot_without_spinning(
    app: durafn.App, clock: FakeClock
) -> None:
    @app.action(flow=Flow(key="slow", rate=Rate(1, per=1000)))
    async def ping(ctx: ActionCtx, n: int) -> None:
        pass

    ids = await app.scheduler().run_many([ping.call(n) for n in range(2)])
    executor = app.executor()
    assert await executor.run_until_idle() == 1
    assert executor._claims.hint.flow.wake_at == pytest.approx(clock.now() + 1000)
    assert (await row_of(app, ids[1])).state is State.PENDING
    clock.advance(1000)
    assert await executor.run_until_idle() == 1


async def test_a_batch_rolled_back_and_run_again_spends_its_budget_once(
    app: durafn.App, clock: FakeClock
) -> None:
    """A mutation that raises after a write restarts its batch (rolled back, claimed again
    with savepoints): the rate budget the first claim spent is rolled back with it."""
    flow = Flow(key="once", rate=Rate(2, per=3600, burst=2))

    @app.mutation(flow=flow)
    async def step(ctx: MutationCtx, n: int, fail: bool) -> None:
        ctx.db.add(Effect(key=f"s{n}"))
        await ctx.db.flush()
        if fail:
            raise ValueError("after a write")

    calls = [step.call(1, True), step.call(2, False), step.call(3, False)]
    ids = await app.scheduler().run_many(calls)
    await app.executor(batch_size=10).run_until_idle()
    states = [(await row_of(app, i)).state for i in ids]
    # Two starts allowed (burst 2), both spent once: the third waits for the next slot.
    assert states == [State.FAILED, State.SUCCESS, State.PENDING]
    assert await effects(app) == ["s2"]
    await a_worker(app)
    explained = await app.explain(ids[2])
    assert explained.reason == "rate_limited"
    assert explained.until is not None
    assert explained.until.timestamp() == pytest.approx(clock.now() + 1800)


# -- fairness ----------------------------------------------------------------------------


async def test_a_light_key_starts_within_one_round_of_a_heavy_one(
    app: durafn.App, clock: FakeClock
) -> None:
    @app.mutation(flow=Flow(key=lambda a: a["tenant"]))
    async def work(ctx: MutationCtx, tenant: str, n: int) -> None:
        ctx.db.add(Effect(key=f"{tenant}{n}"))

    sched = app.scheduler()
    await sched.run_many([work.call("heavy", n) for n in range(200)])
    clock.advance(1)
    await sched.run_after(0, work, "light", 0)
    executor = app.executor(batch_size=4)
    await executor._mutations.run_batch(timed=False)
    # The first batch: the heavy key's first row and the light key's, then more heavy.
    assert (await effects(app))[:2] == ["heavy0", "light0"]


async def test_weights_share_out_a_claim(app: durafn.App, clock: FakeClock) -> None:
    @app.mutation(flow=Flow(key=lambda a: a["tenant"], weight=3))
    async def gold(ctx: MutationCtx, tenant: str, n: int) -> None:
        ctx.db.add(Effect(key=f"{tenant}{n}"))

    @app.mutation(flow=Flow(key=lambda a: a["tenant"]))
    async def basic(ctx: MutationCtx, tenant: str, n: int) -> None:
        ctx.db.add(Effect(key=f"{tenant}{n}"))

    await app.scheduler().run_many(
        [gold.call("g", n) for n in range(10)] + [basic.call("b", n) for n in range(10)]
    )
    await app.executor(batch_size=8)._mutations.run_batch(timed=False)
    done = await effects(app)
    assert sorted(done) == sorted(["g0", "g1", "g2", "b0", "b1", "g3", "g4", "g5"])


@pytest.mark.parametrize("aging", [None, 1.0])
async def test_aging_lifts_a_low_priority_row_past_a_stream_of_urgent_ones(
    app: durafn.App, clock: FakeClock, aging: float | None
) -> None:
    """One row at priority 10 under a stream of priority -10 rows that fills every batch:
    aged one level a second, it competes at -10 after 20 s and runs then; not aged, never."""

    @app.mutation
    async def note(ctx: MutationCtx, tag: str) -> None:
        ctx.db.add(Effect(key=tag))

    sched = app.scheduler()
    t0 = clock.now()
    low = note.options(priority=10, flow=Flow(key="reports", aging=aging))
    await sched.run_after(0, low, "low")
    executor = app.executor(batch_size=2)
    for second in range(30):
        await sched.run_many([note.options(priority=-10).call(f"u{second}.{i}") for i in range(2)])
        await executor._mutations.run_batch(timed=False)
        if "low" in await effects(app):
            break
        clock.advance(1)
    ran = "low" in await effects(app)
    assert ran == (aging is not None)
    if aging is not None:
        assert clock.now() - t0 == 20


# -- debounce ----------------------------------------------------------------------------


@pytest.mark.parametrize("max_wait", [30, None])
async def test_debounce_runs_once_after_the_quiet_period_with_the_last_arguments(
    app: durafn.App, clock: FakeClock, max_wait: float | None
) -> None:
    @app.mutation(flow=Flow(key=by_user, debounce=Debounce(quiet=10, max_wait=max_wait)))
    async def reindex(ctx: MutationCtx, user: int, note: str) -> None:
        ctx.db.add(Effect(key=note))

    sched = app.scheduler()
    first = await sched.run_after(0, reindex, 1, "a")
    executor = app.executor()
    for note in ("b", "c"):  # a call every 4 s: each pushes the run 10 s on
        clock.advance(4)
        assert await executor.run_until_idle() == 0
        assert await sched.run_after(0, reindex, 1, note) == first
    await a_worker(app)
    explained = await app.explain(first)
    assert explained.reason == "debounced"
    assert explained.until is not None and explained.until.timestamp() == clock.now() + 10
    assert ("at the latest" in explained.message) == (max_wait is not None)
    clock.advance(10)
    assert await executor.run_until_idle() == 1
    assert await effects(app) == ["c"]


async def test_debounce_max_wait_runs_a_steady_stream(app: durafn.App, clock: FakeClock) -> None:
    @app.mutation(flow=Flow(key="feed", debounce=Debounce(quiet=10, max_wait=30)))
    async def rebuild(ctx: MutationCtx, note: str) -> None:
        ctx.db.add(Effect(key=note))

    sched, executor = app.scheduler(), app.executor()
    t0 = clock.now()
    for n in range(20):  # a call every 5 s, for 100 s: never quiet for 10 s
        await sched.run_after(0, rebuild, f"n{n}")
        await executor.run_until_idle()
        clock.advance(5)
    await executor.run_until_idle()
    runs = await effects(app)
    # Run at most 30 s after the first call of each round: t0+30 (n6), t0+65 (n13), ...
    assert runs[:2] == ["n6", "n13"]
    assert clock.now() - t0 == 100


async def test_debounce_accumulates_a_list_parameter(app: durafn.App, clock: FakeClock) -> None:
    seen: list[list[int]] = []

    @app.action(flow=Flow(key="batch", debounce=Debounce(quiet=5, accumulate="ids")))
    async def index(ctx: ActionCtx, ids: list[int]) -> None:
        seen.append(ids)

    sched = app.scheduler()
    await sched.run_after(0, index, [1, 2])
    await sched.run_after(0, index, [3])
    await sched.run_after(0, index, [])
    # In one batch too: each call joins the waiting row, in order.
    ids = await sched.run_many([index.call([4]), index.call([5, 6])])
    assert len(set(ids)) == 1
    clock.advance(5)
    await app.executor().run_until_idle()
    assert seen == [[1, 2, 3, 4, 5, 6]]


async def test_leading_edge_debounce_runs_the_first_call_and_absorbs_the_burst(
    app: durafn.App, clock: FakeClock
) -> None:
    @app.mutation(flow=Flow(key="save", debounce=Debounce(quiet=5, edge="leading")))
    async def autosave(ctx: MutationCtx, note: str) -> None:
        ctx.db.add(Effect(key=note))

    sched, executor = app.scheduler(), app.executor()
    first = await sched.run_after(0, autosave, "a")
    assert await executor.run_until_idle() == 1  # at once, not after the quiet period
    for note in ("b", "c", "d"):  # 4 s apart: each within 5 s of the one before
        clock.advance(4)
        assert await sched.run_after(0, autosave, note) == first
        assert await executor.run_until_idle() == 0
    clock.advance(5)  # quiet for 5 s: the next call starts a new burst, and runs
    second = await sched.run_after(0, autosave, "e")
    assert second != first
    assert await executor.run_until_idle() == 1
    assert await effects(app) == ["a", "e"]


async def test_leading_edge_max_wait_runs_a_steady_stream(
    app: durafn.App, clock: FakeClock
) -> None:
    rule = Debounce(quiet=10, max_wait=12, edge="leading")

    @app.mutation(flow=Flow(key="feed", debounce=rule))
    async def rebuild(ctx: MutationCtx, note: str) -> None:
        ctx.db.add(Effect(key=note))

    sched, executor = app.scheduler(), app.executor()
    for n in range(10):  # a call every 4 s: never quiet, a run at least every 12 s
        await sched.run_after(0, rebuild, f"n{n}")
        await executor.run_until_idle()
        clock.advance(4)
    assert await effects(app) == ["n0", "n3", "n6", "n9"]


async def test_throttle_runs_at_once_then_once_per_period(
    app: durafn.App, clock: FakeClock
) -> None:
    @app.mutation(flow=Flow(key=by_user, throttle=Throttle(per=10)))
    async def refresh(ctx: MutationCtx, user: int, note: str) -> None:
        ctx.db.add(Effect(key=note))

    sched, executor = app.scheduler(), app.executor()
    t0 = clock.now()
    first = await sched.run_after(0, refresh, 1, "a")
    assert await sched.run_after(0, refresh, 1, "b") == first  # not started: joins it
    assert await sched.run_after(0, refresh, 2, "other key") != first
    assert await executor.run_until_idle() == 2
    clock.advance(3)
    later = await sched.run_after(0, refresh, 1, "c")
    await a_worker(app)
    explained = await app.explain(later)
    assert explained.reason == "throttled"
    assert explained.until is not None and explained.until.timestamp() == t0 + 10
    clock.advance(3)
    assert await sched.run_after(0, refresh, 1, "d") == later
    assert await executor.run_until_idle() == 0
    clock.advance(4)
    assert await executor.run_until_idle() == 1
    assert await effects(app) == ["b", "other key", "d"]
    # A steady stream, a call a second for 35 s: a run every 10 s, on the period.
    starts: list[float] = []
    for n in range(35):
        clock.advance(1)
        await sched.run_after(0, refresh, 1, f"s{n}")
        if await executor.run_until_idle():
            starts.append(clock.now() - t0)
    assert starts == [20, 30, 40]


async def test_throttle_accumulates_a_list_parameter(app: durafn.App, clock: FakeClock) -> None:
    seen: list[list[int]] = []

    @app.action(flow=Flow(key="batch", throttle=Throttle(per=5, accumulate="ids")))
    async def index(ctx: ActionCtx, ids: list[int]) -> None:
        seen.append(ids)

    sched, executor = app.scheduler(), app.executor()
    await sched.run_after(0, index, [1])
    await executor.run_until_idle()
    await sched.run_many([index.call([2]), index.call([3, 4])])
    await sched.run_after(0, index, [5])
    clock.advance(5)
    await executor.run_until_idle()
    assert seen == [[1], [2, 3, 4, 5]]


# -- hooks -------------------------------------------------------------------------------


async def test_hooks_carry_the_flow_key(app: durafn.App, clock: FakeClock) -> None:
    seen: list[tuple[str, str | None]] = []
    for hook in ("enqueue", "before", "after", "success", "error", "failure"):
        app.on(hook)(lambda event: seen.append((event.hook, event.flow_key)))

    @app.mutation(flow=Flow(key=by_user, concurrency=1))
    async def charge(ctx: MutationCtx, user: int) -> None:
        pass

    @app.action(flow=Flow(key=by_user, rate=Rate(10)))
    async def mail(ctx: ActionCtx, user: int) -> None:
        raise ValueError("bounced")

    await app.scheduler().run_many([charge.call(1), mail.call(2)])
    await app.executor().run_until_idle()
    ran = ("enqueue", "before", "after")
    expected = [(h, "user:1") for h in (*ran, "success")]
    expected += [(h, "user:2") for h in (*ran, "error", "failure")]
    assert sorted(seen) == sorted(expected)


# -- explain -----------------------------------------------------------------------------


async def test_explain_names_what_holds_a_row(db_url: str, clock: FakeClock) -> None:
    app = durafn.App(db_url, clock=clock, queues={"q": Queue(concurrency=1), "r": Queue()})
    try:
        await app.migrate()

        @app.action(flow=Flow(key="k", concurrency=1), cancel="interrupt")
        async def keyed(ctx: ActionCtx) -> None:
            await anyio.sleep_forever()

        @app.action(cancel="interrupt")
        async def plain(ctx: ActionCtx) -> None:
            await anyio.sleep_forever()

        sched = app.scheduler()
        later = await sched.run_after(60, plain)
        assert (await app.explain(later)).reason == "not_due"
        now = await sched.run_after(0, plain.options(flags=["gpu"]))
        assert (await app.explain(now)).reason == "no_worker"
        async with app.run_executor(forbidden_flags=["gpu"], concurrency=4, grace_period=0.1):
            await wait_until(lambda: has_workers(app), "the worker registered")
            found = await app.explain(now)
            assert (found.reason, "gpu" in found.message) == ("forbidden_flag", True)
            first, second = await sched.run_after(0, keyed), await sched.run_after(0, keyed)
            await wait_until(lambda: running(app, first), "it started")
            held = await app.explain(second)
            assert (held.reason, held.held_by, held.flow_key) == ("key_full", [first], "k")
            assert (await app.explain(first)).reason == "running"
            in_q = await sched.run_after(0, plain.options(queue="q"))
            behind = await sched.run_after(0, plain.options(queue="q"))
            await wait_until(lambda: running(app, in_q), "it started")
            assert (await app.explain(behind)).reason == "queue_full"
            await app.pause_queue("r")
            paused = await sched.run_after(0, plain.options(queue="r"))
            assert (await app.explain(paused)).reason == "queue_paused"
            await app.cancel(first)
        assert (await app.explain(first)).reason == "finished"
        with pytest.raises(durafn.NotFoundError):
            await app.explain("00000000-0000-0000-0000-000000000000")
    finally:
        await app.aclose()


async def test_explain_says_ready_when_nothing_holds_a_row(app: durafn.App) -> None:
    @app.mutation
    async def noop(ctx: MutationCtx) -> None:
        pass

    sid = await app.scheduler().run_after(0, noop)
    await a_worker(app)
    assert (await app.explain(sid)).reason == "ready"


async def test_explain_says_when_rows_of_its_queue_start_first(db_url: str) -> None:
    app = durafn.App(db_url, queues={"q": Queue(concurrency=1)})
    try:
        await app.migrate()

        @app.mutation(queue="q")
        async def step(ctx: MutationCtx, n: int) -> None:
            pass

        first, second = await app.scheduler().run_many([step.call(1), step.call(2)])
        await a_worker(app)
        assert (await app.explain(first)).reason == "ready"
        behind = await app.explain(second)
        assert (behind.reason, behind.queue) == ("queue_order", "q")
        assert behind.message.startswith("1 due row(s) of its queue 'q' start before it")
    finally:
        await app.aclose()


# -- bad options -------------------------------------------------------------------------


def test_bad_flow_options_are_typed_errors() -> None:
    with pytest.raises(durafn.FlowError, match="Rate limit must be an integer"):
        Rate(0)
    with pytest.raises(durafn.FlowError, match="Flow concurrency"):
        Flow(key="k", concurrency=0)
    with pytest.raises(durafn.FlowError, match=r"max_wait .* shorter than quiet"):
        Debounce(quiet=10, max_wait=5)
    with pytest.raises(durafn.FlowError, match=r"edge='leading'.* cannot accumulate"):
        Debounce(quiet=1, accumulate="ids", edge="leading")
    with pytest.raises(durafn.FlowError, match="edge must be 'trailing' or 'leading'"):
        Debounce(quiet=1, edge="middle")  # type: ignore[arg-type]
    with pytest.raises(durafn.FlowError, match="Throttle per must be a positive number"):
        Throttle(per=0)
    with pytest.raises(durafn.FlowError, match="debounces or throttles, not both"):
        Flow(key="k", debounce=Debounce(quiet=1), throttle=Throttle(per=1))
    with pytest.raises(durafn.FlowError, match="Flow key must be a non-empty string"):
        Flow(key="")
    with pytest.raises(durafn.FlowError, match="Flow aging must be a positive number"):
        Flow(key="k", aging=0)
    with pytest.raises(durafn.SchedulingError, match="cannot be in a queue with a concurrency"):
        Queue(flow=Flow(key="k"))


async def test_a_flow_in_a_serial_queue_or_a_failing_key_is_refused(app: durafn.App) -> None:
    @app.action(flow=Flow(key=lambda a: a["missing"]))
    async def broken(ctx: ActionCtx, user: int) -> None:
        pass

    with pytest.raises(durafn.FlowError, match=r"flow key function of .* raised KeyError"):
        await app.scheduler().run_after(0, broken, 1)
    with pytest.raises(durafn.FlowError, match="cannot be in a queue with a concurrency"):
        await app.scheduler().run_after(0, broken.options(flow=Flow(key="k"), queue="serial"), 1)
    assert await app.list() == durafn.Page(items=[], next_cursor=None)


def test_the_cli_explains_a_row_and_lists_the_flow_keys(db_url: str) -> None:
    async def rows() -> list[durafn.ScheduledFunctionId]:
        app = durafn.App(db_url)
        try:
            await app.migrate()

            @app.mutation(flow=Flow(key="api", rate=Rate(1, per=3600)), name="flow:step")
            async def step(ctx: MutationCtx, n: int) -> None:
                pass

            ids = await app.scheduler().run_many([step.call(n) for n in range(3)])
            assert await app.executor().run_until_idle() == 1  # the budget is spent
            return ids
        finally:
            await app.aclose()

    ids = anyio.run(rows)
    result = invoke("explain", ids[1], "--url", db_url)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    # No worker is running, and after that the key's budget would hold it.
    assert lines[0] == f"{ids[1]} is Pending: no_worker"
    assert lines[2].startswith("then: its flow key 'api' has spent its rate budget (1 per 3600s)")
    explained = invoke_json("explain", ids[1], "--url", db_url)
    assert explained["reason"] == "no_worker" and explained["flow_key"] == "api"
    # A finished row in one line: how it ended, when, after how many runs.
    [done] = invoke("explain", ids[0], "--url", db_url).stdout.splitlines()
    assert re.fullmatch(rf"{ids[0]} is Success: it succeeded at \S+, after 1 run", done)
    [key] = invoke_json("stats", "--url", db_url)["flow_keys"]
    assert {k: key[k] for k in ("key", "due", "pending", "running", "held", "rate")} == {
        "key": "api",
        "due": 2,
        "pending": 2,
        "running": 0,
        "held": "rate_limited",
        "rate": "1/3600s burst 1",
    }
    assert "flow keys" in invoke("stats", "--url", db_url).stdout


async def test_inline_mode_leaves_keyed_rows_to_the_claim(app_url: tuple[str, bool]) -> None:
    app = durafn.App(app_url[0], inline=True)
    try:
        if not app_url[1]:
            await app.migrate()

        @app.mutation(flow=Flow(key="k", concurrency=1))
        async def keyed(ctx: MutationCtx) -> None:
            pass

        @app.mutation
        async def plain(ctx: MutationCtx) -> None:
            pass

        kept = await app.scheduler().run_after(0, keyed)
        ran = await app.scheduler().run_after(0, plain)
        assert (await row_of(app, ran)).state is State.SUCCESS
        assert (await row_of(app, kept)).state is State.PENDING
    finally:
        await app.aclose()


async def test_keyed_rows_in_a_routing_queue_keep_their_key_limit(
    db_url: str, clock: FakeClock
) -> None:
    """A queue that only routes (no limit) holds keyed and plain rows: the queue's head
    read takes its plain row, never a keyed one past its key's concurrency."""
    app = durafn.App(db_url, clock=clock, queues={"r": Queue(concurrency=None)})
    try:
        await app.migrate()

        @app.action(queue="r", flow=Flow(key="k", concurrency=1), cancel="interrupt")
        async def keyed(ctx: ActionCtx) -> None:
            await anyio.sleep_forever()

        @app.action(queue="r")
        async def plain(ctx: ActionCtx) -> None:
            pass

        sched = app.scheduler()
        ids = [await sched.run_after(0, keyed) for _ in range(3)]
        other = await sched.run_after(0, plain)
        async with app.run_executor(concurrency=5, grace_period=0.1):
            await wait_until(lambda: running(app, ids[0]), "the first keyed row started")
            await wait_until(lambda: done(app, other), "the plain row ran")
            states = [(await row_of(app, i)).state for i in ids]
            assert states == [State.IN_PROGRESS, State.PENDING, State.PENDING]
            await wait_until(lambda: has_workers(app), "the worker registered")
            assert (await app.explain(ids[1])).reason == "key_full"
            for id in ids:
                await app.cancel(id)
    finally:
        await app.aclose()


async def done(app: durafn.App, id: durafn.ScheduledFunctionId) -> bool:
    return (await row_of(app, id)).state is State.SUCCESS


async def test_run_until_idle_runs_the_rows_of_every_key(app: durafn.App) -> None:
    """A claim visits 16 keys at most: run_until_idle goes on while keys are left."""

    @app.mutation(flow=Flow(key=lambda a: f"k{a['n']}"))
    async def note(ctx: MutationCtx, n: int) -> None:
        ctx.db.add(Effect(key=f"m{n}"))

    @app.action(flow=Flow(key=lambda a: f"k{a['n']}"))
    async def ping(ctx: ActionCtx, n: int) -> None:
        pass

    await app.scheduler().run_many([note.call(n) for n in range(40)])
    assert await app.executor().run_until_idle() == 40
    assert len(await effects(app)) == 40
    await app.scheduler().run_many([ping.call(n) for n in range(40)])
    assert await app.executor(concurrency=100).run_until_idle() == 40


async def test_racing_throttled_calls_join_one_run(app: durafn.App, clock: FakeClock) -> None:
    """Calls from many tasks at once, each its own transaction (on PostgreSQL, each on its
    own connection): the key's window is locked, so they all join the first one's row."""
    seen: list[list[int]] = []

    @app.action(flow=Flow(key="batch", throttle=Throttle(per=5, accumulate="ids")))
    async def index(ctx: ActionCtx, ids: list[int]) -> None:
        seen.append(ids)

    ids: list[durafn.ScheduledFunctionId] = []

    async def call(n: int) -> None:
        ids.append(await app.scheduler().run_after(0, index, [n]))

    async with anyio.create_task_group() as tg:
        for n in range(20):
            tg.start_soon(call, n)
    assert len(set(ids)) == 1
    await app.executor().run_until_idle()
    assert len(seen) == 1 and sorted(seen[0]) == list(range(20))


async def test_functions_sharing_a_flow_key_coalesce_apart(
    app: durafn.App, clock: FakeClock
) -> None:
    @app.mutation(flow=Flow(key=by_user, throttle=Throttle(per=60)))
    async def refresh(ctx: MutationCtx, user: int) -> None:
        ctx.db.add(Effect(key=f"refresh {user}"))

    @app.mutation(flow=Flow(key=by_user, debounce=Debounce(quiet=5, edge="leading")))
    async def alert(ctx: MutationCtx, user: int, note: str) -> None:
        ctx.db.add(Effect(key=f"alert {note}"))

    @app.mutation(flow=Flow(key=by_user, debounce=Debounce(quiet=5)))
    async def reindex(ctx: MutationCtx, user: int) -> None:
        ctx.db.add(Effect(key=f"reindex {user}"))

    sched = app.scheduler()
    assert len({await sched.run_after(0, f, 1) for f in (refresh, reindex)}) == 2
    assert await sched.run_after(0, alert, 1, "a") != await sched.run_after(0, refresh, 1)
    clock.advance(5)
    await app.executor().run_until_idle()
    assert sorted(await effects(app)) == ["alert a", "refresh 1", "reindex 1"]


async def test_a_running_mutation_never_joins_its_own_row(
    app: durafn.App, clock: FakeClock
) -> None:
    """A throttled (or debounced) mutation that calls its own key while it runs makes the
    key's next run: its own row, claimed by the batch, is Pending still in the batch's
    transaction, but started. Inside a mutation, a call that joins a row returns its id."""
    joined: list[bool] = []

    @app.mutation(flow=Flow(key="feed", throttle=Throttle(per=10)))
    async def rebuild(ctx: MutationCtx, note: str) -> None:
        ctx.db.add(Effect(key=note))
        if note == "first":
            again = await ctx.scheduler.run_after(0, rebuild, "from inside")
            joined.append(again == await ctx.scheduler.run_after(0, rebuild, "last"))

    @app.mutation(flow=Flow(key="quiet", debounce=Debounce(quiet=3)))
    async def settle(ctx: MutationCtx, note: str) -> None:
        ctx.db.add(Effect(key=note))
        if note == "first settle":
            await ctx.scheduler.run_after(0, settle, "second settle")

    await app.scheduler().run_after(0, rebuild, "first")
    await app.scheduler().run_after(0, settle, "first settle")
    executor = app.executor()
    await finish_all(executor, clock)
    assert joined == [True]
    assert sorted(await effects(app)) == ["first", "first settle", "last", "second settle"]


async def test_a_cancelled_leading_run_absorbs_no_call(app: durafn.App, clock: FakeClock) -> None:
    @app.mutation(flow=Flow(key="save", debounce=Debounce(quiet=5, edge="leading")))
    async def autosave(ctx: MutationCtx, note: str) -> None:
        ctx.db.add(Effect(key=note))

    sched = app.scheduler()
    first = await sched.run_after(0, autosave, "a")
    await app.cancel(first)
    clock.advance(1)
    second = await sched.run_after(0, autosave, "b")  # within quiet: yet nothing ran
    assert second != first
    await app.executor().run_until_idle()
    assert await effects(app) == ["b"]


# -- the fake clock's helpers and held rows --------------------------------------------

_HELD: dict[str, tuple[Flow | str, list[float]]] = {
    # What holds the rows, and the times (from the start) each of four rows runs at.
    "rate 5/s burst 2": (Flow(key="k", rate=Rate(5, per=1, burst=2)), [0, 0, 0.2, 0.4]),
    "rate 1/s": (Flow(key="k", rate=Rate(1)), [0, 1, 2, 3]),
    "rate 3/s": (Flow(key="k", rate=Rate(3)), [0, 1 / 3, 2 / 3, 1]),
    "rate 7 per 3s burst 3": (Flow(key="k", rate=Rate(7, per=3, burst=3)), [0, 0, 0, 3 / 7]),
    "rate 10/ms": (Flow(key="k", rate=Rate(10, per=0.001)), [0, 0.0001, 0.0002, 0.0003]),
    "key of 1 (actions)": (Flow(key="k", concurrency=1), [0, 0, 0, 0]),
    "serial queue": ("serial", [0, 0, 0, 0]),
}


@pytest.mark.parametrize("helper", ["finish_all", "advance"])
@pytest.mark.parametrize("held", list(_HELD))
async def test_the_fake_clock_helpers_stop_whenever_a_held_row_may_start(
    app: durafn.App, clock: FakeClock, held: str, helper: str
) -> None:
    """``finish_all`` and ``advance`` step the clock to every moment a held row becomes
    claimable (a rate's slots, a key or a queue freed), run it there, and end."""
    ran: list[float] = []

    @app.action(name="held:act")
    async def act(ctx: ActionCtx, n: int) -> None:
        ran.append(clock.now())

    hold, expected = _HELD[held]
    ref = act.options(queue=hold) if isinstance(hold, str) else act.options(flow=hold)
    start = clock.now()
    await app.scheduler().run_many([ref.call(n) for n in range(4)])
    executor = app.executor()
    if helper == "finish_all":
        assert await durafn.testing.finish_all(executor, clock) == 4
    else:
        assert await durafn.testing.advance(executor, clock, 60) == 4
        assert clock.now() == start + 60
    # An epoch time of 2030 is exact to 0.24 us: to the microsecond, then.
    assert [t - start for t in ran] == pytest.approx(expected, abs=1e-6)


@pytest.mark.parametrize("helper", ["finish_all", "advance"])
async def test_the_fake_clock_helpers_stop_at_debounced_and_throttled_runs(
    app: durafn.App, clock: FakeClock, helper: str
) -> None:
    ran: list[tuple[str, float]] = []

    @app.mutation(name="held:debounced", flow=Flow(key="d", debounce=Debounce(quiet=10)))
    async def debounced(ctx: MutationCtx, n: int) -> None:
        ran.append(("debounced", clock.now()))

    @app.mutation(name="held:throttled", flow=Flow(key="t", throttle=Throttle(per=30)))
    async def throttled(ctx: MutationCtx, n: int) -> None:
        ran.append(("throttled", clock.now()))

    start = clock.now()
    executor = app.executor()
    for n in range(3):
        await app.scheduler().run_after(0, debounced, n)
        await app.scheduler().run_after(0, throttled, n)
        await executor.run_until_idle()  # the first throttled call runs at once
    if helper == "finish_all":
        await durafn.testing.finish_all(executor, clock)
    else:
        await durafn.testing.advance(executor, clock, 60)
    assert sorted((what, t - start) for what, t in ran) == [
        ("debounced", 10.0),
        ("throttled", 0.0),
        ("throttled", 30.0),
    ]


@given(
    limit=st.integers(1, 10**6),
    per=st.floats(0.001, 86400),
    burst=st.integers(1, 100),
    tat=st.floats(1.7e9, 4.1e9),
)
def test_a_spent_budget_allows_a_start_at_its_next_slot_and_not_before(
    limit: int, per: float, burst: int, tat: float
) -> None:
    """The GCRA at epoch times (exact to a fraction of a microsecond only): the slot the
    idle wait and the fake clock's helpers step to allows a start there, and none
    perceptibly before it."""
    from durafn._flow import allowance, next_slot

    rate = Rate(limit, per=per, burst=burst)
    slot = next_slot(rate, tat)
    assert allowance(rate, tat, slot) >= 1
    if rate.interval > 1e-5:
        assert allowance(rate, tat, slot - 1e-5) == 0
