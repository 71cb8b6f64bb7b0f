"""Named queues across real worker processes: a serial queue under 4 racing workers, a
concurrency limit held across processes, and pools served by the right processes.

Each row is a ``w:span`` action that writes when it starts and ends (the system-wide
monotonic clock) and which queues its worker serves; overlaps are read off those spans.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest

import durafn
from durafn import Flow, State
from durafn.testing import all_rows

from .apps.worker_app import QUEUES, Base, Functions, register
from .support.helpers import CEILING, equals, wait_until
from .support.processes import owned
from .test_workers import ROOT, durafn_command, stop, worker_processes

pytestmark = pytest.mark.anyio
# The default heartbeats (not test_workers' fast ones): on a loaded machine a worker that
# misses a 0.6 s timeout is rescued while its action still runs, and the queue's next row
# may then start beside it (a lost worker's row is recorded Failed, never waited for).
QUICK_POLL = ["--poll-interval", "0.05"]


class Span:
    def __init__(self, n: int, start: float, pid: int, serves: str) -> None:
        self.n, self.start, self.pid, self.serves = n, start, pid, serves
        self.end = float("inf")


def spans_of(path: Path) -> dict[int, Span]:
    spans: dict[int, Span] = {}
    for line in path.read_text().splitlines():
        what, n, at, pid, serves = line.split()
        if what == "start":
            spans[int(n)] = Span(int(n), float(at), int(pid), serves)
        else:
            spans[int(n)].end = float(at)
    return spans


def most_at_once(spans: dict[int, Span]) -> int:
    events = sorted([(s.start, 1) for s in spans.values()] + [(s.end, -1) for s in spans.values()])
    running = most = 0
    for _, step in events:  # an end at the same instant as a start is counted first
        running += step
        most = max(most, running)
    return most


@pytest.fixture
async def qapp(app_url: tuple[str, bool]) -> AsyncIterator[tuple[durafn.App, Functions]]:
    app = durafn.App(app_url[0], queues=QUEUES)  # the ``app`` tests' database
    fns = register(app)
    await app.migrate()
    async with app.engine.begin() as conn:
        await conn.run_sync(Base.metadata.create_all)
        for table in reversed(Base.metadata.sorted_tables):  # as ``worker_app_on`` does
            await conn.execute(table.delete())
    try:
        yield app, fns
    finally:
        await app.aclose()


async def _count_workers(app: durafn.App) -> int:
    return len(await app.workers())


async def _wait_done(app: durafn.App, ids: list[durafn.ScheduledFunctionId]) -> None:
    with anyio.fail_after(CEILING):
        while True:
            rows = [await app.get(i) for i in ids]
            if all(r is not None and r.state.finished for r in rows):
                assert {r.state for r in rows if r is not None} == {State.SUCCESS}
                return
            await anyio.sleep(0.05)


async def test_a_serial_queue_and_a_limit_of_3_hold_across_4_racing_workers(
    qapp: tuple[durafn.App, Functions], db_url: str, tmp_path: Path
) -> None:
    """One run of 4 worker processes: a serial queue never runs two rows at once and
    starts them in order; a queue limited to 3 never runs more (and reaches 3); a flow
    key of concurrency 2 never runs more (and reaches 2)."""
    app, fns = qapp
    trace = tmp_path / "spans"
    calls = [fns.span.options(queue="account:1").call(n, str(trace), 0.02) for n in range(16)]
    # The limited queue's and the flow keys' rows each wait, once, for their limit to be
    # reached (``w:meet``): whether it is then says what the claims allow, not how fast
    # a loaded machine started them (at 50 ms apart, a run under load once never had two
    # rows of a key at once).
    limited = fns.meet.options(queue="limited")
    calls += [limited.call(100 + n, str(trace), 0.03, 3, "limited") for n in range(24)]
    # Unqueued rows keep every worker busy claiming alongside the queues'.
    calls += [fns.span.call(200 + n, str(trace), 0.0) for n in range(40)]
    # Flow keys: at most 2 rows of each key at once (its key computed here, from the
    # arguments: the workers read it, and the limit, off the rows).
    keyed = fns.meet.options(flow=Flow(key=lambda a: f"k{a['n'] % 2}", concurrency=2))
    calls += [keyed.call(300 + n, str(trace), 0.02, 2, f"k{n % 2}") for n in range(24)]
    async with worker_processes(db_url, 4, tmp_path, *QUICK_POLL, "--concurrency", "4") as procs:
        ids = await app.scheduler().run_many(calls)
        await _wait_done(app, ids)
        assert await stop(procs) == [0, 0, 0, 0]
    spans = spans_of(trace)
    serial = {n: s for n, s in spans.items() if n < 100}
    assert most_at_once(serial) == 1
    assert sorted(serial, key=lambda n: serial[n].start) == list(range(16))
    assert most_at_once({n: s for n, s in spans.items() if 100 <= n < 200}) == 3
    for parity in (0, 1):
        of_key = {n: s for n, s in spans.items() if n >= 300 and n % 2 == parity}
        assert len(of_key) == 12 and most_at_once(of_key) == 2
    assert len({s.pid for s in spans.values()}) > 1  # the workers did race


async def test_pools_run_each_queue_in_its_own_processes(
    qapp: tuple[durafn.App, Functions], db_url: str, tmp_path: Path
) -> None:
    app, fns = qapp
    trace = tmp_path / "spans"
    mail = fns.span.options(queue="mail")
    report = fns.span.options(queue="reports")
    calls = [mail.call(n, str(trace), 0.0) for n in range(10)]
    calls += [report.call(100 + n, str(trace), 0.0) for n in range(10)]
    unserved = [fns.span.call(200 + n, str(trace), 0.0) for n in range(5)]
    pools = ["--pool", "mail:2", "--pool", "reports,exports"]
    async with worker_processes(db_url, 1, tmp_path, *QUICK_POLL, *pools) as procs:
        # The supervisor's children, 2 + 1, each registered before any row is there.
        await wait_until(lambda: equals(_count_workers(app), 3), "3 workers")
        ids = await app.scheduler().run_many(calls)
        left = await app.scheduler().run_many(unserved)
        await _wait_done(app, ids)
        assert await stop(procs) == [0]  # the supervisor: its children stopped cleanly
    spans = spans_of(trace)
    assert {s.serves for n, s in spans.items() if n < 100} == {"mail"}
    assert {s.serves for n, s in spans.items() if n >= 100} == {"reports,exports"}
    # No pool serves unqueued rows (none is '*'): they wait.
    assert {(await app.get(i)).state for i in left} == {State.PENDING}  # type: ignore[union-attr]


def _poll_only_as_fallback(engine_name: str) -> list[str]:
    """On PostgreSQL, a fallback poll of an hour: a hand-off that misses its wake-up
    hangs (and the test's ceiling fails it) instead of costing the 5 s default. SQLite
    has no cross-process wake-ups: its poll is how other processes learn."""
    return ["--poll-interval", "3600" if engine_name == "postgres" else "0.05"]


def _ran_in_order(trace: Path, count: int) -> None:
    """The rows ran one at a time, in queue order (the trace's lines are appended as they
    run: an action's start and end, a mutation's run)."""
    lines = [line.split()[:2] for line in trace.read_text().splitlines()]
    expected = [["start", str(n)] if n % 2 else ["run", str(n)] for n in range(count)]
    assert [line for line in lines if line[0] != "end"] == expected
    for n in range(1, count, 2):  # an action ends before the next row starts
        assert lines.index(["end", str(n)]) == lines.index(["start", str(n)]) + 1


async def test_a_serial_queue_hands_off_between_kinds_across_processes(
    qapp: tuple[durafn.App, Functions], db_url: str, engine_name: str, tmp_path: Path
) -> None:
    """Mutations and actions take turns in one serial queue, run by two worker
    processes: each row's end must wake the claimers of the other kind, in the other
    process too (a claim of one kind that only looked at the queue once held it, and the
    other kind's claim, finding it held, slept until its poll). Then a paused queue's
    rows, resumed from the command line: the resume wakes both workers too."""
    app, fns = qapp
    trace, resumed = tmp_path / "spans", tmp_path / "resumed"
    await app.pause_queue("paused")

    def alternating(queue: str, path: Path, count: int) -> list[durafn.Call]:
        return [
            fns.note.options(queue=queue).call(n, str(path))
            if n % 2 == 0
            else fns.span.options(queue=queue).call(n, str(path), 0.0)
            for n in range(count)
        ]

    poll = _poll_only_as_fallback(engine_name)
    async with worker_processes(db_url, 2, tmp_path, *poll) as procs:
        await wait_until(lambda: equals(_count_workers(app), 2), "2 workers")
        paused = await app.scheduler().run_many(alternating("paused", resumed, 6))
        ids = await app.scheduler().run_many(alternating("handoff", trace, 24))
        await _wait_done(app, ids)
        # Both workers were woken by the rows of the paused queue, and found it paused.
        assert {(await app.get(i)).state for i in paused} == {State.PENDING}  # type: ignore[union-attr]
        async with owned() as owner:
            command = durafn_command("queue", "resume", "paused", "--url", db_url)
            resume = await owner.run(command, cwd=ROOT)
        assert resume.returncode == 0, resume.stderr
        await _wait_done(app, paused)
        assert await stop(procs) == [0, 0]
    _ran_in_order(trace, len(ids))
    _ran_in_order(resumed, len(paused))


_SCHEDULE_ELSEWHERE = """
import asyncio, sys
import durafn
from durafn import MutationCtx
from durafn.testing import FakeClock

url, at = sys.argv[1], float(sys.argv[2])
app = durafn.App(url, clock=FakeClock(at))

@app.mutation(name="order:note")
async def note(ctx: MutationCtx, tag: str) -> None: ...

async def main() -> None:
    for options in ({}, {"queue": "q"}, {"flow": durafn.Flow(key="k", concurrency=1)}):
        await app.scheduler().run_after(0, note.options(**options), "B")
    await app.aclose()

asyncio.run(main())
"""


async def test_rows_due_at_one_instant_start_in_the_order_they_were_scheduled(
    app: durafn.App, clock: durafn.testing.FakeClock
) -> None:
    """Another process schedules a row between two of ours, at the same instant (its
    clock and ours stand at the same time): the three start in the order they were
    written, whatever the ids each process made (an id's counter is per process). For
    unqueued rows, a serial queue's and a flow key's alike."""
    from .support.helpers import effects
    from .support.models import Effect

    @app.mutation(name="order:note")
    async def note(ctx: durafn.MutationCtx, tag: str) -> None:
        ctx.db.add(Effect(key=f"{tag} {ctx.run_id}"))

    refs = [note, note.options(queue="q"), note.options(flow=Flow(key="k", concurrency=1))]
    for ref in refs:  # our counter is well past the other process's first id
        await app.scheduler().run_after(0, ref, "warm-up")
    await app.executor().run_until_idle()
    firsts = [await app.scheduler().run_after(0, ref, "A") for ref in refs]
    url = str(app.engine.url.render_as_string(hide_password=False))
    async with owned() as owner:
        done = await owner.run(
            [sys.executable, "-c", _SCHEDULE_ELSEWHERE, url, repr(clock.now())], cwd=ROOT
        )
    assert done.returncode == 0, done.stderr.decode()
    for ref in refs:
        await app.scheduler().run_after(0, ref, "C")
    await app.executor(batch_size=1, concurrency=1).run_until_idle()
    ran = [e.split() for e in await effects(app) if not e.startswith("warm-up")]
    rows: dict[str, durafn.ScheduledFunction] = {r.id: r for r in await all_rows(app)}
    for first in firsts:  # per class: A, then B, then C
        where = (rows[first].queue, rows[first].flow_key)
        tags = [tag for tag, id in ran if (rows[id].queue, rows[id].flow_key) == where]
        assert tags == ["A", "B", "C"], where
