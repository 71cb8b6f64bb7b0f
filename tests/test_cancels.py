"""Cooperative cancel of running actions, on both engines: the action is told (its
``ctx.cancel_requested``, ``ctx.wait_for_cancel()``) or, declared ``cancel="interrupt"``,
cancelled at its next ``await``; either way the row stays Canceled and nothing else is
written for it.

Across processes (a worker told by NOTIFY, or SQLite's poll) it is in ``test_workers.py``;
the time a cancel takes to arrive is measured in ``benchmarks/cancels.py``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import pytest

import durafn
from durafn import ActionCtx, Retry, State
from durafn.testing import FakeClock

from .support.helpers import CEILING, row_of

pytestmark = pytest.mark.anyio

Drive = Callable[[durafn.App], Any]


def _drives() -> list[Any]:
    """Both ways an executor runs actions: its pool of workers, and run_until_idle."""

    async def pool(app: durafn.App, work: Callable[[], Awaitable[None]]) -> None:
        async with app.run_executor():
            await work()

    async def until_idle(app: durafn.App, work: Callable[[], Awaitable[None]]) -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(app.executor().run_until_idle)
            await work()

    return [pytest.param(pool, id="pool"), pytest.param(until_idle, id="run_until_idle")]


@pytest.mark.parametrize("drive", _drives())
async def test_a_running_action_learns_of_its_cancel_and_its_end_is_not_recorded(
    app: durafn.App, clock: FakeClock, drive: Any
) -> None:
    seen: list[str] = []
    started, all_seen = anyio.Event(), anyio.Event()

    def saw(what: str) -> None:
        seen.append(what)
        if len(seen) == 3:
            all_seen.set()

    @app.action(name="polls")
    async def polls(ctx: ActionCtx) -> str:
        assert not ctx.cancel_requested
        started.set()
        while not ctx.cancel_requested:  # noqa: ASYNC110 - a unit of work, then a look
            await anyio.sleep(0.001)
        saw("polls saw it")
        return "stopped early"

    @app.action(name="waits")
    async def waits(ctx: ActionCtx) -> None:
        await ctx.wait_for_cancel()
        saw("waits saw it")
        raise RuntimeError("cleaning up after a cancel fails nothing")

    @app.action(name="interrupted", cancel="interrupt")
    async def interrupted(ctx: ActionCtx) -> None:
        try:
            await anyio.sleep_forever()
        finally:
            saw("interrupted")

    ids = [await app.scheduler().run_after(0, fn) for fn in (polls, waits, interrupted)]

    async def work() -> None:
        await started.wait()
        await anyio.sleep(0.01)  # the other two are waiting as well
        for id in ids:
            assert await app.cancel(id)
        with anyio.fail_after(CEILING):
            await all_seen.wait()

    await drive(app, work)
    assert sorted(seen) == ["interrupted", "polls saw it", "waits saw it"]
    for id in ids:
        row = await row_of(app, id)
        assert (row.state, row.result, row.error) == (State.CANCELED, None, None)
        assert row.history == []


async def test_the_executor_goes_on_after_an_interrupt(app: durafn.App, clock: FakeClock) -> None:
    started = anyio.Event()

    @app.action(name="hangs", cancel="interrupt")
    async def hangs(ctx: ActionCtx) -> None:
        started.set()
        await anyio.sleep_forever()

    @app.action(name="next")
    async def next_one(ctx: ActionCtx) -> str:
        return "ran"

    # One action worker: the interrupted one's slot must take the next row.
    async with app.run_executor(concurrency=1) as executor:
        sid = await app.scheduler().run_after(0, hangs)
        await started.wait()
        await app.cancel(sid)
        after = await app.scheduler().run_after(0, next_one)
        row = await executor.wait_for(after, timeout=CEILING)
    assert (row.state, row.result) == (State.SUCCESS, "ran")
    assert (await row_of(app, sid)).state is State.CANCELED
    assert executor.stats["failed"] == 0


async def test_a_cancelled_parent_tells_its_running_child(
    app: durafn.App, clock: FakeClock
) -> None:
    child_started, told = anyio.Event(), anyio.Event()

    @app.action(name="child")
    async def child(ctx: ActionCtx) -> None:
        child_started.set()
        await ctx.wait_for_cancel()
        told.set()

    @app.action(name="parent", cancel="interrupt")
    async def parent(ctx: ActionCtx) -> None:
        await ctx.scheduler.run_after(0, child)
        await anyio.sleep_forever()

    async with app.run_executor():
        sid = await app.scheduler().run_after(0, parent)
        await child_started.wait()
        await app.cancel(sid)  # the child is a descendant: cancelled, and told
        with anyio.fail_after(CEILING):
            await told.wait()
    states = {row.name: row.state for row in (await app.list()).items}
    assert states == {"parent": State.CANCELED, "child": State.CANCELED}


async def test_a_direct_call_is_never_cancelled(app: durafn.App) -> None:
    @app.action
    async def direct(ctx: ActionCtx) -> bool:
        with anyio.move_on_after(0.01):
            await ctx.wait_for_cancel()
        return ctx.cancel_requested

    assert await app.run_action(direct) is False
    kill: Any = "kill"
    with pytest.raises(durafn.RegistrationError, match="cancel must be one of"):

        @app.action(cancel=kill)
        async def bad(ctx: ActionCtx) -> None:
            pass


@pytest.mark.parametrize("retry", [None, Retry(3)], ids=["no policy", "retry policy"])
async def test_a_failure_after_an_unseen_cancel_leaves_the_row_canceled_and_no_history(
    app: durafn.App, db_url: str, clock: FakeClock, retry: Retry | None
) -> None:
    """Cancelled by another process (here, another app on the database: this one is not
    told before the action ends), the run's failure finds the row Canceled: nothing of it
    is written, neither a retry nor a failed attempt, and no hook fires."""
    started, go_on = anyio.Event(), anyio.Event()
    hooked: list[str] = []

    @app.action(name="fails_late", retry=retry)
    async def fails_late(ctx: ActionCtx) -> None:
        started.set()
        await go_on.wait()
        raise RuntimeError("too late")

    fails_late.on("error")(lambda event: hooked.append(event.hook))
    sid = await app.scheduler().run_after(0, fails_late)
    async with durafn.App(db_url, clock=clock) as elsewhere, app.run_executor() as executor:
        await started.wait()
        assert await elsewhere.cancel(sid)
        go_on.set()  # the stop lets it end, and writes its outcome
    row = await row_of(app, sid)
    assert (row.state, row.failures, row.history, row.error) == (State.CANCELED, 0, [], None)
    assert hooked == [] and executor.stats["failed"] == executor.stats["retried"] == 0
