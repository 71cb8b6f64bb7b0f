"""Reading ``_scheduled_functions``: typed rows, filters, pagination, and scheduling
through a caller's own connection."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import timedelta
from typing import Any

import pytest

import durafn
from durafn import ActionCtx, MutationCtx, State
from durafn.testing import FakeClock, all_rows

from .processes import owned

pytestmark = pytest.mark.anyio


async def test_list_filters_and_paginates(app: durafn.App, clock: FakeClock) -> None:
    @app.mutation(name="a")
    async def a(ctx: MutationCtx, i: int) -> None:
        pass

    @app.mutation(name="b")
    async def b(ctx: MutationCtx, i: int) -> None:
        if i % 2:
            raise ValueError(i)

    start = clock.now_datetime()
    for i in range(7):
        await app.scheduler().run_after(i, a, i=i)
        await app.scheduler().run_after(i, b, i=i)
    clock.advance(3)
    await app.executor().run_until_idle()  # runs a0..a3 and b0..b3 (b1, b3 fail)

    seen: list[int] = []
    cursor = None
    while True:
        page = await app.list(name="a", limit=3, cursor=cursor)
        seen.extend(r.args["i"] for r in page.items)
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    assert seen == list(range(7))

    failed = await app.list(state=State.FAILED)
    assert [(r.name, r.args["i"]) for r in failed.items] == [("b", 1), ("b", 3)]
    finished = await app.list(state=[State.SUCCESS, State.FAILED], name="b")
    assert [r.args["i"] for r in finished.items] == [0, 1, 2, 3]
    window = await app.list(
        scheduled_after=start + timedelta(seconds=2), scheduled_before=start + timedelta(seconds=4)
    )
    assert sorted((r.name, r.args["i"]) for r in window.items) == [
        ("a", 2),
        ("a", 3),
        ("b", 2),
        ("b", 3),
    ]
    with pytest.raises(durafn.ArgumentError, match="not a cursor"):
        await app.list(cursor="garbage")
    with pytest.raises(durafn.ArgumentError, match="limit"):
        await app.list(limit=0)


async def test_schedule_through_a_callers_connection(app: durafn.App) -> None:
    @app.mutation
    async def noop(ctx: MutationCtx) -> None:
        pass

    async with app.engine.connect() as conn:
        await conn.begin()
        kept = await app.scheduler(conn).run_after(0, noop)
        await conn.commit()
        await conn.begin()
        await app.scheduler(conn).run_after(0, noop)
        await conn.rollback()
    assert [r.id for r in await all_rows(app)] == [kept]


async def test_database_failures_are_typed(engine_name: str, tmp_path: object) -> None:
    url = (
        "sqlite+aiosqlite:////nonexistent-dir/x.db"
        if engine_name == "sqlite"
        else "postgresql+asyncpg://postgres@127.0.0.1:1/nothing"
    )
    app = durafn.App(url, direct_retries=1)
    try:
        with pytest.raises(durafn.DatabaseError) as info:
            await app.get("01a20000-0000-7000-8000-000000000000")
        assert info.value.transient is (engine_name == "postgres")
    finally:
        await app.aclose()


async def test_a_mutation_row_says_when_it_started(app: durafn.App, clock: FakeClock) -> None:
    """A mutation's start is never committed on its own (it runs inside its finish's
    transaction): its finish writes it, whichever statement finishes it (a plain
    success, one with a result, a failure, one with a completion callback)."""

    @app.mutation(name="started:plain")
    async def plain(ctx: MutationCtx) -> None:
        pass

    @app.mutation(name="started:result")
    async def result(ctx: MutationCtx) -> int:
        return 1

    @app.mutation(name="started:fails")
    async def fails(ctx: MutationCtx) -> None:
        raise ValueError("no")

    @app.mutation(name="started:done")
    async def done(ctx: MutationCtx, c: durafn.Completion) -> None:
        pass

    @app.action(name="started:act")
    async def act(ctx: ActionCtx) -> None:
        pass

    refs = [plain, result, fails, plain.options(on_complete=done), act]
    ids = [await app.scheduler().run_after(10, ref) for ref in refs]
    clock.advance(15)
    await app.executor().run_until_idle()
    for id in ids:
        row = await app.get(id)
        assert row is not None and row.state.finished
        assert row.started_time is not None and row.completed_time is not None
        assert row.started_time.timestamp() == clock.now()  # the fake clock stood still
        assert row.scheduled_time <= row.started_time <= row.completed_time


async def test_list_finds_the_rows_a_row_scheduled(app: durafn.App) -> None:
    """``parent=``: the scheduling tree one level down, from the API, the command line
    and the dashboard alike (one filter)."""

    @app.mutation(name="tree:leaf")
    async def leaf(ctx: MutationCtx, n: int) -> None:
        pass

    @app.mutation(name="tree:root")
    async def root(ctx: MutationCtx) -> None:
        await ctx.scheduler.run_many([leaf.call(n).after(60) for n in range(3)])

    top = await app.scheduler().run_after(0, root)
    other = await app.scheduler().run_after(0, leaf, 99)
    await app.executor().run_until_idle()
    children = (await app.list(parent=top)).items
    assert sorted(c.args["n"] for c in children) == [0, 1, 2]
    assert {c.parent_id for c in children} == {top}
    assert (await app.list(parent=other)).items == []
    with pytest.raises(durafn.ArgumentError, match="parent must be a scheduled function's id"):
        await app.list(parent="not-an-id")
    url = app._rt.driver.url.render_as_string(hide_password=False)
    listed = await _durafn("ls", "--url", url, "--parent", top, "--json")
    assert listed.returncode == 0, listed.stderr
    assert sorted(r["args"]["n"] for r in json.loads(listed.stdout)["items"]) == [0, 1, 2]


async def test_finished_reads_the_rows_that_ended_lately(app: durafn.App, clock: FakeClock) -> None:
    @app.mutation(name="recent:job")
    async def job(ctx: MutationCtx, n: int) -> None:
        pass

    sched = app.scheduler()
    await sched.run_many([job.call(n) for n in range(3)])
    await app.executor().run_until_idle()
    clock.advance(7200)
    await sched.run_many([job.call(n) for n in range(3, 7)])
    await sched.run_after(60, job, 99)  # not ended: never among them
    await app.executor().run_until_idle()
    lately = await app.finished(within=timedelta(hours=1))
    assert sorted(r.args["n"] for r in lately) == [3, 4, 5, 6]
    assert len(await app.finished(within=3 * 3600)) == 7
    assert len(await app.finished(within=3 * 3600, limit=2)) == 2
    with pytest.raises(durafn.ArgumentError):
        await app.finished(within=0)


async def test_list_filters_on_argument_values(app: durafn.App) -> None:
    """``args=``: equal JSON values at a path, the same on both engines (42 is not "42",
    true is not 1), from the API and from the command line (``--arg PATH=VALUE``)."""

    @app.mutation(name="args:job")
    async def job(ctx: MutationCtx, user_id: Any, address: dict[str, Any], vip: bool) -> None:
        pass

    sched = app.scheduler()
    ids = {
        "oslo": await sched.run_after(60, job, 42, {"city": "Oslo", "zip": 150}, True),
        "text": await sched.run_after(60, job, "42", {"city": "Bergen", "zip": 5003}, False),
        "other": await sched.run_after(60, job, 7, {"city": "Oslo", "zip": 151}, False),
    }

    async def found(args: dict[str, Any]) -> set[str]:
        mine = {v: k for k, v in ids.items()}
        return {mine[r.id] for r in (await app.list(args=args)).items}

    assert await found({"user_id": 42}) == {"oslo"}
    assert await found({"user_id": "42"}) == {"text"}
    assert await found({"address.city": "Oslo"}) == {"oslo", "other"}
    assert await found({"address.city": "Oslo", "address.zip": 151}) == {"other"}
    assert await found({"vip": True}) == {"oslo"}
    assert await found({"vip": False}) == {"text", "other"}
    assert await found({"nowhere.at.all": 1}) == set()
    bads: list[Any] = [{"user id": 1}, {"a..b": 1}, {"user_id": [1]}, {"user_id": None}]
    for bad in bads:  # the last two are type errors too; at run time, typed errors
        with pytest.raises(durafn.ArgumentError, match="args: "):
            await app.list(args=bad)
    url = app._rt.driver.url.render_as_string(hide_password=False)
    listed = await _durafn(
        "ls", "--url", url, "--arg", "address.city=Oslo", "--arg", "user_id=7", "--json"
    )
    assert listed.returncode == 0, listed.stderr
    assert [r["id"] for r in json.loads(listed.stdout)["items"]] == [ids["other"]]
    wrong = await _durafn("ls", "--url", url, "--arg", "user_id")
    assert wrong.returncode == 1 and "PATH=VALUE" in wrong.stderr


async def _durafn(*args: str) -> subprocess.CompletedProcess[str]:
    """The ``durafn`` command in a process of its own, as a user runs it from a shell."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DURAFN_")}
    async with owned() as owner:
        done = await owner.run([sys.executable, "-m", "_durafn_cli", *args], env=env)
    return subprocess.CompletedProcess(
        done.args, done.returncode, done.stdout.decode(), done.stderr.decode()
    )
