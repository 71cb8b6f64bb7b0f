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
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any

import anyio
import asyncpg
from anyio.streams.text import TextReceiveStream

from . import cost
from .throughput import _fresh_postgres


async def pgqueuer_drain(
    n: int, progress: Callable[[int], None] | None = None
) -> dict[str, float | None]:
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

        before = cost.read()
        # Its best settings for a no-op drain: large batches, stop when the queue is empty.
        await manager.run(batch_size=100, mode=QueueExecutionMode.drain)
        after = cost.read()
    finally:
        await conn.close()
    if done != n:
        raise RuntimeError(f"pgqueuer ran {done} of {n} jobs")
    return {"drained_per_s": n / (after.wall - before.wall), **cost.per_thousand(before, after, n)}


async def procrastinate_drain(n: int) -> dict[str, float | None]:
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
        before = cost.read()
        # wait=False: stop once the queue is empty. Concurrency 10, like durafn's default.
        await app.run_worker_async(wait=False, concurrency=10, install_signal_handlers=False)
        after = cost.read()
    if done != n:
        raise RuntimeError(f"procrastinate ran {done} of {n} jobs")
    return {"drained_per_s": n / (after.wall - before.wall), **cost.per_thousand(before, after, n)}


def huey_drain(n: int) -> dict[str, float | None]:
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
        before = cost.read()
        while (task := queue.dequeue()) is not None:
            queue.execute(task)
        after = cost.read()
    if done != n:
        raise RuntimeError(f"huey ran {done} of {n} jobs")
    # SQLite's work is the worker's own: no database process to count.
    spent = {**cost.per_thousand(before, after, n), "database_cpu_ms_per_1000": None}
    return {"drained_per_s": n / (after.wall - before.wall), **spent}


GRAPHILE = Path(__file__).resolve().parent / "graphile"


class NotInstalled(Exception):
    """A peer this machine cannot run; reported as skipped, with the reason."""


GRAPHILE_DEFAULTS: dict[str, Any] = {"concurrency": 10}
"""Graphile Worker as it comes, at durafn's default concurrency: a job per fetch, a
statement per completion."""

GRAPHILE_BATCHED: dict[str, Any] = {
    "concurrency": 24,
    "maxPoolSize": 25,
    "preset": {
        "localQueue": {"size": 500, "refetchDelay": {"durationMs": 10}},
        "completeJobBatchDelay": 0,
        "failJobBatchDelay": 0,
    },
}
"""Graphile Worker with its own batching, as its performance guide recommends for
throughput: jobs fetched 500 at a time into a local queue, completions and failures
written in batches."""


def graphile_node() -> str:
    """Node's path, where Graphile Worker is installed beside it; else ``NotInstalled``."""
    node = shutil.which("node")
    if node is None:
        raise NotInstalled("skipped: Node is not installed")
    if not (GRAPHILE / "node_modules" / "graphile-worker").is_dir():
        raise NotInstalled("skipped: not installed (npm install --prefix benchmarks/graphile)")
    return node


class JsonLines:
    """A child's stdout read as lines of JSON (a line of anything else is passed over)."""

    def __init__(self, stdout: Any) -> None:
        self._text = TextReceiveStream(stdout)
        self._buffered = ""

    async def next(self) -> dict[str, Any]:
        while True:
            while "\n" not in self._buffered:
                self._buffered += await self._text.receive()
            first, self._buffered = self._buffered.split("\n", 1)
            if first.startswith("{"):
                return dict(json.loads(first))


async def graphile_drain(n: int, config: dict[str, Any] | None = None) -> dict[str, Any]:
    """Graphile Worker's no-op drain (``graphile/drain.mjs``) with ``config`` (its runner
    options); jobs/s and the CPU per 1,000 jobs of its Node process and of PostgreSQL."""
    node = graphile_node()
    dsn = (await _fresh_postgres()).replace("postgresql+asyncpg", "postgresql")
    options = json.dumps(config or GRAPHILE_DEFAULTS)
    command = [node, str(GRAPHILE / "drain.mjs"), dsn, str(n), options]
    async with await anyio.open_process(command) as process:
        assert process.stdin is not None and process.stdout is not None
        lines = JsonLines(process.stdout)
        await lines.next()  # {"ready": true}: its jobs are in
        before = cost.read(process.pid)
        await process.stdin.send(b"go\n")
        result = await lines.next()
        after = cost.read(process.pid)
        await process.stdin.send(b"stop\n")
        await process.wait()
    return {"drained_per_s": float(result["per_s"]), **cost.per_thousand(before, after, n)}


async def measure(
    n: int, engines: Iterable[str] = ("sqlite", "postgres"), repeats: int = 1
) -> dict[str, Any]:
    """Each peer's drain (the run with the median rate of ``repeats``, its CPU per 1,000
    jobs beside it); a peer that is not installed is a reason, never a zero. Graphile
    Worker runs twice: as it comes and with its own batching (``GRAPHILE_BATCHED``)."""
    runs: dict[str, Callable[[], Awaitable[dict[str, Any]]]] = {}
    if "postgres" in engines:
        runs["pgqueuer"] = lambda: pgqueuer_drain(n)
        runs["procrastinate"] = lambda: procrastinate_drain(n)
        runs["graphile-worker (Node)"] = lambda: graphile_drain(n)
        runs["graphile-worker, batched (Node)"] = lambda: graphile_drain(n, GRAPHILE_BATCHED)
    if "sqlite" in engines:
        runs["huey (SQLite)"] = lambda: anyio.to_thread.run_sync(huey_drain, n)
    results: dict[str, Any] = {}
    for name, body in runs.items():
        try:
            drains = sorted([await body() for _ in range(repeats)], key=_rate)
            results[name] = {**drains[len(drains) // 2], "runs": [_rate(d) for d in drains]}
        except ImportError:
            results[name] = "skipped: not installed (pip install -e '.[bench]')"
        except NotInstalled as reason:
            results[name] = str(reason)
    return results


def _rate(drain: dict[str, Any]) -> float:
    return float(drain["drained_per_s"])


if __name__ == "__main__":
    print(anyio.run(measure, 20_000))
