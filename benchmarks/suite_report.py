"""The suite's report (``make bench``): the ratios to the raw limits and the peers, and the
markdown page of every figure (``benchmarks/results/latest.md``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from . import realwork_report, sync_schedule


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
    lines += sync_schedule.section(results.get("sync_schedule", {}))
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
