"""Both ends of every documented range, end to end, on both engines.

A bound the README documents ("any 32-bit integer", "1 to 10,000", "at most 32 flags") is
a promise at both of its ends: a value at the end is stored, claimed by a running
executor (a long-lived one: its lanes carry hints from one claim to the next), run and
read back; one step past the end is a typed error that writes nothing. Values inside a
range are what every other test uses; these are the ones nobody reaches by accident.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

import durafn
from durafn import ActionCtx, Flow, MutationCtx, Queue, Rate, Retry, State
from durafn.testing import FakeClock, all_rows

from .support.helpers import CEILING, effects
from .support.models import Effect

pytestmark = pytest.mark.anyio

LOW, HIGH = -(2**31), 2**31 - 1
"""A priority is any 32-bit integer."""

CLASSES: dict[str, dict[str, Any]] = {
    # Each class of Pending rows has its own claim (and its own indexes).
    "unqueued": {},
    "queued": {"queue": "q"},
    "keyed": {"flow": Flow(key="k", concurrency=100)},
}


def _ref(app: durafn.App, kind: str, sink: list[str]) -> Any:
    if kind == "mutation":

        @app.mutation(name="ranges:note")
        async def note(ctx: MutationCtx, tag: str) -> None:
            ctx.db.add(Effect(key=tag))

        return note

    @app.action(name="ranges:act")
    async def act(ctx: ActionCtx, tag: str) -> None:
        sink.append(tag)

    return act


@pytest.mark.parametrize("kind", ["mutation", "action"])
@pytest.mark.parametrize("rows", list(CLASSES))
async def test_priorities_at_both_ends_of_32_bits_run_in_order(
    app: durafn.App, kind: str, rows: str
) -> None:
    ran: list[str] = []
    ref = _ref(app, kind, ran).options(**CLASSES[rows])
    for priority in (HIGH, 0, LOW, HIGH - 1, LOW + 1):
        await app.scheduler().run_after(0, ref.options(priority=priority), str(priority))
    await app.executor(batch_size=2, concurrency=1).run_until_idle()
    order = await effects(app) if kind == "mutation" else ran
    assert order == [str(p) for p in (LOW, LOW + 1, 0, HIGH - 1, HIGH)]
    assert {r.priority for r in await all_rows(app)} == {LOW, LOW + 1, 0, HIGH - 1, HIGH}


@pytest.mark.parametrize("kind", ["mutation", "action"])
@pytest.mark.parametrize("rows", list(CLASSES))
async def test_a_running_executor_claims_again_after_rows_at_either_end(
    app: durafn.App, kind: str, rows: str
) -> None:
    """A long-lived executor's lanes remember which levels they took (a hint for the next
    claim): rows at the top level, then more rows at either end, all run and the
    executor stays up (it once bound the level after 2**31 - 1, outside 32 bits, and
    stopped with a DatabaseError)."""
    ref = _ref(app, kind, []).options(**CLASSES[rows])
    async with app.run_executor() as executor:
        for round, priorities in enumerate([(HIGH,), (HIGH, LOW), (LOW,), (HIGH,)]):
            ids = [
                await app.scheduler().run_after(0, ref.options(priority=p), f"{round} {p} {n}")
                for n, p in enumerate(priorities * 3)
            ]
            for id in ids:
                assert (await executor.wait_for(id, timeout=CEILING)).state is State.SUCCESS


async def test_a_queue_default_priority_at_either_end(app_url: tuple[str, bool]) -> None:
    url, ready = app_url
    app = durafn.App(url, queues={"top": Queue(priority=HIGH), "bottom": Queue(priority=LOW)})
    try:
        if not ready:
            await app.migrate()

        @app.action(name="ranges:act")
        async def act(ctx: ActionCtx, tag: str) -> None:
            pass

        ids = [
            await app.scheduler().run_after(0, act.options(queue=q), q) for q in ("top", "bottom")
        ]
        async with app.run_executor() as executor:
            for id in ids:
                assert (await executor.wait_for(id, timeout=CEILING)).state is State.SUCCESS
        assert [r.priority for r in await all_rows(app)] == [HIGH, LOW]
    finally:
        await app.aclose()


@pytest.mark.parametrize("priority", [LOW - 1, HIGH + 1])
async def test_a_priority_past_32_bits_is_refused_and_writes_nothing(
    app: durafn.App, priority: int
) -> None:
    @app.mutation(name="ranges:note")
    async def note(ctx: MutationCtx, tag: str) -> None:
        pass

    with pytest.raises(durafn.OptionError, match="priority"):
        await app.scheduler().run_after(0, note.options(priority=priority), "x")
    with pytest.raises(durafn.RegistrationError, match="priority"):
        app.mutation(name="ranges:other", priority=priority)(note.fn)
    assert await all_rows(app) == []


async def test_aging_at_the_lowest_priority_stays_in_range(
    app: durafn.App, clock: FakeClock
) -> None:
    """Aging makes a waiting row more urgent, never past the lowest priority there is."""

    @app.mutation(name="ranges:note", flow=Flow(key="k", aging=1))
    async def note(ctx: MutationCtx, tag: str) -> None:
        ctx.db.add(Effect(key=tag))

    await app.scheduler().run_after(0, note.options(priority=LOW), "aged")
    await app.scheduler().run_after(0, note.options(priority=LOW + 5), "young")
    clock.advance(3600)
    await app.executor().run_until_idle()
    assert await effects(app) == ["aged", "young"]


# -- attempts, delays and times ---------------------------------------------------------


@pytest.mark.parametrize("attempts", [1, 10_000])
async def test_max_attempts_at_either_end(app: durafn.App, clock: FakeClock, attempts: int) -> None:
    runs: list[int] = []

    @app.action(name="ranges:flaky", retry=Retry(attempts, backoff=durafn.Fixed(0)))
    async def flaky(ctx: ActionCtx) -> None:
        runs.append(1)
        if len(runs) < 3:
            raise ValueError("not yet")

    id = await app.scheduler().run_after(0, flaky)
    for _ in range(3):
        await app.executor().run_until_idle()
    row = await app.get(id)
    assert row is not None
    if attempts == 1:
        assert (row.state, len(runs)) == (State.FAILED, 1)
    else:
        assert (row.state, len(runs), row.max_attempts) == (State.SUCCESS, 3, 10_000)


@pytest.mark.parametrize("attempts", [0, 10_001])
async def test_max_attempts_past_either_end_is_refused(app: durafn.App, attempts: int) -> None:
    with pytest.raises(durafn.SchedulingError, match="max_attempts"):
        Retry(attempts)


async def test_the_longest_backoff_is_kept_to_the_second(app: durafn.App, clock: FakeClock) -> None:
    year = 366 * 86400.0  # the longest delay a policy may give

    @app.action(name="ranges:late", retry=Retry(2, backoff=durafn.Fixed(year)))
    async def late(ctx: ActionCtx) -> None:
        raise ValueError("later")

    id = await app.scheduler().run_after(0, late)
    start = clock.now()
    await app.executor().run_until_idle()
    row = await app.get(id)
    assert row is not None and row.state is State.PENDING
    assert row.history[-1].retry_at == datetime.fromtimestamp(start + year, UTC)


async def test_run_at_the_epoch_and_at_the_horizon(app: durafn.App, clock: FakeClock) -> None:
    """From 1970 (a past time runs at once, keeping the time asked for) to 5 years on."""

    @app.mutation(name="ranges:note")
    async def note(ctx: MutationCtx, tag: str) -> None:
        ctx.db.add(Effect(key=tag))

    horizon = clock.now_datetime() + timedelta(days=5 * 365.25)
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    old = await app.scheduler().run_at(epoch, note, "epoch")
    far = await app.scheduler().run_at(horizon, note, "horizon")
    with pytest.raises(durafn.SchedulingError, match="years"):
        await app.scheduler().run_at(horizon + timedelta(seconds=1), note, "past it")
    with pytest.raises(durafn.SchedulingError, match="1970"):
        await app.scheduler().run_at(epoch - timedelta(seconds=1), note, "before it")
    executor = app.executor()
    await executor.run_until_idle()
    assert await effects(app) == ["epoch"]
    assert (await app.get(old)).scheduled_time == epoch  # type: ignore[union-attr]
    assert await executor.next_due() == horizon.timestamp()
    clock.set(horizon)
    await executor.run_until_idle()
    assert (await app.get(far)).state is State.SUCCESS  # type: ignore[union-attr]


# -- counts and lengths ---------------------------------------------------------------


async def test_flags_keys_and_names_at_their_longest(app: durafn.App) -> None:
    flags = [f"{n:02d}" + "f" * 62 for n in range(32)]  # 32 flags of 64 characters
    key, flow_key, queue = "k" * 512, "f" * 512, "q" * 255
    ran: list[str] = []

    @app.action(name="ranges:act")
    async def act(ctx: ActionCtx, tag: str) -> None:
        ran.append(tag)

    flagged = act.options(flags=flags, key=key, queue=queue)
    keyed = act.options(flow=Flow(key=flow_key, concurrency=1))
    ids = [
        await app.scheduler().run_after(0, flagged, "flagged"),
        await app.scheduler().run_after(0, keyed, "keyed"),
    ]
    await app.executor(forbidden_flags=[flags[-1]]).run_until_idle()
    assert ran == ["keyed"]  # the last of 32 flags still keeps a row from this worker
    assert [r.flags for r in (await app.list(flag=flags[-1])).items] == [sorted(flags)]
    await app.executor().run_until_idle()
    rows = {r.id: r for r in await all_rows(app)}
    assert (rows[ids[0]].state, rows[ids[0]].key, rows[ids[0]].queue) == (State.SUCCESS, key, queue)
    assert rows[ids[1]].flow_key == flow_key
    with pytest.raises(durafn.OptionError, match="at most 32 flags"):
        act.options(flags=[*flags, "one-more"])
    with pytest.raises(durafn.OptionError, match="512"):
        act.options(key=key + "k")
    with pytest.raises(durafn.OptionError, match="255"):
        act.options(queue=queue + "q")


@pytest.mark.parametrize("limit", [1, 10**9])
async def test_rates_and_limits_at_their_ends(
    app: durafn.App, clock: FakeClock, limit: int
) -> None:
    """``Rate(1)`` and ``Rate(10**9, burst=10**9)``; a flow concurrency of 1 and 100,000."""
    ran: list[int] = []

    flow = Flow(
        key="k",
        rate=Rate(limit, burst=limit),
        concurrency=1 if limit == 1 else 100_000,
        weight=1 if limit == 1 else 10_000,
    )

    @app.action(name="ranges:act", flow=flow)
    async def act(ctx: ActionCtx, n: int) -> None:
        ran.append(n)

    await app.scheduler().run_many([act.call(n) for n in range(5)])
    await durafn.testing.finish_all(app.executor(), clock)
    assert sorted(ran) == list(range(5))


async def test_the_largest_batch_and_page(app: durafn.App) -> None:
    @app.mutation(name="ranges:note")
    async def note(ctx: MutationCtx, n: int) -> None:
        pass

    ids = await app.scheduler().run_many([note.call(n) for n in range(10_000)])
    assert len(set(ids)) == 10_000
    page = await app.list(limit=10_000)
    assert len(page.items) == 10_000 and page.next_cursor is None
    with pytest.raises(durafn.SchedulingLimitError):
        await app.scheduler().run_many([note.call(n) for n in range(10_001)])
    with pytest.raises(durafn.ArgumentError, match="limit"):
        await app.list(limit=10_001)


@pytest.mark.parametrize("size", [1, 100_000])
async def test_queue_and_executor_sizes_at_either_end(app_url: tuple[str, bool], size: int) -> None:
    """A queue's concurrency, an executor's concurrency and batch size: 1 and 100,000."""
    url, ready = app_url
    app = durafn.App(url, queues={"q": Queue(concurrency=size)})
    ran: list[int] = []
    try:
        if not ready:
            await app.migrate()

        @app.action(name="ranges:act", queue="q")
        async def act(ctx: ActionCtx, n: int) -> None:
            ran.append(n)

        @app.mutation(name="ranges:note")
        async def note(ctx: MutationCtx, tag: str) -> None:
            pass

        await app.scheduler().run_many([act.call(n) for n in range(5)])
        await app.scheduler().run_many([note.call(str(n)) for n in range(5)])
        executor = app.executor(concurrency=size, batch_size=size)
        assert await executor.run_until_idle() == 10
        assert sorted(ran) == list(range(5))
        [queue] = await app.queues()
        assert queue.concurrency == size
        for bad in (0, 100_001):
            with pytest.raises(durafn.ArgumentError, match="between 1 and 100000"):
                app.executor(concurrency=bad)
    finally:
        await app.aclose()
