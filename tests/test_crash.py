"""Exactly once under a crash: a real executor subprocess is ``kill -9``-ed at random
moments and restarted; every scheduled mutation ends Success with its effect applied once."""

from __future__ import annotations

import random
import signal
import sys
from pathlib import Path

import anyio
import pytest
from sqlalchemy import insert

import durafn
from durafn import State
from durafn.testing import all_rows

from .crash_app import build
from .helpers import count, counter
from .models import Base, Counter, Effect

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parent.parent
TOTAL = 200
KILLS = 4


async def _done(app: durafn.App) -> int:
    return len((await app.list(state=State.SUCCESS, limit=10_000)).items)


async def test_exactly_once_under_kill_9(db_url: str, tmp_path: Path) -> None:
    app, apply = build(db_url)
    await app.migrate()
    async with app.engine.begin() as conn:
        await conn.run_sync(Base.metadata.create_all)
        await conn.execute(insert(Counter).values(name="c", value=0))
    sched = app.scheduler()
    for n in range(TOTAL):
        await sched.run_after(0, apply, n)

    rng = random.Random(20261123)
    kills = 0
    with (tmp_path / "worker.log").open("w") as log:
        while True:
            proc = await anyio.open_process(
                [sys.executable, "-m", "tests.crash_app", db_url], cwd=ROOT, stdout=log, stderr=log
            )
            try:
                before = await _done(app)
                last_round = kills >= KILLS
                target = TOTAL if last_round else min(TOTAL - 1, before + rng.randint(5, 40))
                with anyio.fail_after(60):
                    # Progress is only visible in the database: poll it (5 ms) for the target.
                    while await _done(app) < target:
                        assert proc.returncode is None, f"worker exited early; see {log.name}"
                        await anyio.sleep(0.005)
                    await anyio.sleep(rng.uniform(0, 0.02))  # land anywhere in the next batch
            finally:
                proc.send_signal(signal.SIGKILL)
                await proc.wait()
            if last_round:
                break
            kills += 1

    rows = await all_rows(app)
    assert len(rows) == TOTAL
    assert {r.state for r in rows} == {State.SUCCESS}
    assert await counter(app) == TOTAL
    assert await count(app, Effect) == TOTAL
    await app.aclose()
