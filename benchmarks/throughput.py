"""First benchmark: drain rate of no-op scheduled mutations, and start lag on an idle executor.

    python -m benchmarks.throughput [--engines sqlite,postgres] [--n 20000] [--lag-samples 300]

Numbers come from the real system clock on this machine; nothing here is asserted.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import asyncpg
from sqlalchemy import Column, Integer, MetaData, Table, func, insert, select

import durafn
from durafn import ActionCtx, MutationCtx

from . import cost

SERVER = "127.0.0.1:5432"
"""The PostgreSQL server the benchmarks use (``use_server``: ``make soak``'s scratch cluster)."""
PG_ADMIN = f"postgresql://postgres@{SERVER}/postgres"
PG_DB = "durafn_bench"


UrlFor = Callable[[str], Awaitable[str]]
"""A fresh database's URL, by name (``fresh_url`` of one engine and one directory)."""


async def per_engine(
    engines: list[str], measure_one: Callable[[UrlFor, str], Awaitable[Any]]
) -> None:
    """``measure_one(url_for, engine)`` for each engine, its databases made fresh by name
    (SQLite files in a temporary directory, removed at the end)."""
    with tempfile.TemporaryDirectory() as tmp:
        for engine in engines:

            async def url_for(name: str, engine: str = engine) -> str:
                return await fresh_url(engine, tmp, name)

            await measure_one(url_for, engine)


async def fresh_url(engine: str, directory: str | Path, name: str) -> str:
    """An empty database of ``engine``: a new SQLite file ``name`` in ``directory``, or the
    benchmark's PostgreSQL database dropped and created again."""
    if engine == "sqlite":
        return f"sqlite+aiosqlite:///{Path(directory) / name}.sqlite3"
    return await _fresh_postgres()


async def _fresh_postgres() -> str:
    await pg_admin(f"DROP DATABASE IF EXISTS {PG_DB} WITH (FORCE)", f"CREATE DATABASE {PG_DB}")
    return pg_url(PG_DB)


def use_server(server: str) -> None:
    """Point the benchmarks at another server (``HOST:PORT``), before any run."""
    global SERVER, PG_ADMIN
    SERVER = server
    PG_ADMIN = f"postgresql://postgres@{server}/postgres"


def pg_dsn(database: str) -> str:
    """``database`` on the benchmarks' server, for asyncpg (and Graphile Worker)."""
    return f"postgresql://postgres@{SERVER}/{database}"


async def pg_admin(*statements: str) -> None:
    """Run ``statements`` on the server's admin database (creating, dropping databases)."""
    conn = await asyncpg.connect(pg_dsn("postgres"))
    try:
        for statement in statements:
            await conn.execute(statement)
    finally:
        await conn.close()


def pg_url(database: str) -> str:
    return f"postgresql+asyncpg://postgres@{SERVER}/{database}"


# The user table of the "each mutation inserts one row" drain.
_USER = MetaData()
ROWS = Table("bench_rows", _USER, Column("id", Integer, primary_key=True), Column("n", Integer))


def _build(url: str) -> tuple[durafn.App, Any, Any, list[float]]:
    app = durafn.App(url)
    lags: list[float] = []

    @app.mutation(name="bench:noop")
    async def noop(ctx: MutationCtx) -> None:
        pass

    @app.mutation(name="bench:probe")
    async def probe(ctx: MutationCtx, due: float) -> None:
        lags.append(time.time() - due)

    @app.action(name="bench:noop_action")
    async def noop_action(ctx: ActionCtx) -> None:
        pass

    @app.mutation(name="bench:insert")
    async def insert_one(ctx: MutationCtx, n: int) -> None:
        await ctx.db.execute(insert(ROWS).values(n=n))

    @app.mutation(name="bench:fan_out")
    async def fan_out(ctx: MutationCtx, n: int, kind: str = "mutation") -> None:
        for i in range(n):
            if kind == "mutation":
                await ctx.scheduler.run_after(0, noop)
            elif kind == "insert":
                await ctx.scheduler.run_after(0, insert_one, i)
            else:
                await ctx.scheduler.run_after(0, noop_action)

    return app, fan_out, probe, lags


async def _count(app: durafn.App, state: str) -> int:
    sf = durafn.scheduled_functions
    async with app.engine.connect() as conn:
        query = select(func.count()).select_from(sf).where(sf.c.state == state)
        return int((await conn.execute(query)).scalar_one())


async def until_done(
    executor: Any, kind: str, n: int, progress: Callable[[int], None] | None = None
) -> None:
    """Wait until the executor has counted ``n`` committed outcomes of ``kind``: woken by
    each batch it commits (its progress signal), not by a poll. (A poll every millisecond
    cost the drain 3-9 us of CPU per row, as much as a fifth of durafn's own.)"""
    counted = "actions" if kind == "action" else "mutations"
    stats, tally = executor.stats, executor._tally
    while True:
        finished = tally.progress.current()
        done = stats[counted] + stats["failed"]
        if progress is not None:
            progress(done)
        if done >= n:
            return
        await finished.wait()


async def drain(
    url: str,
    n: int,
    kind: str = "mutation",
    progress: Callable[[int], None] | None = None,
    prefill: Callable[[durafn.App], Awaitable[None]] | None = None,
    scheduled: Callable[[durafn.App], Awaitable[None]] | None = None,
) -> dict[str, float | None]:
    """Schedule ``n`` no-op functions of ``kind`` (1000 per mutation), then drain them with
    one executor; rows/s for both, and the drain's CPU per 1,000 rows (``cost``).
    ``prefill`` adds a backlog first; ``scheduled`` is called once the rows are written
    (not timed)."""
    app, fan_out, _, _ = _build(url)
    await app.migrate()
    async with app.engine.begin() as conn:
        await conn.run_sync(_USER.create_all)
    if prefill is not None:
        await prefill(app)
    t0 = time.perf_counter()
    for start in range(0, n, 1000):
        await app.run_mutation(fan_out, min(1000, n - start), kind)
    schedule_s = time.perf_counter() - t0
    if scheduled is not None:
        await scheduled(app)
    before = cost.read()
    t0 = time.perf_counter()
    # Actions: 100 at once, as pgqueuer's batch_size=100 in peers.py (the same settings).
    concurrency = 100 if kind == "action" else 10
    async with app.run_executor(concurrency=concurrency) as executor:
        # The executor's own counter of committed outcomes: no query competes with the
        # drain, and the stop is timed at the commit that ends it.
        await until_done(executor, kind, n, progress)
        drain_s = time.perf_counter() - t0
        after = cost.read()
    succeeded = await _count(app, "Success")
    await app.aclose()
    if prefill is None and succeeded != n:
        raise SystemExit(f"only {succeeded} of {n} rows ended Success")
    spent = cost.per_thousand(before, after, n)
    if not url.startswith("postgresql"):
        spent["database_cpu_ms_per_1000"] = None  # SQLite's work is the worker's own
    return {"scheduled_per_s": n / schedule_s, "drained_per_s": n / drain_s, **spent}


WARMUP = 20


async def start_lag(
    url: str,
    samples: int,
    *,
    ahead: float,
    prefill: Callable[[durafn.App], Awaitable[None]] | None = None,
) -> dict[str, Any]:
    """Schedule one probe at a time, due ``ahead`` seconds out; lag = start - due.

    The first ``WARMUP`` probes are not counted: they open the pool's connections and
    prepare each statement on them (on PostgreSQL the very first took 20-60 ms). The lag of
    the first one is reported apart, as ``cold_ms``.
    """
    app, _, probe, lags = _build(url)
    await app.migrate()
    if prefill is not None:
        await prefill(app)
    sched = app.scheduler()
    async with app.run_executor() as executor:
        for i in range(WARMUP + samples):
            if i == WARMUP:
                cold, lags[:] = lags[0], []
            due = time.time() + ahead
            sid = await sched.run_at(due, probe, due=due)
            await executor.wait_for(sid)
    await app.aclose()
    ms = sorted(x * 1000 for x in lags)
    return {
        "cold_ms": cold * 1000,
        "median_ms": statistics.median(ms),
        "p99_ms": ms[min(len(ms) - 1, int(len(ms) * 0.99))],
        "max_ms": ms[-1],
        "samples_ms": [round(x, 3) for x in ms],  # for the distribution chart
    }


async def main(engines: list[str], n: int, lag_samples: int) -> dict[str, Any]:
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for engine in engines:

            async def url(name: str, _engine: str = engine) -> str:
                return await fresh_url(_engine, tmp, name)

            results[engine] = {
                "noop_mutations": await drain(await url("drain"), n),
                "start_lag_due_now": await start_lag(await url("lag0"), lag_samples, ahead=0),
                "start_lag_due_at_time": await start_lag(
                    await url("lag1"), lag_samples, ahead=0.02
                ),
            }
            print(engine, json.dumps(results[engine], indent=2))
    return results


def cli() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--engines", default="sqlite,postgres")
    parser.add_argument("--n", type=int, default=20000)
    parser.add_argument("--lag-samples", type=int, default=300)
    args = parser.parse_args()
    anyio.run(main, args.engines.split(","), args.n, args.lag_samples)


if __name__ == "__main__":
    cli()
