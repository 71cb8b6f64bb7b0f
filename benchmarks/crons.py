"""The cron loop at scale: 10,000 crons, 1,000 of them due each second (each fires every
10 s, at one of ten offsets).

* ``measure``: one executor's loop under the fake clock for ``--seconds`` simulated
  seconds: the wall time and this process's CPU per round (one second's 1,000 ticks) and
  per tick written, and that each tick was written exactly once (rows written, not run);
* ``lag`` (``--processes 4``, PostgreSQL): real worker processes for ``--lag-seconds``
  real seconds: each tick's row completed minus its tick time (an upper bound of the
  write's lag: it includes the no-op run), and no tick written twice or missed.

    python -m benchmarks.crons [--engines sqlite,postgres] [--crons 10000] [--seconds 20]
        [--processes 4] [--lag-seconds 30]
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import tempfile
import time
from typing import Any

import anyio
from sqlalchemy import func, select

import durafn
from durafn import MutationCtx
from durafn.testing import FakeClock

from . import cron_app, throughput, workers


async def measure(url: str, crons: int, seconds: int) -> dict[str, Any]:
    clock = FakeClock(start=1_900_000_000.0)  # a whole minute: offsets line up
    app = durafn.App(url, clock=clock)

    @app.mutation(name="bench:cron_noop")
    async def noop(ctx: MutationCtx, n: int) -> None:
        pass

    for n in range(crons):
        app.cron(f"c{n}", f"{n % 10}/10 * * * * *", noop.call(n), overlap="allow")
    await app.migrate()
    executor = app.executor()
    loop = executor._crons
    started = time.perf_counter()
    await loop.reconcile()
    reconcile_s = time.perf_counter() - started
    walls, cpus, written = [], [], 0
    for _ in range(seconds):
        clock.advance(1)
        wall, cpu = time.perf_counter(), time.process_time()
        n, _ = await loop.tick()
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
        written += n
    sf = durafn.scheduled_functions
    async with app.engine.connect() as conn:
        rows, distinct = (
            await conn.execute(select(func.count(), func.count(func.distinct(sf.c.id))))
        ).one()
    await app.aclose()
    assert rows == distinct == written == crons // 10 * seconds, (rows, distinct, written)
    per_round = statistics.median(walls)
    return {
        "reconcile_s": round(reconcile_s, 2),
        "round_wall_ms_median": round(per_round * 1000, 1),
        "round_wall_ms_max": round(max(walls) * 1000, 1),
        "round_cpu_ms_median": round(statistics.median(cpus) * 1000, 1),
        "cpu_us_per_tick": round(statistics.median(cpus) / (crons // 10) * 1e6, 1),
        "ticks_written": written,
    }


async def lag(
    url: str, crons: int, processes: int, seconds: float, warmup: float = 15.0
) -> dict[str, Any]:
    """Worker processes of ``benchmarks.cron_app`` for ``seconds`` after ``warmup`` (each
    worker reconciles the 10,000 declarations when it starts: ~8 s)."""
    app = cron_app.build(crons, url)
    await app.migrate()
    started = time.time()
    env = {"DURAFN_BENCH_CRONS": str(crons)}
    async with workers.workers(url, processes, app="benchmarks.cron_app:app", env=env):
        await workers._until(app, lambda: workers._workers_are(app, processes))
        up = time.time() + warmup
        await anyio.sleep(warmup + seconds)
    sf = durafn.scheduled_functions
    async with app.engine.connect() as conn:
        rows = (
            await conn.execute(
                select(sf.c.args, sf.c.scheduled_time, sf.c.completed_time).where(
                    sf.c.name == "bench:cron_tick", sf.c.scheduled_time >= up
                )
            )
        ).all()
    await app.aclose()
    lags = sorted((done - due) * 1000 for _, due, done in rows if done is not None)
    per_cron: dict[str, list[float]] = {}
    for args, due, _ in rows:
        per_cron.setdefault(args, []).append(due)
    gaps = sum(
        1
        for ticks in per_cron.values()
        for a, b in itertools.pairwise(sorted(ticks))
        if b - a > 10  # a cron's ticks are 10 s apart
    )
    return {
        "processes": processes,
        "startup_s": round(up - warmup - started, 1),
        "ticks": len(rows),
        "run": len(lags),
        "missed_between": gaps,
        "lag_ms_median": round(statistics.median(lags), 1) if lags else None,
        "lag_ms_p99": round(lags[int(0.99 * (len(lags) - 1))], 1) if lags else None,
        "lag_ms_max": round(lags[-1], 1) if lags else None,
    }


async def main(engines: list[str], crons: int, seconds: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for engine in engines:
            url = await throughput.fresh_url(engine, tmp, "crons")
            out[engine] = got = await measure(url, crons, seconds)
            print(
                f"{engine}: {crons:,} crons, {crons // 10:,} due a second: a round (one "
                f"second's ticks) {got['round_wall_ms_median']} ms median, "
                f"{got['round_wall_ms_max']} ms max; CPU {got['cpu_us_per_tick']} us per "
                f"tick; reconcile {got['reconcile_s']} s; {got['ticks_written']:,} ticks, "
                "each once",
                flush=True,
            )
    return out


async def lag_main(crons: int, processes: int, seconds: float) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        got = await lag(
            await throughput.fresh_url("postgres", tmp, "lag"), crons, processes, seconds
        )
    print(
        f"postgres, {processes} worker processes, {crons:,} crons ({crons // 10:,} due a "
        f"second) for {seconds:g} s: {got['ticks']:,} ticks, each once, "
        f"{got['missed_between']} missed; tick to row done: median {got['lag_ms_median']} "
        f"ms, p99 {got['lag_ms_p99']} ms, max {got['lag_ms_max']} ms "
        f"(workers up after {got['startup_s']} s, then 15 s to warm up)",
        flush=True,
    )


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", default="sqlite,postgres")
    parser.add_argument("--crons", type=int, default=10_000)
    parser.add_argument("--seconds", type=int, default=20)
    parser.add_argument("--processes", type=int, default=0, help="also the lag, with N workers")
    parser.add_argument("--lag-seconds", type=float, default=30.0)
    args = parser.parse_args()
    anyio.run(main, args.engines.split(","), args.crons, args.seconds)
    if args.processes:
        anyio.run(lag_main, args.crons, args.processes, args.lag_seconds)


if __name__ == "__main__":
    cli()
