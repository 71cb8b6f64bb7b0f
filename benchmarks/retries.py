"""Retry policies under load: a drain where a tenth of the no-op rows fail once and
succeed on their retry (``Retry(2, backoff=Fixed(0))``), against the plain drain of as
many rows, side by side in one run (interleaved repeats), for mutations and for actions.

    python -m benchmarks.retries [--engines sqlite,postgres] [--n 20000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
from typing import Any

import anyio

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


async def drain(url: str, n: int, kind: str, failing: bool) -> float:
    """Rows/s of one executor draining ``n`` rows (concurrency as throughput.drain)."""
    app, fan = _build(url, failing)
    await app.migrate()
    for start in range(0, n, 1000):
        await app.run_mutation(fan, start, min(1000, n - start), kind)
    counted = "actions" if kind == "action" else "mutations"
    # A full collection of the cyclic collector costs 35-50 ms here, a twentieth of a
    # drain: start each drain with none pending, so that where one falls is not noise.
    gc.collect()
    started = time.perf_counter()
    async with app.run_executor(concurrency=100 if kind == "action" else 10) as executor:
        while executor.stats[counted] + executor.stats["failed"] < n:  # noqa: ASYNC110
            await anyio.sleep(0.001)
        elapsed = time.perf_counter() - started
        retried = executor.stats["retried"]
    await app.aclose()
    expected = n // FAILING if failing else 0
    assert retried >= expected, f"{retried} retried, expected {expected}"
    return n / elapsed


async def measure(url_for: Any, n: int, repeats: int, engine: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kind in ("mutation", "action"):
        rates: dict[str, list[float]] = {"plain": [], "retried": []}
        for i in range(repeats):
            for mix, runs in rates.items():
                runs.append(
                    await drain(await url_for(f"retry-{kind}-{mix}-{i}"), n, kind, mix == "retried")
                )
        plain, retried = (statistics.median(rates[m]) for m in ("plain", "retried"))
        out[f"{kind}s"] = {
            "plain_per_s": plain,
            "tenth_fail_once_per_s": retried,
            "ratio": retried / plain,
            "runs": rates,
        }
        ratio = retried / plain
        print(
            f"{engine} {kind}s: plain {plain:,.0f}/s, a tenth failing once {retried:,.0f}/s "
            f"({ratio:.2f}x)"
        )
    return out


async def main(engines: list[str], n: int, repeats: int) -> None:
    await throughput.per_engine(
        engines, lambda url_for, engine: measure(url_for, n, repeats, engine)
    )


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", default="sqlite,postgres")
    parser.add_argument("--n", type=int, default=20000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    anyio.run(main, args.engines.split(","), args.n, args.repeats)


if __name__ == "__main__":
    cli()
