"""A long run, as deployments run (``make soak``):

    python -m benchmarks.soak [--minutes 60] [--kill-every 3] [--realwork] [--json PATH]

A scratch PostgreSQL cluster (``soak_cluster``: initdb in a temporary folder, autovacuum
on, port 55432) holds two databases with the same work, side by side: ``shipped``, the
schema as ``durafn migrate`` leaves it, and ``compared``, the same with ``--compare``'s
change to ``_scheduled_functions`` (by default its autovacuum thresholds back to
PostgreSQL's, as before schema version 24; ``--compare ''`` runs the first alone).
Each database gets two workers (``durafn worker``, real processes): one lives the whole
run, the other is ``kill -9``-ed every ``--kill-every`` minutes (the databases in turn)
and started again a second later, as a supervisor would.

The driver schedules, every second and in each database, ``soak_app.produce``'s mix:
mutations that insert a row under a unique key, actions with retries (a quarter fail
their first attempt), batched action items, and every 20 s a fan-out of 23 rows with a
join after them; two crons tick meanwhile. Every 10 s it samples each worker's RSS
(``/proc/PID/status``) and ``_scheduled_functions``' size and dead tuples. After
``--minutes`` it stops scheduling, waits for every due row to finish, stops the workers
and checks the counts (``soak_checks.final_counts``). ``--realwork`` then measures the
W1-W4 table (``benchmarks.realwork``) on the same cluster.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import anyio
import asyncpg

import durafn
from durafn._store.postgres.driver import AUTOVACUUM

from . import realwork, soak_checks, throughput
from .soak_app import TRACE_ENV, USER, Mix, register
from .soak_cluster import scratch_cluster
from .soak_report import autovacuums, growth, markdown

ROOT = Path(__file__).resolve().parent.parent
SAMPLE_SECONDS = 10.0
DEFAULTS = "RESET (" + ", ".join(AUTOVACUUM) + ")"
"""``--compare``'s default: the hot table at PostgreSQL's autovacuum thresholds."""
HISTORY = """
INSERT INTO _scheduled_functions
       (id, name, kind, args, state, scheduled_time, available_at, started_time,
        completed_time, attempts, result)
SELECT gen_random_uuid(), 'soak:history', 'mutation', '{}', 'Success', t, t, t, t, 1, 'null'
  FROM (SELECT extract(epoch FROM now()) - 172800.0 * g / $1 AS t
          FROM generate_series(1, $1) AS g) AS past
"""
"""``--history``: finished rows of the last two days, as a deployment keeps them (7 days
by default); autovacuum's thresholds scale with the table's rows, so they set how many
dead tuples it lets pile up before it vacuums."""
DRAIN_CEILING = 600.0
"""Seconds the end waits for due rows to finish: a killed worker's actions wait for the
lost-worker rescue (``--worker-timeout``, 30 s) and their retries' backoff (2 s)."""


@dataclass
class Life:
    """One worker process, from its start to its end (a kill, or the run's end)."""

    label: str
    database: str
    process: Any
    started: float
    rss_kb: list[tuple[float, int]] = field(default_factory=list)
    """(seconds since the run began, VmRSS) every sample."""
    ended: float | None = None
    killed: bool = False


def rss_kb(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


class Soak:
    def __init__(self, args: argparse.Namespace, server: str, logs: Path) -> None:
        self.args = args
        self.server = server
        self.logs = logs
        self.t0 = time.monotonic()
        self.lives: list[Life] = []
        self.samples: dict[str, list[dict[str, Any]]] = {}
        self.produced: dict[str, int] = {}
        self.kills: list[dict[str, Any]] = []
        self.mix = Mix()
        self.traces = logs / "tracemalloc"

    def now(self) -> float:
        return round(time.monotonic() - self.t0, 1)

    def url(self, database: str) -> str:
        return f"postgresql+asyncpg://postgres@{self.server}/{database}"

    def dsn(self, database: str) -> str:
        return f"postgresql://postgres@{self.server}/{database}"

    async def prepare(self, database: str, settings: str) -> None:
        admin = await asyncpg.connect(self.dsn("postgres"))
        try:
            await admin.execute(f"CREATE DATABASE {database}")
        finally:
            await admin.close()
        app = durafn.App(self.url(database))
        await app.migrate()
        async with app.engine.begin() as conn:
            await conn.run_sync(USER.create_all)
        await app.aclose()
        if settings:
            conn = await asyncpg.connect(self.dsn(database))
            try:
                await conn.execute(f"ALTER TABLE _scheduled_functions {settings}")
            finally:
                await conn.close()
        if self.args.history:
            conn = await asyncpg.connect(self.dsn(database))
            try:
                await conn.execute(HISTORY, self.args.history)
                await conn.execute("VACUUM ANALYZE _scheduled_functions")
            finally:
                await conn.close()
        self.samples[database] = []
        self.produced[database] = 0

    def start_worker(self, database: str, label: str, env: dict[str, str] | None = None) -> Life:
        command = [
            sys.executable,
            *("-m", "durafn", "worker", "--app", "benchmarks.soak_app:app"),
            *("--url", self.url(database), "--concurrency", "20", "--log-level", "warning"),
        ]
        with (self.logs / f"{database}-{label}.log").open("a") as log:
            process = subprocess.Popen(
                command,
                cwd=ROOT,
                stdout=log,
                stderr=log,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **(env or {})},
            )
        life = Life(label, database, process, self.now())
        self.lives.append(life)
        return life

    def alive(self) -> list[Life]:
        return [life for life in self.lives if life.ended is None]

    async def produce(self, database: str, until: float) -> None:
        app = durafn.App(self.url(database), max_connections=2)
        fns = register(app)
        n = 0
        try:
            while time.monotonic() - self.t0 < until:
                n += 1
                self.produced[database] += await app.run_mutation(fns.produce, n, self.mix)
                await anyio.sleep(max(0.0, n - (time.monotonic() - self.t0)))
        finally:
            await app.aclose()

    async def kill_in_turn(self, until: float) -> None:
        """Every ``--kill-every`` minutes, ``kill -9`` the next database's churned worker;
        a second later, a new one in its place."""
        turn = 0
        databases = list(self.samples)
        every = self.args.kill_every * 60
        while (next_kill := (len(self.kills) + 1) * every) < until:
            await anyio.sleep(max(0.0, next_kill - (time.monotonic() - self.t0)))
            database = databases[turn % len(databases)]
            turn += 1
            for life in self.alive():
                if life.database == database and life.label == "churned":
                    life.process.send_signal(signal.SIGKILL)
                    life.process.wait()
                    life.ended, life.killed = self.now(), True
                    self.kills.append({"at": life.ended, "database": database})
            await anyio.sleep(1)
            self.start_worker(database, "churned")

    async def sample(self) -> None:
        at = self.now()
        for life in self.alive():
            if (kb := rss_kb(life.process.pid)) is not None:
                life.rss_kb.append((at, kb))
        for database in self.samples:
            conn = await asyncpg.connect(self.dsn(database))
            try:
                stats = await soak_checks.table_stats(conn)
            finally:
                await conn.close()
            self.samples[database].append({"at": at, **stats})

    async def sample_every(self, stop: anyio.Event) -> None:
        while not stop.is_set():
            await self.sample()
            with anyio.move_on_after(SAMPLE_SECONDS):
                await stop.wait()

    async def settle(self) -> dict[str, float]:
        """Wait for every due row to finish; the seconds each database took."""
        took: dict[str, float] = {}
        started = time.monotonic()
        for database in self.samples:
            conn = await asyncpg.connect(self.dsn(database))
            try:
                with anyio.move_on_after(DRAIN_CEILING):
                    # The workers are other processes: only the database shows progress.
                    while await soak_checks.unsettled(conn):  # noqa: ASYNC110
                        await anyio.sleep(1)
            finally:
                await conn.close()
            took[database] = round(time.monotonic() - started, 1)
        return took

    def stop_workers(self) -> None:
        for life in self.alive():
            life.process.send_signal(signal.SIGTERM)
        for life in self.alive():
            try:
                life.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                life.process.kill()
                life.process.wait()
            life.ended = self.now()

    def kill_workers(self) -> None:
        """At an error or Ctrl-C: end every worker this run started, at once."""
        for life in self.alive():
            life.process.kill()
            life.process.wait()
            life.ended = self.now()

    async def run(self) -> dict[str, Any]:
        compare = self.args.compare
        databases = {"shipped": ""} | ({"compared": compare} if compare else {})
        for database, settings in databases.items():
            await self.prepare(database, settings)
        self.t0 = time.monotonic()
        for database in databases:
            traced = self.args.tracemalloc and database == list(databases)[-1]
            env = {TRACE_ENV: str(self.traces)} if traced else None
            self.start_worker(database, "long-lived" + (" (tracemalloc)" if traced else ""), env)
            self.start_worker(database, "churned")
        until = self.args.minutes * 60
        stop = anyio.Event()
        async with anyio.create_task_group() as tg:
            tg.start_soon(self.sample_every, stop)
            async with anyio.create_task_group() as work:
                for database in databases:
                    work.start_soon(self.produce, database, until)
                work.start_soon(self.kill_in_turn, until)
            settled = await self.settle()
            stop.set()
        await self.sample()
        self.stop_workers()
        counts = {}
        for database in databases:
            conn = await asyncpg.connect(self.dsn(database))
            try:
                counts[database] = await soak_checks.final_counts(conn)
            finally:
                await conn.close()
        return {
            "minutes": self.args.minutes,
            "kill_every_minutes": self.args.kill_every,
            "mix_per_second": self.mix._asdict(),
            "settings": databases,
            "produced_rows": self.produced,
            "settle_seconds": settled,
            "kills": self.kills,
            "lives": [_life(life) for life in self.lives],
            "samples": self.samples,
            "counts": counts,
            "history_rows": self.args.history,
            "growth": growth(self.traces) if self.args.tracemalloc else None,
        }


def _life(life: Life) -> dict[str, Any]:
    return {
        "label": life.label,
        "database": life.database,
        "pid": life.process.pid,
        "started": life.started,
        "ended": life.ended,
        "killed": life.killed,
        "rss_kb": life.rss_kb,
    }


async def main(args: argparse.Namespace, logs: Path) -> dict[str, Any]:
    server = f"127.0.0.1:{args.port}"
    soak = Soak(args, server, logs)
    try:
        report = await soak.run()
    finally:
        soak.kill_workers()
    if args.realwork:
        throughput.use_server(server)
        report["realwork"] = await realwork.measure(args.realwork_jobs, args.realwork_rounds)
    return report


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt  # SIGTERM as Ctrl-C: the workers and the cluster are ended


def cli(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--minutes", type=float, default=60.0)
    parser.add_argument("--kill-every", type=float, default=3.0, help="minutes between kills")
    parser.add_argument("--port", type=int, default=55432)
    parser.add_argument(
        "--compare",
        default=DEFAULTS,
        help="ALTER TABLE _scheduled_functions ... for the second database ('': none)",
    )
    parser.add_argument("--realwork", action="store_true", help="then W1-W4 on the cluster")
    parser.add_argument("--realwork-jobs", type=int, default=20_000)
    parser.add_argument("--realwork-rounds", type=int, default=1)
    parser.add_argument(
        "--history", type=int, default=200_000, help="finished rows in the table at the start"
    )
    parser.add_argument(
        "--tracemalloc",
        action="store_true",
        help="the last database's long-lived worker takes tracemalloc snapshots (LOGS/tracemalloc)",
    )
    parser.add_argument("--json", type=Path, help="write the report here too (and PATH.md)")
    parser.add_argument(
        "--logs", type=Path, default=Path("benchmarks/results/soak-logs"), help="workers' logs"
    )
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, _interrupt)
    (args.logs / "tracemalloc").mkdir(parents=True, exist_ok=True)
    for old in [*args.logs.glob("*.log"), *args.logs.glob("tracemalloc/snap-*.bin")]:
        old.unlink()  # an earlier run's
    with scratch_cluster(args.port, keep_log=args.logs / "server.log"):
        report = anyio.run(main, args, args.logs)
    report["command"] = "python -m benchmarks.soak " + " ".join(
        sys.argv[1:] if argv is None else argv
    )
    vacuums = autovacuums(args.logs / "server.log")
    report["autovacuums"] = {n: vacuums[n] for n in report["settings"] if n in vacuums}
    text = markdown(report)
    if args.json is not None:  # and the markdown beside it
        args.json.write_text(json.dumps(report, indent=2))
        args.json.with_suffix(".md").write_text(text)
    print(text)


if __name__ == "__main__":
    cli()
