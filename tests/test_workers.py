"""Worker processes: real ``durafn worker`` subprocesses on a real database, real signals,
real ``kill -9``. Waits are for conditions (polled), never fixed sleeps, except where the
point is that time passes (a long action must stay alive across many worker timeouts)."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import anyio.abc
import asyncpg
import httpx2
import pytest
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import func, select

import durafn
from durafn import State, cli, scheduled_functions
from durafn.testing import FakeClock

from .apps import cron_app
from .apps.worker_app import Applied, Base, Functions, register
from .conftest import BARE_DSN
from .support.helpers import CEILING, equals, row_of, true, wait_until
from .support.processes import alive, carrying, owned

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parent.parent
HEARTBEAT = 0.1
TIMEOUT = 0.6
FAST = [
    "--heartbeat-interval",
    str(HEARTBEAT),
    "--worker-timeout",
    str(TIMEOUT),
    "--poll-interval",
    "0.05",
]


@asynccontextmanager
async def worker_app_on(url: str) -> AsyncIterator[tuple[durafn.App, Functions]]:
    """The worker app's functions on the test database (the workers import the same)."""
    app = durafn.App(url)
    fns = register(app)
    await app.migrate()
    async with app.engine.begin() as conn:
        await conn.run_sync(Base.metadata.create_all)
        # The worker app's own tables, which the suite's reset between tests does not
        # know: emptied here (the ``app`` tests' database keeps them from test to test).
        for table in reversed(Base.metadata.sorted_tables):
            await conn.execute(table.delete())
    try:
        yield app, fns
    finally:
        await app.aclose()


@pytest.fixture
async def wapp(app_url: tuple[str, bool]) -> AsyncIterator[tuple[durafn.App, Functions]]:
    # The ``app`` tests' database (schema kept, emptied): no migration per test.
    async with worker_app_on(app_url[0]) as value:
        yield value


def durafn_command(*args: str) -> list[str]:
    """The ``durafn`` command, as its console script runs it."""
    return [sys.executable, "-m", "_durafn_cli", *args]


@asynccontextmanager
async def worker_processes(
    url: str,
    count: int,
    logs: Path,
    *args: str,
    app: str = "tests.apps.worker_app:app",
    env: dict[str, str] | None = None,
) -> AsyncIterator[list[anyio.abc.Process]]:
    """``count`` worker processes of ``app``, each logging to ``logs/worker<i>.log``
    (``env``: their environment, default this process's); they, and any process they
    started, are killed at the end if still running."""
    async with owned() as owner:
        procs = []
        for i in range(count):
            with (logs / f"worker{i}.log").open("w") as log:
                command = durafn_command("worker", "--app", app, "--url", url, *args)
                procs.append(await owner.start(command, cwd=ROOT, stdout=log, stderr=log, env=env))
        yield procs


async def state_counts(app: durafn.App) -> dict[str, int]:
    sf = scheduled_functions
    async with app.engine.connect() as conn:
        rows = await conn.execute(select(sf.c.state, func.count()).group_by(sf.c.state))
        return {state: n for state, n in rows}


async def stop(procs: list[anyio.abc.Process], sig: signal.Signals = signal.SIGTERM) -> list[int]:
    for proc in procs:
        if proc.returncode is None:
            proc.send_signal(sig)
    codes = []
    with anyio.fail_after(CEILING):
        for proc in procs:
            codes.append(await proc.wait())
    return codes


def logs_of(tmp_path: Path) -> str:
    return "".join(p.read_text() for p in sorted(tmp_path.glob("worker*.log")))


def trace_of(path: Path) -> list[tuple[int, int]]:
    """(n, pid) per action start, from the trace file the worker app's actions append to."""
    if not path.exists():
        return []
    words = path.read_text().split()
    return [(int(words[i]), int(words[i + 1])) for i in range(0, len(words), 2)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def live_workers(app: durafn.App) -> int:
    return len(await app.workers())


async def test_four_workers_drain_1500_mutations_exactly_once(
    wapp: tuple[durafn.App, Functions], db_url: str, engine_name: str, tmp_path: Path
) -> None:
    app, fns = wapp
    # On PostgreSQL each mutation pauses 0.5 ms, so that a batch is long enough for the
    # other workers' claims to land meanwhile (SKIP LOCKED spreads the rest).
    pause = 0.0005 if engine_name == "postgres" else 0.0
    async with worker_processes(db_url, 4, tmp_path, "--concurrency", "4") as procs:
        await wait_until(lambda: equals(live_workers(app), 4), "4 workers registered")
        for start in range(0, 1500, 500):
            await app.run_mutation(fns.fan_out, start, 500, pause)
        await wait_until(lambda: equals(_state(app, "Success"), 1500), "1500 mutations ran")
        assert await stop(procs) == [0, 0, 0, 0]
    async with app.engine.connect() as conn:
        rows = await conn.execute(select(Applied.pid, func.count()).group_by(Applied.pid))
        per_pid: dict[int, int] = {pid: n for pid, n in rows}
        keys = (await conn.execute(select(func.count(func.distinct(Applied.key))))).scalar()
    # The unique key makes a second application fail its batch: 1500 distinct rows and
    # 1500 Success rows mean each mutation was applied exactly once.
    assert sum(per_pid.values()) == 1500 and keys == 1500
    assert await state_counts(app) == {"Success": 1500}
    assert set(per_pid) <= {p.pid for p in procs}
    if engine_name == "postgres":  # SQLite has one writer at a time: no spread to expect
        assert len(per_pid) >= 2 and max(per_pid.values()) < 1500, per_pid
    assert "Traceback" not in logs_of(tmp_path)


async def test_kill_9_mid_action_is_recorded_lost_and_the_others_carry_on(
    wapp: tuple[durafn.App, Functions], db_url: str, tmp_path: Path
) -> None:
    app, fns = wapp
    callback = fns.completed
    trace = tmp_path / "trace.txt"
    async with worker_processes(db_url, 2, tmp_path, *FAST) as procs:
        await wait_until(lambda: equals(live_workers(app), 2), "2 workers registered")
        # Each row here has a completion callback: written once, by whichever process
        # finishes the row (the rescuer, the canceller, the worker of the re-run).
        sid = await app.scheduler().run_after(
            0, fns.hang.options(on_complete=callback), 1, str(trace)
        )
        await wait_until(lambda: true(bool(trace_of(trace))), "the action started")
        [(_, pid)] = trace_of(trace)
        # Alive across several worker timeouts: its heartbeat keeps it from being lost.
        await anyio.sleep(3 * TIMEOUT)
        row = await app.get(sid)
        assert row is not None and row.state is State.IN_PROGRESS

        os.kill(pid, signal.SIGKILL)
        await wait_until(
            lambda: equals(_row_state(app, sid), State.FAILED), "the action is recorded lost"
        )
        row = await app.get(sid)
        assert row is not None and row.error is not None
        assert row.error.type == "durafn.WorkerLostError"
        assert f":{pid}:" in row.error.message and "sent no heartbeat" in row.error.message
        assert trace_of(trace) == [(1, pid)]  # never re-run
        # The loss is recorded, with what its rescue (by the other worker) did.
        survivor = next(p for p in procs if p.pid != pid)
        (first,) = await app.lost_workers()
        assert f":{pid}:" in first.id and f":{survivor.pid}:" in first.rescued_by
        assert (first.pid, first.failed, first.retried) == (pid, 1, 0)

        # The survivor carries on with new work.
        done = await app.scheduler().run_after(0, fns.touch, 2, str(trace), 0.0)
        await app.scheduler().run_after(0, fns.apply, 7, 0.0)
        await wait_until(lambda: equals(_row_state(app, done), State.SUCCESS), "new work ran")
        assert trace_of(trace) == [(1, pid), (2, survivor.pid)]

        # With a retry policy, a lost action is run again (at least once): exactly once
        # more here, by the worker that rescues it.
        again = await app.scheduler().run_after(
            0, fns.hang_once.options(on_complete=callback), 3, str(trace)
        )
        await wait_until(lambda: true(len(trace_of(trace)) == 3), "it started")
        # Two cancelled while they run, from this process: each learns of it in its
        # worker (by NOTIFY, or SQLite's poll), one waiting for it, one interrupted.
        # The worker is killed after that; the rescue leaves their Canceled rows alone.
        canceled = await app.scheduler().run_after(
            0, fns.until_cancelled.options(on_complete=callback), 4, str(trace)
        )
        interrupted = await app.scheduler().run_after(
            0, fns.interruptible.options(on_complete=callback), 5, str(trace)
        )
        await wait_until(lambda: true(len(trace_of(trace)) == 5), "they started")
        assert await app.cancel(canceled) and await app.cancel(interrupted)
        await wait_until(lambda: true(len(trace_of(trace)) == 7), "they learnt of the cancels")
        (tmp_path / "more").mkdir()
        port = free_port()
        metrics = ("--metrics-port", str(port))
        async with worker_processes(db_url, 1, tmp_path / "more", *FAST, *metrics) as [rescuer]:
            os.kill(survivor.pid, signal.SIGKILL)
            await wait_until(lambda: equals(_row_state(app, again), State.SUCCESS), "re-run")
            await wait_until(lambda: equals(_state(app, "Pending"), 0), "the callbacks ran")
            # The rescuer's own metrics: the run it rescued counts as lost, its re-run as
            # a success (and the survivor's runs are in no counter of this process).
            async with httpx2.AsyncClient() as client:
                page = (await client.get(f"http://127.0.0.1:{port}/metrics")).text
            runs = {
                (s.labels["function"], s.labels["outcome"]): s.value
                for family in text_string_to_metric_families(page)
                for s in family.samples
                if s.name == "durafn_runs_total"
            }
            assert runs[("w:hang_once", "lost")] == 1 and runs[("w:hang_once", "success")] == 1
            assert await stop([rescuer]) == [0]
        assert sorted(trace_of(trace)[2:7]) == [(n, survivor.pid) for n in (3, 4, 5, 1004, 1005)]
        assert trace_of(trace)[7:] == [(3, rescuer.pid)]
        lost = {w.pid: w for w in await app.lost_workers()}
        assert f":{rescuer.pid}:" in lost[survivor.pid].rescued_by
        assert (lost[survivor.pid].failed, lost[survivor.pid].retried) == (0, 1)
        assert [w.pid for w in await app.lost_workers(limit=1)] == [survivor.pid]
        for id in (canceled, interrupted):
            assert await _row_state(app, id) is State.CANCELED
        row = await app.get(again)
        assert row is not None and [h.error.type for h in row.history] == ["durafn.WorkerLostError"]
    callbacks = (await app.list(name="w:completed", limit=10)).items
    assert sorted(f"{c.args['c']['id']} {c.state}" for c in callbacks) == sorted(
        f"{id} Success" for id in (sid, again, canceled, interrupted)
    )
    async with app.engine.connect() as conn:
        applied = set((await conn.execute(select(Applied.key))).scalars())
    assert {f"{sid} Failed", f"{again} Success", f"{canceled} Canceled"} <= applied
    assert f"{interrupted} Canceled" in applied
    assert "Traceback" not in logs_of(tmp_path)


async def test_a_lost_workers_record_counts_the_rows_rescued_after_the_loss(
    wapp: tuple[durafn.App, Functions], db_url: str, tmp_path: Path
) -> None:
    """A worker killed (``kill -9``) with actions it claimed after its last heartbeat:
    the rescue that declares it lost finds it silent for a whole timeout, but not yet those
    rows, which a later rescue records. The loss's record counts them too. (A soak's
    killed worker read 0 failed and 0 retried with 9 of its actions handled at the next
    heartbeat.)

    The rescuer runs here on a fake clock set to the real one's times, so that which rows
    each rescue handles is decided by the test: the killed worker's beat, then its first
    claim, the first rescue (the loss declared, the first row recorded Failed), its second
    claim, the second rescue (the second row, whose policy retries it)."""
    app, fns = wapp
    trace = tmp_path / "trace.txt"
    # One heartbeat (its registration) while the test lasts: every claim comes after it.
    slow = ["--heartbeat-interval", "30", "--worker-timeout", "90", "--poll-interval", "0.05"]
    async with worker_processes(db_url, 1, tmp_path, *slow) as [victim]:
        await wait_until(lambda: equals(live_workers(app), 1), "the worker registered")
        [worker] = await app.workers()
        failing = await app.scheduler().run_after(0, fns.hang, 1, str(trace))
        await wait_until(lambda: true(len(trace_of(trace)) == 1), "the first action started")
        retried = await app.scheduler().run_after(0, fns.hang_once, 2, str(trace))
        await wait_until(lambda: true(len(trace_of(trace)) == 2), "the second one started")
        victim.kill()
        await victim.wait()
    beat = worker.heartbeat_at.timestamp()
    first, second = [(await row_of(app, id)).started_time for id in (failing, retried)]
    assert first is not None and second is not None
    claimed = [first.timestamp(), second.timestamp()]
    assert beat < claimed[0] < claimed[1], (beat, claimed)

    # The rescuer beats every second and rescues from its sixth beat on (a 5 s timeout):
    # that first rescue's cutoff falls between the two claims.
    clock = FakeClock(start=(claimed[0] + claimed[1]) / 2)
    rescuer_app = durafn.App(db_url, clock=clock)
    register(rescuer_app)

    async def has_beaten(app: durafn.App, id: str, at: float) -> bool:
        # A time of the real clock's, with more digits than a datetime's microseconds.
        return any(
            w.id == id and abs(w.heartbeat_at.timestamp() - at) < 1e-3 for w in await app.workers()
        )

    try:
        async with rescuer_app.run_executor(heartbeat_interval=1.0, worker_timeout=5.0) as r:
            for _ in range(5):
                await wait_until(lambda: has_beaten(app, r.worker_id, clock.now()), "a beat")
                clock.advance(1)
            await wait_until(lambda: equals(_row_state(app, failing), State.FAILED), "rescued")
            # Declared lost, with the one row this rescue handled; the other's claim is
            # too recent for it yet.
            [lost] = await app.lost_workers()
            assert (lost.id, lost.failed, lost.retried) == (worker.id, 1, 0)
            assert await _row_state(app, retried) is State.IN_PROGRESS
            while await _row_state(app, retried) is State.IN_PROGRESS:
                await wait_until(lambda: has_beaten(app, r.worker_id, clock.now()), "a beat")
                clock.advance(1)
            await wait_until(lambda: equals(_row_state(app, retried), State.SUCCESS), "re-run")
    finally:
        await rescuer_app.aclose()
    # The record counts every run recorded lost with that worker (each in its row's
    # history): those whose rows stayed Failed, and those retried.
    rows = [await row_of(app, id) for id in (failing, retried)]
    lost_runs = sum(worker.id in h.error.message for row in rows for h in row.history)
    failed = sum(
        row.state is State.FAILED and row.error is not None and worker.id in row.error.message
        for row in rows
    )
    [lost] = await app.lost_workers()
    assert (lost.failed, lost.retried) == (failed, lost_runs - failed) == (1, 1)


async def test_sigterm_lets_running_actions_finish_then_cancels_the_rest(
    wapp: tuple[durafn.App, Functions], db_url: str, tmp_path: Path
) -> None:
    app, fns = wapp
    trace = tmp_path / "trace.txt"
    async with worker_processes(db_url, 1, tmp_path, "--grace-period", "1", *FAST) as procs:
        short = await app.scheduler().run_after(0, fns.touch, 1, str(trace), 0.3)
        stuck = await app.scheduler().run_after(0, fns.hang, 2, str(trace))
        await wait_until(lambda: true(len(trace_of(trace)) == 2), "both actions started")
        assert await stop(procs) == [0]
    short_row, stuck_row = await app.get(short), await app.get(stuck)
    assert short_row is not None and stuck_row is not None
    assert (short_row.state, short_row.result) == (State.SUCCESS, 1)  # finished in its grace
    assert stuck_row.state is State.FAILED  # cancelled after it, recorded, never re-run
    assert stuck_row.error is not None and stuck_row.error.type == "durafn.ExecutorShutdownError"
    logs = logs_of(tmp_path)
    assert "SIGTERM received: stopping" in logs and "Traceback" not in logs
    assert await live_workers(app) == 0  # unregistered on the way out


async def test_a_second_signal_stops_at_once(
    wapp: tuple[durafn.App, Functions], db_url: str, tmp_path: Path
) -> None:
    app, fns = wapp
    trace = tmp_path / "trace.txt"
    async with worker_processes(db_url, 1, tmp_path, "--grace-period", "600") as procs:
        stuck = await app.scheduler().run_after(0, fns.hang, 1, str(trace))
        await wait_until(lambda: true(bool(trace_of(trace))), "the action started")
        procs[0].send_signal(signal.SIGINT)
        await wait_until(lambda: true("SIGINT received: stopping" in logs_of(tmp_path)), "1st")
        # stop() waits at most CEILING (300 s): its return is the second signal cutting
        # the 600 s grace period short, however slow the machine.
        assert await stop(procs, signal.SIGINT) == [1]  # forced: not a clean stop
    row = await app.get(stuck)
    assert row is not None and row.state is State.FAILED
    assert row.error is not None and row.error.type == "durafn.ExecutorShutdownError"


@pytest.mark.parametrize("processes", ["1", "2"])
async def test_a_signal_during_start_up_stops_a_worker_cleanly(
    wapp: tuple[durafn.App, Functions], db_url: str, tmp_path: Path, processes: str
) -> None:
    """SIGTERM while the command is still importing (caught by its entry point) is a clean
    stop before any work is claimed: status 0, the row still Pending. The moment is found
    with ``-X importtime``, whose lines show that durafn's own imports are under way."""
    app, fns = wapp
    due = await app.scheduler().run_after(0, fns.apply, 1, 0.0)
    command = durafn_command("worker", "--app", "tests.apps.worker_app:app", "--url", db_url)
    async with owned() as owner:
        proc = await owner.start(
            [sys.executable, "-X", "importtime", *command[1:], "-n", processes],
            cwd=ROOT,
            stdout=None,
            stderr=subprocess.PIPE,
        )
        assert proc.stderr is not None
        seen = b""
        with anyio.fail_after(CEILING):
            while b"| durafn." not in seen:  # a module of durafn finished importing
                seen += await proc.stderr.receive()
        proc.send_signal(signal.SIGTERM)
        async with anyio.create_task_group() as tg:  # keep the pipe drained
            tg.start_soon(_drain, proc.stderr)
            with anyio.fail_after(CEILING):
                code = await proc.wait()
    assert code == 0
    row = await app.get(due)
    assert row is not None and row.state is State.PENDING


async def _drain(stream: anyio.abc.ByteReceiveStream) -> None:
    try:
        async for _ in stream:
            pass
    except anyio.EndOfStream:
        pass


async def test_exit_on_complete_runs_what_is_due_and_exits_0(
    wapp: tuple[durafn.App, Functions], db_url: str, tmp_path: Path
) -> None:
    """Under the supervisor (``-n 2``), whose children are plain ``--exit-on-complete``
    workers: both paths at the cost of one; each within two database connections, each
    logging JSON (``--log-format json``, passed on to the children): a line per record,
    a run's with its fields."""
    app, fns = wapp
    trace = tmp_path / "trace.txt"
    await app.run_mutation(fns.fan_out, 0, 300, 0.0)
    for n in range(20):
        await app.scheduler().run_after(0, fns.touch, n, str(trace), 0.0)
    later = await app.scheduler().run_after(3600, fns.apply, 999, 0.0)
    command = durafn_command(
        "worker", "--app", "tests.apps.worker_app:app", "--url", db_url, "--exit-on-complete"
    )
    logs = ["--log-format", "json", "--log-level", "DEBUG"]
    async with owned() as owner:
        result = await owner.run([*command, "-n", "2", "--max-connections", "2", *logs], cwd=ROOT)
    assert result.returncode == 0, result.stderr.decode()
    lines = [json.loads(line) for line in result.stderr.decode().splitlines()]
    runs = [r for r in lines if r.get("function") == "w:touch" and r.get("state") == "Success"]
    assert len(runs) == 20
    assert all({"id", "kind", "attempt", "lag", "duration", "worker"} <= set(r) for r in runs)
    # Each child's last line sums up its outcomes: together, every run.
    stops = [r["message"] for r in lines if r["message"].startswith("stopped: ")]
    counts = [[int(n) for n in re.findall(r"\d+", message)] for message in stops]
    assert len(counts) == 2 and [sum(column) for column in zip(*counts, strict=True)] == [
        300,
        20,
        0,
        0,
        0,
    ]
    assert stops[0].endswith("actions succeeded, 0 failed, 0 retried, 0 snoozed")
    # Each child took the supervisor's --max-connections, and drained within it.
    assert result.stderr.decode().count("at most 2 database connections") == 2
    assert await state_counts(app) == {"Success": 320, "Pending": 1}
    row = await app.get(later)
    assert row is not None and row.state is State.PENDING  # due later: not "complete" work
    assert sorted(n for n, _ in trace_of(trace)) == list(range(20))
    assert await live_workers(app) == 0


async def test_the_supervisor_restarts_a_killed_worker_and_stops_cleanly(
    wapp: tuple[durafn.App, Functions], db_url: str, tmp_path: Path
) -> None:
    app, _ = wapp
    args = ["worker", "--app", "tests.apps.worker_app:app", "--url", db_url, "-n", "2", *FAST]
    async with owned() as owner:
        with (tmp_path / "worker-supervisor.log").open("w") as log:
            supervisor = await owner.start(durafn_command(*args), cwd=ROOT, stdout=log, stderr=log)
        await wait_until(lambda: equals(live_workers(app), 2), "2 workers registered")
        victim = (await app.workers())[0]
        os.kill(victim.pid, signal.SIGKILL)

        async def replaced() -> bool:
            now = {w.pid for w in await app.workers()}
            return victim.pid not in now and len(now) == 2

        # The restart waits 1 s; the dead worker's row goes when it times out.
        await wait_until(replaced, "the killed worker is replaced")
        assert await stop([supervisor]) == [0]
    logs = logs_of(tmp_path)
    assert "died (killed by SIGKILL); restarting it" in logs
    assert "Traceback" not in logs
    assert await live_workers(app) == 0


async def test_the_children_of_a_killed_supervisor_stop_by_themselves(
    wapp: tuple[durafn.App, Functions], db_url: str, tmp_path: Path
) -> None:
    """SIGKILL cannot be forwarded: the children (in their own sessions) notice their
    supervisor is gone and stop gracefully, unregistering, instead of running on."""
    app, _ = wapp
    args = ["worker", "--app", "tests.apps.worker_app:app", "--url", db_url, "-n", "2", *FAST]
    async with owned() as owner:  # should they not stop: no orphan outlives the test
        with (tmp_path / "worker-supervisor.log").open("w") as log:
            supervisor = await owner.start(durafn_command(*args), cwd=ROOT, stdout=log, stderr=log)
        await wait_until(lambda: equals(live_workers(app), 2), "2 workers registered")
        children = {w.pid for w in await app.workers()}
        assert children <= set(carrying(owner.token))  # the children carry the token too
        supervisor.kill()
        await supervisor.wait()
        await wait_until(lambda: equals(live_workers(app), 0), "the children unregistered")
    assert "the supervisor (pid" in logs_of(tmp_path)


_TREE = """
import subprocess, sys, time
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
print("started", flush=True)
time.sleep(600)
"""


async def test_a_failing_test_leaves_no_process_behind() -> None:
    """The suite's own guarantee (``tests/support/processes.py``): a test that fails while its
    process and that process's child (in a session of its own, as a supervisor's
    children are) run still ends them both. A plain process tree: the mechanism does not
    care what the processes are."""
    tree: set[int] = set()
    with pytest.raises(RuntimeError, match="the test failed"):
        async with owned() as owner:
            parent = await owner.start([sys.executable, "-c", _TREE], stdout=subprocess.PIPE)
            assert parent.stdout is not None
            with anyio.fail_after(CEILING):
                await parent.stdout.receive()  # its child is started
            tree = set(carrying(owner.token))
            raise RuntimeError("the test failed")
    assert len(tree) == 2 and parent.pid in tree

    async def all_ended() -> bool:
        # Killed and reaped (the parent), or killed and reaped by init (its child).
        return not any(map(alive, tree))

    await wait_until(all_ended, "every process ended")


@pytest.mark.postgres_only  # a server that drops connections: SQLite has none
async def test_workers_survive_a_storm_of_connection_terminations(
    postgres_url: str, tmp_path: Path
) -> None:
    """Every backend terminated every 0.1 s for 20 rounds while work keeps coming: both
    workers carry on (a connection a terminated backend left consuming its last error was
    once handed out again, and a worker died of asyncpg's "another operation is in
    progress"), and every row runs exactly once. Default heartbeats: a worker cut off
    for longer than a 0.6 s timeout would rightly be taken for lost."""
    trace = tmp_path / "trace.txt"
    rounds, per_round = 20, 20
    async with (
        worker_app_on(postgres_url) as (app, fns),
        worker_processes(postgres_url, 2, tmp_path, "--poll-interval", "0.05") as procs,
    ):
        await wait_until(lambda: equals(live_workers(app), 2), "2 workers registered")
        terminated = 0
        for n in range(rounds):
            await app.run_mutation(fns.fan_out, n * per_round, per_round, 0.0)
            await app.scheduler().run_after(0, fns.touch, n, str(trace), 0.0)
            terminated += await _terminate_all_backends()
            await app.engine.dispose()  # the test's own pooled connections went too
            await anyio.sleep(0.1)
        total = rounds * (per_round + 1)  # each round's applies and its action
        await wait_until(lambda: equals(_state(app, "Success"), total), "every row finished")
        assert await state_counts(app) == {"Success": total}
        assert sorted(n for n, _ in trace_of(trace)) == list(range(rounds))  # each once
        assert all(p.returncode is None for p in procs)  # recovered, not crashed
        assert await stop(procs) == [0, 0]
    async with app.engine.connect() as conn:
        applied = select(func.count(func.distinct(Applied.key)))
        assert (await conn.execute(applied)).scalar() == rounds * per_round
    assert terminated >= 2 * rounds
    logs = logs_of(tmp_path)
    assert "lost the connection to PostgreSQL" in logs
    assert "reconnected to PostgreSQL" in logs
    assert "Traceback" not in logs


def test_worker_errors_are_one_line(db_url: str, engine_name: str) -> None:
    # In-process (CliRunner): the same code path as the real command, without paying a
    # process start per case (test_cli.py runs the real subprocess for the error paths).
    cases = [
        (["worker", "--url", db_url], "needs the app"),
        (["worker", "--app", "nosuch.module:app", "--url", db_url], "cannot import 'nosuch"),
        (
            ["worker", "--app", "tests.apps.worker_app:nope", "--url", db_url],
            "has no attribute 'nope'",
        ),
        (
            ["worker", "--app", "tests.apps.worker_app:app", "--url", "mysql://x/y"],
            "SQLite or Postgre",
        ),
    ]
    if engine_name == "postgres":  # no tables yet: PostgreSQL needs `durafn migrate`
        cases.append((["worker", "--app", "tests.apps.worker_app:app", "--url", db_url], "migrate"))
    # Under a supervisor (-n) too: the same line at once, before any child is started.
    cases += [([*args, "-n", "2"], message) for args, message in cases]
    for args, message in cases:
        result = CliRunner().invoke(cli.main, args)
        assert result.exit_code == 1, (args, result.output)
        assert message in result.stderr and "Traceback" not in result.stderr, (args, result.stderr)
        assert [line for line in result.stderr.splitlines() if line.startswith("error:")] == [
            line for line in result.stderr.splitlines() if line.strip()
        ][-1:]


async def _terminate_all_backends() -> int:
    conn = await asyncpg.connect(BARE_DSN)
    try:
        return int(
            await conn.fetchval(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
        )
    finally:
        await conn.close()


async def _state(app: durafn.App, state: str) -> int:
    return (await state_counts(app)).get(state, 0)


async def _row_state(app: durafn.App, id: durafn.ScheduledFunctionId) -> State | None:
    row = await app.get(id)
    return row.state if row is not None else None


async def test_a_killed_cron_leader_is_replaced_and_no_tick_is_written_twice(
    db_url: str, tmp_path: Path
) -> None:
    """Two workers of an app with a cron every second; the one holding the cron lease is
    ``kill -9``ed; the other takes the lease over (within a third of the worker timeout,
    0.2 s here) and the ticks go on, each written once."""
    async with cron_app.make_beats(db_url) as app:
        await app.migrate()
        async with worker_processes(db_url, 2, tmp_path, *FAST, app="tests.apps.cron_app:beats"):
            await wait_until(lambda: _ticks_at_least(app, 1), "a tick")
            leader = await _lease_holder(app)
            os.kill(int(leader.split(":")[-2]), signal.SIGKILL)
            written = len(await _tick_times(app))
            await wait_until(lambda: _ticks_at_least(app, written + 1), "a tick after the kill")
            assert await _lease_holder(app) != leader
        times = await _tick_times(app)
    assert len(times) == len(set(times))  # never twice
    # Every second, from the first to the last, none lost: the ticks a leader's death (or a
    # stall of the survivor) missed are backfilled.
    first = min(times)
    assert sorted(times) == [first + n for n in range(len(times))]


async def _tick_times(app: durafn.App) -> list[float]:
    sf = scheduled_functions
    async with app.engine.connect() as conn:
        rows = await conn.execute(select(sf.c.scheduled_time).where(sf.c.name == "cron:beat"))
        return [float(t) for (t,) in rows]


async def _ticks_at_least(app: durafn.App, count: int) -> bool:
    return len(await _tick_times(app)) >= count


async def _lease_holder(app: durafn.App) -> str:
    leases = durafn.metadata.tables["_durafn_leases"]
    async with app.engine.connect() as conn:
        holder = (await conn.execute(select(leases.c.holder))).scalar()
    assert isinstance(holder, str)
    return holder
