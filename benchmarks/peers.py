"""Peers on the same database and workload, in the same run: N no-op jobs enqueued, then
drained by one worker in this process; jobs per second of the drain.

* pgqueuer (PostgreSQL, asyncpg, LISTEN/NOTIFY, batched dequeue);
* procrastinate (PostgreSQL, psycopg 3; one job per fetch, as it works);
* huey with its SQLite storage (its dequeue/execute loop: the consumer minus its sleeps);
* Graphile Worker (Node, PostgreSQL; the reference for queues and keys), run by
  ``graphile/drain.mjs`` at concurrency 10, where Node is present (``make bench``
  installs it with npm).

They come from the optional ``bench`` extra; a peer that is not installed is reported as
skipped, never as zero.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any

import anyio
import asyncpg

from .throughput import _fresh_postgres


async def pgqueuer_drain(n: int, progress: Callable[[int], None] | None = None) -> float:
    from pgqueuer.db import AsyncpgDriver
    from pgqueuer.qm import QueueManager
    from pgqueuer.queries import Queries
    from pgqueuer.types import QueueExecutionMode

    dsn = (await _fresh_postgres()).replace("postgresql+asyncpg", "postgresql")
    conn = await asyncpg.connect(dsn)
    try:
        driver = AsyncpgDriver(conn)
        queries = Queries(driver)
        await queries.install()
        for start in range(0, n, 1000):
            count = min(1000, n - start)
            await queries.enqueue(["noop"] * count, [None] * count, [0] * count)
        manager = QueueManager(queries)
        done = 0

        async def noop(job: Any) -> None:
            nonlocal done
            done += 1
            if progress is not None and done % 500 == 0:
                progress(done)

        # Registered by a call, not as a decorator: typed where the peer is installed,
        # Any where it is not (mypy runs in both), and the same code for both.
        manager.entrypoint("noop")(noop)

        started = time.perf_counter()
        # Its best settings for a no-op drain: large batches, stop when the queue is empty.
        await manager.run(batch_size=100, mode=QueueExecutionMode.drain)
        elapsed = time.perf_counter() - started
    finally:
        await conn.close()
    if done != n:
        raise RuntimeError(f"pgqueuer ran {done} of {n} jobs")
    return n / elapsed


async def procrastinate_drain(n: int) -> float:
    import procrastinate

    dsn = (await _fresh_postgres()).replace("postgresql+asyncpg", "postgresql")
    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=dsn))
    done = 0

    async def noop() -> None:
        nonlocal done
        done += 1

    task = app.task(name="noop")(noop)

    async with app.open_async():
        await app.schema_manager.apply_schema_async()
        for start in range(0, n, 1000):
            await task.batch_defer_async(*[{} for _ in range(min(1000, n - start))])
        started = time.perf_counter()
        # wait=False: stop once the queue is empty. Concurrency 10, like durafn's default.
        await app.run_worker_async(wait=False, concurrency=10, install_signal_handlers=False)
        elapsed = time.perf_counter() - started
    if done != n:
        raise RuntimeError(f"procrastinate ran {done} of {n} jobs")
    return n / elapsed


def huey_drain(n: int) -> float:
    import huey

    with tempfile.TemporaryDirectory() as tmp:
        queue = huey.SqliteHuey(filename=str(Path(tmp) / "huey.sqlite3"), results=False)
        done = 0

        def noop() -> None:
            nonlocal done
            done += 1

        task = queue.task()(noop)
        for _ in range(n):
            task()
        started = time.perf_counter()
        while (task := queue.dequeue()) is not None:
            queue.execute(task)
        elapsed = time.perf_counter() - started
    if done != n:
        raise RuntimeError(f"huey ran {done} of {n} jobs")
    return n / elapsed


GRAPHILE = Path(__file__).resolve().parent / "graphile"


class NotInstalled(Exception):
    """A peer this machine cannot run; reported as skipped, with the reason."""


async def graphile_drain(n: int, concurrency: int = 10) -> float:
    node = shutil.which("node")
    if node is None:
        raise NotInstalled("skipped: Node is not installed")
    if not (GRAPHILE / "node_modules" / "graphile-worker").is_dir():
        raise NotInstalled("skipped: not installed (npm install --prefix benchmarks/graphile)")
    dsn = (await _fresh_postgres()).replace("postgresql+asyncpg", "postgresql")
    result = await anyio.run_process(
        [node, str(GRAPHILE / "drain.mjs"), dsn, str(n), str(concurrency)], check=True
    )
    return float(json.loads(result.stdout.decode().strip().splitlines()[-1])["per_s"])


async def measure(
    n: int, engines: Iterable[str] = ("sqlite", "postgres"), repeats: int = 1
) -> dict[str, Any]:
    """jobs/s per peer (the median of ``repeats`` drains); a peer that is not installed is
    a reason, never a zero."""
    runs: dict[str, Callable[[], Awaitable[float]]] = {}
    if "postgres" in engines:
        runs["pgqueuer"] = lambda: pgqueuer_drain(n)
        runs["procrastinate"] = lambda: procrastinate_drain(n)
        runs["graphile-worker (Node)"] = lambda: graphile_drain(n)
    if "sqlite" in engines:
        runs["huey (SQLite)"] = lambda: anyio.to_thread.run_sync(huey_drain, n)
    results: dict[str, Any] = {}
    for name, body in runs.items():
        try:
            rates = sorted([await body() for _ in range(repeats)])
            results[name] = rates[len(rates) // 2]
        except ImportError:
            results[name] = "skipped: not installed (pip install -e '.[bench]')"
        except NotInstalled as reason:
            results[name] = str(reason)
    return results


if __name__ == "__main__":
    print(anyio.run(measure, 20_000))
