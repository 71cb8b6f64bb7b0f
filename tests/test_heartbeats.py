"""Heartbeats and lost-worker rescue, driven by the fake clock (no waiting for timeouts).

The real-process versions (``kill -9``, a long action across real timeouts) are in
test_workers.py; these pin down the rules deterministically.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import anyio
import pytest
from sqlalchemy.ext.asyncio import AsyncConnection

import durafn
from durafn import ActionCtx, State
from durafn.testing import FakeClock

from .support.helpers import CEILING, equals, has_beaten, true, wait_until

pytestmark = pytest.mark.anyio

OPTIONS: durafn.ExecutorOptions = {"heartbeat_interval": 1.0, "worker_timeout": 5.0}


async def _until(condition: Callable[[], Awaitable[bool]], what: str) -> None:
    # Fast polls: these waits are for local work, dozens of them per test.
    await wait_until(condition, what, interval=0.005)


async def _beats_at(app: durafn.App, now: float, count: int) -> bool:
    workers = await app.workers()
    return len(workers) == count and all(w.heartbeat_at.timestamp() == now for w in workers)


async def _tick(app: durafn.App, clock: FakeClock, workers: int) -> None:
    """Advance one heartbeat interval and wait until every worker has renewed."""
    clock.advance(OPTIONS["heartbeat_interval"])
    await _until(lambda: _beats_at(app, clock.now(), workers), "every worker heartbeats")


async def _state(app: durafn.App, id: durafn.ScheduledFunctionId) -> State:
    row = await app.get(id)
    assert row is not None
    return row.state


async def _dead_worker_claims(app: durafn.App, id: str) -> durafn.ScheduledFunctionId:
    """A worker that registered and claimed an action, then died without a trace."""

    @app.action(name="victim")
    async def victim(ctx: ActionCtx) -> None:  # never runs: its worker "died"
        raise AssertionError("a claimed action must never run elsewhere")

    sid = await app.scheduler().run_after(0, victim)
    rt = app._rt

    async def _claim(conn: AsyncConnection) -> None:
        now = rt.clock.now()
        await rt.driver.register_worker(conn, id, "elsewhere", 4242, 1, now)
        [claimed] = await rt.driver.claim_actions(conn, now, 10, id)
        assert claimed.id == sid

    await rt.transaction(_claim)
    return sid


async def test_heartbeats_keep_a_long_action_alive(app: durafn.App, clock: FakeClock) -> None:
    release = anyio.Event()

    @app.action
    async def long(ctx: ActionCtx) -> str:
        await release.wait()
        return "done"

    sid = await app.scheduler().run_after(0, long)
    async with app.run_executor(**OPTIONS) as runner, app.run_executor(**OPTIONS):
        await _until(lambda: _beats_at(app, clock.now(), 2), "both workers registered")
        await _until(lambda: equals(_state(app, sid), State.IN_PROGRESS), "the action started")
        for _ in range(30):  # six worker timeouts of fake time, one heartbeat at a time
            await _tick(app, clock, 2)
        assert await _state(app, sid) is State.IN_PROGRESS
        release.set()
        row = await runner.wait_for(sid)
    assert (row.state, row.result) == (State.SUCCESS, "done")


async def test_a_silent_worker_s_action_is_recorded_lost(
    app: durafn.App, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="durafn")
    sid = await _dead_worker_claims(app, "elsewhere:4242:dead")
    async with app.run_executor(**OPTIONS) as rescuer:
        await _until(lambda: has_beaten(app, rescuer.worker_id, clock.now()), "registered")
        for _ in range(4):  # 4 s of silence: under the 5 s timeout, so not lost yet
            clock.advance(1)
            await _until(lambda: has_beaten(app, rescuer.worker_id, clock.now()), "a beat")
        assert await _state(app, sid) is State.IN_PROGRESS
        for _ in range(2):
            clock.advance(1)
            await _until(lambda: has_beaten(app, rescuer.worker_id, clock.now()), "a beat")
        await _until(lambda: equals(_state(app, sid), State.FAILED), "the action is rescued")
        assert [w.id for w in await app.workers()] == [rescuer.worker_id]  # its row is gone
        # ... and its loss recorded, with what the rescue did.
        (lost,) = await app.lost_workers()
        assert (lost.id, lost.hostname, lost.pid) == ("elsewhere:4242:dead", "elsewhere", 4242)
        assert (lost.rescued_by, lost.failed, lost.retried) == (rescuer.worker_id, 1, 0)
        assert lost.lost_at.timestamp() == lost.heartbeat_at.timestamp() + 6
    row = await app.get(sid)
    assert row is not None and row.error is not None
    assert row.error.type == "durafn.WorkerLostError"
    assert "(elsewhere:4242:dead) sent no heartbeat for 5s" in row.error.message
    assert f"action {sid} (victim) InProgress -> Failed: its worker" in caplog.text


async def test_a_worker_rescues_only_after_its_own_heartbeats_held_a_whole_timeout(
    app: durafn.App, clock: FakeClock
) -> None:
    """Just after start (or an outage), stale heartbeats may only mean that the others have
    not caught up yet: nobody is declared lost until the rescuer itself has been connected
    for a whole worker timeout."""
    sid = await _dead_worker_claims(app, "elsewhere:4242:dead")
    clock.advance(3600)  # the dead worker has been silent for an hour already
    async with app.run_executor(**OPTIONS) as rescuer:
        await _until(lambda: has_beaten(app, rescuer.worker_id, clock.now()), "registered")
        for _ in range(4):
            clock.advance(1)
            await _until(lambda: has_beaten(app, rescuer.worker_id, clock.now()), "a beat")
        assert await _state(app, sid) is State.IN_PROGRESS
        clock.advance(1)
        await _until(lambda: equals(_state(app, sid), State.FAILED), "the action is rescued")


async def test_a_pause_is_not_taken_for_dead_workers(app: durafn.App, clock: FakeClock) -> None:
    """Time jumps past several worker timeouts at once (a suspended VM, a stopped process,
    a lock held for long): nobody beat meanwhile, so no one may be declared lost before
    everyone has had the chance to beat again. The other worker here is driven by the
    test, so that it beats after the rescuer, deterministically."""
    other = "elsewhere:4242:alive"
    sid = await _dead_worker_claims(app, other)

    async def other_beats() -> None:
        async def _renew(conn: AsyncConnection) -> None:
            assert await app._rt.driver.heartbeat(conn, other, clock.now())

        await app._rt.transaction(_renew)

    async with app.run_executor(**OPTIONS) as rescuer:
        for _ in range(8):  # the rescuer's streak is long enough to rescue
            await other_beats()
            clock.advance(1)
            await _until(lambda: has_beaten(app, rescuer.worker_id, clock.now()), "a beat")
        clock.advance(20)  # four worker timeouts in one step
        await _until(lambda: has_beaten(app, rescuer.worker_id, clock.now()), "a beat")
        clock.advance(1)  # the rescuer's next beat: the pass after the pause is complete
        await _until(lambda: has_beaten(app, rescuer.worker_id, clock.now()), "a beat")
        assert await _state(app, sid) is State.IN_PROGRESS
        await other_beats()  # the other worker catches up: alive after all
        for _ in range(6):
            clock.advance(1)
            await other_beats()
            await _until(lambda: has_beaten(app, rescuer.worker_id, clock.now()), "a beat")
        assert await _state(app, sid) is State.IN_PROGRESS
        # And once it really stops, it is rescued.
        for _ in range(7):
            clock.advance(1)
            await _until(lambda: has_beaten(app, rescuer.worker_id, clock.now()), "a beat")
        await _until(lambda: equals(_state(app, sid), State.FAILED), "the action is rescued")


async def test_one_executor_serves_one_caller_at_a_time(app: durafn.App) -> None:
    release = anyio.Event()

    @app.action
    async def wait(ctx: ActionCtx) -> None:
        await release.wait()

    await app.scheduler().run_after(0, wait)
    executor = app.executor(**OPTIONS)
    async with anyio.create_task_group() as tg:
        tg.start_soon(executor.run_until_idle)
        await _until(lambda: true(executor._membership.depth > 0), "the first call runs its action")
        with pytest.raises(durafn.ArgumentError, match=r"already running \(run_until_idle"):
            async with executor:
                pass
        release.set()
    async with executor:  # free again once the first caller is done
        assert await executor.run_until_idle() == 0  # nested inside a running one: fine


async def test_a_worker_declared_lost_says_so_and_registers_again(
    app: durafn.App, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="durafn")
    async with app.run_executor(**OPTIONS) as executor:
        await _until(lambda: _beats_at(app, clock.now(), 1), "registered")
        worker_id = executor.worker_id

        async def _forget(conn: AsyncConnection) -> None:
            await app._rt.driver.unregister_worker(conn, worker_id)

        await app._rt.transaction(_forget)  # what another worker's rescue does
        await _tick(app, clock, 1)
        assert [w.id for w in await app.workers()] == [worker_id]
    assert f"worker {worker_id} had been declared lost by another worker" in caplog.text


async def test_run_until_idle_is_a_registered_worker_while_actions_run(
    app: durafn.App,
) -> None:
    seen: list[int] = []

    @app.action
    async def look(ctx: ActionCtx) -> None:
        with anyio.fail_after(CEILING):
            while not await app.workers():  # noqa: ASYNC110 - the first beat registers it
                await anyio.sleep(0.005)
        seen.append(len(await app.workers()))

    await app.scheduler().run_after(0, look)
    executor = app.executor(**OPTIONS)
    assert await executor.run_until_idle() == 1
    assert seen == [1]
    assert await app.workers() == []  # and unregistered after


async def test_a_claim_whose_commit_was_lost_is_started_not_stranded(
    app: durafn.App, clock: FakeClock
) -> None:
    """A claim can commit while its COMMIT reports a dropped connection. Its rows are then
    InProgress under this worker but never started: the next claim finds and starts them
    (once), rather than leaving them for a lost-worker rescue that never comes."""
    runs: list[str] = []

    @app.action
    async def once(ctx: ActionCtx, tag: str) -> str:
        runs.append(tag)
        return tag

    async with app.run_executor(**OPTIONS) as executor:
        await _until(lambda: _beats_at(app, clock.now(), 1), "registered")
        sid = await app.scheduler().run_after(60, once, "stranded")
        rt = app._rt

        async def _claim_as_executor(conn: AsyncConnection) -> None:
            await rt.driver.claim_actions(conn, clock.now() + 60, 10, executor.worker_id)

        await rt.transaction(_claim_as_executor)
        assert await _state(app, sid) is State.IN_PROGRESS and runs == []
        executor._claims.uncertain = True  # what a failed COMMIT of a claim leaves behind
        other = await app.scheduler().run_after(0, once, "next")  # wakes the dispatcher
        assert (await executor.wait_for(sid)).state is State.SUCCESS
        assert (await executor.wait_for(other)).state is State.SUCCESS
    assert sorted(runs) == ["next", "stranded"]
