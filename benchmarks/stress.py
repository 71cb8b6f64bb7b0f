"""Two executors in one process, on one database, on the fake clock: rounds of fan-in work
until a wake-up is lost (``make stress``; outside the suite: it runs for minutes).

An app and its ``app.using()`` twin (the same functions, a runtime of its own: its own
pool, wake-ups and LISTEN) each run an executor. Each round schedules ``--parts`` rows
and a join ``after=`` all of them, from one app or the other in turn, and waits until
the join has run. The kinds take turns too (mutations into an action, actions into a
mutation, and the two plain pairs), so that every route that frees a row is taken: a
mutation batch's finish, the finisher's, the release trigger, ``FreedRows``' look. Every
``--restart``th round, once its first part has begun, one executor is stopped (each app's
in turn) and started again after the round: the other must finish what the stopping one
frees or gives back. Each part sleeps ``--part-ms`` (real time), so that a stop finds
batches and actions running.

The clock never moves, so an executor's fallback poll never comes: a round whose rows
no wake-up announced stays Pending for good. A round that has not ended after
``--ceiling`` real seconds (only a hang reaches it) is a hang: what is still unfinished
is printed, then the clock is moved by the poll interval, and the round must end after
that poll (else it is stuck, and the run stops). The poll is the bound of a lost
wake-up; each hang is one.

    python -m benchmarks.stress [--engines postgres,sqlite] [--rounds 2000] [--parts 8]
        [--restart 5] [--part-ms 1] [--ceiling 20] [--burn 1]

``--burn N`` runs N CPU-burning processes beside it (on a machine of few cores, the
executors' tasks then interleave in more orders). Exits 1 if any round hung.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
from anyio.abc import TaskGroup, TaskStatus
from sqlalchemy import func, select

import durafn
from durafn import ActionCtx, MutationCtx, State
from durafn.testing import FakeClock

from .throughput import pg_admin, pg_url

PG_DB = os.environ.get("DURAFN_STRESS_PG_DATABASE", "durafn_stress")
"""The database ``--engines postgres`` drops and creates again at each run."""

SHAPES = (
    ("mutation", "action"),
    ("action", "mutation"),
    ("mutation", "mutation"),
    ("action", "action"),
)
"""The kinds of a round's parts and its join, by round number (in turn)."""


@dataclass
class Hang:
    round: int
    shape: tuple[str, str]
    scheduled_by: str
    unfinished: list[str]
    """One line per row not finished when the ceiling was reached."""
    after_poll: bool
    """Whether the round then ended after the clock moved by the poll interval."""
    stopped: str | None = None
    """The app whose executor was stopped during the round, if one was."""


@dataclass
class Report:
    engine: str
    rounds: int = 0
    seconds: float = 0.0
    hangs: list[Hang] = field(default_factory=list)
    stuck: bool = False


class FanIn:
    """The two apps, their functions, and the joins' events."""

    def __init__(self, url: str, clock: FakeClock) -> None:
        self.clock = clock
        self.first = durafn.App(url, clock=clock)
        self.joined: dict[int, anyio.Event] = {}
        self.begun: dict[int, anyio.Event] = {}
        """Set as the round's first part begins (a stop then finds work running)."""
        app = self.first

        @app.mutation(name="stress:part_m")
        async def part_m(ctx: MutationCtx, round: int) -> None:
            self.begun[round].set()
            await anyio.sleep(self.part_seconds)

        @app.action(name="stress:part_a")
        async def part_a(ctx: ActionCtx, round: int) -> None:
            self.begun[round].set()
            await anyio.sleep(self.part_seconds)

        @app.mutation(name="stress:join_m")
        async def join_m(ctx: MutationCtx, round: int) -> None:
            # A mutation's body may run again (its batch rolled back): an event set twice.
            self.joined[round].set()

        @app.action(name="stress:join_a")
        async def join_a(ctx: ActionCtx, round: int) -> None:
            self.joined[round].set()

        self.parts: dict[str, Any] = {"mutation": part_m, "action": part_a}
        self.joins: dict[str, Any] = {"mutation": join_m, "action": join_a}
        self.second = app.using()  # the same functions and clock, a runtime of its own

    async def schedule(self, round: int, by: durafn.App, shape: tuple[str, str]) -> None:
        parts, join = self.parts[shape[0]], self.joins[shape[1]]
        self.joined[round], self.begun[round] = anyio.Event(), anyio.Event()
        scheduler = by.scheduler()
        ids = await scheduler.run_many([parts.call(round) for _ in range(self.size)])
        await scheduler.run_after(0, join.options(after=ids), round)

    size = 8
    part_seconds = 0.0
    """Real seconds each part takes: a stop then finds batches and actions running."""

    async def unfinished(self) -> list[str]:
        """The rows not finished, one line each, with what may keep them."""
        sf, deps = durafn.scheduled_functions, durafn.metadata.tables["_durafn_dependencies"]
        edges = select(func.count()).where(deps.c.row_id == sf.c.id).scalar_subquery()
        query = (
            select(sf.c.name, sf.c.state, sf.c.available_at, edges, sf.c.worker_id)
            .where(sf.c.state.in_([State.PENDING.value, State.IN_PROGRESS.value]))
            .order_by(sf.c.seq)
        )
        async with self.first.engine.connect() as conn:
            rows = (await conn.execute(query)).all()
        now = self.clock.now()
        return [
            f"{name} {state}, due {'now' if at <= now else f'in {at - now:g}s'}, "
            f"{left} edge(s) left, worker {worker}"
            for name, state, at, left, worker in rows
        ]

    async def finished_all(self) -> tuple[int, set[str]]:
        """How many rows there are, and their states."""
        sf = durafn.scheduled_functions
        async with self.first.engine.connect() as conn:
            states = list((await conn.execute(select(sf.c.state))).scalars())
        return len(states), set(states)

    async def aclose(self) -> None:
        await self.second.aclose()
        await self.first.aclose()


class Running:
    """One app's executor, run in a task of its own (so that it can stop and start again
    while the other runs: cancel scopes end in the order they began, per task)."""

    def __init__(self, tg: TaskGroup, name: str, app: durafn.App, poll: float) -> None:
        self._tg, self.name, self._app, self._poll = tg, name, app, poll
        self._stop = anyio.Event()
        self._done = anyio.Event()
        self.running = False

    async def start(self) -> None:
        self._stop, self._done = anyio.Event(), anyio.Event()
        await self._tg.start(self._run)
        self.running = True

    async def _run(self, *, task_status: TaskStatus[None]) -> None:
        try:
            async with self._app.run_executor(poll_interval=self._poll):
                task_status.started()
                await self._stop.wait()
        finally:
            self._done.set()

    async def stop(self) -> None:
        self._stop.set()
        await self._done.wait()
        self.running = False


async def run_engine(engine: str, url: str, args: argparse.Namespace) -> Report:
    """Round after round of fan-ins on one database, until ``args.rounds`` or a stuck one."""
    report = Report(engine)
    fan = FanIn(url, FakeClock())
    fan.size, fan.part_seconds = args.parts, args.part_ms / 1000
    await fan.first.migrate()
    apps = {"first": fan.first, "second": fan.second}
    started = time.perf_counter()
    try:
        async with anyio.create_task_group() as tg:
            poll = args.poll_interval
            executors = {name: Running(tg, name, app, poll) for name, app in apps.items()}
            for running in executors.values():
                await running.start()
            try:
                await _rounds(engine, fan, apps, executors, args, report, started)
            finally:
                for running in executors.values():
                    if running.running:
                        await running.stop()
        report.seconds = time.perf_counter() - started
        if not report.stuck:
            rows, states = await fan.finished_all()
            expected = report.rounds * (args.parts + 1)
            if rows != expected or states != {State.SUCCESS.value}:
                raise AssertionError(f"{rows} rows (expected {expected}), states {states}")
    finally:
        await fan.aclose()
    return report


async def _rounds(
    engine: str,
    fan: FanIn,
    apps: dict[str, durafn.App],
    executors: dict[str, Running],
    args: argparse.Namespace,
    report: Report,
    started: float,
) -> None:
    """The rounds: each scheduled by one app or the other; every ``--restart``th with one
    executor stopped while its work is in flight (the other must finish the round) and
    started again after it."""
    names = list(apps)
    for round in range(args.rounds):
        shape = SHAPES[round % len(SHAPES)]
        by = names[(round // len(SHAPES)) % 2]  # each app through every shape in turn
        await fan.schedule(round, apps[by], shape)
        stopped = None
        if args.restart and round % args.restart == args.restart - 1:
            # Each app's executor in turn, through every shape (for --restart not a multiple
            # of four, the rounds it picks go through them all).
            stopped = executors[names[(round // args.restart // len(SHAPES)) % 2]]
            with anyio.move_on_after(args.ceiling):
                await fan.begun[round].wait()
            await stopped.stop()
        with anyio.move_on_after(args.ceiling):
            await fan.joined[round].wait()
        report.rounds = round + 1
        if not fan.joined[round].is_set():
            hang = Hang(round, shape, by, await fan.unfinished(), after_poll=False)
            hang.stopped = stopped.name if stopped is not None else None
            report.hangs.append(hang)
            fan.clock.advance(args.poll_interval)  # the poll: every idle loop looks again
            with anyio.move_on_after(args.ceiling):
                await fan.joined[round].wait()
            hang.after_poll = fan.joined[round].is_set()
            print_hang(engine, hang)
            if not hang.after_poll:
                report.stuck = True
                return
        if stopped is not None:
            await stopped.start()
        if (round + 1) % args.every == 0:
            rate = (round + 1) / (time.perf_counter() - started)
            print(
                f"{engine}: {round + 1} rounds, {len(report.hangs)} hung ({rate:.0f} rounds/s)",
                flush=True,
            )


def print_hang(engine: str, hang: Hang) -> None:
    parts, join = hang.shape
    stop = f", the {hang.stopped} app's executor stopped" if hang.stopped else ""
    print(
        f"{engine}: round {hang.round} HUNG ({parts}s into a {join}, scheduled by the "
        f"{hang.scheduled_by} app{stop}); unfinished at the ceiling:",
        flush=True,
    )
    for line in hang.unfinished or ["(none: the join ran, its event was not seen)"]:
        print(f"    {line}")
    print(
        "    -> ended after the poll (a lost wake-up)"
        if hang.after_poll
        else "    -> STUCK: not even the poll started it",
        flush=True,
    )


@contextmanager
def burning(n: int) -> Iterator[None]:
    """N processes that spin on a core each, killed (by pid) at the end."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        yield
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


async def fresh_url(engine: str, directory: Path) -> str:
    if engine == "sqlite":
        return f"sqlite+aiosqlite:///{directory / 'stress.sqlite3'}"
    await pg_admin(f"DROP DATABASE IF EXISTS {PG_DB} WITH (FORCE)", f"CREATE DATABASE {PG_DB}")
    return pg_url(PG_DB)


async def main(args: argparse.Namespace) -> int:
    reports: list[Report] = []
    with tempfile.TemporaryDirectory() as tmp, burning(args.burn):
        for engine in args.engines.split(","):
            url = await fresh_url(engine, Path(tmp))
            reports.append(await run_engine(engine, url, args))
    print()
    for r in reports:
        healed = sum(h.after_poll for h in r.hangs)
        print(
            f"{r.engine}: {r.rounds} rounds of {args.parts} parts and a join in {r.seconds:.0f} s "
            f"(--burn {args.burn}): {len(r.hangs)} hung ({healed} ended after the poll)"
            + (", the last STUCK" if r.stuck else "")
        )
    return 1 if any(r.hangs for r in reports) else 0


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engines", default="postgres,sqlite")
    parser.add_argument("--rounds", type=int, default=2000)
    parser.add_argument("--parts", type=int, default=8, help="rows each join waits for")
    parser.add_argument(
        "--ceiling", type=float, default=20.0, help="real seconds a round may take (a hang)"
    )
    parser.add_argument(
        "--poll-interval", type=float, default=5.0, help="the executors' (fake seconds)"
    )
    parser.add_argument(
        "--restart",
        type=int,
        default=5,
        help="every Nth round, stop one executor while its work runs (0: never)",
    )
    parser.add_argument(
        "--part-ms", type=float, default=1.0, help="real milliseconds each part sleeps"
    )
    parser.add_argument("--burn", type=int, default=0, help="CPU-burning processes beside it")
    parser.add_argument("--every", type=int, default=250, help="print progress every N rounds")
    sys.exit(anyio.run(main, parser.parse_args()))


if __name__ == "__main__":
    cli()
