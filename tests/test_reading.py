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

from .support.processes import owned

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


async def test_list_filters_on_what_an_argument_contains(app: durafn.App) -> None:
    """``args_contain=``: an array holding the value as an element (of the same JSON
    type), a string holding it as a part, or an equal scalar; never an object's values.
    The same on both engines, and from the command line (``--arg PATH~VALUE``)."""

    @app.mutation(name="args:tagged")
    async def tagged(ctx: MutationCtx, tags: Any, note: Any) -> None:
        pass

    sched = app.scheduler()
    ids = {
        "vip": await sched.run_after(60, tagged, ["vip", "new"], "first order from Oslo"),
        "numbers": await sched.run_after(60, tagged, [1, 2, 42], {"vip": "vip"}),
        "text": await sched.run_after(60, tagged, "a vip customer", 42),
        "truth": await sched.run_after(60, tagged, [True], "Oslo"),
    }

    async def found(contain: dict[str, Any]) -> set[str]:
        mine = {v: k for k, v in ids.items()}
        return {mine[r.id] for r in (await app.list(args_contain=contain)).items}

    assert await found({"tags": "vip"}) == {"vip", "text"}  # element; part of a string
    assert await found({"tags": 42}) == {"numbers"}  # not the string "42"
    assert await found({"tags": "42"}) == set()
    assert await found({"tags": True}) == {"truth"}  # true is not 1
    assert await found({"tags": 1}) == {"numbers"}
    assert await found({"note": "Oslo"}) == {"vip", "truth"}
    assert await found({"note": 42}) == {"text"}  # an equal scalar
    assert await found({"note": "vip"}) == set()  # an object's values are not looked in
    assert await found({"note.vip": "vi"}) == {"numbers"}
    assert await found({"tags": "vip", "note": "Oslo"}) == {"vip"}
    with pytest.raises(durafn.ArgumentError, match="args_contain: "):
        await app.list(args_contain={"tags": ["vip"]})  # type: ignore[dict-item]
    url = app._rt.driver.url.render_as_string(hide_password=False)
    both = ("--arg", "tags~vip", "--arg", "note~order", "--json")  # one process: ~1 s
    listed = await _durafn("ls", "--url", url, *both)
    assert listed.returncode == 0, listed.stderr
    assert [r["id"] for r in json.loads(listed.stdout)["items"]] == [ids["vip"]]


async def _durafn(*args: str) -> subprocess.CompletedProcess[str]:
    """The ``durafn`` command in a process of its own, as a user runs it from a shell."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DURAFN_")}
    async with owned() as owner:
        done = await owner.run([sys.executable, "-m", "_durafn_cli", *args], env=env)
    return subprocess.CompletedProcess(
        done.args, done.returncode, done.stdout.decode(), done.stderr.decode()
    )


async def test_a_scan_bound_stops_a_page_and_the_cursor_goes_on(
    app: durafn.App, clock: FakeClock
) -> None:
    """``scan=``: a page reads at most that many rows of the order; a page the bound cut
    short says so, and its cursor goes on from where it stopped, so that following the
    cursors finds every match, in order, at both ends of the range (scan=1, and a bound
    beyond the table)."""

    @app.mutation(name="scan:job")
    async def job(ctx: MutationCtx, i: int, match: bool) -> None:
        pass

    for i in range(12):  # rows 0, 4 and 8 match the filter
        clock.advance(1)
        await app.scheduler().run_after(0, job, i, i % 4 == 0)

    async def follow(scan: int, newest_first: bool) -> tuple[list[int], list[bool]]:
        seen: list[int] = []
        partial: list[bool] = []
        cursor = None
        while True:
            page = await app.list(
                args={"match": True}, limit=2, scan=scan, cursor=cursor, newest_first=newest_first
            )
            seen.extend(r.args["i"] for r in page.items)
            partial.append(page.partial)
            if page.next_cursor is None:
                return seen, partial
            cursor = page.next_cursor

    # Rows 0-4 hold 0 and 4 (the page is full, but what follows is unread); rows 5-9
    # hold 8; rows 10-11, the end, hold none.
    assert await follow(scan=5, newest_first=False) == ([0, 4, 8], [True, True, False])
    # One row per page: twelve pages cut short, then the end.
    assert await follow(scan=1, newest_first=True) == ([8, 4, 0], [True] * 12 + [False])
    # A bound beyond the table: an ordinary page.
    assert await follow(scan=1000, newest_first=False) == ([0, 4, 8], [False, False])
    with pytest.raises(durafn.ArgumentError, match="scan"):
        await app.list(scan=0)


async def test_a_cursor_from_another_filter_is_refused(app: durafn.App) -> None:
    @app.mutation(name="cursor:job")
    async def job(ctx: MutationCtx) -> None:
        pass

    for _ in range(3):
        await app.scheduler().run_after(60, job)
    page = await app.list(name="cursor:job", limit=1)
    assert page.next_cursor is not None
    following = await app.list(name="cursor:job", limit=1, cursor=page.next_cursor)
    assert len(following.items) == 1
    with pytest.raises(durafn.ArgumentError, match="other filters"):
        await app.list(name="other", limit=1, cursor=page.next_cursor)
    with pytest.raises(durafn.ArgumentError, match="other filters"):
        await app.list(limit=1, cursor=page.next_cursor)


async def test_bounded_counts_stop_at_the_bound(app: durafn.App, clock: FakeClock) -> None:
    """``stats(bound=)`` and ``queues(bound=)``: exact below the bound, the bound and
    ``capped`` at it; the ended states counted among the latest rows that ended."""

    @app.mutation(name="count:job")
    async def job(ctx: MutationCtx, fail: bool) -> None:
        if fail:
            raise ValueError("no")

    sched = app.scheduler()
    for fail in (False, False, True):
        await sched.run_after(0, job, fail)
    await app.executor().run_until_idle()  # Success 2, Failed 1
    for _ in range(3):
        await sched.run_after(60, job.options(queue="slow"), False)
    await sched.run_after(60, job, False)  # Pending: 3 queued, 1 unqueued

    exact = await app.stats()
    assert exact.bound is None and exact.capped == []
    roomy = await app.stats(bound=100)
    assert roomy.counts == exact.counts and roomy.capped == []
    assert roomy.counts[State.PENDING] == 4 and roomy.counts[State.SUCCESS] == 2
    tight = await app.stats(bound=2)
    assert tight.counts[State.PENDING] == 2 and State.PENDING in tight.capped
    # The two that ended last: the Failed one and the second success (in time order).
    assert sum(tight.counts[s] for s in (State.SUCCESS, State.FAILED, State.CANCELED)) == 2
    assert {State.SUCCESS, State.FAILED, State.CANCELED} <= set(tight.capped)
    for _ in range(7):  # one long-lived app: PostgreSQL's generic plans from the sixth run
        again = await app.stats(bound=2)
        assert (again.counts, again.capped) == (tight.counts, tight.capped)
        assert [q.pending for q in await app.queues(bound=2)] == [2]
    at_one = await app.stats(bound=1)
    assert at_one.counts[State.PENDING] == 1 and at_one.counts[State.IN_PROGRESS] == 0

    (slow,) = await app.queues()
    assert (slow.pending, slow.due, slow.capped) == (3, 0, False)
    (slow,) = await app.queues(bound=3)
    assert (slow.pending, slow.capped) == (3, True)
    (slow,) = await app.queues(bound=2)
    assert (slow.pending, slow.capped) == (2, True)
    clock.advance(61)
    (slow,) = await app.queues(bound=100)
    assert (slow.pending, slow.due, slow.capped) == (3, 3, False)
    with pytest.raises(durafn.ArgumentError, match="bound"):
        await app.stats(bound=0)
