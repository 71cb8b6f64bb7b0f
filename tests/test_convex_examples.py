"""The examples of Convex's scheduling guide behave as documented, on both engines."""

from __future__ import annotations

from datetime import timedelta

import anyio
import pytest
from sqlalchemy import select

import durafn
from durafn import ActionCtx, MutationCtx, QueryCtx, State
from durafn.testing import FakeClock, all_rows

from .support.helpers import count
from .support.models import Effect, Message

pytestmark = pytest.mark.anyio


async def test_self_destructing_message(app: durafn.App, clock: FakeClock) -> None:
    @app.mutation
    async def send_expiring_message(ctx: MutationCtx, body: str, author: str) -> int:
        msg = Message(body=body, author=author)
        ctx.db.add(msg)
        await ctx.db.flush()
        await ctx.scheduler.run_after(5, destruct, message_id=msg.id)
        return msg.id

    @app.mutation
    async def destruct(ctx: MutationCtx, message_id: int) -> None:
        msg = await ctx.db.get(Message, message_id)
        assert msg is not None
        await ctx.db.delete(msg)

    msg_id = await app.run_mutation(send_expiring_message, "hello", author="ann")
    assert await count(app, Message) == 1
    [row] = await all_rows(app)
    assert row.name == destruct.name
    assert row.state is State.PENDING
    assert row.args == {"message_id": msg_id}
    assert row.scheduled_time == clock.now_datetime() + timedelta(seconds=5)

    executor = app.executor()
    assert await executor.run_until_idle() == 0  # not due yet
    clock.advance(4.999)
    assert await executor.run_until_idle() == 0
    assert await count(app, Message) == 1
    clock.advance(0.001)
    assert await executor.run_until_idle() == 1
    assert await count(app, Message) == 0
    done = await app.get(row.id)
    assert done is not None
    assert done.state is State.SUCCESS
    assert done.completed_time == clock.now_datetime()
    assert done.attempts == 1


async def test_scheduling_is_atomic_with_a_failing_mutation(app: durafn.App) -> None:
    @app.mutation
    async def noop(ctx: MutationCtx) -> None:
        pass

    @app.mutation
    async def schedule_then_fail(ctx: MutationCtx) -> None:
        ctx.db.add(Message(body="x", author="y"))
        await ctx.scheduler.run_after(0, noop)
        await ctx.system.list()  # forces the scheduled row to be written before the raise
        raise RuntimeError("changed my mind")

    with pytest.raises(RuntimeError, match="changed my mind"):
        await app.run_mutation(schedule_then_fail)
    assert await all_rows(app) == []
    assert await count(app, Message) == 0


async def test_scheduling_from_an_action_survives_its_failure(app: durafn.App) -> None:
    ran: list[str] = []

    @app.mutation
    async def record(ctx: MutationCtx, what: str) -> None:
        ran.append(what)
        ctx.db.add(Effect(key=what))

    @app.action
    async def flaky_action(ctx: ActionCtx) -> None:
        await ctx.scheduler.run_after(0, record, what="scheduled before the failure")
        raise ConnectionError("the HTTP call failed")

    sid = await app.scheduler().run_after(0, flaky_action)
    await app.executor().run_until_idle()
    rows = {r.name: r for r in await all_rows(app)}
    assert rows[flaky_action.name].state is State.FAILED
    error = rows[flaky_action.name].error
    assert error is not None
    assert (error.type, error.message) == ("ConnectionError", "the HTTP call failed")
    assert rows[record.name].state is State.SUCCESS
    assert rows[record.name].parent_id == sid
    assert ran == ["scheduled before the failure"]
    assert await count(app, Effect) == 1


async def test_status_is_read_back_from_queries_and_outside(
    app: durafn.App, clock: FakeClock
) -> None:
    @app.mutation
    async def noop(ctx: MutationCtx) -> str:
        return "done"

    @app.query
    async def list_scheduled(ctx: QueryCtx) -> list[str]:
        page = await ctx.system.list()
        return [f"{r.name}={r.state}" for r in page.items]

    @app.query
    async def get_scheduled(ctx: QueryCtx, id: str) -> durafn.ScheduledFunction | None:
        return await ctx.system.get(id)

    first = await app.scheduler().run_after(1, noop)
    second = await app.scheduler().run_after(2, noop)
    assert await app.run_query(list_scheduled) == [f"{noop.name}=Pending"] * 2
    clock.advance(1)
    await app.executor().run_until_idle()
    got = await app.run_query(get_scheduled, first)
    assert got is not None
    assert got.state is State.SUCCESS
    assert got.result == "done"
    assert (await app.run_query(get_scheduled, second)).state is State.PENDING  # type: ignore[union-attr]
    assert await app.run_query(get_scheduled, "not-an-id") is None


async def test_cancel_before_it_runs(app: durafn.App, clock: FakeClock) -> None:
    ran: list[int] = []

    @app.mutation
    async def work(ctx: MutationCtx, n: int) -> None:
        ran.append(n)

    @app.mutation
    async def cancel_message(ctx: MutationCtx, id: str) -> bool:
        return (await ctx.scheduler.cancel(id)).canceled

    sid = await app.scheduler().run_after(10, work, n=1)
    assert await app.run_mutation(cancel_message, sid) is True
    clock.advance(60)
    assert await app.executor().run_until_idle() == 0
    row = await app.get(sid)
    assert row is not None
    assert row.state is State.CANCELED
    assert ran == []
    # Cancelling again is a no-op that says so.
    again = await app.cancel(sid)
    assert again.canceled is False
    assert again.previous_state is State.CANCELED


async def test_cancel_during_a_run(app: durafn.App, clock: FakeClock) -> None:
    """An InProgress action keeps running; its result does not overwrite Canceled; what it
    scheduled (transitively) and what it schedules afterwards never runs."""
    started = anyio.Event()
    release = anyio.Event()
    ran: list[str] = []

    @app.mutation
    async def child(ctx: MutationCtx, tag: str) -> None:
        ran.append(tag)
        await ctx.scheduler.run_after(5, grandchild, tag=tag + "/grand")

    @app.mutation
    async def grandchild(ctx: MutationCtx, tag: str) -> None:
        ran.append(tag)

    @app.action
    async def long_action(ctx: ActionCtx) -> str:
        await ctx.scheduler.run_after(0, child, tag="early")
        await ctx.scheduler.run_after(30, child, tag="late-pending")
        started.set()
        await release.wait()
        await ctx.scheduler.run_after(0, child, tag="after-cancel")
        await ctx.run_mutation(child, tag="inline-after-cancel")
        return "finished anyway"

    action_id = await app.scheduler().run_after(0, long_action)
    async with app.run_executor(poll_interval=3600) as executor:
        await started.wait()
        # "early" is due and runs, scheduling its grandchild 5s out.
        rows = {r.args.get("tag"): r for r in await all_rows(app) if r.name == child.name}
        await executor.wait_for(rows["early"].id)
        result = await app.cancel(action_id)
        assert result.canceled and result.previous_state is State.IN_PROGRESS
        release.set()
        await executor.wait_for(action_id)
    clock.advance(3600)
    await app.executor().run_until_idle()

    by_tag = {r.args.get("tag"): r for r in await all_rows(app)}
    action_row = await app.get(action_id)
    assert action_row is not None
    assert action_row.state is State.CANCELED
    assert action_row.result is None
    assert by_tag["early"].state is State.SUCCESS
    assert by_tag["early/grand"].state is State.CANCELED  # transitively, through a finished child
    assert by_tag["late-pending"].state is State.CANCELED
    assert by_tag["after-cancel"].state is State.CANCELED
    # The inline mutation ran (the action is still running code), but what it scheduled
    # belongs to the cancelled action and was written Canceled.
    assert by_tag["inline-after-cancel/grand"].state is State.CANCELED
    assert ran == ["early", "inline-after-cancel"]


async def test_cancel_errors(app: durafn.App) -> None:
    @app.mutation
    async def cancel_myself(ctx: MutationCtx) -> None:
        assert ctx.run_id is not None
        await ctx.scheduler.cancel(ctx.run_id)

    @app.mutation
    async def cancel_from_a_mutation(ctx: MutationCtx, target: str) -> None:
        await ctx.scheduler.cancel(target)

    for unknown in ("01a20000-0000-7000-8000-000000000000", "not-an-id"):
        with pytest.raises(durafn.NotFoundError):
            await app.cancel(unknown)
        with pytest.raises(durafn.NotFoundError):
            await app.run_mutation(cancel_from_a_mutation, unknown)
    sid = await app.scheduler().run_after(0, cancel_myself)
    await app.executor().run_until_idle()
    row = await app.get(sid)
    assert row is not None
    assert row.state is State.FAILED
    assert row.error is not None
    assert row.error.type == "durafn.CancelOwnRunError"


async def test_user_session_and_scheduling_commit_together(app: durafn.App) -> None:
    """A web handler's own session: its writes and its scheduled work commit (or not) together."""
    from sqlalchemy.ext.asyncio import AsyncSession

    @app.mutation
    async def noop(ctx: MutationCtx) -> None:
        pass

    async with AsyncSession(app.engine) as session:
        session.add(Message(body="kept", author="web"))
        await app.scheduler(session).run_after(0, noop)
        await session.commit()
    async with AsyncSession(app.engine) as session:
        session.add(Message(body="dropped", author="web"))
        await app.scheduler(session).run_after(0, noop)
        await session.rollback()
    async with app.engine.connect() as conn:
        bodies = (await conn.execute(select(Message.body))).scalars().all()
    assert bodies == ["kept"]
    assert len(await all_rows(app)) == 1
    assert await app.executor().run_until_idle() == 1
