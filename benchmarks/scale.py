"""Many executors against one PostgreSQL: what grows with their number is the database's
work. Each executor stands for a worker host: an app of its own (its own engine and
connection pool) with one executor, running actions that wait on simulated I/O (an awaited
sleep) instead of burning CPU.

    python -m benchmarks.scale [--executors 1,2,4,8,16,24] [--processes 2]
                               [--concurrency 10] [--io 0.1] [--seconds 4] [--json PATH]

The executors are spread over ``--processes`` real processes (``python -m
benchmarks.scale child ...``), so that N does not cost N interpreters on a small machine.
For each N: a fresh database; the executors start and register; a backlog that keeps
every executor busy for about ``--seconds`` is written due at one moment; it drains.
Reported per N:

* rows/s, from the due time to the last ``completed_time`` (and the ideal,
  N x concurrency / io, which only the database or the machine's CPU can cap);
* the database's CPU per 1,000 rows (every PostgreSQL process, ``cost.postgres_cpu``) and
  the workers' (their processes, from ``/proc``);
* lock waits: the share of the database's busy backends seen waiting on a heavyweight
  lock (``wait_event_type = 'Lock'``) or a lightweight one (``LWLock``), sampled every
  20 ms from ``pg_stat_activity``;
* connections: the most seen open on the database, and per executor;
* WAL bytes and commits per row (``pg_stat_wal``, ``pg_stat_database``).

Nothing here is asserted: it is a measurement.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import Counter
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import asyncpg

import durafn
from durafn import ActionCtx

from . import cost
from .throughput import PG_DB, _fresh_postgres

ROOT = Path(__file__).resolve().parent.parent


def register(app: durafn.App) -> durafn.ActionRef[[float], None]:
    @app.action(name="scale:io")
    async def io(ctx: ActionCtx, seconds: float) -> None:
        await anyio.sleep(seconds)  # a call to a slow service: the worker waits, idle

    return io


# --- the child: some of the executors, each an app of its own ------------------------------


async def _child(url: str, executors: int, concurrency: int, connections: int) -> None:
    async with AsyncExitStack() as stack:
        for _ in range(executors):
            app = durafn.App(url, max_connections=connections)
            register(app)
            stack.push_async_callback(app.aclose)
            await stack.enter_async_context(app.executor(concurrency=concurrency))
        print("ready", flush=True)
        await anyio.wrap_file(sys.stdin).readline()  # the parent closes stdin to stop us


# --- the parent ------------------------------------------------------------------------------


async def _connect(url: str) -> asyncpg.Connection:
    return await asyncpg.connect(url.replace("postgresql+asyncpg", "postgresql"))


async def _sample(conn: asyncpg.Connection, stop: anyio.Event, into: dict[str, Any]) -> None:
    """Every 20 ms: the database's connections and what its busy backends wait on."""
    busy = lock = lwlock = peak = 0
    events: Counter[str] = Counter()
    while not stop.is_set():
        rows = await conn.fetch(
            "SELECT state, wait_event_type, wait_event FROM pg_stat_activity"
            " WHERE datname = $1 AND backend_type = 'client backend'",
            PG_DB,
        )
        peak = max(peak, len(rows) - 2)  # not this connection, nor the parent's other
        for row in rows:
            if row["state"] == "active":
                busy += 1
                lock += row["wait_event_type"] == "Lock"
                lwlock += row["wait_event_type"] == "LWLock"
                if row["wait_event_type"] in ("Lock", "LWLock", "IO"):
                    events[row["wait_event"]] += 1
        await anyio.sleep(0.02)
    into.update(
        connections=peak,
        lock_wait_share=round(lock / busy, 3) if busy else 0.0,
        lwlock_wait_share=round(lwlock / busy, 3) if busy else 0.0,
        waits={event: round(seen / busy, 3) for event, seen in events.most_common(3)},
    )


async def _server_counters(conn: asyncpg.Connection) -> tuple[int, int]:
    wal = await conn.fetchval("SELECT wal_bytes FROM pg_stat_wal")
    commits = await conn.fetchval(
        "SELECT xact_commit FROM pg_stat_database WHERE datname = $1", PG_DB
    )
    return int(wal), int(commits)


async def _drained(conn: asyncpg.Connection, rows: int) -> None:
    """Progress lives in the children's commits: polled, and rarely (a count every 10 ms
    cost the database more than the drain it watched)."""
    done = "SELECT count(*) FROM _scheduled_functions WHERE state = 'Success'"
    while await conn.fetchval(done) < rows:  # noqa: ASYNC110
        await anyio.sleep(0.25)


async def one(
    n: int, processes: int, concurrency: int, connections: int, io: float, seconds: float
) -> dict[str, Any]:
    url = await _fresh_postgres()
    app = durafn.App(url)
    io_fn = register(app)
    await app.migrate()
    ideal = n * concurrency / io
    rows = max(1000, int(ideal * seconds))
    split = [n // processes + (i < n % processes) for i in range(processes)]
    procs: list[anyio.abc.Process] = []
    child = [sys.executable, "-m", "benchmarks.scale", "child", url]
    try:
        for count in filter(None, split):
            settings = [str(count), str(concurrency), str(connections)]
            procs.append(await anyio.open_process([*child, *settings], cwd=ROOT, stderr=None))
        for proc in procs:  # every executor registered and claiming
            assert proc.stdout is not None
            line = await proc.stdout.receive()
            assert line.startswith(b"ready"), line
        # Written ahead of its due time, so that the drain starts with the whole backlog.
        due = time.time() + 1 + rows / 20_000
        sched = app.scheduler()
        for start in range(0, rows, 10_000):
            calls = [io_fn.call(io).at(due) for _ in range(min(10_000, rows - start))]
            await sched.run_many(calls)
        await app.aclose()  # from here on, the parent's own reads are the two below
        watcher, sampler = await _connect(url), await _connect(url)
        # Their backends' CPU is the benchmark's, not the drain's: taken off below.
        ours = [await c.fetchval("SELECT pg_backend_pid()") for c in (watcher, sampler)]
        try:
            await anyio.sleep(max(0.0, due - time.time()))
            before = cost.read(None)
            ours_before = sum(cost.process_cpu(pid) for pid in ours)
            workers_before = sum(cost.process_cpu(p.pid) for p in procs)
            wal0, commits0 = await _server_counters(watcher)
            seen: dict[str, Any] = {}
            stop = anyio.Event()
            async with anyio.create_task_group() as tg:
                tg.start_soon(_sample, sampler, stop, seen)
                await _drained(watcher, rows)
                stop.set()
            after = cost.read(None)
            ours_after = sum(cost.process_cpu(pid) for pid in ours)
            workers_after = sum(cost.process_cpu(p.pid) for p in procs)
            wal1, commits1 = await _server_counters(watcher)
            last = await watcher.fetchval("SELECT max(completed_time) FROM _scheduled_functions")
        finally:
            await watcher.close()
            await sampler.close()
        rate = rows / (float(last) - due)
        assert before.database is not None and after.database is not None
        database = after.database - before.database - (ours_after - ours_before)
        return {
            "executors": n,
            "rows": rows,
            "rows_per_s": round(rate),
            "ideal_per_s": round(ideal),
            "of_ideal": round(rate / ideal, 2),
            "database_cpu_ms_per_1000": round(database * 1e6 / rows, 1),
            "workers_cpu_ms_per_1000": round((workers_after - workers_before) * 1e6 / rows, 1),
            "wal_bytes_per_row": round((wal1 - wal0) / rows),
            "commits_per_row": round((commits1 - commits0) / rows, 3),
            **seen,
            "connections_per_executor": round(seen["connections"] / n, 1),
        }
    finally:
        for proc in procs:
            if proc.stdin is not None:
                await proc.stdin.aclose()
        for proc in procs:
            with anyio.move_on_after(60):
                await proc.wait()
            if proc.returncode is None:
                proc.kill()
        await app.aclose()


def _table(results: list[dict[str, Any]]) -> str:
    head = (
        "| executors | rows/s | of ideal | DB CPU ms/1000 | workers CPU ms/1000 | WAL B/row"
        " | commits/row | lock waits | LWLock waits | connections |"
    )
    lines = [head, "|" + "---|" * 10]
    for r in results:
        lines.append(
            f"| {r['executors']} | {r['rows_per_s']:,} | {r['of_ideal']} |"
            f" {r['database_cpu_ms_per_1000']} | {r['workers_cpu_ms_per_1000']} |"
            f" {r['wal_bytes_per_row']} | {r['commits_per_row']} | {r['lock_wait_share']:.1%} |"
            f" {r['lwlock_wait_share']:.1%} | {r['connections']} |"
        )
    return "\n".join(lines)


async def main(args: argparse.Namespace) -> list[dict[str, Any]]:
    results = []
    for n in (int(x) for x in args.executors.split(",")):
        result = await one(
            n, args.processes, args.concurrency, args.connections, args.io, args.seconds
        )
        print(json.dumps(result), flush=True)
        results.append(result)
    db = [r["database_cpu_ms_per_1000"] for r in results if r["database_cpu_ms_per_1000"]]
    if db:
        per_row = statistics.median(db) / 1000  # ms of one core per row
        print(
            f"database CPU per row, median over N: {per_row * 1000:.0f} us;"
            f" one core of the primary saturates near {1000 / per_row:,.0f} rows/s"
        )
    print(_table(results))
    return results


def _cli() -> None:
    if sys.argv[1:2] == ["child"]:
        url, executors, concurrency, connections = sys.argv[2], *map(int, sys.argv[3:6])
        anyio.run(_child, url, executors, concurrency, connections)
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--executors", default="1,2,4,8,16,24")
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=10)
    parser.add_argument(
        "--connections", type=int, default=4, help="each executor's App(max_connections=)"
    )
    parser.add_argument("--io", type=float, default=0.1, help="seconds each action waits")
    parser.add_argument("--seconds", type=float, default=4.0, help="the drain's length")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    results = anyio.run(main, args)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    _cli()
