"""Operations (``durafn/_operations.py``), on both engines: a bulk change tracked in
``_durafn_operations`` and run a page at a time: all of its rows changed across pages,
its progress seen between them, resumed by another process where one left it, never a
page taken twice by two runners, run by the workers' maintenance, stopped by a cancel,
removed by retention; and the failure groups it is started from."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import anyio
import pytest
from click.testing import CliRunner, Result

import durafn
from durafn import ActionCtx, MutationCtx, State
from durafn._operations import PAGE
from durafn.cli import main
from durafn.testing import FakeClock

from .support.helpers import CEILING, wait_until
from .support.processes import owned

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.anyio

ROWS = 2 * PAGE + 200
"""Three pages' worth: two full, one not."""


async def pending(
    app: durafn.App, n: int = ROWS, queue: str = "bulk"
) -> list[durafn.ScheduledFunctionId]:
    @app.mutation(name="ops:later")
    async def later(ctx: MutationCtx, n: int) -> None:
        pass

    sched = app.scheduler()
    await sched.run_after(60, later, -1)  # another queue's row: never touched
    return await sched.run_many([later.options(queue=queue).call(i).after(60) for i in range(n)])


async def test_an_operation_over_more_rows_than_a_page_changes_them_all_page_by_page(
    app: durafn.App,
) -> None:
    await pending(app)
    op = await app.start_operation("cancel", who="ann", queue="bulk")
    assert (op.state, op.total, op.done, op.total_bounded) == ("Running", ROWS, 0, False)
    assert await app.count(state=State.CANCELED) == 0  # started, not run: the workers run it
    seen = []
    while (await app.operation(op.id)).state == "Running":
        assert await app.run_operations(pages=1) == 1
        now = await app.operation(op.id)
        seen.append(now.done)
        assert await app.count(state=State.CANCELED) == now.done  # committed page by page
    assert seen == [PAGE, 2 * PAGE, ROWS]
    ended = await app.operation(op.id)
    assert (ended.state, ended.done, ended.finished_at is not None) == ("Done", ROWS, True)
    assert ended.scanned == ROWS + 1  # the table read once: its rows and the other one
    assert await app.count(state=State.PENDING) == 1
    assert await app.run_operations() == 0  # nothing left to run
    assert [o.id for o in await app.operations()] == [op.id]


async def test_an_operation_left_by_a_process_is_resumed_by_another_where_it_stopped(
    app: durafn.App,
) -> None:
    await pending(app)
    op = await app.start_operation("reschedule", who="ann", queue="bulk", priority=-4)
    first = app.using()  # another process's pool: it runs one page, then is gone
    try:
        assert await first.run_operations(pages=1) == 1
    finally:
        await first.aclose()
    halfway = await app.operation(op.id)
    assert (halfway.state, halfway.done) == ("Running", PAGE)
    second = app.using()
    try:
        assert await second.run_operations() == 2
    finally:
        await second.aclose()
    assert (await app.operation(op.id)).done == ROWS
    rows = (await app.list(queue="bulk", limit=ROWS)).items
    assert len(rows) == ROWS and {r.priority for r in rows} == {-4}


async def test_a_page_whose_process_is_killed_before_its_commit_is_done_by_the_next(
    app: durafn.App, db_url: str
) -> None:
    """A real process takes the first page, changes its rows, and is ``kill -9``-ed
    before it commits: its page is rolled back, and the next runner does it, once."""
    await pending(app)
    op = await app.start_operation("cancel", who="ann", queue="bulk")
    async with owned() as owner:
        proc = await owner.start(
            [sys.executable, "-m", "tests.apps.operation_killed", db_url],
            cwd=ROOT,
            stdout=subprocess.PIPE,
        )
        assert proc.stdout is not None
        said = b""
        with anyio.fail_after(CEILING):
            while not said.endswith(b"\n"):
                said += await proc.stdout.receive()
        assert said.decode().strip() == f"changed {PAGE}"
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
    left = await app.operation(op.id)
    assert (left.state, left.done, left.scanned) == ("Running", 0, 0)  # as before the page
    assert await app.count(state=State.CANCELED) == 0
    assert await app.run_operations() == 3
    ended = await app.operation(op.id)
    assert (ended.state, ended.done) == ("Done", ROWS)
    assert await app.count(state=State.CANCELED) == ROWS


async def test_two_runners_never_take_the_same_page(app: durafn.App) -> None:
    await pending(app)
    op = await app.start_operation("cancel", who="ann", queue="bulk")
    others = [app.using() for _ in range(2)]
    taken: list[int] = []
    try:

        async def run(runner: durafn.App) -> None:
            taken.append(await runner.run_operations())

        async with anyio.create_task_group() as tg:
            for runner in others:
                tg.start_soon(run, runner)
    finally:
        for runner in others:
            await runner.aclose()
    assert sum(taken) == 3  # three pages, each taken once
    ended = await app.operation(op.id)
    assert (ended.state, ended.done, ended.scanned) == ("Done", ROWS, ROWS + 1)
    assert await app.count(state=State.CANCELED) == ROWS


async def test_the_workers_maintenance_runs_operations_and_a_cancel_stops_one(
    app: durafn.App,
) -> None:
    await pending(app)
    stopped = await app.start_operation("cancel", who="ann", queue="bulk")
    assert await app.cancel_operation(stopped.id) is True
    assert await app.cancel_operation(stopped.id) is False  # it had ended
    op = await app.start_operation("cancel", who="ann", queue="bulk")
    async with app.run_executor():

        async def done() -> bool:
            return (await app.operation(op.id)).state == "Done"

        await wait_until(done, "the operation is done")
    assert (await app.operation(stopped.id)).done == 0
    assert (await app.operation(op.id)).done == ROWS
    with pytest.raises(durafn.UnknownOperationError):
        await app.operation(op.id + 100)


async def test_operations_are_checked_and_removed_by_retention(
    app: durafn.App, clock: FakeClock
) -> None:
    await pending(app, n=3)
    with pytest.raises(durafn.ArgumentError, match="needs a filter"):
        await app.start_operation("cancel", who="ann")
    with pytest.raises(durafn.ArgumentError, match="no operation 'explode'"):
        await app.start_operation("explode", who="ann", queue="bulk")
    with pytest.raises(durafn.ArgumentError, match="reschedule needs run_at"):
        await app.start_operation("reschedule", who="ann", queue="bulk")
    op = await app.start_operation("cancel", who="ann", queue="bulk")
    running = await app.start_operation("cancel", who="ann", queue="none")
    await app.run_operations(pages=1)  # the first only: the other stays Running
    clock.advance(8 * 86400)
    await app.executor().run_maintenance()
    assert [o.id for o in await app.operations()] == [running.id]  # only ended ones go
    with pytest.raises(durafn.UnknownOperationError):
        await app.operation(op.id)


async def test_failures_are_grouped_by_function_and_error_type_and_retried_as_one(
    app: durafn.App,
) -> None:
    @app.action(name="ops:fetch")
    async def fetch(ctx: ActionCtx, n: int) -> None:
        if n % 3:
            raise TimeoutError(f"slow {n}")
        raise KeyError(n)

    @app.mutation(name="ops:fine")
    async def fine(ctx: MutationCtx) -> None:
        pass

    sched = app.scheduler()
    await sched.run_many([fetch.call(n) for n in range(9)] + [fine.call()])
    await app.executor().run_until_idle()
    groups = await app.failure_groups()
    assert [(g.name, g.error_type, g.count) for g in groups] == [
        ("ops:fetch", "TimeoutError", 6),
        ("ops:fetch", "KeyError", 3),
    ]
    assert groups[0].sample.startswith("slow ") and groups[0].first_seen <= groups[0].last_seen
    assert len(await app.failure_groups(scan=1)) <= 1  # bounded: the last row that ended
    op = await app.start_operation("retry", who="ann", name="ops:fetch", error_type="KeyError")
    assert op.total == 3
    await app.run_operations()
    assert (await app.operation(op.id)).done == 3
    assert await app.count(state=State.PENDING, name="ops:fetch") == 3
    assert await app.count(state=State.FAILED, name="ops:fetch") == 6


async def test_the_command_line_lists_shows_runs_and_cancels_operations(
    app: durafn.App, db_url: str
) -> None:
    await pending(app, n=3)
    op = await app.start_operation("cancel", who="ann", queue="bulk")
    other = await app.start_operation("reschedule", who="bob", queue="bulk", priority=2)

    async def invoke(*args: str) -> Result:
        runner = CliRunner()
        env: dict[str, str | None] = {"DURAFN_APP": None, "DURAFN_DATABASE_URL": None}
        return await anyio.to_thread.run_sync(
            lambda: runner.invoke(main, [*args, "--url", db_url], env=env)
        )

    ran = await invoke("operations", "run", str(op.id))
    assert ran.exit_code == 0 and f"operation {op.id}: Done, 3 rows changed" in ran.output
    stopped = await invoke("operations", "cancel", str(other.id))
    assert stopped.exit_code == 0 and "canceled" in stopped.output
    listed = await invoke("operations", "ls", "--json")
    assert [(o["id"], o["state"]) for o in json.loads(listed.output)] == [
        (other.id, "Canceled"),
        (op.id, "Done"),
    ]
    shown = await invoke("operations", "show", str(op.id))
    assert shown.exit_code == 0 and "queue=bulk" in shown.output and "Done" in shown.output
    missing = await invoke("operations", "show", "999999")
    assert missing.exit_code == 1 and "no operation has id 999999" in missing.output
    assert [(e.action, e.target) for e in await app.audit_log()] == [
        ("cancel operation", str(other.id))
    ]
