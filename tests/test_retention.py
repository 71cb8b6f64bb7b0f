"""Finished rows are removed after the retention period (7 days by default), not before;
Pending and InProgress rows never are."""

from __future__ import annotations

from datetime import timedelta

import anyio
import pytest
from sqlalchemy import update

import durafn
from durafn import ActionCtx, MutationCtx, State
from durafn.testing import FakeClock, all_rows

from .support.helpers import CEILING

pytestmark = pytest.mark.anyio


async def _finished_and_unfinished(app: durafn.App) -> dict[str, durafn.ScheduledFunctionId]:
    @app.mutation
    async def ok(ctx: MutationCtx) -> None:
        pass

    @app.mutation
    async def bad(ctx: MutationCtx) -> None:
        raise ValueError("no")

    @app.action
    async def act(ctx: ActionCtx) -> None:
        pass

    sched = app.scheduler()
    ids = {
        "success": await sched.run_after(0, ok),
        "failed": await sched.run_after(0, bad),
        "canceled": await sched.run_after(0, ok),
        "pending": await sched.run_after(timedelta(days=30), ok),
        "in_progress": await sched.run_after(timedelta(days=30), act),
    }
    await app.cancel(ids["canceled"])
    await app.executor().run_until_idle()
    async with app.engine.begin() as conn:
        sf = durafn.scheduled_functions
        await conn.execute(
            update(sf).where(sf.c.id == ids["in_progress"]).values(state="InProgress")
        )
    return ids


async def test_rows_disappear_after_seven_days_not_before(
    app: durafn.App, clock: FakeClock
) -> None:
    ids = await _finished_and_unfinished(app)
    executor = app.executor()
    clock.advance(timedelta(days=7) - timedelta(seconds=1))
    assert await executor.run_maintenance() == 0
    assert len(await all_rows(app)) == 5
    clock.advance(timedelta(seconds=2))
    assert await executor.run_maintenance() == 3
    left = {r.id: r.state for r in await all_rows(app)}
    assert left == {ids["pending"]: State.PENDING, ids["in_progress"]: State.IN_PROGRESS}
    clock.advance(timedelta(days=365))
    assert await executor.run_maintenance() == 0
    assert len(await all_rows(app)) == 2


async def test_retention_is_configurable_and_batched(app: durafn.App, clock: FakeClock) -> None:
    @app.mutation
    async def ok(ctx: MutationCtx) -> None:
        pass

    for _ in range(25):
        await app.scheduler().run_after(0, ok)
    await app.executor().run_until_idle()
    executor = app.executor(retention=3600, retention_batch=10)
    clock.advance(3599)
    assert await executor.run_maintenance() == 0
    clock.advance(2)
    assert await executor.run_maintenance() == 25  # in three bounded batches
    assert await all_rows(app) == []


async def test_background_executor_runs_retention_on_the_clock(
    app: durafn.App, clock: FakeClock
) -> None:
    @app.mutation
    async def ok(ctx: MutationCtx) -> None:
        pass

    sid = await app.scheduler().run_after(0, ok)
    async with app.run_executor(retention_interval=3600) as executor:
        await executor.wait_for(sid)
        clock.advance(timedelta(days=7, hours=1))
        with anyio.fail_after(CEILING):
            # Retention has no completion signal of its own; poll the row briefly.
            while await app.get(sid) is not None:  # noqa: ASYNC110
                await anyio.sleep(0.01)


async def test_retention_per_state_and_per_function(app: durafn.App, clock: FakeClock) -> None:
    """delayed_job's ``destroy_failed_jobs`` and more: the executor's periods per state,
    and a function's own on its decorator (the states it names; the rest as everyone)."""
    ids = await _finished_and_unfinished(app)

    @app.mutation(retention=durafn.Retention(success=3600, failed=0))
    async def audited(ctx: MutationCtx, fail: bool) -> None:
        if fail:
            raise ValueError("no")

    own_ok = await app.scheduler().run_after(0, audited, fail=False)
    own_bad = await app.scheduler().run_after(0, audited, fail=True)
    await app.executor().run_until_idle()
    keep = durafn.Retention(success=0, failed=86400)  # canceled: 7 days, the default
    executor = app.executor(retention=keep)

    async def left() -> set[str]:
        return {r.id for r in await all_rows(app)}

    clock.advance(1)
    assert await executor.run_maintenance() == 2  # the plain Success row, audited's Failed
    assert ids["success"] not in await left() and own_bad not in await left()
    clock.advance(3600)
    assert await executor.run_maintenance() == 1  # audited's Success, after its hour
    assert own_ok not in await left()
    clock.advance(86400)
    assert await executor.run_maintenance() == 1  # the Failed row, after a day
    clock.advance(timedelta(days=7))
    assert await executor.run_maintenance() == 1  # the Canceled row, after seven
    assert await left() == {ids["pending"], ids["in_progress"]}
    with pytest.raises(durafn.ArgumentError, match="Retention failed must be a non-negative"):
        durafn.Retention(failed=-1)
    with pytest.raises(durafn.RegistrationError, match=r"retention must be a durafn\.Retention"):
        app.mutation(retention=3600)  # type: ignore[call-overload]
    with pytest.raises(
        durafn.ArgumentError, match=r"retention must be a number of seconds or a durafn\.Retention"
    ):
        app.executor(retention="forever")  # type: ignore[arg-type]
