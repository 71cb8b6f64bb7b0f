"""Exactly once under a crash: a real executor subprocess is ``kill -9``-ed at random
moments and restarted; every scheduled mutation ends Success with its effect applied once."""

from __future__ import annotations

import os
import random
import signal
import sys
from collections import Counter as Tally
from pathlib import Path

import anyio
import pytest
from sqlalchemy import and_, func, insert, or_, select

import durafn
from durafn import State
from durafn.testing import all_rows

from .apps.crash_app import build
from .support.helpers import CEILING, count, counter
from .support.models import Base, Counter, Effect
from .support.processes import owned

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parent.parent
TOTAL = 200
KILLS = 4
GROUPS = 4
"""Groups of the 200 rows (50 each): each adds two rows, durafn:group_complete and the
callback it schedules, both mutations run in the batches the kills land in."""
ALL = TOTAL + 2 * GROUPS


async def _done(app: durafn.App) -> int:
    """Success rows: polled every few ms while the worker runs, so counted, not listed
    (reading 200 rows as models took CPU from the worker it waits for)."""
    return (await app.stats()).counts[State.SUCCESS]


def _began(starts: Path) -> int:
    return len(starts.read_text().split()) if starts.exists() else 0


async def test_exactly_once_under_kill_9(db_url: str, tmp_path: Path) -> None:
    app, apply = build(db_url)
    await app.migrate()
    async with app.engine.begin() as conn:
        await conn.run_sync(Base.metadata.create_all)
        await conn.execute(insert(Counter).values(name="c", value=0))
    sched = app.scheduler()
    ids = [await sched.run_after(0, apply, n) for n in range(TOTAL)]
    done_ref = app._rt.registry.get("crash:group_done")
    size = TOTAL // GROUPS
    for g in range(GROUPS):
        await sched.group(ids[g * size : (g + 1) * size], on_complete=done_ref)  # type: ignore[arg-type]

    rng = random.Random(20261123)
    kills = lost = 0
    starts = tmp_path / "starts.txt"
    env = {**os.environ, "DURAFN_TEST_STARTS": str(starts)}
    async with owned() as owner:
        with (tmp_path / "worker.log").open("w") as log:
            while True:
                proc = await owner.start(
                    [sys.executable, "-m", "tests.apps.crash_app", db_url],
                    cwd=ROOT,
                    stdout=log,
                    stderr=log,
                    env=env,
                )
                try:
                    before = await _done(app)
                    last_round = kills >= KILLS
                    target = ALL if last_round else min(ALL - 1, before + rng.randint(5, 40))
                    with anyio.fail_after(CEILING):
                        # Progress is only visible in the database: poll it (5 ms) for the target.
                        while await _done(app) < target:
                            assert proc.returncode is None, f"worker exited early; see {log.name}"
                            await anyio.sleep(0.005)
                        # Then land inside an open batch: runs have begun (the file, read
                        # first) that were not committed when the count was read after it.
                        while not last_round:
                            begun, done = _began(starts), await _done(app)
                            if begun > done + lost or done >= TOTAL:
                                break
                            await anyio.sleep(0.001)
                finally:
                    proc.send_signal(signal.SIGKILL)
                    await proc.wait()
                if last_round:
                    break
                kills += 1
                lost = _began(starts) - await _done(app)  # runs begun and lost with the kill

    rows = await all_rows(app)
    assert len(rows) == ALL
    assert {r.state for r in rows} == {State.SUCCESS}
    assert await counter(app) == TOTAL
    assert await count(app, Effect) == TOTAL + GROUPS
    async with app.engine.connect() as conn:
        keys = (await conn.execute(select(Effect.key).where(Effect.key.like("group %")))).scalars()
        assert sorted(keys) == sorted(f"group {ids[g * size]} {size}/{size}" for g in range(GROUPS))
    # The kills did land inside open batches: some runs began, were lost with their
    # uncommitted batch, and began again; their effects still count once.
    began = Tally(int(line) for line in starts.read_text().split())
    assert set(began) == set(range(TOTAL))
    assert any(times > 1 for times in began.values()), "no kill landed inside a batch"
    await app.aclose()


async def _unsettled(app: durafn.App, pid: int) -> bool:
    """Rows Pending, or running under the worker of ``pid``. Actions cut off by a kill
    stay InProgress under their dead worker and never start again; counting them when a
    round began raced with a claim whose COMMIT the kill had already sent (the server
    still commits it), and the round then waited for a row that never comes."""
    sf = durafn.scheduled_functions
    mine = and_(sf.c.state == State.IN_PROGRESS.value, sf.c.worker_id.contains(f":{pid}:"))
    async with app.engine.connect() as conn:
        found = select(func.count()).where(or_(sf.c.state == State.PENDING.value, mine))
        return bool((await conn.execute(found)).scalar_one())


async def test_actions_run_at_most_once_under_kill_9(db_url: str, tmp_path: Path) -> None:
    """Actions append to a file (a side effect no transaction can undo), batched ones
    too. Killed mid-run and restarted, no action ever starts twice: the ones cut off stay
    InProgress (the worker issue adds lost-worker rescue), every other one is Success,
    each with one line."""
    app, _ = build(db_url)
    await app.migrate()
    effects = tmp_path / "effects.txt"
    effects.touch()
    sched = app.scheduler()
    for n in range(60):
        await sched.run_after(0, "crash:act", n=n, path=str(effects))
    # And 30 items of a batched action, five to a call: a kill cuts off whole batches.
    for n in range(1000, 1030):
        await sched.run_after(0, "crash:act_many", {"n": n, "path": str(effects)})

    async def started() -> int:
        return len(effects.read_text().split())

    async with owned() as owner:
        with (tmp_path / "worker.log").open("w") as log:
            for round_ in range(3):
                last = round_ == 2
                proc = await owner.start(
                    [sys.executable, "-m", "tests.apps.crash_app", db_url],
                    cwd=ROOT,
                    stdout=log,
                    stderr=log,
                )
                try:
                    with anyio.fail_after(CEILING):
                        # Side effects are only visible in the file and the table: poll them.
                        while (
                            await _unsettled(app, proc.pid)
                            if last
                            else await started() < 20 * (round_ + 1) + 5
                        ):
                            assert proc.returncode is None, f"worker exited early; see {log.name}"
                            await anyio.sleep(0.005)
                finally:
                    proc.send_signal(signal.SIGKILL)
                    await proc.wait()

    starts = Tally(int(x) for x in effects.read_text().split())
    assert max(starts.values()) == 1, f"an action started twice: {starts.most_common(3)}"
    rows = {r.args.get("item", r.args)["n"]: r for r in await all_rows(app)}
    lost = [n for n, r in rows.items() if r.state is State.IN_PROGRESS]
    assert lost, "no kill landed while actions were running"
    for n, row in rows.items():
        assert row.state in (State.SUCCESS, State.IN_PROGRESS), (n, row.state)
        assert row.attempts == 1
        if row.state is State.SUCCESS:
            assert starts[n] == 1
    await app.aclose()
