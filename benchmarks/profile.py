"""Where a no-op row's time goes, per drain (mutations, actions; SQLite, PostgreSQL):

    python -m benchmarks.profile [--engines sqlite,postgres] [--kinds mutation,action] [--n N]

The drain runs in a child process (its rows scheduled first, then drained with the
executor's defaults, as ``throughput.drain``), so that its CPU is its own and a sampling
profiler can watch it from outside. Per row:

* **CPU**: the worker's (``cost``), and PostgreSQL's;
* **statements** and **round trips**: every statement SQLAlchemy sends (an executemany is
  one), and every BEGIN, COMMIT and ROLLBACK, each a round trip on PostgreSQL (on SQLite
  a call on aiosqlite's thread; ``_store/sqlite/calls.py`` folds BEGIN and COMMIT into
  the statements, so there they count a round trip they do not cost);
* **WAL bytes** (PostgreSQL): ``pg_current_wal_lsn()`` before and after;
* **Python, per layer**, where py-spy is installed (the ``bench`` extra): the worker's
  samples (1,000 a second, on CPU only), each given to the innermost durafn (or user)
  frame on its stack, libraries below it included: the claim, the context, argument
  validation, the function call, result encoding, the finish, hooks, the executor's own
  loop; samples with no durafn frame on the stack are the event loop and the database
  driver's protocol (asyncpg's reads run as event-loop callbacks).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import anyio
import asyncpg
from sqlalchemy import event

from . import cost, throughput

LAYERS = (
    # (where the innermost durafn frame is, layer): first match wins.
    ("benchmarks/throughput.py:_build.<locals>.noop", "the function call"),
    ("benchmarks/throughput.py:_build.<locals>.noop_action", "the function call"),
    ("benchmarks/", "the drain's own wait (not durafn)"),
    ("durafn/_store/claim/", "claim"),
    ("durafn/_executor/action_claims", "claim"),
    ("durafn/_store/write/", "finish"),
    ("durafn/_store/postgres/multirow", "finish"),
    ("durafn/_store/sqlite/multirow", "finish"),
    ("durafn/_executor/finisher", "finish"),
    ("durafn/_executor/outcomes", "finish"),
    ("durafn/_executor/retrying", "finish"),
    ("durafn/_registry.py:FunctionRef.decode_args", "argument validation"),
    ("durafn/_registry.py:FunctionRef.encode_result", "result encoding"),
    ("durafn/_registry", "argument validation"),
    ("durafn/_context", "context"),
    ("durafn/_scheduler", "context"),
    ("durafn/_writers", "context"),
    ("durafn/_invoke", "context"),
    ("durafn/_hooks", "hooks"),
    ("durafn/_executor/", "executor loop"),
    ("durafn/_store/", "store, other"),
    ("durafn/", "durafn, other"),
)


def _layer(stack: list[tuple[str, str]]) -> str:
    """The layer of one sample: its innermost durafn or user frame's."""
    for function, file in reversed(stack):
        if "durafn/" in file or "benchmarks/" in file:
            where = file[file.find("durafn/") if "durafn/" in file else file.find("benchmarks/") :]
            key = f"{where}:{function}"
            for prefix, layer in LAYERS:
                if key.startswith(prefix):
                    return layer
    return "event loop and driver I/O"


LIBRARIES = ("sqlalchemy", "asyncpg", "aiosqlite", "sqlite3", "pydantic", "anyio", "asyncio")


def _library(file: str) -> str:
    """Whose code a sample's innermost frame is."""
    if "durafn/" in file:
        return "durafn"
    for name in LIBRARIES:
        if f"/{name}/" in file or file.startswith(f"{name}/") or file.endswith(f"/{name}.py"):
            return "asyncio, anyio" if name in ("anyio", "asyncio") else name
    if "benchmarks/" in file:
        return "the benchmark"
    return "other (selectors, socket, json, ...)"


def layers(raw: Path, cpu_us_per_row: float) -> dict[str, dict[str, float]]:
    """py-spy's raw (collapsed) samples as CPU microseconds per row: by layer (the
    innermost durafn frame's), and by whose code ran (the innermost frame's).

    py-spy's count of samples is not CPU time (it took a thread blocked in a socket call
    for a busy one: 30 us of samples per row against 23 us of CPU, from ``/proc``), so
    each part is its share of the samples that have a Python frame and do not wait in
    the selector, times the worker's measured CPU per row."""
    per_layer: Counter[str] = Counter()
    per_library: Counter[str] = Counter()
    for line in raw.read_text().splitlines():
        stack_text, _, count = line.rpartition(" ")
        stack = []
        for frame in stack_text.split(";"):
            function, _, where = frame.rpartition(" (")
            if function:
                stack.append((function, where.rstrip(")").rsplit(":", 1)[0]))
        if not stack or stack[-1][0].endswith("Selector.select"):
            continue  # no Python frame, or waiting for the database
        per_layer[_layer(stack)] += int(count)
        per_library[_library(stack[-1][1])] += int(count)
    total = sum(per_layer.values()) or 1
    return {
        "by_layer": {
            name: round(cpu_us_per_row * n / total, 2) for name, n in per_layer.most_common()
        },
        "by_code": {
            name: round(cpu_us_per_row * n / total, 2) for name, n in per_library.most_common()
        },
    }


# -- the child: schedule, wait for the go, drain ----------------------------------------


async def _child(kind: str, url: str, n: int) -> None:
    app, fan_out, _, _ = throughput._build(url)
    await app.migrate()
    for start in range(0, n, 1000):
        await app.run_mutation(fan_out, min(1000, n - start), kind)
    counts: Counter[str] = Counter()
    sync_engine = app.engine.sync_engine

    @event.listens_for(sync_engine, "before_cursor_execute")
    def _statement(*_: Any) -> None:
        counts["statements"] += 1

    for name in ("begin", "commit", "rollback"):
        event.listen(sync_engine, name, lambda *_, name=name: counts.update([name]))
    print(json.dumps({"ready": True}), flush=True)
    sys.stdin.readline()
    before = cost.read()
    concurrency = 100 if kind == "action" else 10  # as throughput.drain
    async with app.run_executor(concurrency=concurrency) as executor:
        await throughput.until_done(executor, kind, n)
        after = cost.read()
    await app.aclose()
    trips = counts["statements"] + counts["begin"] + counts["commit"] + counts["rollback"]
    print(
        json.dumps(
            {
                "drained_per_s": n / (after.wall - before.wall),
                "worker_cpu_us_per_row": round((after.worker - before.worker) / n * 1e6, 2),
                "statements_per_row": round(counts["statements"] / n, 3),
                "round_trips_per_row": round(trips / n, 3),
                "transactions_per_row": round(counts["commit"] / n, 4),
            }
        ),
        flush=True,
    )


# -- the parent ---------------------------------------------------------------------------


def _wal(url: str) -> int:
    """The server's WAL position, in bytes."""

    async def read() -> int:
        conn = await asyncpg.connect(url.replace("postgresql+asyncpg", "postgresql"))
        try:
            return int(await conn.fetchval("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn"))
        finally:
            await conn.close()

    return anyio.run(read)


def profile(kind: str, engine: str, n: int, directory: str) -> dict[str, Any]:
    """One drain of ``n`` no-op rows of ``kind`` on ``engine``, profiled."""
    url = anyio.run(throughput.fresh_url, engine, directory, f"profile-{kind}")
    command = [sys.executable, "-m", "benchmarks.profile", "--child", kind, url, str(n)]
    child = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert child.stdin is not None and child.stdout is not None
    sampler = None
    try:
        assert json.loads(child.stdout.readline())["ready"]
        spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
        raw = Path(directory) / f"{engine}-{kind}.raw"
        if Path(spy).exists():
            rate = ["--rate", "1000", "--format", "raw", "--nonblocking"]
            sampler = subprocess.Popen(
                [spy, "record", "--pid", str(child.pid), *rate, "--output", str(raw)],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            time.sleep(1.0)  # it attaches before the drain starts
        wal = _wal(url) if engine == "postgres" else None
        database = cost.postgres_cpu()
        child.stdin.write("go\n")
        child.stdin.flush()
        result: dict[str, Any] = json.loads(child.stdout.readline())
        if wal is not None and database is not None:
            result["wal_bytes_per_row"] = round((_wal(url) - wal) / n)
            spent = (cost.postgres_cpu() or 0.0) - database
            result["database_cpu_us_per_row"] = round(spent / n * 1e6, 2)
        child.wait(timeout=600)
        if sampler is None:
            result["python_us_per_row"] = "skipped: py-spy is not installed"
        else:
            sampler.wait(timeout=600)
            result["python_us_per_row"] = layers(raw, result["worker_cpu_us_per_row"])
        return result
    finally:
        for process in (child, sampler):
            if process is not None and process.poll() is None:
                process.kill()


def main(engines: list[str], kinds: list[str], n: int) -> dict[str, Any]:
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for engine in engines:
            for kind in kinds:
                found = profile(kind, engine, n, tmp)
                results[f"{engine}_{kind}s"] = found
                print(engine, kind, json.dumps(found, indent=2), flush=True)
    return results


def cli() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--engines", default="sqlite,postgres")
    parser.add_argument("--kinds", default="mutation,action")
    parser.add_argument("--n", type=int, default=50_000)
    parser.add_argument("--child", nargs=3, metavar=("KIND", "URL", "N"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        kind, url, n = args.child
        anyio.run(_child, kind, url, int(n))
        return
    main(args.engines.split(","), args.kinds.split(","), args.n)


if __name__ == "__main__":
    cli()
