"""Workflows: a fan-in's drain against a plain drain, and how soon a join starts after
the last row it waited for.

Each round, in a fresh database (and one process), interleaved:

* ``plain``: ``--rows`` no-op mutations, drained by one executor;
* ``fan-in``: the same rows, with ``--joins`` no-op actions each scheduled
  ``after=`` its share of them (``--rows / --joins`` rows each) and one more after all
  of them: the rows waited for carry ``dependents = 1``, so each finish runs the release
  trigger. The rate counts the ``--rows`` mutations only (the joins are timed apart).

Reports the medians of the rounds' rates, their ratio (target >= 0.9), and the start
delay of the joins: from the last of its rows' ``completed_time`` to the join's
``started_time`` (the executor's clock), median and p99 over every join of every round.

    python -m benchmarks.workflows [--engines sqlite,postgres] [--rows 10000] [--joins 100]
        [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import anyio
from sqlalchemy import func, select

import durafn
from durafn import ActionCtx, MutationCtx

from .throughput import UrlFor, per_engine, until_done


def _app(url: str) -> tuple[durafn.App, Any, Any]:
    app = durafn.App(url)

    @app.mutation(name="bench:noop")
    async def noop(ctx: MutationCtx) -> None:
        pass

    @app.action(name="bench:join")
    async def join(ctx: ActionCtx) -> None:
        pass

    return app, noop, join


async def _drain(url: str, rows: int, joins: int) -> tuple[float, list[float]]:
    """Rows/s of the ``rows`` mutations, and each join's start delay (s)."""
    app, noop, join = _app(url)
    await app.migrate()
    sched = app.scheduler()
    ids: list[str] = []
    for start in range(0, rows, 10_000):
        ids += await sched.run_many([noop.call() for _ in range(min(10_000, rows - start))])
    join_ids: list[tuple[str, list[str]]] = []
    if joins:
        share = rows // joins
        for j in range(joins):
            group = ids[j * share : (j + 1) * share]
            join_ids.append((await sched.run_after(0, join.options(after=group)), group))
        join_ids.append((await sched.run_after(0, join.options(after=ids)), ids))
    t0 = time.perf_counter()
    async with app.run_executor(concurrency=10) as executor:
        await until_done(executor, "mutation", rows)
        drained = rows / (time.perf_counter() - t0)
        if joins:
            await until_done(executor, "action", len(join_ids))
    delays: list[float] = []
    sf = durafn.scheduled_functions
    async with app.engine.connect() as conn:
        for id, group in join_ids:
            started = (
                await conn.execute(select(sf.c.started_time).where(sf.c.id == id))
            ).scalar_one()
            last = 0.0
            for at in range(0, len(group), 500):
                chunk = group[at : at + 500]
                found = await conn.execute(
                    select(func.max(sf.c.completed_time)).where(sf.c.id.in_(chunk))
                )
                last = max(last, found.scalar_one())
            delays.append(started - last)
    await app.aclose()
    return drained, delays


async def measure(
    url_for: UrlFor, engine: str, rows: int, joins: int, rounds: int
) -> dict[str, float]:
    rates: dict[str, list[float]] = {"plain": [], "fan-in": []}
    delays: list[float] = []
    for i in range(rounds):
        for setting in rates:
            url = await url_for(f"workflows-{i}-{setting}")
            rate, found = await _drain(url, rows, joins if setting == "fan-in" else 0)
            rates[setting].append(rate)
            delays += found
    plain, fan_in = (statistics.median(rates[s]) for s in ("plain", "fan-in"))
    print(f"{engine}: {rows:,} no-op mutations, {joins} joins of {rows // joins} + one of all")
    for setting, found in rates.items():
        median = statistics.median(found)
        print(f"  {setting:7} median {median:9,.0f} rows/s  {[round(r) for r in found]}")
    print(f"  fan-in / plain {fan_in / plain:.3f}  (target >= 0.9)")
    delays.sort()
    p99 = delays[min(len(delays) - 1, int(len(delays) * 0.99))]
    median = statistics.median(delays)
    print(
        f"  join start after its last row: median {median * 1000:.1f} ms, "
        f"p99 {p99 * 1000:.1f} ms ({len(delays)} joins)"
    )
    return {
        "plain_per_s": plain,
        "fan_in_per_s": fan_in,
        "ratio": fan_in / plain,
        "join_delay_median_ms": median * 1000,
        "join_delay_p99_ms": p99 * 1000,
    }


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", default="sqlite,postgres")
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--joins", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    async def one(url_for: UrlFor, engine: str) -> None:
        await measure(url_for, engine, args.rows, args.joins, args.rounds)

    anyio.run(per_engine, args.engines.split(","), one)


if __name__ == "__main__":
    cli()
