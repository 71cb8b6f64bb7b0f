"""Durable workflows across real ``kill -9``: a five-step workflow (a mutation, an action,
a sleep, an event, a mutation) run by ``durafn worker`` processes, the worker killed at
each step boundary in turn (``tests/apps/workflow_app.py``: it kills itself right after
the k-th row it commits), a fresh worker then carrying the workflow on from its journal.
Each mutation's effect is written once, the action runs once, the result is right."""

from __future__ import annotations

import functools
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from sqlalchemy import delete, select

import durafn
from durafn import WorkflowState

from .apps.workflow_app import KILL_AFTER, KILL_NAME, Base, Done, Functions, register
from .support.helpers import wait_until
from .test_workers import FAST, worker_processes

pytestmark = pytest.mark.anyio

APP = "tests.apps.workflow_app:app"
BOUNDARIES = 4
"""Rows a run of the workflow commits before its event comes: its first turn, the
action, the action's completion (a turn), the turn that ends the sleep."""
JOURNALED = [1, 1, 2, 3]
"""The steps finished in the journal at each boundary: the first mutation; the action's
outcome is on its row, not yet journaled; journaled, the sleep begun; the sleep over,
the wait for the event begun."""


@asynccontextmanager
async def workflow_app_on(url: str) -> AsyncIterator[tuple[durafn.App, Functions]]:
    app = durafn.App(url)
    fns = register(app)
    await app.migrate()
    async with app.engine.begin() as conn:
        await conn.run_sync(Base.metadata.create_all)
        await conn.execute(delete(Done))
    try:
        yield app, fns
    finally:
        await app.aclose()


async def _state(app: durafn.App, id: str) -> durafn.Workflow:
    found = await app.get_workflow(id)
    assert found is not None
    return found


async def _waits_for_event(app: durafn.App, id: str) -> bool:
    return (await _state(app, id)).waiting == "step 4: event 'go'"


async def _waits_or_ended(app: durafn.App, id: str) -> bool:
    return await _waits_for_event(app, id) or await _ended(app, id)


async def _ended(app: durafn.App, id: str) -> bool:
    return (await _state(app, id)).state.finished


async def test_a_worker_killed_at_every_step_boundary_leaves_each_step_done_once(
    db_url: str, tmp_path: Path
) -> None:
    async with workflow_app_on(db_url) as (app, fns):
        trace = tmp_path / "actions.txt"
        for k in range(1, BOUNDARIES + 1):
            tag = f"k{k}"
            id = await app.start_workflow(fns.five_steps, tag, str(trace))
            env = {**os.environ, KILL_AFTER: str(k)}
            # Killed right after its first turn commits, a worker may have claimed the
            # action that turn wrote (claims run beside the turns): the action is then
            # lost, Failed, as an action of a killed worker is (at most once). The
            # boundary is before the action starts: this worker does not take it.
            args = [*FAST, "--forbid-flag", "calls-out"] if k == 1 else FAST
            async with worker_processes(db_url, 1, tmp_path, *args, app=APP, env=env) as [victim]:
                assert await victim.wait() == -9  # killed itself at boundary k
            journal = await _state(app, id)
            finished = [s.step_no for s in journal.steps if s.state != "Started"]
            assert len(finished) == JOURNALED[k - 1], journal
            async with worker_processes(db_url, 1, tmp_path, *FAST, app=APP):
                await wait_until(functools.partial(_waits_or_ended, app, id), f"{tag} waits")
                assert await _waits_for_event(app, id), await _state(app, id)
                assert await app.send_event(id, "go", tag)
                await wait_until(functools.partial(_ended, app, id), f"{tag} ends")
            done = await _state(app, id)
            assert (done.state, done.result) == (
                WorkflowState.SUCCESS,
                f"{tag}:1 called {tag} {tag} {tag}:5",
            ), done.error
        async with app.engine.connect() as conn:
            keys = sorted((await conn.execute(select(Done.key))).scalars())
    tags = [f"k{k}" for k in range(1, BOUNDARIES + 1)]
    assert keys == sorted(f"{t}:{n}" for t in tags for n in (1, 5))  # each once
    lines = trace.read_text().split("\n")[:-1]
    assert sorted(line.split()[0] for line in lines) == tags  # each action once


async def test_five_parallel_steps_one_failing_the_worker_killed_after_three_complete(
    db_url: str, tmp_path: Path
) -> None:
    """The three parts that completed are not run again; the one running when the
    worker died (its retry policy: at least once) runs again on the next worker; the
    one that failed stays failed; the workflow ends with each part's outcome."""
    async with workflow_app_on(db_url) as (app, fns):
        trace = tmp_path / "parts.txt"
        id = await app.start_workflow(fns.fan_out, str(trace))
        env = {**os.environ, KILL_AFTER: "3", KILL_NAME: "cw:part"}
        async with worker_processes(db_url, 1, tmp_path, *FAST, app=APP, env=env) as [victim]:
            assert await victim.wait() == -9
        async with worker_processes(db_url, 1, tmp_path, *FAST, app=APP):
            await wait_until(functools.partial(_ended, app, id), "the workflow ends")
        done = await _state(app, id)
    assert (done.state, done.result) == (WorkflowState.SUCCESS, [0, 1, 4, "failed", 16])
    runs = [int(line.split()[0]) for line in trace.read_text().split("\n")[:-1]]
    assert sorted(runs) == [0, 1, 2, 3, 4, 4]  # part 4 twice: killed, then run again
    assert [s.state for s in done.steps] == ["Success"] * 3 + ["Failed", "Success"]
