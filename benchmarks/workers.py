"""Worker processes on PostgreSQL: throughput of 1, 2 and 4 ``durafn worker`` processes,
start lag on an idle worker in another process, recovery time after ``kill -9``, and a
crash loop.

    python -m benchmarks.workers [--n 20000] [--processes 1,2,4] [--lag-samples 300]
                                 [--recovery "5,30;0.2,2"] [--kills 24]
                                 [--kills-engines sqlite,postgres] [--kills-timing 0.5,1.5]
                                 [--crash-loop postgres] [--crash-rows 1000]
                                 [--crash-every 0.4,1.4] [--pause sqlite,postgres]
                                 [--pause-rows 300] [--pause-kills 3] [--json PATH]

``--processes ""``, ``--lag-samples 0``, ``--recovery ""``, ``--kills-engines ""`` or
``--crash-loop ""`` skip a scenario; ``--pause`` (none by default) measures how long the
survivor of a ``kill -9``, and its replacement, wait to commit (``pause_after_kills``).
``--kills`` repeats the recovery after ``kill -9`` on both engines, the killed worker
replaced at once, and reports min, median and max. The crash loop kills one of two
workers every 0.4-1.4 s until 1,000 actions of 50 ms have finished: a worker's start-up
cost decides whether it reaches its first claim.

The workers are real subprocesses (``python -m durafn worker --app benchmarks.worker_app:app``);
times come from the rows themselves (completed_time, the function's own start stamp), so
the benchmark's polling does not enter the figures. Nothing here is asserted.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import math
import os
import random
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
from sqlalchemy import func, select

import durafn
from durafn import State

from .throughput import _fresh_postgres
from .worker_app import register

ROOT = Path(__file__).resolve().parent.parent


@asynccontextmanager
async def workers(
    url: str,
    count: int,
    *args: str,
    app: str = "benchmarks.worker_app:app",
    env: dict[str, str] | None = None,
) -> AsyncIterator[list[anyio.abc.Process]]:
    command = [sys.executable, "-m", "_durafn_cli", "worker", "--app", app]
    procs = [
        await anyio.open_process(
            [*command, "--url", url, "--log-level", "WARNING", *args],
            cwd=ROOT,
            stdout=None,
            stderr=None,
            env={**os.environ, **(env or {})},
        )
        for _ in range(count)
    ]
    try:
        yield procs
    finally:
        for proc in procs:
            if proc.returncode is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            await proc.wait()


async def _until(app: durafn.App, condition: Any, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while not await condition():
        if time.monotonic() > deadline:
            raise TimeoutError("the benchmark waited too long")
        await anyio.sleep(0.01)


async def _fresh_app(engine: str = "postgres") -> tuple[str, durafn.App, Any]:
    if engine == "postgres":
        url = await _fresh_postgres()
    else:
        url = f"sqlite+aiosqlite:///{tempfile.mkdtemp(prefix='durafn-bench-')}/bench.db"
    app = durafn.App(url)
    fns = register(app)
    await app.migrate()
    return url, app, fns


async def throughput(n: int, processes: int, kind: str) -> dict[str, float]:
    """Rows per second drained by ``processes`` workers, from the first due time to the
    last completed_time (all rows are in place and due at one moment), and the largest
    peak RSS among the worker processes."""
    url, app, fns = await _fresh_app()
    try:
        async with workers(url, processes, "--concurrency", "64") as procs:
            await _until(app, lambda: _workers_are(app, processes))
            due = time.time() + 3 + n / 50_000  # after the scheduling below has committed
            for start in range(0, n, 1000):
                await app.run_mutation(fns.fan_out, min(1000, n - start), due, kind)
            await _until(app, lambda: _finished(app, n))
            sf = durafn.scheduled_functions
            async with app.engine.connect() as conn:
                last = (await conn.execute(select(func.max(sf.c.completed_time)))).scalar()
                states = dict(
                    (await conn.execute(select(sf.c.state, func.count()).group_by(sf.c.state)))
                    .tuples()
                    .all()
                )
            assert states == {"Success": n}, states
            return {
                "drained_per_s": n / (float(last) - due),
                "peak_rss_mb": max(peak_rss_mb(p.pid) for p in procs),
            }
    finally:
        await app.aclose()


async def start_lag(samples: int) -> dict[str, list[float]]:
    """An idle worker in another process; probes scheduled one at a time."""
    url, app, fns = await _fresh_app()
    lags: dict[str, list[float]] = {"due now": [], "due at a set time": []}
    try:
        async with workers(url, 1):
            await _until(app, lambda: _workers_are(app, 1))
            sched = app.scheduler()
            for i in range(samples):
                if i % 2:
                    sid = await sched.run_after(0, fns.probe)
                    label = "due now"
                else:
                    sid = await sched.run_at(time.time() + 0.02, fns.probe)
                    label = "due at a set time"
                row = await _wait_done(app, sid)
                lags[label].append(float(row.result) - row.scheduled_time.timestamp())
                await anyio.sleep(0.01)  # idle again before the next probe
    finally:
        await app.aclose()
    return lags


async def recovery(heartbeat: float, timeout: float) -> float:
    """Seconds from ``kill -9`` of the worker running an action to its row being Failed."""
    url, app, fns = await _fresh_app()
    try:
        args = ("--heartbeat-interval", str(heartbeat), "--worker-timeout", str(timeout))
        async with workers(url, 2, *args):
            await _until(app, lambda: _workers_are(app, 2))
            sid = await app.scheduler().run_after(0, fns.hang)
            await _until(app, lambda: _state_is(app, sid, State.IN_PROGRESS))
            # Let it run past a whole timeout first: the rescuer must have its streak.
            await anyio.sleep(timeout + heartbeat)
            [worker] = [w for w in await app.workers() if w.running]
            killed = time.monotonic()
            os.kill(worker.pid, signal.SIGKILL)
            await _until(app, lambda: _state_is(app, sid, State.FAILED))
            return time.monotonic() - killed
    finally:
        await app.aclose()


async def recovery_after_kills(
    engine: str, kills: int, heartbeat: float, timeout: float
) -> dict[str, list[float]]:
    """``kill -9`` the worker running an action, ``kills`` times; two workers at all times
    (the killed one is replaced at once, as a supervisor would). Seconds from the kill to
    the row being Failed, in two cases taken in turn: the surviving worker (the rescuer)
    has been up for longer than ``worker_timeout``, or it was itself restarted just before
    the kill (a rescuer needs ``worker_timeout`` of its own heartbeats before it rescues
    anything, so that a pause is never taken for a death)."""
    url, app, fns = await _fresh_app(engine)
    args = ("--heartbeat-interval", str(heartbeat), "--worker-timeout", str(timeout))
    steady, fresh = "rescuer up for worker_timeout", "rescuer restarted just before"
    delays: dict[str, list[float]] = {steady: [], fresh: []}
    procs: dict[int, anyio.abc.Process] = {}
    try:
        async with AsyncExitStack() as stack:

            async def start() -> None:
                [proc] = await stack.enter_async_context(workers(url, 1, *args))
                procs[proc.pid] = proc

            await start()
            await start()
            for i in range(kills):
                await _until(app, lambda: _workers_are(app, 2))
                sid = await app.scheduler().run_after(0, fns.hang)
                await _until(app, functools.partial(_state_is, app, sid, State.IN_PROGRESS))
                [victim] = [w.pid for w in await app.workers() if w.running]
                case = fresh if i % 2 else steady
                if case == fresh:
                    [survivor] = [pid for pid in procs if pid != victim]
                    procs.pop(survivor).send_signal(signal.SIGTERM)
                    await start()
                    await _until(app, lambda: _workers_are(app, 2))
                else:
                    await anyio.sleep(timeout)  # the survivor is older than that by now
                killed = time.monotonic()
                os.kill(victim, signal.SIGKILL)
                del procs[victim]
                await start()
                await _until(app, functools.partial(_state_is, app, sid, State.FAILED))
                delays[case].append(time.monotonic() - killed)
                await _until(app, lambda: _no_stale_workers(app))
    finally:
        await app.aclose()
    return delays


async def crash_loop(
    engine: str, rows: int, between: tuple[float, float], heartbeat: float, timeout: float
) -> dict[str, float]:
    """Two workers drain ``rows`` short actions (50 ms each, 10 at once) while one of
    them, at random, is killed (``kill -9``) every ``between`` seconds (uniform) and
    replaced at once: a crash loop, or a busy node. A worker that spends its life
    importing never reaches its first claim; what it does reach, it runs. Seconds until
    every row has finished (the ones cut off by a kill are rescued as Failed), and the
    kills it took."""
    url, app, fns = await _fresh_app(engine)
    args = ["--heartbeat-interval", str(heartbeat), "--worker-timeout", str(timeout)]
    args += ["--concurrency", "10"]
    rng = random.Random(20261127)
    procs: dict[int, anyio.abc.Process] = {}
    sched = app.scheduler()
    await sched.run_many([fns.short.call() for _ in range(rows)])
    kills = 0
    try:
        async with AsyncExitStack() as stack:

            async def start() -> None:
                [proc] = await stack.enter_async_context(workers(url, 1, *args))
                procs[proc.pid] = proc

            began = time.monotonic()
            await start()
            await start()
            while True:
                with anyio.move_on_after(rng.uniform(*between)):
                    await _until(app, lambda: _finished(app, rows))
                    break
                victim = rng.choice(sorted(procs))
                procs.pop(victim).send_signal(signal.SIGKILL)
                kills += 1
                await start()
            seconds = time.monotonic() - began
        counts = (await app.stats()).counts
    finally:
        await app.aclose()
    return {
        "seconds": round(seconds, 1),
        "kills": kills,
        "success": counts[State.SUCCESS],
        "lost (Failed)": counts[State.FAILED],
    }


async def pause_after_kills(engine: str, rows: int, kills: int) -> list[dict[str, float]]:
    """Two workers drain ``rows`` mutations of 0.1 s each, fanning in to one action
    (``--batch-size 4 --concurrency 4 --worker-timeout 3 --heartbeat-interval 0.5``);
    ``kills`` times, one of the two, at random, is killed (``kill -9``) while rows remain
    and replaced at once. Per kill, in seconds from the kill (the rows' completed_time and
    the pid each returns; until the next kill): the survivor's next commit (``next``) and
    its longest wait between two of its commits in the 8 s after (``s-gap``); the replacement's
    registration (``r-reg``: its start-up) and first commit (``r-first``); ten more
    commits by either (``ten``); and ``run``, the most commits in a row by one of the two
    in the 24 from the replacement's first (1 or 2 when they take turns; 24 when one ran
    on while the other waited; NaN when the replacement committed none in 8 s)."""
    url, app, fns = await _fresh_app(engine)
    args = ["--batch-size", "4", "--concurrency", "4"]
    args += ["--worker-timeout", "3", "--heartbeat-interval", "0.5"]
    sched = app.scheduler()
    ids = await sched.run_many([fns.slow.call() for _ in range(rows)])
    await sched.run_after(0, fns.noop_action.options(after=ids))
    rng = random.Random()
    procs: dict[int, anyio.abc.Process] = {}
    events: list[tuple[float, int, int, float]] = []
    try:
        async with AsyncExitStack() as stack:

            async def start() -> int:
                [proc] = await stack.enter_async_context(workers(url, 1, *args))
                procs[proc.pid] = proc
                return proc.pid

            await start()
            await start()
            step = (rows - 60) // (kills + 1)
            for k in range(kills):
                await _until(app, functools.partial(_finished, app, step * (k + 1)))
                await anyio.sleep(rng.uniform(0, 0.5))  # anywhere in a batch
                victim = rng.choice(sorted(procs))
                [survivor] = [pid for pid in procs if pid != victim]
                killed = time.time()
                procs.pop(victim).send_signal(signal.SIGKILL)
                new = await start()
                await _until(app, functools.partial(_registered, app, new))
                [row] = [w for w in await app.workers() if w.pid == new]
                events.append((killed, survivor, new, row.started_at.timestamp() - killed))
            await _until(app, functools.partial(_finished, app, rows + 1))
        sf = durafn.scheduled_functions
        async with app.engine.connect() as conn:
            found = await conn.execute(
                select(sf.c.completed_time, sf.c.result)
                .where(sf.c.name == "bench:slow", sf.c.state == "Success")
                .order_by(sf.c.completed_time)
            )
            # The pid each returned: JSON text on SQLite, decoded already on PostgreSQL.
            commits = [
                (float(t), int(json.loads(r) if isinstance(r, str) else r)) for t, r in found
            ]
    finally:
        await app.aclose()
    ends = [event[0] for event in events[1:]] + [math.inf]
    return [_pause(commits, *event, end) for event, end in zip(events, ends, strict=True)]


def _pause(
    commits: list[tuple[float, int]],
    killed: float,
    survivor: int,
    new: int,
    registered: float,
    end: float,
) -> dict[str, float]:
    """The figures of ``pause_after_kills`` for one kill, from the commits before ``end``
    (the next kill)."""
    commits = [(t, pid) for t, pid in commits if t < end]
    window = [(t, pid) for t, pid in commits if killed < t <= killed + 8]
    mine = [t for t, pid in window if pid == survivor]
    theirs = [t for t, pid in window if pid == new]
    order = [pid for t, pid in commits if t > killed and pid in (survivor, new)]
    nan = float("nan")
    run = nan
    if theirs:
        turns = order[order.index(new) :][:24]
        run = max(len(list(same)) for _, same in itertools.groupby(turns))
    later = [t for t, _ in commits if t > killed]
    waits = [b - a for a, b in itertools.pairwise([killed, *mine])]
    return {
        "next": round(mine[0] - killed, 2) if mine else nan,
        "s-gap": round(max(waits), 2) if waits else nan,
        "r-reg": round(registered, 2),
        "r-first": round(theirs[0] - killed, 2) if theirs else nan,
        "ten": round(later[9] - killed, 2) if len(later) >= 10 else nan,
        "run": run,
    }


async def _registered(app: durafn.App, pid: int) -> bool:
    return any(w.pid == pid for w in await app.workers())


async def _no_stale_workers(app: durafn.App) -> bool:
    """The killed worker's row is gone (the rescue removes it with its actions)."""
    return len(await app.workers()) <= 2


def peak_rss_mb(pid: int) -> float:
    """The process's peak resident set size so far (Linux: VmHWM)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def _workers_are(app: durafn.App, count: int) -> bool:
    return len(await app.workers()) == count


async def _finished(app: durafn.App, n: int) -> bool:
    sf = durafn.scheduled_functions
    async with app.engine.connect() as conn:
        done = (
            await conn.execute(
                select(func.count()).where(sf.c.state.in_(["Success", "Failed", "Canceled"]))
            )
        ).scalar()
    return int(done or 0) >= n


async def _state_is(app: durafn.App, sid: durafn.ScheduledFunctionId, state: State) -> bool:
    row = await app.get(sid)
    return row is not None and row.state is state


async def _wait_done(app: durafn.App, sid: durafn.ScheduledFunctionId) -> durafn.ScheduledFunction:
    while True:
        row = await app.get(sid)
        if row is not None and row.state.finished:
            return row
        # The lag comes from the row's own times; polling slowly keeps this process from
        # competing with the worker for the machine's two cores while it is measured.
        await anyio.sleep(0.02)


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def main(args: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, Any] = {"throughput": {}, "lag_ms": {}, "recovery_s": {}}
    for kind in ("mutation", "action"):
        for processes in [int(p) for p in args.processes.split(",") if p]:
            got = await throughput(args.n, processes, kind)
            results["throughput"][f"{kind}s, {processes} processes"] = got
            print(
                f"no-op {kind}s, {processes} worker processes: {got['drained_per_s']:,.0f} /s, "
                f"peak RSS {got['peak_rss_mb']:.0f} MB",
                flush=True,
            )
    lags = await start_lag(args.lag_samples) if args.lag_samples else {}
    for label, values in lags.items():
        ms = [v * 1000 for v in values]
        summary = {
            "median": round(statistics.median(ms), 2),
            "p99": round(_percentile(ms, 0.99), 2),
            "max": round(max(ms), 2),
        }
        results["lag_ms"][label] = summary
        print(f"start lag, idle worker process, {label}: {summary} ms", flush=True)
    for pair in filter(None, args.recovery.split(";")):
        heartbeat, timeout = (float(x) for x in pair.split(","))
        seconds = await recovery(heartbeat, timeout)
        results["recovery_s"][f"heartbeat {heartbeat:g}s, timeout {timeout:g}s"] = round(seconds, 2)
        print(
            f"kill -9 to Failed (heartbeat {heartbeat:g}s, worker timeout {timeout:g}s): "
            f"{seconds:.2f} s",
            flush=True,
        )
    for engine in filter(None, args.kills_engines.split(",")):
        heartbeat, timeout = (float(x) for x in args.kills_timing.split(","))
        by_case = await recovery_after_kills(engine, args.kills, heartbeat, timeout)
        every = [d for values in by_case.values() for d in values]
        for label, values in [("all", every), *by_case.items()]:
            if not values:
                continue
            summary = {
                "kills": len(values),
                "min": round(min(values), 2),
                "median": round(statistics.median(values), 2),
                "max": round(max(values), 2),
            }
            results["recovery_s"][f"{engine}, {args.kills} kills, {label}"] = summary
            print(
                f"kill -9 to Failed on {engine} (heartbeat {heartbeat:g}s, worker timeout "
                f"{timeout:g}s), {label}: {summary}",
                flush=True,
            )
    for engine in filter(None, args.crash_loop.split(",")):
        heartbeat, timeout = (float(x) for x in args.kills_timing.split(","))
        low, high = (float(x) for x in args.crash_every.split(","))
        got = await crash_loop(engine, args.crash_rows, (low, high), heartbeat, timeout)
        results["crash_loop"] = {**results.get("crash_loop", {}), engine: got}
        print(
            f"crash loop on {engine} ({args.crash_rows} 50 ms actions, two workers, one"
            f" killed every {low:g}-{high:g} s): {got}",
            flush=True,
        )
    for engine in filter(None, args.pause.split(",")):
        pauses = await pause_after_kills(engine, args.pause_rows, args.pause_kills)
        results["pause_s"] = {**results.get("pause_s", {}), engine: pauses}
        for pause in pauses:
            print(f"pause after kill -9 on {engine}: {pause}", flush=True)
    return results


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=20_000)
    parser.add_argument("--processes", default="1,2,4")
    parser.add_argument("--lag-samples", type=int, default=300)
    parser.add_argument("--recovery", default="5,30;0.2,2")
    parser.add_argument("--kills", type=int, default=24)
    parser.add_argument("--kills-engines", default="sqlite,postgres")
    parser.add_argument("--kills-timing", default="0.5,1.5", metavar="HEARTBEAT,TIMEOUT")
    parser.add_argument("--crash-loop", default="postgres", metavar="ENGINES")
    parser.add_argument("--crash-rows", type=int, default=1000)
    parser.add_argument("--crash-every", default="0.4,1.4", metavar="LOW,HIGH")
    parser.add_argument("--pause", default="", metavar="ENGINES")
    parser.add_argument("--pause-rows", type=int, default=300)
    parser.add_argument("--pause-kills", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    results = anyio.run(main, args)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    cli()
