"""Plain ``def`` functions: actions in a bounded pool of threads (their time limit and
cancel as documented: the run ends, the function sees ``ctx.stop_requested``), mutations
in their batch's transaction through a sync ``Session``. Both engines."""

from __future__ import annotations

import threading

import anyio
import anyio.to_thread
import pytest
from sqlalchemy import select

import durafn
from durafn import ActionCtx, State, SyncMutationCtx
from durafn.testing import all_rows

from .support.helpers import CEILING
from .support.models import Effect

pytestmark = pytest.mark.anyio


async def _effects(app: durafn.App) -> list[str]:
    async with app.engine.connect() as conn:
        return sorted((await conn.execute(select(Effect.key))).scalars())


async def _wait(event: threading.Event) -> None:
    """Until ``event`` is set by a thread (a ceiling only a hang reaches)."""
    assert await anyio.to_thread.run_sync(event.wait, CEILING)


async def test_a_def_action_runs_in_a_thread_with_no_event_loop(app: durafn.App) -> None:
    loop_thread = threading.get_ident()

    @app.action(name="def:where")
    def where(ctx: ActionCtx, word: str) -> list[object]:
        try:
            import asyncio

            asyncio.get_running_loop()
            has_loop = True
        except RuntimeError:
            has_loop = False
        child = ctx.sync_scheduler.run_after(0, echo, word)
        return [threading.get_ident() != loop_thread, has_loop, word, child]

    @app.action(name="def:echo")
    def echo(ctx: ActionCtx, word: str) -> str:
        return word

    sid = await app.scheduler().run_after(0, where, "hi")
    assert await app.executor().run_until_idle() == 2
    row = await app.get(sid)
    assert row is not None and row.state is State.SUCCESS
    other_thread, has_loop, word, child = row.result
    assert (other_thread, has_loop, word) == (True, False, "hi")
    child_row = await app.get(child)
    assert child_row is not None and child_row.parent_id == sid and child_row.result == "hi"
    assert await app.run_action(echo, "direct") == "direct"


async def test_a_def_action_past_its_time_limit_fails_and_is_told(app: durafn.App) -> None:
    """The row is Failed at the limit, as an async action's; the thread cannot be
    stopped, and sees ``ctx.stop_requested`` turn True."""
    told = threading.Event()

    @app.action(name="def:slow", timeout=0.1)
    def slow(ctx: ActionCtx) -> str:
        while not ctx.stop_requested:
            told.wait(0.005)
        told.set()
        return "too late"

    sid = await app.scheduler().run_after(0, slow)
    async with app.run_executor(poll_interval=3600) as executor:
        row = await executor.wait_for(sid, timeout=CEILING)
    assert row.state is State.FAILED
    assert row.error is not None and row.error.type == "durafn.FunctionTimeoutError"
    await _wait(told)
    assert (await app.get(sid)).state is State.FAILED  # type: ignore[union-attr]


async def test_a_def_action_learns_of_its_cancel(app: durafn.App) -> None:
    started, told = threading.Event(), threading.Event()

    @app.action(name="def:export")
    def export(ctx: ActionCtx) -> None:
        started.set()
        while not ctx.cancel_requested:
            told.wait(0.005)
        told.set()

    sid = await app.scheduler().run_after(0, export)
    async with app.run_executor(poll_interval=3600) as executor:
        await _wait(started)
        assert (await app.cancel(sid)).canceled
        await _wait(told)
        row = await executor.wait_for(sid, timeout=CEILING)
    assert row.state is State.CANCELED and row.error is None


async def test_a_def_mutation_writes_and_schedules_in_its_transaction(app: durafn.App) -> None:
    @app.action(name="def:notify")
    def notify(ctx: ActionCtx, key: str) -> str:
        return key

    @app.mutation(name="def:place")
    def place(ctx: SyncMutationCtx, key: str, fail: bool = False) -> str:
        ctx.db.add(Effect(key=key))
        ctx.db.flush()
        sid = ctx.scheduler.run_after(0, notify, key)
        found = ctx.db.execute(select(Effect.key).where(Effect.key == key)).scalar_one()
        if fail:
            raise ValueError("after its writes")
        return f"{found} {sid}"

    ok = await app.scheduler().run_after(0, place, "a")
    bad = await app.scheduler().run_after(0, place, "b", fail=True)
    assert await app.executor().run_until_idle() == 3  # two mutations, one notify
    rows = {r.id: r for r in await all_rows(app)}
    assert rows[ok].state is State.SUCCESS and rows[bad].state is State.FAILED
    assert await _effects(app) == ["a"]
    child = durafn.ScheduledFunctionId(str(rows[ok].result).split()[1])
    assert rows[child].name == "def:notify" and rows[child].state is State.SUCCESS
    assert len(rows) == 3  # the failed run's notify was rolled back with it
    direct = await app.run_mutation(place, "c")
    assert direct.startswith("c ") and await _effects(app) == ["a", "c"]


async def test_what_a_def_function_may_not_be(app: durafn.App) -> None:
    with pytest.raises(durafn.RegistrationError, match="async def"):

        @app.query  # type: ignore[arg-type]
        def read(ctx: durafn.QueryCtx) -> int:
            return 1

    with pytest.raises(durafn.RegistrationError, match="SyncMutationCtx"):

        @app.mutation  # type: ignore[arg-type]
        def wrong(ctx: durafn.MutationCtx) -> int:
            return 1
