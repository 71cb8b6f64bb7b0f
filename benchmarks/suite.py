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
    flow,
    options,
    peers,
    realwork,
    realwork_report,
    retries,
    telemetry,
    throughput,
    versus,
    workers,
    workflows,
)

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

            async def _batches(_: Any, engine: str = engine) -> Any:
                return await batches.measure(
                    lambda name: url_for(engine, name), engine, sizes.drain, sizes.repeats
                )

            r["batches"] = await step(f"{engine}: batched actions against plain", 1, _batches)
            results[engine] = r
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


def peer_rates(results: dict[str, Any]) -> dict[str, float]:
    """Each measured peer's drain rate (jobs/s); a peer that was skipped has none. Each
    configuration of a peer is its own entry, so "best peer" is its best configuration."""
    peers_found = results.get("peers", {}).items()
    return {k: float(v["drained_per_s"]) for k, v in peers_found if isinstance(v, dict)}


def ratios(results: dict[str, Any]) -> dict[str, float]:
    """durafn / raw-limit ratios (a per-job system committing once per job gets <= 1)."""
    raw = results["raw"]
    out: dict[str, float] = {}
    measured = peer_rates(results)
    pg_peers = {k: v for k, v in measured.items() if "SQLite" not in k}
    sqlite_peers = {k: v for k, v in measured.items() if "SQLite" in k}
    for engine, found in (("postgres", pg_peers), ("sqlite", sqlite_peers)):
        if engine in results and found:
            best = max(found, key=lambda k: found[k])
            for kind in ("mutations", "actions"):
                mine = results[engine][f"drain_{kind}"]["drained_per_s"]
                out[f"{engine} no-op {kind} / best peer ({best})"] = mine / found[best]
                mixed = results[engine].get("options", {}).get(kind, {}).get("priorities_per_s")
                if mixed:
                    out[f"{engine} no-op {kind}, priorities mixed / best peer ({best})"] = (
                        mixed / found[best]
                    )
    for name, got in results.get("versus", {}).get("ratios", {}).items():
        out[f"postgres {name} (interleaved rounds): rate"] = got["rate"]
        out[f"postgres {name} (interleaved rounds): CPU per row"] = got["cpu_per_row"]
    for engine in ("sqlite", "postgres"):
        got = results.get(engine, {}).get("options")
        if not got:
            continue
        for kind in ("mutations", "actions"):
            out[f"{engine} {kind}, priorities mixed / plain (same run)"] = got[kind][
                "priorities_ratio"
            ]
            out[f"{engine} {kind}, 1000 serial queues x 20 / unqueued (same run)"] = got[kind][
                "queues_ratio"
            ]
        out[f"{engine} one serial queue of 2000 actions / its round-trip limit"] = got[
            "one_serial_queue_2000_actions"
        ]["of_limit"]
    if "postgres" in results:
        inserts = results["postgres"]["drain_inserts"]["drained_per_s"]
        out["postgres inserting mutations / raw 1-connection commits"] = (
            inserts / raw["postgres_1_connection"]
        )
        drained = results["postgres"]["drain_mutations"]["drained_per_s"]
        out["postgres drain / raw 1-connection commits"] = drained / raw["postgres_1_connection"]
        out["postgres drain / raw 8-connection commits"] = drained / raw["postgres_8_connections"]
    if "sqlite" in results:
        drained = results["sqlite"]["drain_mutations"]["drained_per_s"]
        out["sqlite drain / raw aiosqlite commits"] = drained / raw["aiosqlite"]
        out["sqlite drain / raw sqlite3 commits"] = drained / raw["sqlite3"]
    return {k: round(v, 2) for k, v in out.items()}


def _cpu(drain: dict[str, Any]) -> str:
    """A drain's CPU per 1,000 rows, worker / database (``cost``)."""
    worker, database = drain["worker_cpu_ms_per_1000"], drain.get("database_cpu_ms_per_1000")
    if database is None:
        return f"{worker:.0f} ms (SQLite runs in the worker)"
    return f"{worker:.0f} / {database:.0f} ms"


def markdown(report: dict[str, Any]) -> str:
    results = report["results"]
    engines = [e for e in ("sqlite", "postgres") if e in results]
    lines = [
        f"# durafn benchmarks ({report['mode']}, {report['when']})",
        "",
        f"Machine: {report['machine']}. Command: `{report['command']}`.",
        "",
        *realwork_report.section(results.get("realwork")),
        f"Drains (durafn's and the peers'): the median of {report['repeats']} runs; every "
        "run's rate is in latest.json.",
        "",
        "| | " + " | ".join(engines) + " |",
        "|---|" + "---|" * len(engines),
    ]

    def row(label: str, value: Callable[[dict[str, Any]], str]) -> None:
        lines.append(f"| {label} | " + " | ".join(value(results[e]) for e in engines) + " |")

    row("no-op mutations drained", lambda r: f"{r['drain_mutations']['drained_per_s']:,.0f} /s")
    row("no-op actions drained", lambda r: f"{r['drain_actions']['drained_per_s']:,.0f} /s")
    row(
        "mutations inserting one row drained",
        lambda r: f"{r['drain_inserts']['drained_per_s']:,.0f} /s",
    )
    row("schedule, 1 per mutation", lambda r: f"{r['schedule_1_per_mutation']:,.0f} rows/s")
    row("schedule, 1000 per mutation", lambda r: f"{r['schedule_1000_per_mutation']:,.0f} rows/s")

    def lag(key: str) -> Callable[[dict[str, Any]], str]:
        return lambda r: "{median_ms:.1f} / {p99_ms:.1f} / {max_ms:.1f} ms".format(**r[key])

    def cold(key: str) -> Callable[[dict[str, Any]], str]:
        return lambda r: "{cold_ms:.1f} ms".format(**r[key])

    for label in ("due_now", "due_at_time"):
        row(f"start lag {label.replace('_', ' ')}: median / p99 / max", lag(f"lag_{label}"))
    row("start lag of the first probe (cold connections), due now", cold("lag_due_now"))
    row("  CPU per 1,000 no-op mutations: worker / db", lambda r: _cpu(r["drain_mutations"]))
    row("  CPU per 1,000 no-op actions: worker / db", lambda r: _cpu(r["drain_actions"]))
    lines += ["", "Peers, same database and workload, jobs/s drained (same run):", ""]
    for name, value in results.get("peers", {}).items():
        lines.append(
            f"- {name}: {value['drained_per_s']:,.0f}; CPU per 1,000 jobs {_cpu(value)}"
            if isinstance(value, dict)
            else f"- {name}: {value}"
        )
    faced = results.get("versus", {}).get("medians")
    if faced:
        lines += ["", "Against batched Graphile Worker, interleaved rounds (PostgreSQL):", ""]
        lines += ["| | drained | CPU per 1,000: worker / db |", "|---|---|---|"]
        labels = {
            "graphile": "Graphile Worker, batched",
            "mutations": "durafn, no-op mutations",
            "actions": "durafn, no-op actions",
        }
        for name, got in faced.items():
            cpu = f"{got['worker_cpu_ms_per_1000']:.0f} / {got['database_cpu_ms_per_1000']:.0f} ms"
            lines.append(f"| {labels[name]} | {got['drained_per_s']:,.0f} /s | {cpu} |")
    raw = results["raw"]
    lines += ["", "Raw database, single-row UPDATE transactions/s (same run):", ""]
    lines += [f"- {name}: {rate:,.0f}" for name, rate in raw.items()]
    procs = results.get("postgres", {}).get("worker_processes_mutations")
    if procs:
        lines += ["", "PostgreSQL worker processes, no-op mutations drained:", ""]
        lines += [
            f"- {n} processes: {got['drained_per_s']:,.0f} /s "
            f"(peak RSS of a worker {got['peak_rss_mb']:.0f} MB)"
            for n, got in procs.items()
        ]
    for engine in engines:
        sizes = results[engine].get("backlog", {})
        if not sizes:
            continue
        lines += ["", f"{engine}: backlog scaling (rows already in the table):", ""]
        lines += ["| backlog | drained | lag median / p99 |", "|---|---|---|"]
        for rows, got in sizes.items():
            lag_text = "{median_ms:.1f} / {p99_ms:.1f} ms".format(**got["lag"])
            lines.append(f"| {int(rows):,} | {got['drained_per_s']:,.0f} /s | {lag_text} |")
        largest = list(sizes.values())[-1]["plans"]
        lines += ["", f"Plans at the largest backlog ({engine}):", ""]
        for name, plan in largest.items():
            lines += [f"{name}:", "", "```", plan, "```", ""]
    for engine in engines:
        got = results[engine].get("options")
        if not got:
            continue
        lines += ["", f"{engine}: job options (rows/s, median of interleaved runs):", ""]
        for kind in ("mutations", "actions"):
            k = got[kind]
            lines.append(
                f"- {kind}: plain {k['plain_per_s']:,.0f}; half at random priorities "
                f"{k['priorities_per_s']:,.0f} ({k['priorities_ratio']:.2f}x); 1000 serial "
                f"queues x 20 {k['queues_1000x20_per_s']:,.0f} ({k['queues_ratio']:.2f}x)"
            )
        one = got["one_serial_queue_2000_actions"]
        lines.append(
            f"- one serial queue of 2000 actions: {one['per_s']:,.0f} /s; its limit, one "
            f"claim and one finish round trip per row: {one['round_trip_limit_per_s']:,.0f} "
            f"/s ({one['of_limit']:.2f} of it)"
        )
    for engine in engines:
        got = results[engine].get("retries")
        if not got:
            continue
        lines += ["", f"{engine}: retries (rows/s, median of interleaved pairs):", ""]
        for kind in ("mutations", "actions"):
            k = got[kind]
            low, high = k["ratio_quartiles"]
            lines.append(
                f"- {kind}: plain {k['plain_per_s']:,.0f}; a tenth failing once and retried "
                f"{k['tenth_fail_once_per_s']:,.0f} ({k['runs_per_s']:,.0f} runs/s); the "
                f"pairs' ratio {k['ratio']:.2f}x (quartiles {low:.2f}-{high:.2f}); a "
                f"failure's own cost {k['failure_cost_runs']:.2f} plain runs"
            )
    for engine in engines:
        got = results[engine].get("cancels")
        if not got:
            continue
        lines += ["", f"{engine}: cancel() to the action in another process seeing it:", ""]
        for label, k in got.items():
            lines.append(
                f"- {label}: median {k['median_ms']} ms, p99 {k['p99_ms']} ms, max {k['max_ms']} ms"
            )
    for engine in engines:
        got = results[engine].get("crons")
        if not got:
            continue
        lines += [
            "",
            f"{engine}: the cron loop, {got['ticks_written']:,} ticks, each written once: "
            f"a second's ticks {got['round_wall_ms_median']} ms (median; max "
            f"{got['round_wall_ms_max']} ms), {got['cpu_us_per_tick']} us of CPU per tick; "
            f"reconciling the declarations {got['reconcile_s']} s",
        ]
    got = results.get("postgres", {}).get("cron_lag")
    if got:
        lines += [
            "",
            f"postgres: 4 worker processes, {got['ticks']:,} cron ticks (each once, "
            f"{got['missed_between']} missed): tick to row done median {got['lag_ms_median']} "
            f"ms, p99 {got['lag_ms_p99']} ms, max {got['lag_ms_max']} ms",
        ]
    lines += ["", "Ratios:", ""]
    lines += [f"- {name}: {value}x" for name, value in report["ratios"].items()]
    return "\n".join(lines) + "\n"


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
