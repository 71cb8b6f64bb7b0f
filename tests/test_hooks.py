"""Lifecycle hooks on both engines: each fires once, in order, for mutations and actions,
retried or not; a function's hooks before the app's; a raising hook changes nothing."""

from __future__ import annotations

import logging

import pytest

import durafn
from durafn import ActionCtx, Fixed, HookEvent, MutationCtx, Retry, State
from durafn.testing import FakeClock

from .support.helpers import row_of

pytestmark = pytest.mark.anyio


async def test_hooks_fire_once_each_in_order(app: durafn.App, clock: FakeClock) -> None:
    seen: list[tuple[str, ...]] = []

    def short(event: HookEvent) -> str:
        return event.name.rsplit(".", 1)[-1]

    for hook in ("enqueue", "before", "after", "success", "error", "failure"):

        @app.on(hook)
        async def record(event: HookEvent) -> None:
            retry = "retry" if event.retry_at is not None else ""
            seen.append((event.hook, short(event), str(event.state), retry))

    @app.action(name="act", retry=Retry(2, backoff=Fixed(1)))
    async def act(ctx: ActionCtx) -> str:
        if not seen_run:
            seen_run.append(True)
            raise ConnectionError("down")
        return "sent"

    seen_run: list[bool] = []

    @act.on("error")
    def first(event: HookEvent) -> None:  # a function's own hooks run before the app's
        seen.append(("own error", short(event), str(event.state), ""))

    @app.mutation(name="note")
    async def note(ctx: MutationCtx) -> None:
        await ctx.scheduler.run_after(0, act)

    @app.mutation(name="broken")
    async def broken(ctx: MutationCtx) -> None:
        raise KeyError("gone")

    await app.scheduler().run_after(0, note)
    executor = app.executor()
    await executor.run_until_idle()
    clock.advance(1)
    await executor.run_until_idle()
    failed = await app.scheduler().run_after(0, broken)
    await executor.run_until_idle()
    P, S, F = str(State.PENDING), str(State.SUCCESS), str(State.FAILED)
    assert seen == [
        ("enqueue", "note", P, ""),
        ("before", "note", "None", ""),
        ("after", "note", S, ""),
        ("success", "note", S, ""),
        ("enqueue", "act", P, ""),
        ("before", "act", "None", ""),
        ("after", "act", F, ""),  # the run failed; its policy then retries it
        ("own error", "act", P, ""),
        ("error", "act", P, "retry"),
        ("before", "act", "None", ""),
        ("after", "act", S, ""),
        ("success", "act", S, ""),
        ("enqueue", "broken", P, ""),
        ("before", "broken", "None", ""),
        ("after", "broken", F, ""),
        ("error", "broken", F, ""),
        ("failure", "broken", F, ""),
    ]
    assert (await row_of(app, failed)).state is State.FAILED


async def test_a_hook_that_raises_is_logged_and_changes_nothing(
    app: durafn.App, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="durafn.hooks")

    @app.on("before")
    def fails(event: HookEvent) -> None:
        raise RuntimeError("a broken metrics client")

    @app.on("success")
    async def also_fails(event: HookEvent) -> None:
        raise RuntimeError("still broken")

    @app.action
    async def act(ctx: ActionCtx) -> int:
        return 7

    @app.mutation
    async def note(ctx: MutationCtx) -> int:
        return 8

    ids = [await app.scheduler().run_after(0, fn) for fn in (act, note)]
    await app.executor().run_until_idle()
    assert [(r.state, r.result) for r in [await row_of(app, i) for i in ids]] == [
        (State.SUCCESS, 7),
        (State.SUCCESS, 8),
    ]
    logged = [r.getMessage() for r in caplog.records if r.name == "durafn.hooks"]
    assert len(logged) == 4 and all("hook" in m and "ignored" in m for m in logged)


async def test_bad_hooks_are_registration_errors(app: durafn.App) -> None:
    @app.action
    async def act(ctx: ActionCtx) -> None:
        pass

    with pytest.raises(durafn.RegistrationError, match="no hook is called 'finish'"):
        app.on("finish")  # type: ignore[arg-type]
    with pytest.raises(durafn.RegistrationError, match="a hook must be a function"):
        act.on("error")(3)  # type: ignore[type-var]
