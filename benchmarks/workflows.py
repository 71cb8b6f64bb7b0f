"""Workflows: a fan-in's drain against a plain drain, and how soon a join starts after
the last row it waited for.

Each round, in a fresh database (and one process), interleaved, each setting first in
turn:

* ``plain``: ``--rows`` no-op mutations, drained by one executor;
* ``fan-in``: the same rows and one no-op action scheduled ``after=`` all of them (the
  issue's fan-in of 10,000 into one): each finish runs the trigger and deletes its edge;
* ``groups``: the same rows in ``--joins`` groups, each with an action ``after=`` it: the
  start delays of many joins, finishing while the drain goes on.

The rates count the ``--rows`` mutations only. Reports the medians of the rounds' rates,
the ratio fan-in / plain (target >= 0.9), and the start delays: from the last of a
join's rows' ``completed_time`` (written before its commit) to the join's call (the
system clock of the one process): the fan-in's join each round, and every group join
(median, p99).

    python -m benchmarks.workflows [--engines sqlite,postgres] [--rows 10000] [--joins 100]
        [--rounds 15]

``--joins 0`` leaves the groups out: the fan-in against the plain drain alone, twice as
many rounds in the same time, for an A/B of a change.
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


def _app(url: str) -> tuple[durafn.App, Any, Any, dict[str, float]]:
    app = durafn.App(url)
    called: dict[str, float] = {}

    @app.mutation(name="bench:noop")
    async def noop(ctx: MutationCtx) -> None:
        pass

    @app.action(name="bench:join")
    async def join(ctx: ActionCtx) -> None:
        # When it was called, not its started_time: a claim stamps that with the time it
        # was sent, and on SQLite it may then wait for the write lock a while.
        assert ctx.run_id is not None
        called[ctx.run_id] = time.time()

    return app, noop, join, called


async def _drain(url: str, rows: int, joins: int) -> tuple[float, list[float]]:
    """Rows/s of the ``rows`` mutations, and each join's start delay (s): ``joins`` 0,
    none; 1, one after all the rows; more, one per share of them."""
    app, noop, join, called = _app(url)
    await app.migrate()
    sched = app.scheduler()
    ids: list[str] = []
    for start in range(0, rows, 10_000):
        ids += await sched.run_many([noop.call() for _ in range(min(10_000, rows - start))])
    join_ids: list[tuple[str, list[str]]] = []
    share = rows // joins if joins else 0
    for j in range(joins):
        group = ids[j * share : (j + 1) * share]
        join_ids.append((await sched.run_after(0, join.options(after=group)), group))
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
            started = called[id]
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
    settings = {"plain": 0, "fan-in": 1, "groups": joins}
    if not joins:  # --joins 0: the fan-in against the plain drain only (A/B runs)
        del settings["groups"]
    rates: dict[str, list[float]] = {s: [] for s in settings}
    delays: dict[str, list[float]] = {s: [] for s in settings}
    names = list(settings)
    for i in range(rounds):
        # Each setting first in turn: this machine's speed drifts within a round, and a
        # fixed order gave the first setting the faster machine.
        for setting in names[i % len(names) :] + names[: i % len(names)]:
            url = await url_for(f"workflows-{i}-{setting}")
            rate, found = await _drain(url, rows, settings[setting])
            rates[setting].append(rate)
            delays[setting] += found
    plain, fan_in = (statistics.median(rates[s]) for s in ("plain", "fan-in"))
    groups = f"; groups: {joins} of {rows // joins}" if joins else ""
    print(f"{engine}: {rows:,} no-op mutations; fan-in: one join of all{groups}")
    for setting, found in rates.items():
        median = statistics.median(found)
        print(f"  {setting:7} median {median:9,.0f} rows/s  {[round(r) for r in found]}")
    pairs = [f / p for f, p in zip(rates["fan-in"], rates["plain"], strict=True)]
    print(
        f"  fan-in / plain {fan_in / plain:.3f}  (target >= 0.9); round by round "
        f"{[round(r, 2) for r in pairs]}, median {statistics.median(pairs):.3f}"
    )
    fan_in_delay = statistics.median(delays["fan-in"])
    print(f"  the fan-in's join started {fan_in_delay * 1000:.1f} ms after its last row (median)")
    found = sorted(delays.get("groups", []))
    result = {
        "plain_per_s": plain,
        "fan_in_per_s": fan_in,
        "ratio": fan_in / plain,
        "ratio_round_median": statistics.median(pairs),
        "fan_in_join_delay_ms": fan_in_delay * 1000,
    }
    if found:
        p99 = found[min(len(found) - 1, int(len(found) * 0.99))]
        median = statistics.median(found)
        print(
            f"  group joins started after their last row: median {median * 1000:.1f} ms, "
            f"p99 {p99 * 1000:.1f} ms ({len(found)} joins)"
        )
        result["group_join_delay_median_ms"] = median * 1000
        result["group_join_delay_p99_ms"] = p99 * 1000
    return result


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", default="sqlite,postgres")
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--joins", type=int, default=100)
    # A round's drain lasts a third of a second here: its ratio wanders by +-0.3 round to
    # round, so the median needs many (15 rounds: two minutes for both engines).
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()

    async def one(url_for: UrlFor, engine: str) -> None:
        await measure(url_for, engine, args.rows, args.joins, args.rounds)

    anyio.run(per_engine, args.engines.split(","), one)


if __name__ == "__main__":
    cli()
