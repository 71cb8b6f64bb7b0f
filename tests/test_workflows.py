"""Workflow parts on both engines, driven by the fake clock: a function that snoozes
(``durafn.Snooze``: back to Pending, not a failure, up to its limit) and a running
action's progress (``ctx.progress``), read back through ``get``, ``durafn show`` and
``durafn ls``."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from datetime import UTC, datetime

import anyio
import pytest

import durafn
from durafn import ActionCtx, Fixed, MutationCtx, Retry, Snooze, State
from durafn.testing import FakeClock

from .helpers import effects, row_of
from .models import Effect

pytestmark = pytest.mark.anyio


async def test_a_snoozed_mutation_is_rolled_back_and_comes_back_without_using_an_attempt(
    app: durafn.App, clock: FakeClock
) -> None:
    start = clock.now()
    errors: list[str] = []
    app.on("error")(lambda event: errors.append(event.id))

    @app.mutation(retry=Retry(2, backoff=Fixed(1)))
    async def waits(ctx: MutationCtx) -> str:
        ctx.db.add(Effect(key=f"at {clock.now() - start:g}"))
        if clock.now() < start + 30:
            raise Snooze(10)
        if clock.now() < start + 31:
            raise ValueError("one real failure")
        return "done"

    sid = await app.scheduler().run_after(0, waits)
    executor = app.executor()
    await executor.run_until_idle()
    row = await row_of(app, sid)
    assert (row.state, row.snoozes, row.failures, row.history, row.error) == (
        State.PENDING,
        1,
        0,
        [],
        None,
    )
    assert row.due_time is not None and row.due_time.timestamp() == start + 10
    assert await executor.next_due() == start + 10
    assert await effects(app) == []  # the snoozed run's write was rolled back
    for _ in range(2):
        clock.advance(10)
        await executor.run_until_idle()
    assert (await row_of(app, sid)).snoozes == 3
    clock.advance(10)  # at 30: a real failure, the first of its policy's two runs
    await executor.run_until_idle()
    assert [h.error.message for h in (await row_of(app, sid)).history] == ["one real failure"]
    assert errors == [sid]  # the failure's hook; no snooze fired one
    clock.advance(1)  # at 31: the policy's second run is still there to use
    await executor.run_until_idle()
    row = await row_of(app, sid)
    assert (row.state, row.snoozes, row.failures, row.attempts) == (State.SUCCESS, 3, 1, 5)
    assert await effects(app) == ["at 31"]
    assert executor.stats["snoozed"] == 3 and executor.stats["retried"] == 1


async def test_an_action_snoozes_up_to_its_limit_and_then_fails(
    app: durafn.App, clock: FakeClock
) -> None:
    runs = 0

    @app.action(snooze_limit=2)
    async def polls(ctx: ActionCtx) -> None:
        nonlocal runs
        runs += 1
        raise Snooze(0)  # the bottom of the range: due again at once

    sid = await app.scheduler().run_after(0, polls)
    await app.executor().run_until_idle()
    row = await row_of(app, sid)
    assert runs == 3
    assert (row.state, row.snoozes, row.attempts) == (State.FAILED, 2, 3)
    assert row.error is not None and row.error.type == "durafn.SnoozeLimitError"
    assert "snoozed 2 times" in row.error.message and "snooze_limit" in row.error.message
    assert [h.error.type for h in row.history] == ["durafn.SnoozeLimitError"]


async def test_the_snooze_limit_s_ends_and_a_snooze_past_the_range(
    app: durafn.App, clock: FakeClock
) -> None:
    @app.action(snooze_limit=0)
    async def never(ctx: ActionCtx) -> None:
        raise Snooze(366 * 24 * 3600)  # the top of the range, refused by the limit

    @app.action(retry=Retry(2, backoff=Fixed(1)))
    async def too_long(ctx: ActionCtx) -> None:
        raise Snooze(366 * 24 * 3600 + 1)

    never_id = await app.scheduler().run_after(0, never)
    long_id = await app.scheduler().run_after(0, too_long)
    await app.executor().run_until_idle()
    row = await row_of(app, never_id)
    assert (row.state, row.snoozes) == (State.FAILED, 0)
    assert row.error is not None and row.error.type == "durafn.SnoozeLimitError"
    # A bad snooze is the function's error: a failure, retried by its policy.
    row = await row_of(app, long_id)
    assert (row.state, row.failures, row.snoozes) == (State.PENDING, 1, 0)
    assert row.error is not None and row.error.type == "durafn.ArgumentError"
    assert "Snooze(seconds) must be a number of seconds from 0 to" in row.error.message
    with pytest.raises(durafn.RegistrationError, match="snooze_limit must be an integer"):
        app.action(snooze_limit=-1)
    with pytest.raises(durafn.RegistrationError, match="snooze_limit must be an integer"):
        app.mutation(snooze_limit=True)  # a bool is not a count
    big = app.action(name="big", snooze_limit=1_000_000)(never.fn)
    assert big.snooze_limit == 1_000_000


async def test_a_snoozed_action_cancelled_while_it_ran_stays_canceled(
    app: durafn.App, clock: FakeClock
) -> None:
    @app.action
    async def cancelled_meanwhile(ctx: ActionCtx) -> None:
        assert ctx.run_id is not None
        await ctx.scheduler.cancel(ctx.run_id)
        raise Snooze(5)

    sid = await app.scheduler().run_after(0, cancelled_meanwhile)
    await app.executor().run_until_idle()
    row = await row_of(app, sid)
    assert (row.state, row.snoozes) == (State.CANCELED, 0)


async def test_progress_is_written_at_most_once_a_second_and_read_from_another_process(
    app: durafn.App, app_url: tuple[str, bool], clock: FakeClock
) -> None:
    reported, release = anyio.Event(), anyio.Event()

    @app.action
    async def copies(ctx: ActionCtx, n: int) -> str:
        await ctx.progress(0)  # the bottom of the range, written: the first report
        await ctx.progress(0.2, "copied 2,000")  # within the second: skipped
        clock.advance(1)
        await ctx.progress(0.4, f"copied 4,000 of {n:,}")  # a second later: written
        reported.set()
        await release.wait()
        return "copied"

    sid = await app.scheduler().run_after(0, copies, n=10_000)
    async with anyio.create_task_group() as tg:
        tg.start_soon(app.executor().run_until_idle)
        with anyio.fail_after(60):  # a ceiling only a hang reaches
            await reported.wait()
        shown = await anyio.to_thread.run_sync(
            lambda: subprocess.run(
                [sys.executable, "-m", "durafn", "show", sid, "--url", app_url[0], "--json"],
                capture_output=True,
                text=True,
                env={k: v for k, v in os.environ.items() if not k.startswith("DURAFN_")},
            )
        )
        assert shown.returncode == 0, shown.stderr
        seen = json.loads(shown.stdout)
        assert (seen["state"], seen["progress"], seen["progress_message"]) == (
            "InProgress",
            0.4,
            "copied 4,000 of 10,000",
        )
        release.set()
    row = await row_of(app, sid)
    assert (row.state, row.progress, row.progress_message) == (
        State.SUCCESS,
        0.4,
        "copied 4,000 of 10,000",
    )


async def test_bad_progress_is_a_typed_error_and_a_direct_call_stores_none(
    app: durafn.App, clock: FakeClock
) -> None:
    refused: list[str] = []

    @app.action
    async def reports(ctx: ActionCtx) -> None:
        for fraction in (1.5, -0.1, math.nan, True):
            with pytest.raises(durafn.ArgumentError, match="progress must be a number from 0"):
                await ctx.progress(fraction)
        for message in ("x" * 1001, "nul\x00"):
            with pytest.raises(durafn.ArgumentError) as caught:
                await ctx.progress(0.5, message)
            refused.append(str(caught.value))
        await ctx.progress(1, "x" * 1000)  # both ends of the ranges are kept

    sid = await app.scheduler().run_after(0, reports)
    await app.executor().run_until_idle()
    row = await row_of(app, sid)
    assert (row.state, row.progress, row.progress_message) == (State.SUCCESS, 1.0, "x" * 1000)
    assert "at most 1000 characters, not 1001" in refused[0] and "NUL" in refused[1]
    await app.run_action(reports)  # no row: nothing stored, nothing raised


def test_ls_shows_a_running_row_s_progress() -> None:
    from durafn.cli.rows import narrow_row

    row = durafn.ScheduledFunction(
        id=durafn.ScheduledFunctionId("0" * 36),
        name="copies",
        kind=durafn.FunctionKind.ACTION,
        args={},
        state=State.IN_PROGRESS,
        scheduled_time=datetime(2026, 11, 27, tzinfo=UTC),
        started_time=None,
        completed_time=None,
        error=None,
        result=None,
        parent_id=None,
        attempts=1,
        progress=0.4,
    )
    assert str(narrow_row(row)[2]) == "InProgress 40%"
    ended = row.model_copy(update={"state": State.SUCCESS})
    assert str(narrow_row(ended)[2]) == "Success"
