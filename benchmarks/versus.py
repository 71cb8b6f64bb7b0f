"""durafn against batched Graphile Worker, side by side in one run:

    python -m benchmarks.versus [--n 20000] [--rounds 3]

Each round drains ``n`` no-op jobs with Graphile Worker in its batched configuration
(``peers.GRAPHILE_BATCHED``: the one its performance guide recommends for throughput),
then ``n`` no-op mutations and ``n`` no-op actions with one durafn executor, all on
PostgreSQL; rounds interleave, so that the machine's drift falls on both. Reported: each
drain's rate and CPU per 1,000 rows (worker and database, ``cost``), and durafn's ratios
to Graphile Worker: of the median rates, and of the median CPU (worker + database).
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Callable
from typing import Any

import anyio

from . import peers, throughput


def _total_cpu(drain: dict[str, Any]) -> float:
    return float(drain["worker_cpu_ms_per_1000"]) + float(drain["database_cpu_ms_per_1000"])


async def measure(
    n: int, rounds: int, progress: Callable[[int], None] | None = None
) -> dict[str, Any]:
    runs: dict[str, list[dict[str, Any]]] = {"graphile": [], "mutations": [], "actions": []}
    for done in range(rounds):
        try:
            runs["graphile"].append(await peers.graphile_drain(n, peers.GRAPHILE_BATCHED))
        except peers.NotInstalled as reason:
            return {"skipped": str(reason)}
        for kind in ("mutation", "action"):
            url = await throughput.fresh_url("postgres", ".", "versus")
            runs[f"{kind}s"].append(await throughput.drain(url, n, kind))
        if progress is not None:
            progress(done + 1)
    medians: dict[str, dict[str, Any]] = {
        name: {
            "drained_per_s": statistics.median(float(d["drained_per_s"]) for d in drains),
            "cpu_ms_per_1000": statistics.median(_total_cpu(d) for d in drains),
            "worker_cpu_ms_per_1000": statistics.median(
                float(d["worker_cpu_ms_per_1000"]) for d in drains
            ),
            "database_cpu_ms_per_1000": statistics.median(
                float(d["database_cpu_ms_per_1000"]) for d in drains
            ),
            "runs": [round(float(d["drained_per_s"])) for d in drains],
        }
        for name, drains in runs.items()
    }
    graphile = medians["graphile"]
    ratios = {
        f"{kind} / graphile batched": {
            "rate": round(medians[kind]["drained_per_s"] / graphile["drained_per_s"], 2),
            "cpu_per_row": round(medians[kind]["cpu_ms_per_1000"] / graphile["cpu_ms_per_1000"], 2),
            "rate_per_round": [
                round(float(mine["drained_per_s"]) / float(theirs["drained_per_s"]), 2)
                for mine, theirs in zip(runs[kind], runs["graphile"], strict=True)
            ],
        }
        for kind in ("mutations", "actions")
    }
    return {"n": n, "rounds": rounds, "medians": medians, "ratios": ratios}


def cli() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print(json.dumps(anyio.run(measure, args.n, args.rounds), indent=2))


if __name__ == "__main__":
    cli()
