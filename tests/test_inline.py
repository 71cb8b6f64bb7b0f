"""Inline mode (``App(inline=...)``) on both engines: scheduled functions run in the
caller's task right after the transaction that scheduled them commits, due or not; rows
are written and recorded as ever; nothing runs for a transaction rolled back."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import pytest

import durafn
from durafn import ActionCtx, MutationCtx, ScheduledFunction, State
from durafn.testing import FakeClock

from .support.helpers import effects
from .support.models import Effect

pytestmark = pytest.mark.anyio


@pytest.fixture
async def inline_app(
    app: durafn.App, db_url: str, clock: FakeClock, request: pytest.FixtureRequest
) -> AsyncIterator[durafn.App]:
    """An inline app on the ``app`` fixture's database (its tables made already)."""
    mode: bool | Callable[[ScheduledFunction], bool] = getattr(request, "param", True)
    async with durafn.App(db_url, clock=clock, inline=mode) as inline:
        yield inline


def _register(
    app: durafn.App,
) -> tuple[durafn.MutationRef[[str], None], durafn.ActionRef[[], None]]:
    @app.mutation(name="note")
    async def note(ctx: MutationCtx, what: str) -> None:
        ctx.db.add(Effect(key=what))

    @app.action(name="later")
    async def later(ctx: ActionCtx) -> None:
        await ctx.run_mutation(note, "the action ran")

    @app.mutation(name="starts")
    async def starts(ctx: MutationCtx, what: str) -> None:
        ctx.db.add(Effect(key=what))
        await ctx.scheduler.run_after(0, note, f"{what}, then its mutation")
        await ctx.scheduler.run_after(3600, later)  # an hour ahead: inline runs it now
        if what == "rolled back":
            raise ValueError("nothing it scheduled runs, nor is written")

    return starts, later


async def test_what_a_mutation_schedules_runs_as_it_commits(inline_app: durafn.App) -> None:
    starts, _ = _register(inline_app)
    await inline_app.run_mutation(starts, "first")
    assert await effects(inline_app) == ["first", "first, then its mutation", "the action ran"]
    rows = (await inline_app.list()).items
    assert {(row.name, row.state) for row in rows} == {
        ("note", State.SUCCESS),
        ("later", State.SUCCESS),
    }
    with pytest.raises(ValueError, match="nothing it scheduled"):
        await inline_app.run_mutation(starts, "rolled back")
    assert len(await effects(inline_app)) == 3 and len((await inline_app.list()).items) == 2


async def test_a_direct_schedule_runs_before_it_returns_and_failures_are_recorded(
    inline_app: durafn.App,
) -> None:
    _, later = _register(inline_app)

    @inline_app.action(name="breaks")
    async def breaks(ctx: ActionCtx) -> None:
        raise RuntimeError("recorded, not raised to the scheduler")

    sid = await inline_app.scheduler().run_after(0, later)
    assert await effects(inline_app) == ["the action ran"]
    broken = await inline_app.scheduler().run_after(0, breaks)
    row = await inline_app.get(broken)
    assert row is not None and row.state is State.FAILED and row.attempts == 1
    assert row.error is not None and row.error.message == "recorded, not raised to the scheduler"
    assert (await inline_app.get(sid)) is not None


def _not_later(row: ScheduledFunction) -> bool:
    return row.name != "later"


@pytest.mark.parametrize("inline_app", [_not_later], indirect=True)
async def test_a_predicate_chooses_the_rows_and_the_rest_wait_for_an_executor(
    inline_app: durafn.App, clock: FakeClock
) -> None:
    starts, _ = _register(inline_app)

    @inline_app.mutation(name="queued", queue="serial")
    async def queued(ctx: MutationCtx) -> None:
        ctx.db.add(Effect(key="queued"))

    await inline_app.run_mutation(starts, "first")
    await inline_app.scheduler().run_after(0, queued)  # a named queue's row: executors'
    assert await effects(inline_app) == ["first", "first, then its mutation"]
    states = {row.name: row.state for row in (await inline_app.list()).items}
    assert states == {"note": State.SUCCESS, "later": State.PENDING, "queued": State.PENDING}
    clock.advance(3600)
    await inline_app.executor().run_until_idle()
    assert sorted(await effects(inline_app))[-2:] == ["queued", "the action ran"]


async def test_inline_must_be_a_flag_or_a_predicate(db_url: str) -> None:
    bad: object = "yes"
    with pytest.raises(durafn.ArgumentError, match="inline must be True, False or a function"):
        durafn.App(db_url, inline=bad)  # type: ignore[arg-type]


async def test_completion_callbacks_run_inline_too(inline_app: durafn.App) -> None:
    @inline_app.mutation(name="done")
    async def done(ctx: MutationCtx, c: durafn.Completion) -> None:
        ctx.db.add(Effect(key=f"{c.name} {c.state}"))

    @inline_app.action(name="works", on_complete=done)
    async def works(ctx: ActionCtx) -> None:
        pass

    @inline_app.mutation(name="schedules", on_complete=done)
    async def schedules(ctx: MutationCtx) -> None:
        await ctx.scheduler.run_after(0, works)

    await inline_app.scheduler().run_after(0, schedules)
    assert sorted(await effects(inline_app)) == ["schedules Success", "works Success"]

    @inline_app.action(name="waits")
    async def waits(ctx: ActionCtx) -> None:
        pass

    # A named queue's row waits for an executor; cancelled, its callback runs inline.
    held = await inline_app.scheduler().run_after(0, waits.options(queue="q", on_complete=done))
    assert await inline_app.cancel(held)
    assert (await effects(inline_app))[-1] == "waits Canceled"
