"""Many executors against one PostgreSQL: what grows with their number is the database's
work. Each executor stands for a worker host: an app of its own (its own engine and
connection pool) with one executor, running actions that wait on simulated I/O (an awaited
sleep) instead of burning CPU.

    python -m benchmarks.scale [--executors 1,2,4,8,16,24] [--processes 2]
                               [--concurrency 10] [--io 0.1] [--seconds 4] [--jobs N]
                               [--pooler] [--server-connections 16] [--json PATH]

The executors are spread over ``--processes`` real processes (``python -m
benchmarks.scale child ...``), so that N does not cost N interpreters on a small machine.
For each N: a fresh scratch database (``pgcost.scratch``); the executors start and
register; a backlog that keeps every executor busy for about ``--seconds`` (at most
``--jobs`` rows) is written due at one moment; it drains.

``--pooler``: the executors reach the server through PgBouncer in transaction mode
(Debian's package, started here: ``tests/support/pgbouncer.py``), with
``--server-connections`` server connections for them all, and LISTEN on a direct
connection per process (``pooler=transaction&listen=...`` in their URL); each
executor's pool is its ``--connections`` (4) client connections to PgBouncer. The
server's ``max_connections`` is read before and after, never changed.

Reported per N:

* rows/s, from the due time to the last ``completed_time`` (and the ideal,
  N x concurrency / io, which only the database or the machine's CPU can cap);
* the database's CPU per 1,000 rows: its own backends' (``pgcost.Meter``, the run's
  database only, less this process's watching connection), and the workers' (their
  processes, from ``/proc``), and PgBouncer's (``--pooler``);
* lock waits: the share of the database's busy backends seen waiting on a heavyweight
  lock (``wait_event_type = 'Lock'``) or a lightweight one (``LWLock``), sampled every
  20 ms from ``pg_stat_activity`` on a connection to another database;
* connections: the most of the run's database's backends seen at once (server
  connections: PgBouncer's, LISTEN, and this process's watcher), of them LISTEN, and of
  the whole server's (every database's clients, against ``max_connections``);
* WAL bytes per row (``pgcost``: the run's database's records) and commits per row
  (``pg_stat_database``, read while clients are connected: a backend reports within 1 s).

Nothing here is asserted: it is a measurement.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import asyncpg

import durafn
from durafn import ActionCtx
from tests.support.pgbouncer import PgBouncer, binary

from . import cost, pgcost
from .throughput import PG_ADMIN, pg_url

ROOT = Path(__file__).resolve().parent.parent
SERVER = "127.0.0.1:5432"


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


# --- the pooler ------------------------------------------------------------------------------


class Pooler:
    """PgBouncer in transaction mode, run by this process for the whole benchmark."""

    def __init__(self, bouncer: PgBouncer, process: anyio.abc.Process) -> None:
        self.bouncer = bouncer
        self.process = process

    def url(self, database: str) -> str:
        return self.bouncer.url(database, listen=SERVER)

    def cpu(self) -> float:
        return cost.process_cpu(self.process.pid)


@asynccontextmanager
async def pooler(server_connections: int, clients: int) -> AsyncIterator[Pooler]:
    """Start PgBouncer (``tests/support/pgbouncer.py``: the tests' configuration) with
    ``server_connections`` for each database, taking up to ``clients`` connections."""
    executable = binary()
    if executable is None:
        raise SystemExit("--pooler needs PgBouncer: apt-get install pgbouncer")
    with tempfile.TemporaryDirectory(prefix="durafn-scale-") as directory:
        bouncer = PgBouncer(
            Path(directory),
            pool_size=server_connections,
            max_clients=clients,
            log_connections=False,
        )
        async with await anyio.open_process(
            bouncer.command(executable), stdout=None, stderr=None
        ) as process:
            try:
                await bouncer.ready("postgres", 60)
                yield Pooler(bouncer, process)
            finally:
                process.terminate()
                with anyio.move_on_after(10):
                    await process.wait()
                if process.returncode is None:
                    process.kill()


# --- the parent ------------------------------------------------------------------------------


async def _connect(url: str) -> asyncpg.Connection:
    return await asyncpg.connect(url.split("?")[0].replace("postgresql+asyncpg", "postgresql"))


async def _sample(
    conn: asyncpg.Connection, database: str, stop: anyio.Event, into: dict[str, Any]
) -> None:
    """Every 20 ms, from a connection to another database: the run's database's
    connections, its LISTEN ones, the whole server's, and what its busy backends wait on."""
    busy = lock = lwlock = peak = listening = server = 0
    events: Counter[str] = Counter()
    while not stop.is_set():
        rows = await conn.fetch(
            "SELECT datname = $1 AS ours, state, wait_event_type, wait_event,"
            " query LIKE 'LISTEN%' AS listen FROM pg_stat_activity"
            " WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()",
            database,
        )
        ours = [row for row in rows if row["ours"]]
        peak = max(peak, len(ours))
        listening = max(listening, sum(row["listen"] for row in ours))
        server = max(server, len(rows) + 1)  # and this one
        for row in ours:
            if row["state"] == "active":
                busy += 1
                lock += row["wait_event_type"] == "Lock"
                lwlock += row["wait_event_type"] == "LWLock"
                if row["wait_event_type"] in ("Lock", "LWLock", "IO"):
                    events[row["wait_event"]] += 1
        await anyio.sleep(0.02)
    into.update(
        connections=peak,
        listen_connections=listening,
        server_connections=server,
        lock_wait_share=round(lock / busy, 3) if busy else 0.0,
        lwlock_wait_share=round(lwlock / busy, 3) if busy else 0.0,
        waits={event: round(seen / busy, 3) for event, seen in events.most_common(3)},
    )


async def _commits(conn: asyncpg.Connection, database: str) -> int:
    return int(
        await conn.fetchval("SELECT xact_commit FROM pg_stat_database WHERE datname = $1", database)
    )


async def _drained(conn: asyncpg.Connection, rows: int) -> None:
    """Progress lives in the children's commits: polled, and rarely (a count every 10 ms
    cost the database more than the drain it watched)."""
    done = "SELECT count(*) FROM _scheduled_functions WHERE state = 'Success'"
    while await conn.fetchval(done) < rows:  # noqa: ASYNC110
        await anyio.sleep(0.25)


def _rows(n: int, args: argparse.Namespace) -> int:
    """Enough rows to keep every executor busy for about ``--seconds``, at most
    ``--jobs`` (and at least 100)."""
    ideal = n * args.concurrency / args.io
    return max(100, min(int(args.jobs), int(ideal * args.seconds)))


async def one(n: int, args: argparse.Namespace, pool: Pooler | None) -> dict[str, Any]:
    database = await pgcost.scratch(f"scale_{n}{'_pooled' if pool else ''}")
    direct = pg_url(database)
    url = direct if pool is None else pool.url(database)
    app = durafn.App(direct)
    io_fn = register(app)
    await app.migrate()
    ideal = n * args.concurrency / args.io
    rows = _rows(n, args)
    split = [n // args.processes + (i < n % args.processes) for i in range(args.processes)]
    procs: list[anyio.abc.Process] = []
    child = [sys.executable, "-m", "benchmarks.scale", "child", url]
    admin = await asyncpg.connect(PG_ADMIN)  # another database: not one of the run's
    meter: pgcost.Meter | None = None
    try:
        limit = await admin.fetchval("SHOW max_connections")
        for count in filter(None, split):
            settings = [str(count), str(args.concurrency), str(args.connections)]
            procs.append(await anyio.open_process([*child, *settings], cwd=ROOT, stderr=None))
        for proc in procs:  # every executor registered and claiming
            assert proc.stdout is not None
            line = await proc.stdout.receive()
            assert line.startswith(b"ready"), line
        # Written ahead of its due time, so that the drain starts with the whole backlog.
        due = time.time() + 1 + rows / 20_000
        sched = app.scheduler()
        for start in range(0, rows, 10_000):
            calls = [io_fn.call(args.io).at(due) for _ in range(min(10_000, rows - start))]
            await sched.run_many(calls)
        await app.aclose()  # from here on, the parent's own read of the run's database:
        watcher = await _connect(direct)
        ours = await watcher.fetchval("SELECT pg_backend_pid()")  # its CPU is taken off
        try:
            meter = await pgcost.Meter.start(database, counters=False)
            await anyio.sleep(max(0.0, due - time.time()))
            ours_before = cost.process_cpu(ours)
            workers_before = sum(cost.process_cpu(p.pid) for p in procs)
            pooler_before = pool.cpu() if pool else 0.0
            commits0 = await _commits(admin, database)
            seen: dict[str, Any] = {}
            stop = anyio.Event()
            async with anyio.create_task_group() as tg:
                tg.start_soon(_sample, admin, database, stop, seen)
                await _drained(watcher, rows)
                stop.set()
            await meter.stop()
            ours_spent = cost.process_cpu(ours) - ours_before
            workers_spent = sum(cost.process_cpu(p.pid) for p in procs) - workers_before
            pooler_spent = (pool.cpu() if pool else 0.0) - pooler_before
            commits1 = await _commits(admin, database)
            last = await watcher.fetchval("SELECT max(completed_time) FROM _scheduled_functions")
        finally:
            await watcher.close()
        figures = await meter.figures(rows)
        limit_after = await admin.fetchval("SHOW max_connections")
        rate = rows / (float(last) - due)
        per_1000 = 1_000_000 / rows
        database_ms = figures["db_cpu_ms_per_1000"] - ours_spent * per_1000
        return {
            "executors": n,
            "pooled": pool is not None,
            "rows": rows,
            "rows_per_s": round(rate),
            "ideal_per_s": round(ideal),
            "of_ideal": round(rate / ideal, 2),
            "database_cpu_ms_per_1000": round(database_ms, 1),
            "workers_cpu_ms_per_1000": round(workers_spent * per_1000, 1),
            "pgbouncer_cpu_ms_per_1000": round(pooler_spent * per_1000, 1) if pool else None,
            "wal_bytes_per_row": figures["wal_bytes_per_job"],
            "commits_per_row": round((commits1 - commits0) / rows, 3),
            **seen,
            "client_connections_per_executor": args.connections,
            "server_pool": pool.bouncer.pool_size if pool else None,
            "max_connections": f"{limit} -> {limit_after}",
        }
    finally:
        if meter is not None:
            await meter.close()
        for proc in procs:
            if proc.stdin is not None:
                await proc.stdin.aclose()
        for proc in procs:
            with anyio.move_on_after(60):
                await proc.wait()
            if proc.returncode is None:
                proc.kill()
        await app.aclose()
        await admin.close()
        if pool is not None:  # the next N's server connections, not this one's idle ones
            await pool.bouncer.close_server_connections(database)


def _table(results: list[dict[str, Any]]) -> str:
    head = (
        "| executors | rows | rows/s | of ideal | DB CPU ms/1000 | workers CPU ms/1000"
        " | PgBouncer CPU ms/1000 | WAL B/row | commits/row | LWLock waits"
        " | server connections (LISTEN) | whole server | max_connections |"
    )
    lines = [head, "|" + "---|" * 13]
    for r in results:
        bouncer = r["pgbouncer_cpu_ms_per_1000"]
        lines.append(
            f"| {r['executors']} | {r['rows']:,} | {r['rows_per_s']:,} | {r['of_ideal']} |"
            f" {r['database_cpu_ms_per_1000']:,} | {r['workers_cpu_ms_per_1000']:,} |"
            f" {'-' if bouncer is None else f'{bouncer:,}'} | {r['wal_bytes_per_row']:,.0f} |"
            f" {r['commits_per_row']} | {r['lwlock_wait_share']:.1%} |"
            f" {r['connections']} ({r['listen_connections']}) | {r['server_connections']} |"
            f" {r['max_connections']} |"
        )
    return "\n".join(lines)


async def main(args: argparse.Namespace) -> list[dict[str, Any]]:
    results = []
    counts = [int(x) for x in args.executors.split(",")]
    try:
        async with AsyncExitStack() as stack:
            pool = None
            if args.pooler:
                clients = max(counts) * args.connections + 50
                pool = await stack.enter_async_context(pooler(args.server_connections, clients))
            for n in counts:
                result = await one(n, args, pool)
                print(json.dumps(result), flush=True)
                results.append(result)
    finally:  # once PgBouncer has closed its connections to them
        await pgcost.drop_scratch()
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
    parser.add_argument("--jobs", type=int, default=100_000, help="the most rows per point")
    parser.add_argument(
        "--pooler", action="store_true", help="through PgBouncer in transaction mode"
    )
    parser.add_argument(
        "--server-connections",
        type=int,
        default=16,
        help="with --pooler: PgBouncer's server connections for them all",
    )
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    results = anyio.run(main, args)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    _cli()
