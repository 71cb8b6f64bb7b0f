"""The app ``benchmarks.soak`` runs: ``durafn worker --app benchmarks.soak_app:app --url URL``
in its workers, and ``register`` on an app of its own in the driver, which schedules the
work (``produce``) and reads the tables below to prove nothing was lost or doubled.

Every unit of work leaves a trace in a user table that outlives the row's retention:

* ``soak_planned``: each unit the producer scheduled (its key and kind), written in the
  same transaction as the rows;
* ``soak_effects``: a mutation's effect, one row per key under a unique key (a mutation
  run twice would fail on it): the writes, the fan-ins' joins (with how many of their
  dependencies had not finished when they ran), the cron ticks;
* ``soak_starts``: each start of an action (its key, row, attempt, process), with no
  unique key, so that a second start of one attempt would show.
"""

from __future__ import annotations

import gc
import json
import os
import threading
import time
import tracemalloc
import zlib
from pathlib import Path
from typing import Any, NamedTuple

import anyio
from sqlalchemy import Column, Float, Integer, MetaData, String, Table, func, insert, select

import durafn
from durafn import ActionCtx, Batch, Fixed, MutationCtx, Retention, Retry
from durafn.cron import every

USER = MetaData()
PLANNED = Table(
    "soak_planned", USER, Column("key", String, primary_key=True), Column("kind", String)
)
EFFECTS = Table(
    "soak_effects",
    USER,
    Column("key", String, primary_key=True),
    Column("unfinished", Integer),
    Column("detail", String),
    Column("at", Float, server_default=func.extract("epoch", func.clock_timestamp())),
)
STARTS = Table(
    "soak_starts",
    USER,
    Column("n", Integer, primary_key=True, autoincrement=True),
    Column("key", String, index=True),
    Column("row_id", String),
    Column("attempt", Integer),
    Column("pid", Integer),
)

SHORT = Retention(success=300.0)
"""The bulk (writes, batch items) is deleted five minutes after it succeeds, as a
deployment's retention would: the table reaches a steady size instead of growing for the
hour. Their proof is in the user tables. Failed rows are kept (7 days)."""
FINAL = ("Success", "Failed", "Canceled")
FAN_WRITES, FAN_ACTIONS = 20, 3


class Mix(NamedTuple):
    """What ``produce`` schedules per call (the driver calls it once a second)."""

    writes: int = 8
    actions: int = 1
    batch_items: int = 4
    fan_every: int = 20
    """A fan-out (20 writes, 3 actions) and its join every this many calls."""


class Functions(NamedTuple):
    produce: durafn.MutationRef[[int, Mix], int]


def _hash(key: str) -> int:
    return zlib.crc32(key.encode())


def register(app: durafn.App) -> Functions:
    @app.mutation(name="soak:record_starts")
    async def record_starts(ctx: MutationCtx, keys: list[str], row_id: str, attempt: int) -> None:
        rows = [{"key": k, "row_id": row_id, "attempt": attempt, "pid": os.getpid()} for k in keys]
        await ctx.db.execute(insert(STARTS).values(rows))

    @app.mutation(name="soak:write", retention=SHORT)
    async def write(ctx: MutationCtx, key: str) -> None:
        await ctx.db.execute(insert(EFFECTS).values(key=key))

    @app.action(name="soak:call", retry=Retry(3, backoff=Fixed(2)))
    async def call(ctx: ActionCtx, key: str) -> None:
        """A call to another service: 0.2 to 1 s; a quarter fail their first attempt."""
        assert ctx.run_id is not None
        row = await ctx.system.get(ctx.run_id)
        attempt = 0 if row is None else row.attempts
        await ctx.run_mutation(record_starts, [key], ctx.run_id, attempt)
        await anyio.sleep(0.2 + (_hash(key) % 9) / 10)
        if attempt == 1 and _hash(key) % 4 == 0:
            raise RuntimeError(f"{key}: the service refused the first attempt")

    @app.action(name="soak:send", batch=Batch(max_size=20, max_wait=1.0), retention=SHORT)
    async def send(ctx: ActionCtx, keys: list[str]) -> list[None]:
        await ctx.run_mutation(record_starts, keys, "batch", 0)
        await anyio.sleep(0.3)
        return [None] * len(keys)

    @app.mutation(name="soak:join")
    async def join(ctx: MutationCtx, key: str, ids: list[str]) -> None:
        sf = durafn.scheduled_functions
        columns = (sf.c.id, sf.c.name, sf.c.state, sf.c.attempts, sf.c.worker_id)
        waiting = (
            await ctx.db.execute(select(*columns).where(sf.c.id.in_(ids), sf.c.state.not_in(FINAL)))
        ).all()
        detail = json.dumps([[str(v) for v in row] for row in waiting]) if waiting else None
        await ctx.db.execute(
            insert(EFFECTS).values(key=key, unfinished=len(waiting), detail=detail)
        )

    @app.mutation(name="soak:tick")
    async def tick(ctx: MutationCtx) -> None:
        await ctx.db.execute(insert(EFFECTS).values(key=f"tick:{ctx.run_id}"))

    @app.action(name="soak:ping")
    async def ping(ctx: ActionCtx) -> None:
        assert ctx.run_id is not None
        await ctx.run_mutation(record_starts, [f"ping:{ctx.run_id}"], ctx.run_id, 1)

    app.cron("soak-tick", every(seconds=10), tick)
    app.cron("soak-ping", every(seconds=30), ping)

    @app.mutation(name="soak:produce")
    async def produce(ctx: MutationCtx, n: int, mix: Mix) -> int:
        """Schedule call ``n``'s work; returns the number of rows scheduled."""
        planned: list[dict[str, Any]] = []
        for i in range(mix.writes):
            planned.append({"key": f"w{n}.{i}", "kind": "write"})
            await ctx.scheduler.run_after(0, write, f"w{n}.{i}")
        for i in range(mix.actions):
            planned.append({"key": f"a{n}.{i}", "kind": "action"})
            await ctx.scheduler.run_after(0, call, f"a{n}.{i}")
        for i in range(mix.batch_items):
            planned.append({"key": f"b{n}.{i}", "kind": "batch"})
            await ctx.scheduler.run_after(0, send, f"b{n}.{i}")
        if n % mix.fan_every == 0:
            ids = []
            for i in range(FAN_WRITES):
                planned.append({"key": f"fw{n}.{i}", "kind": "write"})
                ids.append(await ctx.scheduler.run_after(0, write, f"fw{n}.{i}"))
            for i in range(FAN_ACTIONS):
                planned.append({"key": f"fa{n}.{i}", "kind": "action"})
                ids.append(await ctx.scheduler.run_after(0, call, f"fa{n}.{i}"))
            planned.append({"key": f"j{n}", "kind": "join"})
            await ctx.scheduler.run_after(0, join.options(after=ids), f"j{n}", list(ids))
        await ctx.db.execute(insert(PLANNED).values(planned))
        return len(planned)

    return Functions(produce)


TRACE_ENV = "DURAFN_SOAK_TRACEMALLOC"
TRACE_EVERY = float(os.environ.get("DURAFN_SOAK_TRACE_EVERY", "600"))


def _trace(folder: Path) -> None:
    """A thread of a worker that ``TRACE_ENV`` names a folder for: a tracemalloc snapshot
    there every ``TRACE_EVERY`` seconds (``snap-SECONDS.bin``), after a full collection,
    for ``soak_report.growth`` to compare (what a long-lived worker keeps)."""
    started = time.monotonic()
    while True:
        time.sleep(TRACE_EVERY)
        gc.collect()
        at = round(time.monotonic() - started)
        tracemalloc.take_snapshot().dump(str(folder / f"snap-{os.getpid()}-{at:05d}.bin"))


if folder := os.environ.get(TRACE_ENV):
    tracemalloc.start(12)
    threading.Thread(target=_trace, args=(Path(folder),), daemon=True, name="soak-trace").start()

app = durafn.App()
register(app)
