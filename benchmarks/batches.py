"""Batched actions: a drain of no-op actions, batched (``Batch(max_size=100)``) against
unbatched.

Each round, in a fresh database (and one process), the two settings in turn (their
order alternating from round to round, as this machine's speed wanders):

* ``plain``: ``--rows`` no-op actions, drained by one executor (concurrency 10);
* ``beside``: the plain drain in an app that also has a batched action (none of its
  rows): what the claims of batches cost the other actions;
* ``batched``: the same rows of a batched no-op action (``max_size`` 100, ``max_wait``
  2 s, so every batch is full), drained by the same executor: one call per 100 rows.

The rows are written before the clock starts. Reports the medians of the rounds' rates
and the ratios batched / plain (the issue's target: >= 3) and beside / plain.

    python -m benchmarks.batches [--engines sqlite,postgres] [--rows 10000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import anyio

import durafn
from durafn import ActionCtx, Batch

from .throughput import UrlFor, per_engine, until_done

SIZE = 100


async def _drain(url: str, rows: int, setting: str) -> float:
    """Rows/s of a drain of ``rows`` no-op actions, as ``setting`` says."""
    app = durafn.App(url)

    @app.action(name="bench:noop")
    async def noop(ctx: ActionCtx) -> None:
        pass

    async def no_op_batch(ctx: ActionCtx, items: list[int]) -> list[None]:
        return [None] * len(items)

    batch = Batch(max_size=SIZE, max_wait=2.0)
    many = (
        app.action(name="bench:batched", batch=batch)(no_op_batch) if setting != "plain" else None
    )

    await app.migrate()
    sched = app.scheduler()
    for start in range(0, rows, 10_000):
        n = min(10_000, rows - start)
        if many is not None and setting == "batched":
            calls = [many.call(i) for i in range(n)]
        else:
            calls = [noop.call() for _ in range(n)]
        await sched.run_many(calls)
    t0 = time.perf_counter()
    async with app.run_executor(concurrency=10) as executor:
        await until_done(executor, "action", rows)
        rate = rows / (time.perf_counter() - t0)
    await app.aclose()
    return rate


async def measure(url_for: UrlFor, engine: str, rows: int, rounds: int) -> dict[str, Any]:
    settings = ["plain", "beside", "batched"]
    rates: dict[str, list[float]] = {s: [] for s in settings}
    for i in range(rounds):
        for setting in settings[i % 3 :] + settings[: i % 3]:  # each first in turn
            url = await url_for(f"batches-{i}-{setting}")
            rates[setting].append(await _drain(url, rows, setting))
    plain, beside, batched = (statistics.median(rates[s]) for s in settings)
    print(f"{engine}: {rows:,} no-op actions, concurrency 10; batched: max_size {SIZE}")
    for setting, found in rates.items():
        median = statistics.median(found)
        print(f"  {setting:7} median {median:9,.0f} rows/s  {[round(r) for r in found]}")
    print(f"  batched / plain {batched / plain:.2f}  (target >= 3)")
    print(f"  beside / plain {beside / plain:.2f}")
    return {
        "plain_per_s": plain,
        "batched_per_s": batched,
        "ratio": batched / plain,
        "beside_ratio": beside / plain,
    }


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", default="sqlite,postgres")
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    async def one(url_for: UrlFor, engine: str) -> None:
        await measure(url_for, engine, args.rows, args.rounds)

    anyio.run(per_engine, args.engines.split(","), one)


if __name__ == "__main__":
    cli()
