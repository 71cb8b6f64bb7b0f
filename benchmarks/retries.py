"""Retry policies under load: a drain where a tenth of the no-op rows fail once and
succeed on their retry (``Retry(2, backoff=Fixed(0))``), against the plain drain of as
many rows, side by side in one run (interleaved pairs), for mutations and for actions.

    python -m benchmarks.retries [--engines sqlite,postgres] [--n 20000] [--pairs 15]

The rows are scheduled once into a template database, and each drain runs on a fresh
copy of it (a file copy on SQLite, ``CREATE DATABASE ... TEMPLATE`` on PostgreSQL): a
pair costs two drains, not two schedulings of 20,000 rows as well, so more pairs fit.
They are needed: on the 2-core benchmark machine one pair's ratio wanders by ±0.1 from
the next (2026-11-26: 0.66 to 0.98 for the same code within one run), so the ratio is
reported as the median of the pairs' ratios, with their quartiles (nine pairs gave medians
from 0.78 to 0.88x for the same code; fifteen, 0.80-0.84x). Rows/s counts the rows
drained; the failing drain runs a tenth more (``runs_per_s`` counts those), and
``failure_cost_runs`` is what a failure costs beyond its run, in plain runs.
"""

from __future__ import annotations

import argparse
import gc
import shutil
import statistics
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread

import durafn
from durafn import ActionCtx, Fixed, MutationCtx, Retry

from . import throughput

FAILING = 10
"""One row in FAILING fails its first run."""


def _build(url: str, failing: bool) -> tuple[durafn.App, Any]:
    app = durafn.App(url)
    failed: set[str] = set()
    policy = Retry(2, backoff=Fixed(0))

    def _first_run_fails(run_id: str, n: int) -> None:
        # A mutation that raises before writing anything is recorded at once (no re-run of
        # its batch), so a set of this process is enough to fail each row's first run.
        if failing and n % FAILING == 0 and run_id not in failed:
            failed.add(run_id)
            raise RuntimeError("fails once")

    @app.mutation(name="bench:flaky", retry=policy)
    async def flaky(ctx: MutationCtx, n: int) -> None:
        _first_run_fails(str(ctx.run_id), n)

    @app.action(name="bench:flaky_action", retry=policy)
    async def flaky_action(ctx: ActionCtx, n: int) -> None:
        _first_run_fails(str(ctx.run_id), n)

    @app.mutation(name="bench:fan")
    async def fan(ctx: MutationCtx, start: int, count: int, kind: str) -> None:
        ref: durafn.SchedulableRef[[int], None] = flaky if kind == "mutation" else flaky_action
        await ctx.scheduler.run_many([ref.call(n) for n in range(start, start + count)])

    return app, fan


async def schedule(url: str, n: int, kind: str) -> None:
    """``n`` rows of ``kind`` due now, in the database at ``url``."""
    app, fan = _build(url, False)
    try:
        await app.migrate()
        for start in range(0, n, 1000):
            await app.run_mutation(fan, start, min(1000, n - start), kind)
    finally:
        await app.aclose()  # on SQLite the last close checkpoints: the file is whole


async def drain(url: str, n: int, kind: str, failing: bool) -> tuple[float, int]:
    """Rows/s of one executor draining the ``n`` rows at ``url`` (concurrency as
    throughput.drain), and how many runs it retried."""
    app, _ = _build(url, failing)
    # A full collection of the cyclic collector costs 35-50 ms here, a twentieth of a
    # drain: start each drain with none pending, so that where one falls is not noise.
    gc.collect()
    started = time.perf_counter()
    async with app.run_executor(concurrency=100 if kind == "action" else 10) as executor:
        await throughput.until_done(executor, kind, n)
        elapsed = time.perf_counter() - started
        retried = executor.stats["retried"]
    await app.aclose()
    expected = n // FAILING if failing else 0
    assert retried >= expected, f"{retried} retried, expected {expected}"
    return n / elapsed, retried


Copy = Callable[[], Awaitable[str]]
"""A fresh copy of the template: its URL."""


async def _templated(url_for: throughput.UrlFor, engine: str, name: str) -> tuple[str, Copy]:
    """A template database's URL, and how to make a fresh copy of it (the copy's URL)."""
    template = await url_for(name)
    if engine == "sqlite":
        path = Path(template.removeprefix("sqlite+aiosqlite:///"))
        copy = path.with_name(f"{path.stem}-copy.sqlite3")

        def _copy_file() -> None:
            for suffix in ("", "-wal", "-shm"):
                Path(f"{copy}{suffix}").unlink(missing_ok=True)
            shutil.copyfile(path, copy)

        async def _file() -> str:
            await anyio.to_thread.run_sync(_copy_file)
            return f"sqlite+aiosqlite:///{copy}"

        return template, _file

    async def _database() -> str:
        await throughput.pg_admin(
            f"DROP DATABASE IF EXISTS {_PG_COPY} WITH (FORCE)",
            f"CREATE DATABASE {_PG_COPY} TEMPLATE {throughput.PG_DB}",
        )
        return throughput.pg_url(_PG_COPY)

    return template, _database


_PG_COPY = f"{throughput.PG_DB}_copy"


def failure_cost(plain_per_s: float, failing_per_s: float, n: int, retried: int) -> float:
    """What a failed run costs beyond the run itself, in plain runs: the failing drain's
    time over the plain one's, less its share of runs (``(n + retried) / n``), per failure.
    The ratio is ``1 / (1 + retried / n * (1 + cost))``: with a tenth failing, 0.85x and
    better needs a cost of 0.76 or less; a failure that cost nothing would give 0.91x."""
    return (plain_per_s / failing_per_s - (n + retried) / n) * n / retried


def _quartiles(values: list[float]) -> list[float]:
    return statistics.quantiles(values, n=4) if len(values) > 1 else values * 3


async def measure(url_for: throughput.UrlFor, n: int, pairs: int, engine: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    try:
        for kind in ("mutation", "action"):
            template, fresh = await _templated(url_for, engine, f"retry-{kind}")
            await schedule(template, n, kind)
            rates: dict[str, list[float]] = {"plain": [], "retried": []}
            runs: list[float] = []
            costs: list[float] = []
            for _ in range(pairs):
                for mix, got in rates.items():
                    rate, retried = await drain(await fresh(), n, kind, mix == "retried")
                    got.append(rate)
                    if retried:
                        runs.append(rate * (n + retried) / n)
                        costs.append(failure_cost(rates["plain"][-1], rate, n, retried))
            ratios = [r / p for p, r in zip(rates["plain"], rates["retried"], strict=True)]
            low, ratio, high = _quartiles(ratios)
            plain, failing = (statistics.median(rates[m]) for m in ("plain", "retried"))
            out[f"{kind}s"] = {
                "plain_per_s": plain,
                "tenth_fail_once_per_s": failing,
                "runs_per_s": statistics.median(runs),
                "failure_cost_runs": statistics.median(costs),
                "ratio": ratio,
                "ratio_quartiles": [low, high],
                "pair_ratios": ratios,
                "runs": rates,
            }
            print(
                f"{engine} {kind}s: plain {plain:,.0f}/s, a tenth failing once {failing:,.0f}/s; "
                f"ratio {ratio:.2f}x (median of {pairs} pairs, quartiles {low:.2f}-{high:.2f}); "
                f"a failure's own cost {statistics.median(costs):.2f} plain runs"
            )
    finally:
        if engine == "postgres":
            await throughput.pg_admin(f"DROP DATABASE IF EXISTS {_PG_COPY} WITH (FORCE)")
    return out


async def main(engines: list[str], n: int, pairs: int) -> None:
    await throughput.per_engine(engines, lambda url_for, engine: measure(url_for, n, pairs, engine))


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", default="sqlite,postgres")
    parser.add_argument("--n", type=int, default=20000)
    parser.add_argument("--pairs", type=int, default=15)
    args = parser.parse_args()
    anyio.run(main, args.engines.split(","), args.n, args.pairs)


if __name__ == "__main__":
    cli()
