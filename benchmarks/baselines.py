"""The raw database's limits on this machine, measured beside durafn in the same run.

Each figure is committed single-row UPDATE transactions per second, with the durability
durafn runs at (fsync on; SQLite in WAL with ``synchronous=FULL``):

* PostgreSQL through asyncpg, one connection, one transaction after another;
* PostgreSQL through asyncpg from 8 connections at once;
* SQLite through the sqlite3 module (no event loop, no thread hop);
* SQLite through aiosqlite, which is what durafn uses (a thread per connection).

A per-job system that commits once per job cannot beat these; durafn's group commit is
measured against them as a ratio.
"""

from __future__ import annotations

import sqlite3
import tempfile
import time
from pathlib import Path

import aiosqlite
import anyio
import asyncpg

from .throughput import _fresh_postgres


async def postgres_updates(seconds: float, connections: int) -> float:
    url = await _fresh_postgres()
    dsn = url.replace("postgresql+asyncpg", "postgresql")
    setup = await asyncpg.connect(dsn)
    await setup.execute("CREATE TABLE counters (id int PRIMARY KEY, n bigint NOT NULL)")
    await setup.executemany(
        "INSERT INTO counters VALUES ($1, 0)", [(i,) for i in range(connections)]
    )
    await setup.close()
    done = 0

    async def _worker(row: int) -> None:
        nonlocal done
        conn = await asyncpg.connect(dsn)
        try:
            deadline = time.perf_counter() + seconds
            while time.perf_counter() < deadline:
                # One row per connection: contention-free, so this is the commit rate.
                async with conn.transaction():
                    await conn.execute("UPDATE counters SET n = n + 1 WHERE id = $1", row)
                done += 1
        finally:
            await conn.close()

    start = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for row in range(connections):
            tg.start_soon(_worker, row)
    return done / (time.perf_counter() - start)


def _sqlite_setup(path: Path) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("CREATE TABLE counters (id INTEGER PRIMARY KEY, n INTEGER NOT NULL)")
    conn.execute("INSERT INTO counters VALUES (1, 0)")
    conn.close()


def sqlite_updates(seconds: float) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "raw.sqlite3"
        _sqlite_setup(path)
        conn = sqlite3.connect(path, isolation_level=None)
        conn.execute("PRAGMA synchronous=FULL")
        done = 0
        start = time.perf_counter()
        while time.perf_counter() - start < seconds:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("UPDATE counters SET n = n + 1 WHERE id = 1")
            conn.execute("COMMIT")
            done += 1
        elapsed = time.perf_counter() - start
        conn.close()
    return done / elapsed


async def aiosqlite_updates(seconds: float) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "raw.sqlite3"
        _sqlite_setup(path)
        async with aiosqlite.connect(path, isolation_level=None) as conn:
            await conn.execute("PRAGMA synchronous=FULL")
            done = 0
            start = time.perf_counter()
            while time.perf_counter() - start < seconds:
                await conn.execute("BEGIN IMMEDIATE")
                await conn.execute("UPDATE counters SET n = n + 1 WHERE id = 1")
                await conn.execute("COMMIT")
                done += 1
            return done / (time.perf_counter() - start)


async def measure(seconds: float) -> dict[str, float]:
    """Every baseline, ``seconds`` each; committed transactions per second."""
    return {
        "postgres_1_connection": await postgres_updates(seconds, 1),
        "postgres_8_connections": await postgres_updates(seconds, 8),
        "sqlite3": await anyio.to_thread.run_sync(sqlite_updates, seconds),
        "aiosqlite": await aiosqlite_updates(seconds),
    }


if __name__ == "__main__":
    for name, rate in anyio.run(measure, 3.0).items():
        print(f"{name}: {rate:,.0f} single-row UPDATE transactions/s")
