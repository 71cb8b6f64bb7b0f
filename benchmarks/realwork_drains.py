"""The drains of ``benchmarks.realwork``: each enqueues its jobs (not timed), closes the
connections that did, then drains them in a database of its own, measured by
``pgcost.Meter`` on PostgreSQL (by this process's CPU alone on SQLite). Each returns its
figures per job, the wall seconds from the first job's start to the last one's committed
outcome, and jobs/s over them."""

from __future__ import annotations

import copy
import itertools
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import asyncpg
from sqlalchemy import event, func, insert, select
from sqlalchemy.ext.asyncio import create_async_engine

import durafn
from durafn import ActionCtx, MutationCtx

from . import peers, pgcost
from .throughput import _USER, ROWS, pg_dsn, pg_url, until_done


@dataclass(frozen=True)
class Waits:
    """A workload of jobs that await ``seconds``, run ``concurrency`` at a time."""

    key: str
    title: str
    seconds: float
    concurrency: int
    share: int = 1
    """The workload drains jobs // share jobs."""

    @property
    def ideal_per_s(self) -> float:
        return self.concurrency / self.seconds


def graphile_batched(concurrency: int) -> dict[str, Any]:
    """``peers.GRAPHILE_BATCHED`` at ``concurrency``: its local queue at least as large
    (Graphile warns of "drastically lower performance" below that); its pool stays 25,
    since running jobs hold no connection: fetches and completions are batched."""
    config = copy.deepcopy(peers.GRAPHILE_BATCHED)
    config["concurrency"] = concurrency
    config["preset"]["localQueue"]["size"] = max(500, concurrency)
    return config


class _First:
    """The wall time (perf_counter) the first job started."""

    at: float | None = None

    def mark(self) -> None:
        if self.at is None:
            self.at = time.perf_counter()


async def _enqueue(app: durafn.App, calls: list[Any]) -> None:
    scheduler = app.scheduler()
    for start in range(0, len(calls), 10_000):  # run_many's limit from outside
        await scheduler.run_many(calls[start : start + 10_000])


async def _durafn_drain(
    app: durafn.App,
    database: str | None,
    calls: list[Any],
    kind: str,
    first: _First,
    **options: Any,
) -> dict[str, Any]:
    """Enqueue ``calls``, close the app's connections, then drain them with one executor
    in this process; ``database``: the PostgreSQL scratch database (None: SQLite)."""
    n = len(calls)
    await app.migrate()
    async with app.engine.begin() as conn:
        await conn.run_sync(_USER.create_all)
    await _enqueue(app, calls)
    await app.aclose()
    meter = None if database is None else await pgcost.Meter.start(database)
    try:
        cpu = time.process_time()
        async with app.run_executor(**options) as executor:
            await until_done(executor, kind, n)
            ended = time.perf_counter()
            cpu = time.process_time() - cpu
            if meter is not None:
                await meter.stop()
        await app.aclose()
        if meter is not None:
            figures = await meter.figures(n)
        else:  # SQLite: the database's work is the worker's own
            figures = {"worker_cpu_ms_per_1000": round(cpu * 1_000_000 / n, 1)}
    finally:
        if meter is not None:
            await meter.close()
    sf = durafn.scheduled_functions
    async with app.engine.connect() as conn:
        done, batches = (
            await conn.execute(
                select(func.count(), func.count(sf.c.completed_time.distinct())).where(
                    sf.c.state == "Success"
                )
            )
        ).one()
    await app.aclose()
    if done != n or first.at is None:
        raise RuntimeError(f"durafn: {done} of {n} rows ended Success")
    seconds = ended - first.at
    return {**figures, "seconds": seconds, "jobs_per_s": n / seconds, "batch_rows": n / batches}


async def durafn_waits(n: int, w: Waits) -> dict[str, Any]:
    database = await pgcost.scratch(f"{w.key}_durafn")
    app = durafn.App(pg_url(database))
    first = _First()

    @app.action(name="bench:wait")
    async def wait(ctx: ActionCtx) -> None:
        first.mark()
        await anyio.sleep(w.seconds)

    calls = [wait.call() for _ in range(n)]
    return await _durafn_drain(app, database, calls, "action", first, concurrency=w.concurrency)


_files = itertools.count()


async def _database(tag: str, sqlite_dir: str | None) -> tuple[str | None, str]:
    """A scratch PostgreSQL database and its URL, or (None, a new SQLite file's URL)."""
    if sqlite_dir is not None:
        path = Path(sqlite_dir) / f"{tag}_{next(_files)}.sqlite3"
        return None, f"sqlite+aiosqlite:///{path}"
    database = await pgcost.scratch(tag)
    return database, pg_url(database)


async def durafn_mutations(n: int, inserting: bool, sqlite_dir: str | None) -> dict[str, Any]:
    """``n`` mutations, each inserting a row into ``bench_rows`` or doing nothing, at the
    executor's defaults; on SQLite where ``sqlite_dir`` is given."""
    tag = "insert" if inserting else "noop"
    database, url = await _database(f"w3_{tag}", sqlite_dir)
    app = durafn.App(url)
    first = _First()

    @app.mutation(name="bench:insert")
    async def insert_one(ctx: MutationCtx, n: int) -> None:
        first.mark()
        await ctx.db.execute(insert(ROWS).values(n=n))

    @app.mutation(name="bench:noop")
    async def noop(ctx: MutationCtx) -> None:
        first.mark()

    calls = [insert_one.call(i) if inserting else noop.call() for i in range(n)]
    return await _durafn_drain(app, database, calls, "mutation", first)


async def graphile_waits(n: int, w: Waits, config: dict[str, Any]) -> dict[str, Any]:
    """Graphile Worker's drain of ``n`` jobs that await ``w.seconds`` (``graphile/work.mjs``)."""
    node = peers.graphile_node()
    database = await pgcost.scratch(f"{w.key}_graphile")
    dsn = pg_dsn(database)
    ms = str(round(w.seconds * 1000))
    command = [node, str(peers.GRAPHILE / "work.mjs"), dsn, str(n), ms, json.dumps(config)]
    async with await anyio.open_process(command, stderr=None) as process:
        assert process.stdin is not None and process.stdout is not None
        lines = peers.JsonLines(process.stdout)
        await lines.next()  # {"ready": true}: its jobs are in, its connection closed
        meter = await pgcost.Meter.start(database, process.pid)
        try:
            await process.stdin.send(b"go\n")
            result = await lines.next()
            await meter.stop()
            await process.stdin.send(b"stop\n")
            await process.wait()
            figures = await meter.figures(n)
        finally:
            await meter.close()
    return {**figures, "seconds": result["seconds"], "jobs_per_s": result["per_s"]}


def _sqlite_like_durafn(engine: Any) -> None:
    @event.listens_for(engine.sync_engine, "connect")
    def _pragmas(dbapi_conn: Any, _record: Any) -> None:
        cursor = dbapi_conn.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=FULL")
        cursor.close()


async def sqlalchemy_inserts(n: int, batch: int, sqlite_dir: str | None) -> dict[str, Any]:
    """The same INSERT in a loop on one ``AsyncConnection``, committing every ``batch``."""
    database, url = await _database("w3_sqlalchemy", sqlite_dir)
    engine = create_async_engine(url)
    if sqlite_dir:
        _sqlite_like_durafn(engine)
    async with engine.begin() as conn:
        await conn.run_sync(_USER.create_all)
    await engine.dispose()
    meter = None if database is None else await pgcost.Meter.start(database)
    try:
        cpu, started = time.process_time(), time.perf_counter()
        async with engine.connect() as conn:
            for i in range(n):
                await conn.execute(insert(ROWS).values(n=i))
                if (i + 1) % batch == 0:
                    await conn.commit()
            await conn.commit()
        seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
        if meter is not None:
            await meter.stop()
        await engine.dispose()
        figures = (
            {"worker_cpu_ms_per_1000": round(cpu * 1_000_000 / n, 1)}
            if meter is None
            else await meter.figures(n)
        )
    finally:
        if meter is not None:
            await meter.close()
    return {**figures, "seconds": seconds, "jobs_per_s": n / seconds, "batch_rows": batch}


async def asyncpg_inserts(n: int, batch: int) -> dict[str, Any]:
    """The same INSERT through asyncpg, in transactions of ``batch`` rows: the floor."""
    database = await pgcost.scratch("w3_asyncpg")
    dsn = pg_dsn(database)
    engine = create_async_engine(pg_url(database))
    async with engine.begin() as conn:
        await conn.run_sync(_USER.create_all)
    await engine.dispose()
    meter = await pgcost.Meter.start(database)
    try:
        started = time.perf_counter()
        conn = await asyncpg.connect(dsn)
        for start in range(0, n, batch):
            async with conn.transaction():
                for i in range(start, min(n, start + batch)):
                    await conn.execute("INSERT INTO bench_rows (n) VALUES ($1)", i)
        seconds = time.perf_counter() - started
        await meter.stop()
        await conn.close()
        figures = await meter.figures(n)
    finally:
        await meter.close()
    return {**figures, "seconds": seconds, "jobs_per_s": n / seconds, "batch_rows": batch}
