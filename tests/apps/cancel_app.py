"""Cancelled callers and a stopped executor, in a real process that must then exit
(``python -m tests.apps.cancel_app URL``): a connection cancelled mid-statement once left a task
behind that hung the event loop's shutdown."""

from __future__ import annotations

import asyncio
import faulthandler
import sys
import threading
import time

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


def _dump_tasks_later(loop: asyncio.AbstractEventLoop, seconds: float) -> None:
    """After ``seconds``, every asyncio task's stack to stderr (from the loop's thread)."""

    def _dump() -> None:
        for task in asyncio.all_tasks(loop):
            task.print_stack(file=sys.stderr)

    def _watch() -> None:
        time.sleep(seconds)
        loop.call_soon_threadsafe(_dump)

    threading.Thread(target=_watch, daemon=True).start()


async def _watched(url: str) -> None:
    _dump_tasks_later(asyncio.get_running_loop(), 60)
    await _main(url)


if __name__ == "__main__":
    # It hung in suite runs under pytest-xdist (never run alone, even under load): if it
    # hangs again, every task's and every thread's stack goes to stderr, which the test's
    # failure shows.
    faulthandler.dump_traceback_later(90, exit=True)
    anyio.run(_watched, sys.argv[1])
    print("exited")
