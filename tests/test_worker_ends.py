"""What becomes of an action's row when its worker process ends, in the two windows the
executor's concept page names.

* **Claimed ahead.** A real worker (``durafn worker``, one slot) runs a few short actions
  (0.1 s, so that its look-ahead claims one row beyond the slot), then one that holds
  its slot until the test says. The row claimed ahead of it cannot start while it holds:
  the worker is stopped, or killed with ``kill -9``, with that row InProgress and never
  started, whatever the machine's speed. Such a row never runs in that worker; a stop
  gives it back (Pending, its attempt uncounted) and it runs later, once; after a kill
  the next worker records it lost and never runs it (at most once: from the database
  alone it cannot be told from a row that was running), its error saying it may not have
  run at all.
* **Finished, its outcome not yet written.** An action has returned and the finisher's
  write waits (here for a lock the test holds) when the worker is killed: the row stays
  InProgress, the next worker records it lost, the action never runs again, and its
  result is lost.
"""

from __future__ import annotations

import signal
from collections import Counter
from pathlib import Path

import anyio
import pytest
from sqlalchemy import select

import durafn
from durafn import State, scheduled_functions

from .apps.worker_app import Functions
from .support.helpers import row_of, system_table_locked, true, wait_until
from .test_workers import FAST, trace_of, wapp, worker_processes

__all__ = ["wapp"]  # the fixture, used here by name

pytestmark = pytest.mark.anyio

ROWS = 12
SECONDS = 0.1
"""A short action's time: well under the quarter second that gets a look-ahead
(``AHEAD_HORIZON``), so that a loaded machine's slower pace still gets one."""
HOLD = 3
"""The row that holds the one slot (``w:on_cue``, its cue never given): the rows before
it set the worker's pace, the one after it is claimed ahead as it starts."""


async def _in_progress(app: durafn.App) -> set[str]:
    sf = scheduled_functions
    async with app.engine.connect() as conn:
        found = await conn.execute(select(sf.c.id).where(sf.c.state == State.IN_PROGRESS.value))
        return {str(id) for (id,) in found}


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["stop", "kill-9"])
async def test_a_row_claimed_ahead_never_runs_in_a_worker_that_ends(
    wapp: tuple[durafn.App, Functions], db_url: str, tmp_path: Path, sig: signal.Signals
) -> None:
    app, fns = wapp
    trace = tmp_path / "trace.txt"
    trace.touch()
    calls = [
        fns.on_cue.call(n, str(trace)) if n == HOLD else fns.touch.call(n, str(trace), SECONDS)
        for n in range(ROWS)
    ]
    ids = await app.scheduler().run_many(calls)
    number = {str(id): n for n, id in enumerate(ids)}
    ahead: set[str] = set()

    async def one_claimed_ahead() -> bool:
        # The held row has started and holds the only slot, so no row after it can
        # start until the worker ends: whatever is InProgress beyond it was claimed ahead.
        if HOLD not in {n for n, _ in trace_of(trace)}:
            return False
        ahead.update(id for id in await _in_progress(app) if number[id] > HOLD)
        return bool(ahead)

    logs = tmp_path / "first"
    logs.mkdir()
    args = ("--concurrency", "1", "--grace-period", "0", *FAST)
    async with worker_processes(db_url, 1, logs, *args) as [worker]:
        await wait_until(one_claimed_ahead, "a row claimed ahead of the held one")
        worker.send_signal(sig)
        await worker.wait()
    started = {n for n, _ in trace_of(trace)}
    assert started == set(range(HOLD + 1)), started  # none after the held row started
    for id in ahead:
        row = await row_of(app, id)
        if sig == signal.SIGTERM:
            # Given back by the stop: Pending, its attempt uncounted.
            assert (row.state, row.attempts) == (State.PENDING, 0), (id, row.state)
        else:
            assert row.state is State.IN_PROGRESS and row.attempts == 1, (id, row.state)

    # The next worker: a stop's rows run, once; a killed worker's are recorded lost.
    logs = tmp_path / "next"
    logs.mkdir()
    async with worker_processes(db_url, 1, logs, "--concurrency", str(ROWS), *FAST) as [_]:

        async def all_ended() -> bool:
            rows = [await row_of(app, id) for id in number]
            return all(r.state in (State.SUCCESS, State.FAILED) for r in rows)

        await wait_until(all_ended, "every row ended")
    starts = Counter(n for n, _ in trace_of(trace))
    assert max(starts.values()) == 1, f"an action started twice: {starts.most_common(3)}"
    for id in ahead:
        row = await row_of(app, id)
        if sig == signal.SIGTERM:
            assert row.state is State.SUCCESS and starts[number[id]] == 1
        else:
            assert row.state is State.FAILED and number[id] not in starts
            assert row.error is not None and row.error.type == "durafn.WorkerLostError"
            assert "or not at all (claimed ahead" in row.error.message


async def test_a_finished_actions_outcome_lost_with_its_worker_is_recorded_lost_not_rerun(
    wapp: tuple[durafn.App, Functions], db_url: str, tmp_path: Path
) -> None:
    app, fns = wapp
    trace = tmp_path / "trace.txt"
    trace.touch()
    done = Path(f"{trace}.done")
    id = await app.scheduler().run_after(0, fns.on_cue, 7, str(trace))
    async with worker_processes(db_url, 1, tmp_path, "--concurrency", "1", *FAST) as [worker]:
        await wait_until(lambda: true(trace_of(trace) == [(7, worker.pid)]), "the action started")
        # Every write to the table waits behind this lock: the outcome's too.
        async with system_table_locked(app) as lock:
            await anyio.Path(f"{trace}.go").touch()
            await wait_until(lambda: true(done.exists()), "the action returned")
            worker.kill()
            await worker.wait()
            await lock.rollback()
    row = await row_of(app, id)
    assert row.state is State.IN_PROGRESS, row.state  # its outcome never written
    logs = tmp_path / "next"
    logs.mkdir()
    async with worker_processes(db_url, 1, logs, *FAST):

        async def recorded_lost() -> bool:
            return (await row_of(app, id)).state is State.FAILED

        await wait_until(recorded_lost, "recorded lost")
    row = await row_of(app, id)
    assert row.error is not None and row.error.type == "durafn.WorkerLostError"
    assert row.result is None  # the value it returned is lost with its worker
    assert [n for n, _ in trace_of(trace)] == [7]  # and it never ran again
