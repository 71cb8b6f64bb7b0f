"""Cancelled callers and a stopped executor, in a real process that must then exit
(``python -m tests.cancel_app URL``): a connection cancelled mid-statement once left a task
behind that hung the event loop's shutdown."""

from __future__ import annotations

import faulthandler
import sys

import anyio
from sqlalchemy import text

import durafn
from durafn import MutationCtx


async def _main(url: str) -> None:
    app = durafn.App(url)
    await app.migrate()

    @app.mutation
    async def touch(ctx: MutationCtx, n: int) -> int:
        await ctx.db.execute(text("SELECT 1"))
        await ctx.db.execute(text("SELECT 2"))
        return n

    for n in range(60):
        await app.scheduler().run_after(0, touch, n=n)
    cancelled = 0
    for n in range(200):
        # Deadlines from 0 to 1.8 ms land before, inside and after the statements.
        with anyio.move_on_after(0.0003 * (n % 7)) as scope:
            await app.run_mutation(touch, n=n)
        cancelled += scope.cancelled_caught
    for _ in range(20):
        with anyio.move_on_after(0.002):
            async with app.run_executor(poll_interval=0.001):
                await anyio.sleep(1)
    await app.aclose()
    print(f"cancelled {cancelled}")


if __name__ == "__main__":
    # It hung twice in suite runs under pytest-xdist (never run alone, even under load): if it
    # hangs again, every thread's stack goes to stderr, which the test's failure shows.
    faulthandler.dump_traceback_later(90, exit=True)
    anyio.run(_main, sys.argv[1])
    print("exited")
