"""The app the worker benchmark runs as ``durafn worker --app benchmarks.worker_app:app``
(its database from ``--url``)."""

from __future__ import annotations

import os
import time
from typing import NamedTuple

import anyio

import durafn
from durafn import ActionCtx, MutationCtx


class Functions(NamedTuple):
    fan_out: durafn.MutationRef[[int, float, str], None]
    probe: durafn.MutationRef[[], float]
    hang: durafn.ActionRef[[], None]
    until_cancelled: durafn.ActionRef[[str], None]
    noop_action: durafn.ActionRef[[], None]
    short: durafn.ActionRef[[], None]
    slow: durafn.MutationRef[[], int]


def register(app: durafn.App) -> Functions:
    @app.mutation(name="bench:noop")
    async def noop(ctx: MutationCtx) -> None:
        pass

    @app.action(name="bench:noop_action")
    async def noop_action(ctx: ActionCtx) -> None:
        pass

    @app.mutation(name="bench:fan_out")
    async def fan_out(ctx: MutationCtx, count: int, due: float, kind: str) -> None:
        for _ in range(count):
            if kind == "mutation":
                await ctx.scheduler.run_at(due, noop)
            else:
                await ctx.scheduler.run_at(due, noop_action)

    @app.mutation(name="bench:probe")
    async def probe(ctx: MutationCtx) -> float:
        return time.time()  # when it started, on the worker's own clock (same machine)

    @app.action(name="bench:hang")
    async def hang(ctx: ActionCtx) -> None:
        await anyio.sleep_forever()

    @app.action(name="bench:until_cancelled")
    async def until_cancelled(ctx: ActionCtx, path: str) -> None:
        """Says when it started and when its cancel reached it (the system-wide monotonic
        clock, comparable across processes)."""
        async with await anyio.open_file(path, "a") as f:
            await f.write(f"start {ctx.run_id} {time.monotonic()}\n")
        await ctx.wait_for_cancel()
        seen = time.monotonic()
        async with await anyio.open_file(path, "a") as f:
            await f.write(f"seen {ctx.run_id} {seen}\n")

    @app.action(name="bench:short")
    async def short(ctx: ActionCtx) -> None:
        await anyio.sleep(0.05)  # a short call to another service

    @app.mutation(name="bench:slow")
    async def slow(ctx: MutationCtx) -> int:
        await anyio.sleep(0.1)  # its batch stays open meanwhile
        return os.getpid()  # which worker committed it

    return Functions(fan_out, probe, hang, until_cancelled, noop_action, short, slow)


app = durafn.App()
register(app)
