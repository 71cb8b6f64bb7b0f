"""Completion callbacks (``on_complete``) on both engines, under the fake clock: one
callback per row that finishes for good, whatever finishes it (a run, its last retry, a
cancel of any kind, a rescue), none for a finish that is rolled back or loses its race.

The real-process case (the finishing worker ``kill -9``ed, the row rescued and its
callback written once) is in ``test_workers.py``.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest

import durafn
from durafn import ActionCtx, Completion, Fixed, MutationCtx, OptionError, Retry, State
from durafn.testing import FakeClock

from .support.helpers import effects, equals, row_of, wait_until
from .support.models import Effect

pytestmark = pytest.mark.anyio


def _callback(app: durafn.App) -> durafn.MutationRef[[Completion], None]:
    """A callback that records each completion it is given as an ``Effect`` (a row's
    second completion, after ``app.retry``, marked with a ``+``)."""
    seen: set[str] = set()

    @app.mutation(name="done")
    async def done(ctx: MutationCtx, c: Completion) -> None:
        error = f" {c.error.type}: {c.error.message}" if c.error else ""
        again = "+" if c.id in seen else ""
        ctx.db.add(Effect(key=f"{c.id[-6:]}{again} {c.name} {c.state} {c.result}{error}"))
        seen.add(c.id)

    return done


async def test_each_way_to_finish_schedules_the_callback_once(
    app: durafn.App, clock: FakeClock
) -> None:
    done = _callback(app)

    @app.mutation(name="adds")
    async def adds(ctx: MutationCtx, a: int, b: int) -> int:
        return a + b

    @app.action(name="fails", retry=Retry(2, backoff=Fixed(10)))
    async def fails(ctx: ActionCtx) -> None:
        raise ConnectionError("down")

    @app.action(name="waits")
    async def waits(ctx: ActionCtx) -> None:
        pass

    sched = app.scheduler()
    added = await sched.run_after(0, adds.options(on_complete=done), 2, 3)
    failed = await sched.run_after(0, fails.options(on_complete=done))
    canceled = await sched.run_after(60, waits.options(on_complete=done))
    plain = await sched.run_after(0, adds, 1, 1)  # no callback
    assert (await row_of(app, added)).on_complete == "done"
    assert (await row_of(app, plain)).on_complete is None
    await sched.cancel(canceled)
    executor = app.executor()
    await executor.run_until_idle()  # the callbacks, written as the rows finish, run too
    # The first failure is retried: no callback yet.
    assert sorted(await effects(app)) == sorted(
        [f"{added[-6:]} adds Success 5", f"{canceled[-6:]} waits Canceled None"]
    )
    clock.advance(10)
    await executor.run_until_idle()
    assert (await row_of(app, failed)).state is State.FAILED
    assert f"{failed[-6:]} fails Failed None ConnectionError: down" in await effects(app)
    assert len(await effects(app)) == 3
    # Retried by hand, the row finishes for good again: a new completion, a new callback.
    await app.retry([failed])
    for _ in range(2):
        await executor.run_until_idle()
        clock.advance(10)
    assert len(await effects(app)) == 4
    callbacks = [row for row in (await app.list(limit=100)).items if row.name == "done"]
    assert len(callbacks) == 4 and all(row.state is State.SUCCESS for row in callbacks)


async def test_a_rolled_back_finish_or_cancel_schedules_nothing(
    app: durafn.App, clock: FakeClock
) -> None:
    done = _callback(app)

    @app.action(name="later")
    async def later(ctx: ActionCtx) -> None:
        pass

    @app.mutation(name="cancels_then_raises")
    async def cancels_then_raises(ctx: MutationCtx, target: str) -> None:
        await ctx.scheduler.cancel(target)
        raise ValueError("changed my mind")

    @app.mutation(name="retried", retry=Retry(2, backoff=Fixed(5)))
    async def retried(ctx: MutationCtx) -> None:
        raise KeyError("once more")

    target = await app.scheduler().run_after(60, later.options(on_complete=done))
    with pytest.raises(ValueError, match="changed my mind"):
        await app.run_mutation(cancels_then_raises, target)
    await app.scheduler().run_after(0, retried.options(on_complete=done))
    await app.executor().run_until_idle()  # the first run fails, rolled back, retried
    assert (await row_of(app, target)).state is State.PENDING
    assert await effects(app) == []
    assert [row.name for row in (await app.list(limit=10)).items if row.name == "done"] == []


async def test_a_running_action_cancelled_gets_one_callback_not_two(
    app: durafn.App, clock: FakeClock
) -> None:
    done = _callback(app)
    started, release = anyio.Event(), anyio.Event()

    @app.action(name="slow")
    async def slow(ctx: ActionCtx) -> str:
        started.set()
        await release.wait()
        return "finished anyway"

    sid = await app.scheduler().run_after(0, slow.options(on_complete=done))
    async with app.run_executor():
        await started.wait()
        assert await app.cancel(sid)
        release.set()  # its outcome finds the row Canceled: no second completion
        await wait_until(lambda: equals(_count(app, "done", State.SUCCESS), 1), "callback ran")
    assert await effects(app) == [f"{sid[-6:]} slow Canceled None"]
    assert (await row_of(app, sid)).state is State.CANCELED


async def test_cancels_by_filter_of_descendants_and_at_birth_schedule_callbacks(
    app: durafn.App, clock: FakeClock
) -> None:
    done = _callback(app)
    started, release = anyio.Event(), anyio.Event()

    @app.action(name="child")
    async def child(ctx: ActionCtx) -> None:
        pass

    @app.action(name="parent")
    async def parent(ctx: ActionCtx) -> None:
        await ctx.scheduler.run_after(60, child.options(on_complete=done))
        started.set()
        await release.wait()
        # Cancelled by now: what it schedules is written Canceled, its callback due.
        await ctx.scheduler.run_after(0, child.options(on_complete=done))

    batch = [await app.scheduler().run_after(60, child.options(on_complete=done)) for _ in "ab"]
    assert await app.cancel_where(name="child") == 2
    sid = await app.scheduler().run_after(0, parent)
    async with app.run_executor():
        await started.wait()
        await app.cancel(sid)  # its Pending child is cancelled with it
        release.set()
        await wait_until(lambda: equals(_count(app, "done", State.SUCCESS), 4), "callbacks ran")
    states = sorted(key.split()[1:3] == ["child", "Canceled"] for key in await effects(app))
    assert states == [True] * 4
    assert {key.split()[0] for key in await effects(app)} >= {b[-6:] for b in batch}


async def test_the_callback_runs_with_its_own_options(app: durafn.App, clock: FakeClock) -> None:
    @app.mutation(name="audit", queue="audits", priority=-5)
    async def audit(ctx: MutationCtx, completion: Completion) -> None:
        ctx.db.add(Effect(key=completion.state))

    @app.mutation(name="work", on_complete=audit)  # on the decorator: every call
    async def work(ctx: MutationCtx) -> str:
        return "ok"

    await app.scheduler().run_after(0, work)
    await app.executor().run_until_idle()
    [callback] = [row for row in (await app.list(limit=10)).items if row.name == "audit"]
    assert (callback.queue, callback.priority, callback.state) == ("audits", -5, State.SUCCESS)
    assert callback.args["completion"]["result"] == "ok"
    assert await effects(app) == ["Success"]
    assert [q.name for q in await app.queues()] == ["audits"]


async def test_a_callback_must_be_a_mutation_taking_a_completion(app: durafn.App) -> None:
    @app.action
    async def an_action(ctx: ActionCtx, c: Completion) -> None:
        pass

    @app.mutation
    async def two(ctx: MutationCtx, c: Completion, extra: int = 0) -> None:
        pass

    @app.mutation
    async def wrong_type(ctx: MutationCtx, n: int) -> None:
        pass

    @app.mutation
    async def fine(ctx: MutationCtx, c: Completion) -> None:
        pass

    with pytest.raises(OptionError, match="must be a mutation"):
        fine.options(on_complete=an_action)  # type: ignore[arg-type]
    with pytest.raises(OptionError, match="takes 2 parameters besides ctx"):
        fine.options(on_complete=two)  # mypy lets a defaulted extra parameter through
    with pytest.raises(OptionError, match=r"cannot be given a durafn\.Completion"):
        fine.options(on_complete=wrong_type)  # type: ignore[arg-type]
    by_name: Any = "fine"
    with pytest.raises(durafn.RegistrationError, match="must be a mutation"):

        @app.mutation(on_complete=by_name)
        async def named(ctx: MutationCtx) -> None:
            pass

    assert fine.options(on_complete=fine).job_options.on_complete is fine


async def _count(app: durafn.App, name: str, state: State) -> int:
    rows = (await app.list(limit=100)).items
    return sum(row.name == name and row.state is state for row in rows)
