"""Jobs that do work, side by side with Graphile Worker, on PostgreSQL:

    python -m benchmarks.realwork [--jobs N] [--rounds R] [--only W1,W3] [--json PATH]
                                  [--server HOST:PORT]

* **W1**: each job awaits 20 ms (real time), concurrency 100: durafn actions (one
  executor in this process, ``concurrency=100``) against Graphile Worker at concurrency
  100 batched (``graphile_batched``: a local queue and batched completions, as
  ``peers.GRAPHILE_BATCHED``) and as it comes (``{"concurrency": 100}``).
* **W2**: each job awaits 200 ms, concurrency 500; the same three.
* **W3**: a durafn mutation that INSERTs one row into a user table (``bench_rows``), at
  the executor's defaults; beside it no-op mutations, the same INSERT through
  SQLAlchemy's ``AsyncConnection`` committing every B rows, and through asyncpg directly
  in transactions of B rows (the floor). B is the mean number of rows durafn's mutation
  batches committed in its latest insert drain of the same run (its count of distinct
  ``completed_time``s: a batch writes one): the executor's ``batch_size`` (256) is only
  its ceiling, and a lane claims what fits in ``batch_time`` (0.05 s) at the recent pace.
  The same pair on SQLite: durafn's insert mutation against SQLAlchemy's loop (WAL,
  ``synchronous=FULL``, as durafn opens it).
* **W4**: each job awaits 100 ms, concurrency 10, a tenth of the jobs (2,000 of 20,000).

Every drain enqueues all its jobs first (not timed; durafn through
``app.scheduler().run_many``, Graphile through ``add_jobs``), closes the connections
that did it, then drains in a scratch database of its own, measured by ``pgcost.Meter``
(database and worker CPU, commits, tuples, WAL: see there). The rate runs from the first
job's start to the last one's committed outcome; the share of the ideal rate divides it
by concurrency / job duration. Rounds interleave the systems (round 1: A B C, round 2:
B C A, ...); the medians of the rounds are reported, with durafn's ratio to Graphile
batched round by round.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import anyio

from . import peers, pgcost, throughput
from . import realwork_drains as drains
from .realwork_report import markdown

WAITS = {
    w.key: w
    for w in (
        drains.Waits("W1", "each job awaits 20 ms, concurrency 100", 0.020, 100),
        drains.Waits("W2", "each job awaits 200 ms, concurrency 500", 0.200, 500),
        drains.Waits("W4", "each job awaits 100 ms, concurrency 10", 0.100, 10, share=10),
    )
}
W3_TITLE = "a mutation that INSERTs one row in a user table"
ORDER = ("W1", "W2", "W3", "W4")

DURAFN, BATCHED, DEFAULTS = "durafn actions", "Graphile batched", "Graphile defaults"
INSERTS, NOOPS = "durafn, inserting mutations", "durafn, no-op mutations, same run"
SA, RAW = "SQLAlchemy AsyncConnection, commit every B", "asyncpg directly, commit every B"
SQLITE_INSERTS, SQLITE_SA = "SQLite: durafn, inserting mutations", "SQLite: SQLAlchemy loop"


Run = Callable[[], Awaitable[dict[str, Any]]]


def _systems(key: str, jobs: int, batches: dict[str, float], tmp: str) -> dict[str, Run]:
    """The systems of workload ``key``, in round 1's order (durafn's insert drains come
    before the loops that take their batch size)."""

    def b(engine: str) -> int:
        return max(1, round(batches[engine]))

    if key == "W3":
        return {
            INSERTS: lambda: drains.durafn_mutations(jobs, True, None),
            NOOPS: lambda: drains.durafn_mutations(jobs, False, None),
            SA: lambda: drains.sqlalchemy_inserts(jobs, b("postgres"), None),
            RAW: lambda: drains.asyncpg_inserts(jobs, b("postgres")),
            SQLITE_INSERTS: lambda: drains.durafn_mutations(jobs, True, tmp),
            SQLITE_SA: lambda: drains.sqlalchemy_inserts(jobs, b("sqlite"), tmp),
        }
    w, n = WAITS[key], jobs // WAITS[key].share
    return {
        DURAFN: lambda: drains.durafn_waits(n, w),
        BATCHED: lambda: drains.graphile_waits(n, w, drains.graphile_batched(w.concurrency)),
        DEFAULTS: lambda: drains.graphile_waits(n, w, {"concurrency": w.concurrency}),
    }


def _median(values: list[Any]) -> Any:
    if isinstance(values[0], dict):
        keys = [k for k in values[0] if k != "wal_by_relation_per_job"]
        return {k: _median([v[k] for v in values]) for k in keys}
    if all(isinstance(v, int | float) for v in values):
        return statistics.median(values)
    return values[len(values) // 2]


RATIO_KEYS = (
    "jobs_per_s",
    "db_cpu_ms_per_1000",
    "worker_cpu_ms_per_1000",
    "commits_per_job",
    "wal_bytes_per_job",
    "wal_bytes_per_job_without_fpi",
)
PAIRS = {"W1": (DURAFN, BATCHED), "W2": (DURAFN, BATCHED), "W4": (DURAFN, BATCHED)}
W3_PAIRS = ((INSERTS, SA), (SQLITE_INSERTS, SQLITE_SA))


def _ratios(runs: dict[str, list[Any]], mine: str, theirs: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in RATIO_KEYS:
        rounds = [
            round(a[key] / b[key], 2)
            for a, b in zip(runs[mine], runs[theirs], strict=True)
            if isinstance(a, dict) and isinstance(b, dict) and a.get(key) and b.get(key)
        ]
        if rounds:
            out[key] = {"median": statistics.median(rounds), "rounds": rounds}
    return out


async def measure(
    jobs: int = 20_000,
    rounds: int = 3,
    only: Sequence[str] = ORDER,
    progress: Callable[[int], None] | None = None,
) -> dict[str, Any]:
    """Every workload of ``only``, ``rounds`` interleaved rounds; the report's dict."""
    workloads = [k for k in ORDER if k in only]
    batches = {"postgres": 0.0, "sqlite": 0.0}
    runs: dict[str, dict[str, list[Any]]] = {k: {} for k in workloads}
    with tempfile.TemporaryDirectory() as tmp:
        await pgcost.drop_scratch(leftovers=True)
        try:
            for r in range(rounds):
                for key in workloads:
                    systems = list(_systems(key, jobs, batches, tmp).items())
                    turn = r % len(systems)
                    for label, body in systems[turn:] + systems[:turn]:
                        try:
                            got: Any = await body()
                        except peers.NotInstalled as reason:
                            got = str(reason)
                        runs[key].setdefault(label, []).append(got)
                        if label in (INSERTS, SQLITE_INSERTS):
                            batches["sqlite" if label == SQLITE_INSERTS else "postgres"] = got[
                                "batch_rows"
                            ]
                if progress is not None:
                    progress(r + 1)
        finally:
            await pgcost.drop_scratch()
    report: dict[str, Any] = {"jobs": jobs, "rounds": rounds, "workloads": {}}
    for key in workloads:
        measured = {
            label: {
                "median": _median(got) if isinstance(got[0], dict) else got[0],
                "runs": got,
            }
            for label, got in runs[key].items()
        }
        entry: dict[str, Any] = {"systems": measured}
        if key == "W3":
            entry |= {"title": W3_TITLE, "jobs": jobs, "ratios": {}}
            for mine, theirs in W3_PAIRS:
                entry["ratios"][f"{mine} / {theirs}"] = _ratios(runs[key], mine, theirs)
        else:
            w = WAITS[key]
            entry |= {
                "title": w.title,
                "jobs": jobs // w.share,
                "ideal_per_s": w.ideal_per_s,
                "ratios": {f"{DURAFN} / {BATCHED}": _ratios(runs[key], *PAIRS[key])},
            }
            for got in runs[key].values():
                for run in got:
                    if isinstance(run, dict):
                        run["of_ideal"] = round(run["jobs_per_s"] / w.ideal_per_s, 3)
            for system in measured.values():
                if isinstance(system["median"], dict):
                    system["median"]["of_ideal"] = round(
                        system["median"]["jobs_per_s"] / w.ideal_per_s, 3
                    )
        report["workloads"][key] = entry
    return report


async def for_suite(
    jobs: int, rounds: int, progress: Callable[[int], None] | None = None
) -> dict[str, Any]:
    """``measure`` for ``make bench``: a machine that cannot measure this way (no
    pg_waldump, no ``/proc``, pg_wal unreadable) gets the reason, not an error."""
    try:
        return await measure(jobs, rounds, progress=progress)
    except pgcost.Unavailable as reason:
        return {"skipped": f"skipped: {reason}"}


def cli() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", default=",".join(ORDER), help="e.g. W1,W3")
    parser.add_argument("--json", type=Path, help="write the report here too")
    parser.add_argument(
        "--server",
        default=throughput.SERVER,
        help="the PostgreSQL server, HOST:PORT (user postgres, trust; its pg_wal readable)",
    )
    args = parser.parse_args()
    throughput.use_server(args.server)
    only = [k.strip().upper() for k in args.only.split(",")]
    if unknown := set(only) - set(ORDER):
        parser.error(f"unknown workload(s) {', '.join(sorted(unknown))}; known: W1,W2,W3,W4")

    def done(r: int) -> None:
        print(f"round {r} of {args.rounds} done", flush=True)

    report = anyio.run(measure, args.jobs, args.rounds, only, done)
    report["command"] = "python -m benchmarks.realwork " + " ".join(
        f"--{k} {v}"
        for k, v in (
            ("jobs", args.jobs),
            ("rounds", args.rounds),
            ("only", args.only),
            ("server", args.server),
        )
    )
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2))
    print(markdown(report))


if __name__ == "__main__":
    cli()
