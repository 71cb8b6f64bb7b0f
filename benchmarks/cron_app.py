"""The app the cron-lag benchmark runs as ``durafn worker --app benchmarks.cron_app:app``:
``$DURAFN_BENCH_CRONS`` crons (10,000 by default), each every 10 s at one of ten offsets,
so a tenth of them are due each second; each tick runs a no-op mutation."""

from __future__ import annotations

import os

import durafn
from durafn import MutationCtx


def build(crons: int, url: str | None = None) -> durafn.App:
    application = durafn.App(url)

    @application.mutation(name="bench:cron_tick")
    async def tick(ctx: MutationCtx, n: int) -> None:
        pass

    for n in range(crons):
        application.cron(f"c{n}", f"{n % 10}/10 * * * * *", tick.call(n), overlap="allow")
    return application


app = build(int(os.environ.get("DURAFN_BENCH_CRONS", "10000")))
