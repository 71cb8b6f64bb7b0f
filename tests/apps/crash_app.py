"""The app the crash test runs in a real subprocess (``python -m tests.apps.crash_app URL``).

Each mutation inserts a unique row and bumps a counter; a run applied twice would either
violate the unique key or push the counter past the number of rows. A group's callback
inserts a row named for the group: once, or the unique key refuses it.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import anyio
from sqlalchemy import update

import durafn
from durafn import ActionCtx, MutationCtx

from ..support.models import Counter, Effect


def build(url: str) -> tuple[durafn.App, durafn.MutationRef[[int], None]]:
    app = durafn.App(url)

    @app.action(name="crash:act")
    async def act(ctx: ActionCtx, n: int, path: str) -> None:
        # A side effect outside the database: the file shows how often each action started.
        async with await anyio.open_file(path, "a") as f:
            await f.write(f"{n}\n")
        await anyio.sleep(0.05)

    # A batched action: each call writes its items' numbers, then takes a while.
    @app.action(name="crash:act_many", batch=durafn.Batch(max_size=5, max_wait=0))
    async def act_many(ctx: ActionCtx, items: list[dict[str, Any]]) -> list[None]:
        async with await anyio.open_file(items[0]["path"], "a") as f:
            await f.write("".join(f"{item['n']}\n" for item in items))
        await anyio.sleep(0.05)
        return [None] * len(items)

    @app.mutation(name="crash:apply")
    async def apply(ctx: MutationCtx, n: int) -> None:
        if starts := os.environ.get("DURAFN_TEST_STARTS"):
            # Outside the database, so it survives the kill: how often each run began.
            with open(starts, "a") as f:  # noqa: ASYNC230 - a tiny local append
                f.write(f"{n}\n")
        ctx.db.add(Effect(key=f"n{n}"))
        await ctx.db.execute(
            update(Counter).where(Counter.name == "c").values(value=Counter.value + 1)
        )
        await ctx.db.flush()
        # Stretch each run so that a kill lands inside an open batch transaction.
        await anyio.sleep(0.003)

    @app.mutation(name="crash:group_done")
    async def group_done(ctx: MutationCtx, group: durafn.GroupCompletion) -> None:
        # Once per group: a second callback would violate the unique key.
        ctx.db.add(Effect(key=f"group {group.ids[0]} {group.succeeded}/{group.size}"))

    return app, apply


async def _work(url: str) -> None:
    app, _ = build(url)
    async with app.run_executor(batch_size=16, poll_interval=0.05, concurrency=8):
        await anyio.sleep_forever()


if __name__ == "__main__":
    anyio.run(_work, sys.argv[1])
