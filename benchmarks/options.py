"""Job options under load, each compared side by side in one run (interleaved repeats):

* the no-op drains with half the rows at random priorities, against the plain drain;
* 1,000 serial queues of 20 rows each (interleaved in time, as per-user work arrives),
  drained by one worker, against the unqueued drain of as many rows;
* one serial queue of 2,000 actions, against its physical limit: one claim and one
  finish round trip per row (two single-row autocommit UPDATEs, measured on the same
  table in the same run);
* the plans of the claim's statements (``claim_plans``), for the backlog scenario.
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

import anyio
from sqlalchemy import bindparam, text, update
from sqlalchemy.ext.asyncio import AsyncConnection

import durafn
from durafn import ActionCtx, Flow, MutationCtx
from durafn._store import SERVE_ALL
from durafn._store.claim import levels
from durafn._store.claim import take as claims
from durafn._store.claim.queues import QUEUE_HEAD

from . import throughput

QUEUES = 1000


def _build(url: str) -> tuple[durafn.App, durafn.MutationRef[[int, int, str, str], None]]:
    app = durafn.App(url)

    @app.mutation(name="bench:noop")
    async def noop(ctx: MutationCtx) -> None:
        pass

    @app.action(name="bench:noop_action")
    async def noop_action(ctx: ActionCtx) -> None:
        pass

    @app.mutation(name="bench:fan")
    async def fan(ctx: MutationCtx, start: int, n: int, kind: str, mix: str) -> None:
        ref: durafn.SchedulableRef[[], None] = noop if kind == "mutation" else noop_action
        rnd = random.Random(start)
        calls = []
        for i in range(start, start + n):
            if mix == "priorities" and i % 2:
                calls.append(ref.options(priority=rnd.randint(-10, 10)).call())
            elif mix == "queues":
                calls.append(ref.options(queue=f"user:{i % QUEUES}").call())
            elif mix == "one queue":
                calls.append(ref.options(queue="serial").call())
            elif mix == "keys":  # benchmarks/flow.py: 100 flow keys, no limits
                calls.append(ref.options(flow=Flow(key=f"k{i % 100}")).call())
            else:
                calls.append(ref.call())
        await ctx.scheduler.run_many(calls)

    return app, fan


async def drain(url: str, n: int, kind: str, mix: str) -> float:
    """Schedule ``n`` no-op rows of ``kind`` laid out as ``mix``; rows/s of one executor's
    drain (concurrency as in throughput.drain: 100 for actions, 10 for mutations)."""
    app, fan = _build(url)
    await app.migrate()
    for start in range(0, n, 1000):
        await app.run_mutation(fan, start, min(1000, n - start), kind, mix)
    concurrency = 100 if kind == "action" else 10
    started = time.perf_counter()
    async with app.run_executor(concurrency=concurrency) as executor:
        await throughput.until_done(executor, kind, n)
        elapsed = time.perf_counter() - started
    await app.aclose()
    return n / elapsed


async def round_trip_limit(url: str, n: int) -> float:
    """Rows/s of the physical limit of one serial queue: per row, one claim and one finish
    round trip, each a single-row autocommit UPDATE (what a row of a serial queue cannot
    do without), on the same table."""
    app, fan = _build(url)
    await app.migrate()
    await app.run_mutation(fan, 0, min(n, 1000), "action", "plain")
    ids = [r.id for r in (await app.list(limit=1000)).items][:n]
    sf = durafn.scheduled_functions
    claim = update(sf).where(sf.c.id == bindparam("b_id")).values(state="InProgress")
    finish = update(sf).where(sf.c.id == bindparam("b_id")).values(state="Success")
    engine = app.engine.execution_options(**app._rt.driver.single_statement_options)
    started = time.perf_counter()
    async with engine.connect() as conn:
        for id in ids:
            for stmt in (claim, finish):
                await conn.execute(stmt, {"b_id": id})
                await conn.commit()
    elapsed = time.perf_counter() - started
    await app.aclose()
    return len(ids) / elapsed


async def measure(
    url_for: Callable[[str], Any], n: int, repeats: int, engine: str
) -> dict[str, Any]:
    """The scenarios above on one engine; medians of ``repeats`` interleaved runs."""
    out: dict[str, Any] = {}
    for kind in ("mutation", "action"):
        rates: dict[str, list[float]] = {"plain": [], "priorities": [], "queues": []}
        for i in range(repeats):  # interleaved: plain, priorities, queues, plain, ...
            for mix in rates:
                rates[mix].append(await drain(await url_for(f"opt-{kind}-{mix}-{i}"), n, kind, mix))
        median = {mix: statistics.median(r) for mix, r in rates.items()}
        out[f"{kind}s"] = {
            "plain_per_s": median["plain"],
            "priorities_per_s": median["priorities"],
            "priorities_ratio": median["priorities"] / median["plain"],
            "queues_1000x20_per_s": median["queues"],
            "queues_ratio": median["queues"] / median["plain"],
            "runs": rates,
        }
    serial: list[float] = []
    limit: list[float] = []
    for i in range(repeats):
        serial.append(await drain(await url_for(f"opt-serial-{i}"), 2000, "action", "one queue"))
        limit.append(await round_trip_limit(await url_for(f"opt-limit-{i}"), 1000))
    out["one_serial_queue_2000_actions"] = {
        "per_s": statistics.median(serial),
        "round_trip_limit_per_s": statistics.median(limit),
        "of_limit": statistics.median(serial) / statistics.median(limit),
    }
    print(engine, {k: v for k, v in out.items() if k != "runs"})
    return out


async def claim_plans(app: durafn.App) -> dict[str, str]:
    """EXPLAIN of the claim's statements as the driver issues them on this engine
    (``durafn/_store/claim/take.py``), values inlined."""
    lateral = app._rt.driver.lateral_claims
    st = claims.statements(SERVE_ALL, lateral)
    values = {
        "b_kind": "mutation",
        "now": time.time(),
        "limit": 64,
        "level": 0,
        "after": 0.0,
        "from_level": -(2**31),
    }
    hot: dict[str, Any] = {
        "claim, fast path: the lowest level (from a level on)": st.first,
        "claim, fast path past levels with nothing due: every level": st.fast,
        "claim at one level (the full claim)": st.unqueued,
    }
    hot["priority levels (the full claim)"] = levels.LEVELS
    hot["queued rows at one level (which queues)"] = st.queued
    hot["a queue's head"] = QUEUE_HEAD.params(queue="user:1")
    hot["next due"] = levels.NEXT_DUE[True]
    plans: dict[str, str] = {}
    async with app.engine.connect() as conn:
        explain = "EXPLAIN" if conn.dialect.name == "postgresql" else "EXPLAIN QUERY PLAN"
        for name, stmt in hot.items():
            sql = _inline(conn, stmt.params(**values))
            rows = await conn.execute(text(f"{explain} {sql}"))
            plans[name] = "\n".join(str(r[-1]) for r in rows)
    return plans


def _inline(conn: AsyncConnection, stmt: Any) -> str:
    return str(stmt.compile(dialect=conn.dialect, compile_kwargs={"literal_binds": True}))


async def _pairs(engines: list[str], kinds: list[str], n: int, repeats: int) -> None:
    """The priorities scenario alone: plain and priorities drains alternating."""
    with tempfile.TemporaryDirectory() as tmp:
        for engine in engines:
            for kind in kinds:
                rates: dict[str, list[float]] = {"plain": [], "priorities": []}
                for i in range(repeats):
                    for mix, runs in rates.items():
                        url = await throughput.fresh_url(engine, tmp, f"{kind}-{mix}-{i}")
                        runs.append(await drain(url, n, kind, mix))
                plain, mixed = (statistics.median(rates[m]) for m in ("plain", "priorities"))
                each = ", ".join(
                    f"{p / q:.2f}" for p, q in zip(rates["priorities"], rates["plain"], strict=True)
                )
                print(
                    f"{engine} {kind}s: plain {plain:,.0f}/s, priorities {mixed:,.0f}/s, "
                    f"{mixed / plain:.2f}x (runs: {each})"
                )


def cli() -> None:
    parser = argparse.ArgumentParser(description="Mixed priorities against the plain drain.")
    parser.add_argument("--engines", default="sqlite,postgres")
    parser.add_argument("--kinds", default="mutation,action")
    parser.add_argument("--n", type=int, default=20000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--all",
        action="store_true",
        help="every scenario of the module docstring (make bench's), not priorities alone",
    )
    args = parser.parse_args()
    engines = args.engines.split(",")
    if args.all:

        async def one(url_for: throughput.UrlFor, engine: str) -> None:
            await measure(url_for, args.n, args.repeats, engine)

        anyio.run(throughput.per_engine, engines, one)
        return
    anyio.run(_pairs, engines, args.kinds.split(","), args.n, args.repeats)


if __name__ == "__main__":
    cli()
