"""The benchmark suite: ``make bench`` / ``python -m benchmarks [--quick]``.

Runs every scenario on SQLite and PostgreSQL with the raw-database baselines in the same
run, and writes ``benchmarks/results/latest.json`` and ``latest.md`` (figures and the
ratios to the raw limits). Each scenario shows a progress bar while it runs.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

import durafn

from . import (
    backlog,
    baselines,
    batches,
    cancels,
    charts,
    crons,
    dashboard,
    durable_workflows,
    flow,
    options,
    peers,
    realwork,
    retries,
    sync_schedule,
    telemetry,
    throughput,
    versus,
    workers,
    workflows,
)
from .suite_report import markdown, ratios

RESULTS = Path(__file__).resolve().parent / "results"


class Sizes:
    def __init__(self, quick: bool) -> None:
        self.quick = quick
        self.drain = 5_000 if quick else 20_000
        self.realwork_jobs = 2_000 if quick else 20_000
        self.lag = 100 if quick else 300
        self.baseline_seconds = 2.0 if quick else 5.0
        self.single_schedules = 500 if quick else 3_000
        self.bulk_schedules = 5 if quick else 20
        self.processes = [1, 2] if quick else [1, 2, 4]
        self.backlogs = [10_000, 100_000] if quick else [10_000, 100_000, 1_000_000]
        # Drains are short and this machine's speed wanders (steal time, fsync latency): the
        # full run drains each way three times, peers too, and reports the median run.
        self.repeats = 1 if quick else 3
        self.cancels = 20 if quick else 50
        self.crons = 2_000 if quick else 10_000
        self.cron_seconds = 5 if quick else 20


def median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run with the median drain rate, with every run's rate beside it."""
    ordered = sorted(runs, key=lambda r: float(r["drained_per_s"]))
    return {**ordered[len(ordered) // 2], "runs": [r["drained_per_s"] for r in runs]}


async def schedule_rate(url: str, per_mutation: int, mutations: int) -> float:
    """Rows per second written by mutations that each schedule ``per_mutation`` rows."""
    app, fan_out, _, _ = throughput._build(url)
    await app.migrate()
    start = time.perf_counter()
    for _ in range(mutations):
        await app.run_mutation(fan_out, per_mutation)
    elapsed = time.perf_counter() - start
    await app.aclose()
    return per_mutation * mutations / elapsed


async def run(sizes: Sizes, engines: list[str]) -> dict[str, Any]:
    results: dict[str, Any] = {}
    columns = (
        TextColumn("{task.description:<48}"),
        BarColumn(),
        TextColumn("{task.completed:>7,.0f}/{task.total:,.0f}"),
        TimeElapsedColumn(),
    )
    with Progress(*columns) as bar, tempfile.TemporaryDirectory() as tmp:

        async def step(name: str, total: float, body: Callable[..., Awaitable[Any]]) -> Any:
            task = bar.add_task(name, total=total)

            def advance(done: int) -> None:
                bar.update(task, completed=done)

            value = await body(advance)
            bar.update(task, completed=total)
            return value

        async def url_for(engine: str, name: str) -> str:
            return await throughput.fresh_url(engine, tmp, name)

        if "postgres" in engines:  # first: its table heads the results
            results["realwork"] = await step(
                f"postgres: jobs that do work, W1-W4, {sizes.repeats} rounds",
                sizes.repeats,
                lambda advance: realwork.for_suite(sizes.realwork_jobs, sizes.repeats, advance),
            )
        seconds = sizes.baseline_seconds
        results["raw"] = await step(
            "raw database: single-row UPDATE transactions", 1, lambda _: baselines.measure(seconds)
        )
        results["peers"] = await step(
            f"peers: drain {sizes.drain:,} no-op jobs",
            1,
            lambda _: peers.measure(sizes.drain, engines, sizes.repeats),
        )
        if "postgres" in engines:
            results["versus"] = await step(
                f"postgres: durafn and batched Graphile Worker, {sizes.repeats} rounds",
                sizes.repeats,
                lambda advance: versus.measure(sizes.drain, sizes.repeats, advance),
            )
        for engine in engines:
            r: dict[str, Any] = {}
            for kind in ("mutation", "action", "insert"):

                async def _drain(
                    advance: Callable[[int], None], kind: str = kind, engine: str = engine
                ) -> Any:
                    runs = []
                    for i in range(sizes.repeats):
                        url = await url_for(engine, f"drain-{kind}-{i}")
                        runs.append(await throughput.drain(url, sizes.drain, kind, advance))
                    return median_run(runs)

                what = "mutations inserting a row" if kind == "insert" else f"no-op {kind}s"
                times = f", {sizes.repeats} runs" if sizes.repeats > 1 else ""
                r[f"drain_{kind}s"] = await step(
                    f"{engine}: drain {sizes.drain:,} {what}{times}", sizes.drain, _drain
                )
            for per, count in ((1, sizes.single_schedules), (1000, sizes.bulk_schedules)):

                async def _schedule(
                    _: Any, per: int = per, count: int = count, engine: str = engine
                ) -> float:
                    return await schedule_rate(await url_for(engine, f"s{per}"), per, count)

                r[f"schedule_{per}_per_mutation"] = await step(
                    f"{engine}: mutations scheduling {per} each", 1, _schedule
                )
            for label, ahead in (("due_now", 0.0), ("due_at_time", 0.02)):

                async def _lag(
                    _: Any, ahead: float = ahead, label: str = label, engine: str = engine
                ) -> Any:
                    url = await url_for(engine, f"lag-{label}")
                    return await throughput.start_lag(url, sizes.lag, ahead=ahead)

                r[f"lag_{label}"] = await step(f"{engine}: start lag, {label}", 1, _lag)
            backlog_results: dict[str, Any] = {}
            for rows in sizes.backlogs:

                async def _backlog(_: Any, rows: int = rows, engine: str = engine) -> Any:
                    url = await url_for(engine, f"backlog-{rows}")
                    fill = backlog.prefill(rows)
                    drained = await throughput.drain(url, sizes.drain, prefill=fill)
                    app = durafn.App(url)
                    try:
                        plans = await backlog.plans(app)
                    finally:
                        await app.aclose()
                    lag_url = await url_for(engine, f"backlog-lag-{rows}")
                    lag = await throughput.start_lag(lag_url, sizes.lag, ahead=0.02, prefill=fill)
                    return {"drained_per_s": drained["drained_per_s"], "lag": lag, "plans": plans}

                backlog_results[str(rows)] = await step(
                    f"{engine}: backlog of {rows:,} rows", 1, _backlog
                )
            r["backlog"] = backlog_results

            async def _options(_: Any, engine: str = engine) -> Any:
                return await options.measure(
                    lambda name: url_for(engine, name), sizes.drain, sizes.repeats, engine
                )

            r["options"] = await step(
                f"{engine}: priorities, 1000 serial queues, one serial queue", 1, _options
            )

            async def _retries(_: Any, engine: str = engine) -> Any:
                # Pairs of drains of one template's copies: five per run of the others
                # (nine pairs' medians still wandered by ±0.05 for the same code).
                return await retries.measure(
                    lambda name: url_for(engine, name), sizes.drain, 5 * sizes.repeats, engine
                )

            r["retries"] = await step(f"{engine}: a tenth failing once, retried", 1, _retries)

            async def _cancels(_: Any, engine: str = engine) -> Any:
                return await cancels.measure(
                    lambda name: url_for(engine, name), sizes.cancels, engine
                )

            r["cancels"] = await step(f"{engine}: cancel() to a running action", 1, _cancels)

            async def _crons(_: Any, engine: str = engine) -> Any:
                url = await url_for(engine, "crons")
                return await crons.measure(url, sizes.crons, sizes.cron_seconds)

            r["crons"] = await step(f"{engine}: the cron loop, {sizes.crons:,} crons", 1, _crons)

            async def _flow(_: Any, engine: str = engine) -> Any:
                return await flow.measure(
                    lambda name: url_for(engine, name), engine, sizes.drain, sizes.repeats
                )

            r["flow"] = await step(f"{engine}: flow keys, a rate, fairness", 1, _flow)

            async def _dashboard(_: Any, engine: str = engine) -> Any:
                rows = sizes.backlogs[-1]
                return await dashboard.measure(engine, rows, 10 if sizes.quick else 50)

            r["dashboard"] = await step(
                f"{engine}: dashboard pages, {sizes.backlogs[-1]:,} rows", 1, _dashboard
            )

            async def _telemetry(_: Any, engine: str = engine) -> Any:
                return await telemetry.measure(engine, sizes.drain, sizes.repeats, "mutation", None)

            r["telemetry"] = await step(f"{engine}: traces and metrics on and off", 1, _telemetry)

            async def _workflows(_: Any, engine: str = engine) -> Any:
                # Five rounds per run of the others: a round's drain of 10,000 rows lasts
                # a third of a second, and its fan-in / plain ratio wandered from 0.64 to
                # 1.52 round by round (15 rounds, 2026-11-28), too much for three rounds.
                return await workflows.measure(
                    lambda name: url_for(engine, name),
                    engine,
                    sizes.drain // 2,
                    100,
                    5 * sizes.repeats,
                )

            r["workflows"] = await step(f"{engine}: a fan-in against a plain drain", 1, _workflows)

            async def _durable(_: Any, engine: str = engine) -> Any:
                # Ten-step workflows against the same chains of scheduled functions; the
                # database's CPU and WAL per step on PostgreSQL (benchmarks/pgcost.py).
                count = 100 if sizes.quick else 300
                cost = engine == "postgres"  # where pg_wal can be read (else: without it)
                return await durable_workflows.measure(engine, count, sizes.repeats, cost)

            r["durable_workflows"] = await step(
                f"{engine}: ten-step durable workflows against chains", 1, _durable
            )

            async def _batches(_: Any, engine: str = engine) -> Any:
                return await batches.measure(
                    lambda name: url_for(engine, name), engine, sizes.drain, sizes.repeats
                )

            r["batches"] = await step(f"{engine}: batched actions against plain", 1, _batches)
            results[engine] = r
        rounds = 5 if sizes.quick else 15

        async def _sync(_: Any) -> Any:
            # In a thread of its own: the sync routes run as a web server's thread does
            # (no event loop), the async one on an event loop of that thread's.
            return await anyio.to_thread.run_sync(sync_schedule.measure, engines, rounds, tmp)

        results["sync_schedule"] = await step(
            "sync and async scheduling in a held transaction", 1, _sync
        )
        if "postgres" in engines:
            procs: dict[str, dict[str, float]] = {}
            for count in sizes.processes:

                async def _procs(_: Any, count: int = count) -> dict[str, float]:
                    return await workers.throughput(sizes.drain, count, "mutation")

                procs[str(count)] = await step(
                    f"postgres: {count} worker processes, mutations", 1, _procs
                )
            results["postgres"]["worker_processes_mutations"] = procs

            async def _cron_lag(_: Any) -> Any:
                url = await url_for("postgres", "cron-lag")
                return await crons.lag(url, sizes.crons, 4, sizes.cron_seconds)

            results["postgres"]["cron_lag"] = await step(
                f"postgres: {sizes.crons:,} crons, 4 worker processes", 1, _cron_lag
            )
    return results


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes: under 2 minutes")
    parser.add_argument("--engines", default="sqlite,postgres")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    sizes = Sizes(args.quick)
    results = anyio.run(run, sizes, args.engines.split(","))
    report = {
        "mode": "quick" if args.quick else "full",
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.node()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
        "command": "python -m benchmarks" + (" --quick" if args.quick else ""),
        "repeats": sizes.repeats,
        "results": results,
    }
    report["ratios"] = ratios(results)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "latest.json").write_text(json.dumps(report, indent=2))
    (args.out / "latest.md").write_text(markdown(report))
    print(markdown(report))
    try:
        paths = charts.write(report, args.out)
        print("charts:", ", ".join(str(p) for p in paths))
    except ImportError:
        print("charts skipped: install the bench extra (pip install -e '.[bench]')")
