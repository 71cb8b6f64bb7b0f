"""Durable workflows: steps per second of a ten-step no-op workflow against the same
chain written as scheduled functions (each link scheduling the next), and, on
PostgreSQL, what each step costs the database (CPU, WAL: ``pgcost.Meter``).

Two kinds of step, each against its own chain:

* ``mutation``: ``await step.run_mutation(noop)`` ten times, against ten no-op mutations
  each scheduling the next. A workflow's mutation steps run in its turn's transaction
  (``_workflow/steps.py``), so the ten run in one turn: the figure says what that buys.
* ``action``: ``await step.run_action(noop)`` ten times, against ten no-op actions each
  scheduling the next: a row per step on both sides, plus, for the workflow, the step's
  completion (a mutation journaling it and running the next turn).

Each round, in a fresh database, ``--workflows`` of each start at once and one executor
runs them to the end (``run_until_idle``, on the system clock); steps per second is
``10 * workflows`` over that time. Rounds alternate which side runs first; the figures
are the medians, and the ratio workflow / chain (the issue's target: >= 0.7).

    python -m benchmarks.durable_workflows [--engines sqlite,postgres] [--workflows 200]
        [--rounds 3] [--cost]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio

import durafn
from durafn import ActionCtx, MutationCtx, WorkflowCtx

from . import pgcost
from .throughput import pg_url

STEPS = 10


def _app(url: str) -> tuple[durafn.App, dict[str, Any]]:
    app = durafn.App(url, max_scheduled_per_run=100_000)

    @app.mutation(name="dwb:noop")
    async def noop(ctx: MutationCtx) -> None:
        pass

    @app.action(name="dwb:noop_action")
    async def noop_action(ctx: ActionCtx) -> None:
        pass

    @app.mutation(name="dwb:link")
    async def link(ctx: MutationCtx, left: int) -> None:
        if left > 1:
            await ctx.scheduler.run_after(0, link, left - 1)

    @app.action(name="dwb:link_action")
    async def link_action(ctx: ActionCtx, left: int) -> None:
        if left > 1:
            await ctx.scheduler.run_after(0, link_action, left - 1)

    @app.workflow(name="dwb:ten")
    async def ten(step: WorkflowCtx) -> None:
        for _ in range(STEPS):
            await step.run_mutation(noop)

    @app.workflow(name="dwb:ten_actions")
    async def ten_actions(step: WorkflowCtx) -> None:
        for _ in range(STEPS):
            await step.run_action(noop_action)

    @app.mutation(name="dwb:start")
    async def start(ctx: MutationCtx, side: str, kind: str, count: int) -> None:
        for _ in range(count):
            if side == "chain":
                await ctx.scheduler.run_after(0, link if kind == "mutation" else link_action, STEPS)
            else:
                await ctx.scheduler.start_workflow(ten if kind == "mutation" else ten_actions)

    return app, {"start": start}


async def _round(
    url: str, side: str, kind: str, count: int, database: str | None
) -> dict[str, Any]:
    app, fns = _app(url)
    try:
        await app.migrate()
        await app.run_mutation(fns["start"], side, kind, count)
        executor = app.executor(concurrency=32)
        meter = None
        if database is not None:
            # pg_wal unreadable (not root): the rates alone.
            with contextlib.suppress(pgcost.Unavailable):
                meter = await pgcost.Meter.start(database, counters=False)
        began = time.perf_counter()
        await executor.run_until_idle()
        took = time.perf_counter() - began
        if side == "workflow":
            ended = await app.list_workflows(state=durafn.WorkflowState.SUCCESS, limit=count)
            assert len(ended) == count, f"{len(ended)} of {count} workflows ended"
        figures: dict[str, Any] = {"steps_per_s": round(STEPS * count / took, 1)}
        if meter is not None:
            await meter.stop()
            await app.aclose()
            cost = await meter.figures(STEPS * count)
            await meter.close()
            figures |= {
                "db_cpu_ms_per_1000_steps": cost["db_cpu_ms_per_1000"],
                "worker_cpu_ms_per_1000_steps": cost["worker_cpu_ms_per_1000"],
                "wal_bytes_per_step": cost["wal_bytes_per_job"],
            }
        return figures
    finally:
        await app.aclose()


async def _url(engine: str, tmp: str, name: str) -> tuple[str, str | None]:
    if engine == "sqlite":
        return f"sqlite+aiosqlite:///{Path(tmp) / name}.sqlite3", None
    database = await pgcost.scratch(name)
    return pg_url(database), database


async def measure(engine: str, count: int, rounds: int, cost: bool) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        try:
            for kind in ("mutation", "action"):
                runs: dict[str, list[dict[str, Any]]] = {"workflow": [], "chain": []}
                for r in range(rounds):
                    order = ("workflow", "chain") if r % 2 == 0 else ("chain", "workflow")
                    for side in order:
                        url, database = await _url(engine, tmp, f"dw{r}{side[0]}{kind[0]}")
                        metered = database if cost else None
                        runs[side].append(await _round(url, side, kind, count, metered))
                result = {
                    side: {
                        key: statistics.median(run[key] for run in side_runs)
                        for key in side_runs[0]
                    }
                    for side, side_runs in runs.items()
                }
                result["ratio"] = round(
                    result["workflow"]["steps_per_s"] / result["chain"]["steps_per_s"], 2
                )
                out[kind] = result
        finally:
            if engine == "postgres":
                await pgcost.drop_scratch()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engines", default="sqlite,postgres")
    parser.add_argument("--workflows", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cost", action="store_true", help="PostgreSQL: CPU and WAL per step")
    args = parser.parse_args()

    async def _run() -> None:
        results = {}
        for engine in args.engines.split(","):
            cost = args.cost and engine == "postgres"
            results[engine] = await measure(engine, args.workflows, args.rounds, cost)
            print(engine, json.dumps(results[engine], indent=1), flush=True)

    anyio.run(_run)


if __name__ == "__main__":
    main()
