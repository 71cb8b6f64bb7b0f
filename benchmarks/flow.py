"""Flow control under load (``python -m benchmarks.flow``), each compared in one run:

* **cost**: the no-op drain of rows with a flow key and no limit (100 keys) against the
  plain drain of as many rows, interleaved repeats (one executor, as throughput.drain);
* **rate**: one key limited to 1,000 starts per second (burst 50), 5,000 no-op actions
  drained by 4 worker processes on PostgreSQL: starts per second after the first burst,
  from the rows' ``started_time`` (the claim's clock, which the budget is kept against);
* **fairness**: 100 keys, one with 100x the rows of each other (2,000 and 99 x 20),
  the heavy key's rows scheduled first: the light keys' median start lag (completed
  minus due time), and how long the last light key waited for its first start, with flow
  keys against the same rows without (first come, first served), one executor.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import anyio
from sqlalchemy import func, select

import durafn
from durafn import Flow, MutationCtx, Rate

from . import throughput
from .options import drain
from .workers import _fresh_app, _until, _workers_are, workers


async def cost(url_for: Any, n: int, repeats: int, engine: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kind in ("mutation", "action"):
        plain: list[float] = []
        keyed: list[float] = []
        for i in range(repeats):
            plain.append(await drain(await url_for(f"flow-{kind}-plain-{i}"), n, kind, "plain"))
            keyed.append(await drain(await url_for(f"flow-{kind}-keyed-{i}"), n, kind, "keys"))
        p, k = statistics.median(plain), statistics.median(keyed)
        out[f"{kind}s"] = {"plain_per_s": p, "keyed_per_s": k, "ratio": k / p}
        print(f"{engine} {kind}s: plain {p:,.0f}/s, 100 flow keys {k:,.0f}/s ({k / p:.2f}x)")
    return out


async def rate(
    n: int = 5000, per_second: int = 1000, burst: int = 50, processes: int = 4
) -> dict[str, float]:
    """PostgreSQL, ``processes`` workers: the starts per second one limited key sees after
    its first burst (a burst of 1 would need a claim every millisecond: each claim may
    start what the budget allows, and a budget keeps at most ``burst`` unspent starts)."""
    url, app, fns = await _fresh_app()
    sf = durafn.scheduled_functions
    try:
        async with workers(url, processes, "--concurrency", "64"):
            await _until(app, lambda: _workers_are(app, processes))
            limited = fns.noop_action.options(
                flow=Flow(key="api", rate=Rate(per_second, burst=burst))
            )
            due = time.time() + 2  # every row in place before the first is due
            sched = app.scheduler()
            for start in range(0, n, 1000):
                await sched.run_many([limited.call().at(due) for _ in range(min(1000, n - start))])

            async def _done() -> bool:
                async with app.engine.connect() as conn:
                    found = select(func.count()).where(sf.c.state == "Success")
                    return int((await conn.execute(found)).scalar_one()) == n

            await _until(app, _done)
            async with app.engine.connect() as conn:
                first, last = (
                    await conn.execute(
                        select(func.min(sf.c.started_time), func.max(sf.c.started_time))
                    )
                ).one()
        observed = (n - burst) / (float(last) - float(first))
        print(
            f"postgres, {processes} workers: a key limited to {per_second}/s (burst {burst}) "
            f"started {observed:,.1f}/s after its burst ({observed / per_second - 1:+.1%})"
        )
        return {"limit_per_s": per_second, "observed_per_s": observed}
    finally:
        await app.aclose()


def _fair_app(url: str, keyed: bool) -> tuple[durafn.App, Any]:
    app = durafn.App(url)

    @app.mutation(name="bench:tenant_work")
    async def work(ctx: MutationCtx, tenant: int) -> None:
        pass

    return app, (work.options(flow=Flow(key=lambda a: f"t{a['tenant']}")) if keyed else work)


async def lag(url: str, keyed: bool, heavy: int = 2000, light: int = 20) -> tuple[float, float]:
    """The light keys' median lag (completed - due) in seconds, and the latest of their
    first rows' lags (how long the last light key waited for its first start)."""
    app, work = _fair_app(url, keyed)
    await app.migrate()
    sched = app.scheduler()
    for start in range(0, heavy, 1000):
        await sched.run_many([work.call(0) for _ in range(min(1000, heavy - start))])
    await sched.run_many([work.call(t) for t in range(1, 100) for _ in range(light)])
    total = heavy + 99 * light
    async with app.run_executor() as executor:
        await throughput.until_done(executor, "mutation", total)
    sf = durafn.scheduled_functions
    async with app.engine.connect() as conn:
        rows = await conn.execute(
            select(sf.c.args, sf.c.completed_time - sf.c.scheduled_time).where(
                sf.c.args != '{"tenant":0}'
            )
        )
        lags: dict[str, list[float]] = {}
        for args, waited in rows:
            lags.setdefault(args, []).append(float(waited))
    await app.aclose()
    every = [x for waited in lags.values() for x in waited]
    return statistics.median(every), max(min(waited) for waited in lags.values())


async def fairness(url_for: Any, engine: str, repeats: int) -> dict[str, float]:
    runs: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
    for i in range(repeats):
        for keyed in (False, True):
            runs[keyed].append(await lag(await url_for(f"fair-{keyed}-{i}"), keyed=keyed))
    (fm, ff), (um, uf) = (
        tuple(statistics.median(r[j] for r in runs[k]) for j in (0, 1)) for k in (True, False)
    )
    print(
        f"{engine}: light keys' median start lag {fm * 1000:,.0f} ms with flow keys, "
        f"{um * 1000:,.0f} ms first come first served ({um / fm:.1f}x); the last light key's "
        f"first start {ff * 1000:,.0f} ms against {uf * 1000:,.0f} ms ({uf / ff:.1f}x sooner)"
    )
    return {"fair_median_s": fm, "unfair_median_s": um, "fair_first_s": ff, "unfair_first_s": uf}


async def measure(url_for: Any, engine: str, n: int, repeats: int) -> dict[str, Any]:
    out: dict[str, Any] = {"cost": await cost(url_for, n, repeats, engine)}
    out["fairness"] = await fairness(url_for, engine, repeats)
    if engine == "postgres":
        out["rate"] = await rate()
    return out


async def main(engines: list[str], n: int, repeats: int) -> None:
    await throughput.per_engine(
        engines, lambda url_for, engine: measure(url_for, engine, n, repeats)
    )


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", default="sqlite,postgres")
    parser.add_argument("--n", type=int, default=10000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    anyio.run(main, args.engines.split(","), args.n, args.repeats)


if __name__ == "__main__":
    cli()
