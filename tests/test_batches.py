"""Batched actions (``durafn.Batch``) on both engines, driven by the fake clock: exactly
``max_size`` rows to a call, a partial batch once the oldest has waited ``max_wait``,
keys batched apart, per-item failures retried alone, a call that raises or returns the
wrong count, a row that reaches a worker alone, and what is refused."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from pydantic import BaseModel

import durafn
from durafn import ActionCtx, Batch, Fixed, ItemFailed, Retry, State
from durafn.testing import FakeClock

from .apps.worker_app import Touch
from .support.helpers import CEILING, equals, row_of, wait_until
from .test_workers import FAST, live_workers, worker_app_on, worker_processes

pytestmark = pytest.mark.anyio


class Email(BaseModel):
    to: str
    domain: str = "example.com"


async def test_a_batch_gets_exactly_max_size_rows_and_each_row_keeps_its_result(
    app: durafn.App, clock: FakeClock
) -> None:
    calls: list[list[str]] = []

    @app.action(batch=Batch(max_size=100, max_wait=2.0))
    async def send(ctx: ActionCtx, items: list[Email]) -> list[str]:
        calls.append([e.to for e in items])
        return [f"sent {e.to}" for e in items]

    ids = await app.scheduler().run_many([send.call(Email(to=f"u{i}")) for i in range(250)])
    executor = app.executor()
    assert await executor.run_until_idle() == 200  # two full batches; 50 wait for max_wait
    assert [len(c) for c in calls] == [100, 100]
    assert calls[0] == [f"u{i}" for i in range(100)]  # in the order scheduled
    row = await row_of(app, ids[42])
    assert (row.state, row.result, row.args) == (
        State.SUCCESS,
        "sent u42",
        {"item": {"to": "u42", "domain": "example.com"}},
    )
    assert (await row_of(app, ids[200])).state is State.PENDING
    clock.advance(1.999)
    assert await executor.run_until_idle() == 0
    clock.advance(0.001)  # the oldest of the 50 has waited max_wait: a partial batch
    assert await executor.run_until_idle() == 50
    assert [len(c) for c in calls] == [100, 100, 50]
    assert (await row_of(app, ids[249])).result == "sent u249"


async def test_a_partial_batch_runs_after_max_wait_counted_from_its_oldest_row(
    app: durafn.App, clock: FakeClock
) -> None:
    calls: list[list[int]] = []

    @app.action(batch=Batch(max_size=10, max_wait=5.0))
    async def add(ctx: ActionCtx, items: list[int]) -> list[int]:
        calls.append(items)
        return [i * 2 for i in items]

    scheduler = app.scheduler()
    await scheduler.run_after(0, add, 1)
    clock.advance(3)
    await scheduler.run_after(0, add, 2)
    await scheduler.run_after(60, add, 3)  # not due: not in this batch
    executor = app.executor()
    assert await executor.run_until_idle() == 0
    assert await executor.next_due() is not None
    clock.advance(2)
    assert await executor.run_until_idle() == 2
    assert calls == [[1, 2]]


async def test_keys_are_batched_apart(app: durafn.App, clock: FakeClock) -> None:
    calls: list[list[str]] = []

    @app.action(batch=Batch(max_size=3, max_wait=1.0, key=lambda e: e.domain))
    async def send(ctx: ActionCtx, items: list[Email]) -> list[None]:
        calls.append([f"{e.to}@{e.domain}" for e in items])
        return [None] * len(items)

    scheduler = app.scheduler()
    for i in range(4):
        await scheduler.run_after(0, send, Email(to=f"a{i}", domain="a.org"))
        await scheduler.run_after(0, send, Email(to=f"b{i}", domain="b.org"))
    executor = app.executor()
    assert await executor.run_until_idle() == 6
    assert sorted(calls) == [
        ["a0@a.org", "a1@a.org", "a2@a.org"],
        ["b0@b.org", "b1@b.org", "b2@b.org"],
    ]
    clock.advance(1)
    assert await executor.run_until_idle() == 2
    assert sorted(calls[2:]) == [["a3@a.org"], ["b3@b.org"]]


async def test_an_item_that_failed_is_retried_alone_by_its_own_policy(
    app: durafn.App, clock: FakeClock
) -> None:
    calls: list[list[int]] = []

    @app.action(batch=Batch(max_size=4, max_wait=0), retry=Retry(3, backoff=Fixed(10)))
    async def charge(ctx: ActionCtx, items: list[int]) -> list[int | ItemFailed]:
        calls.append(items)
        return [ItemFailed(f"card {i} declined") if i == 3 and len(calls) < 3 else i for i in items]

    ids = await app.scheduler().run_many([charge.call(i) for i in range(4)])
    executor = app.executor()
    assert await executor.run_until_idle() == 4
    failed = await row_of(app, ids[3])
    assert (failed.state, failed.failures) == (State.PENDING, 1)
    assert failed.history[0].error.type == "durafn.BatchItemError"
    assert failed.history[0].error.message == "card 3 declined"
    assert failed.due_time is not None and failed.due_time.timestamp() == clock.now() + 10
    assert [(await row_of(app, i)).state for i in ids[:3]] == [State.SUCCESS] * 3
    for _ in range(2):
        clock.advance(10)
        await executor.run_until_idle()
    assert calls == [[0, 1, 2, 3], [3], [3]]
    row = await row_of(app, ids[3])
    assert (row.state, row.result, row.failures, row.attempts) == (State.SUCCESS, 3, 2, 3)


async def test_a_call_that_raises_or_miscounts_fails_every_row_of_its_batch(
    app: durafn.App, clock: FakeClock
) -> None:
    @app.action(batch=Batch(max_size=2, max_wait=0))
    async def broken(ctx: ActionCtx, items: list[str]) -> list[str]:
        if items[0] == "raise":
            raise RuntimeError("the mail server is down")
        return ["only one"]

    scheduler = app.scheduler()
    raising = await scheduler.run_many([broken.call("raise"), broken.call("x")])
    await app.executor().run_until_idle()
    miscounted = await scheduler.run_many([broken.call("a"), broken.call("b")])
    await app.executor().run_until_idle()
    for sid in raising:
        row = await row_of(app, sid)
        assert row.state is State.FAILED and row.error is not None
        assert row.error.message == "the mail server is down"
    for sid in miscounted:
        row = await row_of(app, sid)
        assert row.state is State.FAILED and row.error is not None
        assert row.error.type == "durafn.BatchResultError"
        assert "returned 1 results for 2 items" in row.error.message


async def test_a_row_that_reaches_a_worker_alone_runs_as_a_batch_of_one(
    app: durafn.App, clock: FakeClock
) -> None:
    calls: list[list[int]] = []

    @app.action(batch=Batch(max_size=50, max_wait=60))
    async def square(ctx: ActionCtx, items: list[int]) -> list[int | ItemFailed]:
        calls.append(items)
        return [ItemFailed(ValueError("negative")) if i < 0 else i * i for i in items]

    assert await app.run_action(square, 7) == 49
    with pytest.raises(ValueError, match="negative"):
        await app.run_action(square, -1)
    assert calls == [[7], [-1]]


async def test_batched_actions_are_checked_when_registered_and_scheduled(
    app: durafn.App,
) -> None:
    with pytest.raises(
        durafn.RegistrationError,
        match=r"Batch\(max_size\) must be an integer between 1 and 10000, not 0",
    ):
        Batch(max_size=0)
    Batch(max_size=10_000, max_wait=86_400)  # both ends of the ranges
    Batch(max_size=1, max_wait=0)
    with pytest.raises(durafn.RegistrationError, match="max_wait"):
        Batch(max_wait=86_401)
    with pytest.raises(durafn.RegistrationError, match="list of items"):

        @app.action(batch=Batch())  # type: ignore[arg-type]  # mypy refuses it too
        async def two(ctx: ActionCtx, a: int, b: int) -> None: ...

    with pytest.raises(durafn.RegistrationError, match="must be list"):

        @app.action(batch=Batch())  # type: ignore[arg-type]
        async def one(ctx: ActionCtx, items: int) -> list[None]:
            return []

    with pytest.raises(durafn.RegistrationError, match="named queue"):

        @app.action(batch=Batch(), queue="mail")
        async def queued(ctx: ActionCtx, items: list[int]) -> list[None]:
            return []

    @app.action(batch=Batch(key=lambda item: item["tenant"]))
    async def keyed(ctx: ActionCtx, items: list[dict[str, Any]]) -> list[None]:
        return [None] * len(items)

    scheduler = app.scheduler()
    with pytest.raises(durafn.ArgumentError, match=r"batch key of .* raised KeyError"):
        await scheduler.run_after(0, keyed, {"other": 1})
    with pytest.raises(durafn.ArgumentError, match="must be a string"):
        await scheduler.run_after(0, keyed, {"tenant": 5})
    with pytest.raises(durafn.ArgumentError, match="NUL"):
        await scheduler.run_after(0, keyed, {"tenant": "a\x00b"})
    with pytest.raises(durafn.ArgumentError, match="at most 1000 characters, not 1001"):
        await scheduler.run_after(0, keyed, {"tenant": "k" * 1001})
    await scheduler.run_after(0, keyed, {"tenant": "k" * 1000})  # the longest key
    with pytest.raises(durafn.ArgumentError, match="invalid arguments"):
        await scheduler.run_after(0, keyed, "not a dict")  # type: ignore[call-overload]
    with pytest.raises(durafn.OptionError, match="batched action"):
        await scheduler.run_after(0, keyed.options(queue="q"), {"tenant": "t"})
    assert len((await app.list()).items) == 1  # the longest key's row only


async def test_running_workers_take_full_batches_at_once_and_a_partial_one_at_max_wait(
    app: durafn.App, clock: FakeClock
) -> None:
    """Two running executors (the dispatcher's path, with the poll an hour away): every
    row runs once, full batches as soon as they are written, the rest when the fake
    clock reaches the oldest's ``max_wait``."""
    calls: list[list[int]] = []

    @app.action(batch=Batch(max_size=10, max_wait=5.0))
    async def record(ctx: ActionCtx, items: list[int]) -> list[int]:
        calls.append(items)
        await anyio.lowlevel.checkpoint()
        return items

    async with (
        app.run_executor(poll_interval=3600) as first,
        app.using().run_executor(poll_interval=3600),
    ):
        ids = await app.scheduler().run_many([record.call(i) for i in range(30)])
        for sid in ids:
            assert (await first.wait_for(sid, timeout=CEILING)).state is State.SUCCESS
        assert sorted(i for call in calls for i in call) == list(range(30))  # each once
        assert all(len(call) <= 10 for call in calls)
        late = await app.scheduler().run_many([record.call(i) for i in range(30, 33)])
        clock.advance(4.9)
        await anyio.sleep(0.01)
        assert (await row_of(app, late[0])).state is State.PENDING
        clock.advance(0.1)
        for sid in late:
            assert (await first.wait_for(sid, timeout=CEILING)).state is State.SUCCESS
    assert calls[-1] == [30, 31, 32]


async def test_explain_says_a_due_row_waits_for_its_batch_and_until_when(
    app: durafn.App, clock: FakeClock
) -> None:
    @app.action(batch=Batch(max_size=3, max_wait=30, key=lambda n: "odd" if n % 2 else "even"))
    async def total(ctx: ActionCtx, items: list[int]) -> list[int]:
        return items

    scheduler = app.scheduler()
    first = await scheduler.run_after(0, total, 1)
    clock.advance(10)
    await scheduler.run_after(0, total, 3)
    later = await scheduler.run_after(60, total, 5)
    why = await app.explain(first)
    assert why.reason == "batching"
    assert why.until is not None and why.until.timestamp() == clock.now() + 20
    assert "2 row(s) of its key 'odd' due of max_size=3" in why.message
    assert (await app.explain(later)).reason == "not_due"
    stats = await app.stats(bound=100)  # counted in the batched rows' partial indexes
    assert stats.counts[State.PENDING] == 3
    assert stats.oldest_due is not None and stats.oldest_due.timestamp() == clock.now() - 10


async def test_an_item_can_snooze_alone_and_a_cancelled_item_stays_cancelled(
    app: durafn.App, clock: FakeClock
) -> None:
    cancel_me: list[str] = []
    start = clock.now()

    @app.action(batch=Batch(max_size=3, max_wait=0))
    async def work(ctx: ActionCtx, items: list[str]) -> list[str | ItemFailed]:
        if cancel_me:
            await app.cancel(cancel_me.pop())  # while its batch runs
        first = clock.now() == start
        return [
            ItemFailed(durafn.Snooze(30)) if i == "later" and first else i.upper() for i in items
        ]

    ids = await app.scheduler().run_many([work.call(s) for s in ("a", "later", "c")])
    cancel_me.append(ids[2])
    executor = app.executor()
    await executor.run_until_idle()
    rows = [await row_of(app, i) for i in ids]
    assert [r.state for r in rows] == [State.SUCCESS, State.PENDING, State.CANCELED]
    assert (rows[0].result, rows[1].snoozes, rows[1].failures) == ("A", 1, 0)
    assert executor.stats["snoozed"] == 1
    clock.advance(30)
    await executor.run_until_idle()
    assert (await row_of(app, ids[1])).result == "LATER"


async def test_two_worker_processes_run_each_row_once_in_full_batches(
    db_url: str, tmp_path: Path
) -> None:
    """Real ``durafn worker`` processes (the dispatcher, the claim of batches racing on
    one key): 300 items of a ``max_size=50`` action, each in exactly one call."""
    trace = tmp_path / "batches.trace"
    async with (
        worker_app_on(db_url) as (app, fns),
        worker_processes(db_url, 2, tmp_path, *FAST, "--concurrency", "2"),
    ):
        await wait_until(lambda: equals(live_workers(app), 2), "2 workers registered")
        ids = await app.scheduler().run_many(
            [fns.touch_many.call(Touch(n, str(trace))) for n in range(300)]
        )

        async def finished() -> bool:
            return (await app.stats()).counts[State.SUCCESS] == len(ids)

        await wait_until(finished, "300 items succeeded")
    calls = [line.split() for line in trace.read_text().splitlines()]
    items = [int(n) for numbers, _ in calls for n in numbers.split(",")]
    assert sorted(items) == list(range(300))  # each exactly once
    assert all(len(numbers.split(",")) <= 50 for numbers, _ in calls)


async def test_a_crons_tick_of_a_batched_action_runs_as_a_batch_of_one(
    app: durafn.App, clock: FakeClock
) -> None:
    calls: list[list[str]] = []

    @app.action(batch=Batch(max_size=10, max_wait=60))
    async def digest(ctx: ActionCtx, items: list[str]) -> list[str]:
        calls.append(items)
        return [i.upper() for i in items]

    app.cron("digest", "* * * * *", digest.call("hourly digest"))
    executor = app.executor()
    await executor.run_until_idle()
    clock.advance(60)
    await executor.run_until_idle()
    assert calls == [["hourly digest"]]  # at its tick, not max_wait later
    [row] = (await app.list(name=digest.name, state=State.SUCCESS)).items
    assert (row.args, row.result) == ({"item": "hourly digest"}, "HOURLY DIGEST")


async def test_batched_functions_take_turns_when_room_is_short(
    app: durafn.App, clock: FakeClock
) -> None:
    order: list[str] = []

    @app.action(batch=Batch(max_size=2, max_wait=0))
    async def first(ctx: ActionCtx, items: list[int]) -> list[None]:
        order.append("first")
        return [None] * len(items)

    @app.action(batch=Batch(max_size=2, max_wait=0))
    async def second(ctx: ActionCtx, items: list[int]) -> list[None]:
        order.append("second")
        return [None] * len(items)

    await app.scheduler().run_many([f.call(i) for f in (first, second) for i in range(6)])
    assert await app.executor(concurrency=1).run_until_idle() == 12
    assert sorted(order) == ["first"] * 3 + ["second"] * 3
    assert order[:2] in (["first", "second"], ["second", "first"])  # not all of one first


async def test_both_ends_of_max_size_run_as_documented(app: durafn.App, clock: FakeClock) -> None:
    """``max_size=1``: a call per row, at once; ``max_size=10_000``: 10,000 rows (the
    most one ``run_many`` from outside writes) in one call and one claim statement."""
    sizes: dict[str, list[int]] = {"one": [], "most": []}

    @app.action(batch=Batch(max_size=1, max_wait=86_400))
    async def one(ctx: ActionCtx, items: list[int]) -> list[int]:
        sizes["one"].append(len(items))
        return items

    @app.action(batch=Batch(max_size=10_000, max_wait=86_400))
    async def most(ctx: ActionCtx, items: list[int]) -> list[int]:
        sizes["most"].append(len(items))
        return items

    scheduler = app.scheduler()
    await scheduler.run_many([one.call(i) for i in range(3)])
    ids = await scheduler.run_many([most.call(i) for i in range(10_000)])
    assert await app.executor().run_until_idle() == 10_003
    assert sizes == {"one": [1, 1, 1], "most": [10_000]}
    assert (await row_of(app, ids[-1])).result == 9_999
