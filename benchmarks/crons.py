"""The cron loop at scale: 10,000 crons, 1,000 of them due each second (each fires every
10 s, at one of ten offsets), written by one executor's loop under the fake clock for
``--seconds`` simulated seconds; the wall time and this process's CPU per round (one
second's 1,000 ticks) and per tick written, and that each tick was written exactly once.
The rows are written, not run (the benchmark measures the loop).

    python -m benchmarks.crons [--engines sqlite,postgres] [--crons 10000] [--seconds 20]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from typing import Any

import anyio
from sqlalchemy import func, select

import durafn
from durafn import MutationCtx
from durafn.testing import FakeClock

from . import throughput


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


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", default="sqlite,postgres")
    parser.add_argument("--crons", type=int, default=10_000)
    parser.add_argument("--seconds", type=int, default=20)
    args = parser.parse_args()
    anyio.run(main, args.engines.split(","), args.crons, args.seconds)


if __name__ == "__main__":
    cli()
