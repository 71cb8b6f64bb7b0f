"""Workflow parts on both engines, driven by the fake clock: a function that snoozes
(``durafn.Snooze``: back to Pending, not a failure, up to its limit) and a running
action's progress (``ctx.progress``), read back through ``get``, ``durafn show`` and
``durafn ls``."""

from __future__ import annotations

import functools
import json
import math
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import anyio
import pytest
from sqlalchemy import select, text
from sqlalchemy.ext.asyncio import AsyncConnection

import durafn
from durafn import ActionCtx, Fixed, MutationCtx, Retry, Snooze, State
from durafn._store import Claimed, Outcome
from durafn.testing import FakeClock, all_rows

from .apps.worker_app import Applied
from .conftest import BARE_DSN
from .support.helpers import CEILING, effects, row_of, wait_until
from .support.models import Effect
from .test_workers import FAST, worker_app_on, worker_processes

pytestmark = pytest.mark.anyio


async def test_a_snoozed_mutation_is_rolled_back_and_comes_back_without_using_an_attempt(
    app: durafn.App, clock: FakeClock
) -> None:
    start = clock.now()
    errors: list[str] = []
    app.on("error")(lambda event: errors.append(event.id))

    @app.mutation(retry=Retry(2, backoff=Fixed(1)))
    async def waits(ctx: MutationCtx) -> str:
        ctx.db.add(Effect(key=f"at {clock.now() - start:g}"))
        if clock.now() < start + 30:
            raise Snooze(10)
        if clock.now() < start + 31:
            raise ValueError("one real failure")
        return "done"

    sid = await app.scheduler().run_after(0, waits)
    executor = app.executor()
    await executor.run_until_idle()
    row = await row_of(app, sid)
    assert (row.state, row.snoozes, row.failures, row.history, row.error) == (
        State.PENDING,
        1,
        0,
        [],
        None,
    )
    assert row.due_time is not None and row.due_time.timestamp() == start + 10
    assert await executor.next_due() == start + 10
    assert await effects(app) == []  # the snoozed run's write was rolled back
    for _ in range(2):
        clock.advance(10)
        await executor.run_until_idle()
    assert (await row_of(app, sid)).snoozes == 3
    clock.advance(10)  # at 30: a real failure, the first of its policy's two runs
    await executor.run_until_idle()
    assert [h.error.message for h in (await row_of(app, sid)).history] == ["one real failure"]
    assert errors == [sid]  # the failure's hook; no snooze fired one
    clock.advance(1)  # at 31: the policy's second run is still there to use
    await executor.run_until_idle()
    row = await row_of(app, sid)
    assert (row.state, row.snoozes, row.failures, row.attempts) == (State.SUCCESS, 3, 1, 5)
    assert await effects(app) == ["at 31"]
    assert executor.stats["snoozed"] == 3 and executor.stats["retried"] == 1


async def test_an_action_snoozes_up_to_its_limit_and_then_fails(
    app: durafn.App, clock: FakeClock
) -> None:
    runs = 0

    @app.action(snooze_limit=2)
    async def polls(ctx: ActionCtx) -> None:
        nonlocal runs
        runs += 1
        raise Snooze(0)  # the bottom of the range: due again at once

    sid = await app.scheduler().run_after(0, polls)
    await app.executor().run_until_idle()
    row = await row_of(app, sid)
    assert runs == 3
    assert (row.state, row.snoozes, row.attempts) == (State.FAILED, 2, 3)
    assert row.error is not None and row.error.type == "durafn.SnoozeLimitError"
    assert "snoozed 2 times" in row.error.message and "snooze_limit" in row.error.message
    assert [h.error.type for h in row.history] == ["durafn.SnoozeLimitError"]


async def test_the_snooze_limit_s_ends_and_a_snooze_past_the_range(
    app: durafn.App, clock: FakeClock
) -> None:
    @app.action(snooze_limit=0)
    async def never(ctx: ActionCtx) -> None:
        raise Snooze(366 * 24 * 3600)  # the top of the range, refused by the limit

    @app.action(retry=Retry(2, backoff=Fixed(1)))
    async def too_long(ctx: ActionCtx) -> None:
        raise Snooze(366 * 24 * 3600 + 1)

    never_id = await app.scheduler().run_after(0, never)
    long_id = await app.scheduler().run_after(0, too_long)
    await app.executor().run_until_idle()
    row = await row_of(app, never_id)
    assert (row.state, row.snoozes) == (State.FAILED, 0)
    assert row.error is not None and row.error.type == "durafn.SnoozeLimitError"
    # A bad snooze is the function's error: a failure, retried by its policy.
    row = await row_of(app, long_id)
    assert (row.state, row.failures, row.snoozes) == (State.PENDING, 1, 0)
    assert row.error is not None and row.error.type == "durafn.ArgumentError"
    assert "Snooze(seconds) must be a number of seconds from 0 to" in row.error.message
    with pytest.raises(durafn.RegistrationError, match="snooze_limit must be an integer"):
        app.action(snooze_limit=-1)
    with pytest.raises(durafn.RegistrationError, match="snooze_limit must be an integer"):
        app.mutation(snooze_limit=True)  # a bool is not a count
    big = app.action(name="big", snooze_limit=1_000_000)(never.fn)
    assert big.snooze_limit == 1_000_000


async def test_a_snoozed_action_cancelled_while_it_ran_stays_canceled(
    app: durafn.App, clock: FakeClock
) -> None:
    @app.action
    async def cancelled_meanwhile(ctx: ActionCtx) -> None:
        assert ctx.run_id is not None
        await ctx.scheduler.cancel(ctx.run_id)
        raise Snooze(5)

    sid = await app.scheduler().run_after(0, cancelled_meanwhile)
    await app.executor().run_until_idle()
    row = await row_of(app, sid)
    assert (row.state, row.snoozes) == (State.CANCELED, 0)


async def test_progress_is_written_at_most_once_a_second_and_read_from_another_process(
    app: durafn.App, app_url: tuple[str, bool], clock: FakeClock
) -> None:
    reported, release = anyio.Event(), anyio.Event()

    @app.action
    async def copies(ctx: ActionCtx, n: int) -> str:
        await ctx.progress(0)  # the bottom of the range, written: the first report
        await ctx.progress(0.2, "copied 2,000")  # within the second: skipped
        clock.advance(1)
        await ctx.progress(0.4, f"copied 4,000 of {n:,}")  # a second later: written
        reported.set()
        await release.wait()
        return "copied"

    sid = await app.scheduler().run_after(0, copies, n=10_000)
    async with anyio.create_task_group() as tg:
        tg.start_soon(app.executor().run_until_idle)
        with anyio.fail_after(60):  # a ceiling only a hang reaches
            await reported.wait()
        shown = await anyio.to_thread.run_sync(
            lambda: subprocess.run(
                [sys.executable, "-m", "durafn", "show", sid, "--url", app_url[0], "--json"],
                capture_output=True,
                text=True,
                env={k: v for k, v in os.environ.items() if not k.startswith("DURAFN_")},
            )
        )
        assert shown.returncode == 0, shown.stderr
        seen = json.loads(shown.stdout)
        assert (seen["state"], seen["progress"], seen["progress_message"]) == (
            "InProgress",
            0.4,
            "copied 4,000 of 10,000",
        )
        release.set()
    row = await row_of(app, sid)
    assert (row.state, row.progress, row.progress_message) == (
        State.SUCCESS,
        0.4,
        "copied 4,000 of 10,000",
    )


async def test_bad_progress_is_a_typed_error_and_a_direct_call_stores_none(
    app: durafn.App, clock: FakeClock
) -> None:
    refused: list[str] = []

    @app.action
    async def reports(ctx: ActionCtx) -> None:
        for fraction in (1.5, -0.1, math.nan, True):
            with pytest.raises(durafn.ArgumentError, match="progress must be a number from 0"):
                await ctx.progress(fraction)
        for message in ("x" * 1001, "nul\x00"):
            with pytest.raises(durafn.ArgumentError) as caught:
                await ctx.progress(0.5, message)
            refused.append(str(caught.value))
        await ctx.progress(1, "x" * 1000)  # both ends of the ranges are kept

    sid = await app.scheduler().run_after(0, reports)
    await app.executor().run_until_idle()
    row = await row_of(app, sid)
    assert (row.state, row.progress, row.progress_message) == (State.SUCCESS, 1.0, "x" * 1000)
    assert "at most 1000 characters, not 1001" in refused[0] and "NUL" in refused[1]
    await app.run_action(reports)  # no row: nothing stored, nothing raised


def test_ls_shows_a_running_row_s_progress() -> None:
    from durafn.cli.rows import narrow_row

    row = durafn.ScheduledFunction(
        id=durafn.ScheduledFunctionId("0" * 36),
        name="copies",
        kind=durafn.FunctionKind.ACTION,
        args={},
        state=State.IN_PROGRESS,
        scheduled_time=datetime(2026, 11, 27, tzinfo=UTC),
        started_time=None,
        completed_time=None,
        error=None,
        result=None,
        parent_id=None,
        attempts=1,
        progress=0.4,
    )
    assert str(narrow_row(row)[2]) == "InProgress 40%"
    ended = row.model_copy(update={"state": State.SUCCESS})
    assert str(narrow_row(ended)[2]) == "Success"


# -- dependencies (after=) ---------------------------------------------------------------


async def test_a_fan_in_runs_once_after_the_last_of_its_rows(
    app: durafn.App, clock: FakeClock
) -> None:
    order: list[str] = []

    @app.mutation
    async def part(ctx: MutationCtx, n: int) -> None:
        order.append(f"part {n}")

    @app.action
    async def join(ctx: ActionCtx) -> None:
        order.append("join")

    @app.mutation
    async def plan(ctx: MutationCtx) -> durafn.ScheduledFunctionId:
        ids = [await ctx.scheduler.run_after(0, part, n=n) for n in range(1000, 1010)]
        # The join is written in the same transaction as the rows it waits for.
        return await ctx.scheduler.run_after(0, join.options(after=ids))

    sched = app.scheduler()
    parts = await sched.run_many([part.call(n=n) for n in range(1000)])
    join_id = await sched.run_after(0, join.options(after=parts))
    row = await row_of(app, join_id)
    assert row.state is State.PENDING
    explained = await app.explain(join_id)
    assert explained.reason == "awaiting" and "waits for 1000 row(s)" in explained.message
    assert len(explained.held_by) == 10
    await app.executor().run_until_idle()
    assert order[-1] == "join" and order.count("join") == 1 and len(order) == 1001
    row = await row_of(app, join_id)
    assert row.state is State.SUCCESS
    assert (await app.explain(join_id)).reason == "finished"
    order.clear()
    join_id = await app.run_mutation(plan)
    assert "waits for 10 row(s)" in (await app.explain(join_id)).message
    await app.executor().run_until_idle()
    assert order[-1] == "join" and len(order) == 11


async def test_a_failed_dependency_under_each_policy(app: durafn.App, clock: FakeClock) -> None:
    runs: list[str] = []

    @app.action
    async def breaks(ctx: ActionCtx) -> None:
        raise RuntimeError("broken")

    @app.action
    async def slow(ctx: ActionCtx) -> None:
        runs.append("slow")

    @app.mutation
    async def after_them(ctx: MutationCtx, policy: str) -> None:
        runs.append(policy)

    sched = app.scheduler()
    broken = await sched.run_after(0, breaks)
    later = await sched.run_after(60, slow)  # still Pending when the other fails
    ids = {}
    for policy in ("run", "cancel", "fail"):
        ref = after_them.options(after=[broken, later], after_policy=policy)
        ids[policy] = await sched.run_after(0, ref, policy=policy)
    await app.executor().run_until_idle()
    # cancel and fail act as soon as one dependency fails; run waits for the other.
    assert (await row_of(app, ids["cancel"])).state is State.CANCELED
    failed = await row_of(app, ids["fail"])
    assert failed.state is State.FAILED and failed.error is not None
    assert failed.error.type == "durafn.DependencyFailedError" and failed.failures == 1
    waiting = await row_of(app, ids["run"])
    assert waiting.state is State.PENDING
    assert (await app.explain(ids["run"])).held_by == [later]
    assert runs == []
    clock.advance(60)
    await app.executor().run_until_idle()
    assert runs == ["slow", "run"]


async def test_a_cancel_propagates_to_the_rows_that_say_so(
    app: durafn.App, clock: FakeClock
) -> None:
    @app.action
    async def step(ctx: ActionCtx, n: int) -> None: ...

    sched = app.scheduler()
    first = await sched.run_after(60, step, n=1)
    second = await sched.run_after(0, step.options(after=[first], after_policy="cancel"), n=2)
    third = await sched.run_after(0, step.options(after=[second], after_policy="cancel"), n=3)
    keeps = await sched.run_after(0, step.options(after=[first]), n=4)
    await app.cancel(first)
    await app.executor().run_until_idle()
    states = [(await row_of(app, i)).state for i in (second, third, keeps)]
    assert states == [State.CANCELED, State.CANCELED, State.SUCCESS]


async def test_after_names_only_rows_that_exist_and_nothing_is_written_otherwise(
    app: durafn.App, clock: FakeClock
) -> None:
    @app.action
    async def step(ctx: ActionCtx) -> None: ...

    sched = app.scheduler()
    done = await sched.run_after(0, step)
    await app.executor().run_until_idle()
    missing = "01900000-0000-7000-8000-000000000000"
    with pytest.raises(durafn.SchedulingError, match=f"does not exist: {missing}"):
        await sched.run_after(0, step.options(after=[done, missing]))
    assert len((await app.list(limit=10)).items) == 1  # nothing was written
    for bad, message in (
        (["not-an-id"], "is not a row id"),
        ([], "must name 1 to 10000 rows, not 0"),
        (done, "must be a list of row ids"),
    ):
        with pytest.raises(durafn.OptionError, match=message):
            step.options(after=bad)
    with pytest.raises(durafn.OptionError, match="after_policy must be one of run, cancel"):
        step.options(after=[done], after_policy="skip")  # type: ignore[arg-type]
    with pytest.raises(durafn.RegistrationError, match="given per call"):
        app.action(after=[done])
    # A row after one that already succeeded is due at once; the same id twice is once.
    at_once = await sched.run_after(0, step.options(after=[done, done.upper()]))
    assert (await app.explain(at_once)).reason == "no_worker"  # due, awaiting nothing


# -- groups -------------------------------------------------------------------------------


async def test_a_group_s_callback_runs_once_after_its_last_row_with_the_counts(
    app: durafn.App, clock: FakeClock
) -> None:
    seen: list[durafn.GroupCompletion] = []

    @app.mutation
    async def summarize(ctx: MutationCtx, group: durafn.GroupCompletion) -> None:
        seen.append(group)

    @app.action
    async def step(ctx: ActionCtx, n: int) -> None:
        if n == 1:
            raise RuntimeError("one fails")

    @app.mutation
    async def start(ctx: MutationCtx) -> durafn.ScheduledFunctionId:
        ids = [await ctx.scheduler.run_after(0, step, n=n) for n in range(3)]
        ids.append(await ctx.scheduler.run_after(60, step, n=3))  # cancelled below
        ids.append(await ctx.scheduler.run_after(30, step, n=4))  # the last to finish
        rows[:] = ids
        return await ctx.scheduler.group(ids, on_complete=summarize)

    rows: list[durafn.ScheduledFunctionId] = []

    group_row = await app.run_mutation(start)
    assert app.functions() == sorted(f.name for f in (summarize, step, start))
    executor = app.executor()
    await executor.run_until_idle()
    page = await app.list(limit=10)
    pending = [r.id for r in page.items if r.state is State.PENDING]
    assert group_row in pending and seen == []
    assert (await app.explain(group_row)).reason == "awaiting"
    await app.cancel(rows[3])
    assert seen == []
    clock.advance(30)
    await executor.run_until_idle()
    assert len(seen) == 1
    group = seen[0]
    assert (group.size, group.succeeded, group.failed, group.canceled) == (5, 3, 1, 1)
    clock.advance(3600)
    await executor.run_until_idle()
    assert len(seen) == 1  # never twice


async def test_an_empty_group_completes_at_once_and_bad_callbacks_are_refused(
    app: durafn.App, clock: FakeClock
) -> None:
    seen: list[int] = []

    @app.mutation
    async def summarize(ctx: MutationCtx, group: durafn.GroupCompletion) -> None:
        seen.append(group.size)

    @app.mutation
    async def two(ctx: MutationCtx, a: int, b: int) -> None: ...

    @app.action
    async def an_action(ctx: ActionCtx, group: durafn.GroupCompletion) -> None: ...

    sched = app.scheduler()
    await sched.group([], on_complete=summarize)
    await app.executor().run_until_idle()
    assert seen == [0]
    with pytest.raises(durafn.SchedulingError, match="takes 2 parameters besides ctx"):
        await sched.group([], on_complete=two)  # type: ignore[arg-type]
    with pytest.raises(durafn.SchedulingError, match="must be a mutation"):
        await sched.group([], on_complete=an_action)  # type: ignore[arg-type]
    with pytest.raises(durafn.SchedulingError, match="does not exist"):
        await sched.group(["01900000-0000-7000-8000-000000000000"], on_complete=summarize)


async def test_a_rescheduled_waiting_row_waits_for_both_its_dependency_and_its_time(
    app: durafn.App, clock: FakeClock
) -> None:
    start = clock.now()

    @app.action
    async def step(ctx: ActionCtx, n: int) -> None: ...

    sched = app.scheduler()
    first = await sched.run_after(60, step, n=1)
    then = await sched.run_after(0, step.options(after=[first]), n=2)
    moved = await app.reschedule([then], run_at=datetime.fromtimestamp(start + 120, UTC))
    assert moved == 1
    row = await row_of(app, then)
    assert row.due_time is not None and row.due_time.timestamp() == start + 120
    assert (await app.explain(then)).held_by == [first]  # it still waits
    clock.advance(60)
    await app.executor().run_until_idle()
    row = await row_of(app, then)
    assert row.state is State.PENDING  # free of its dependency, not yet due
    assert (await app.explain(then)).reason == "not_due"
    clock.advance(60)
    await app.executor().run_until_idle()
    assert (await row_of(app, then)).state is State.SUCCESS


async def test_one_long_lived_app_waits_and_reports_many_times(
    app: durafn.App, clock: FakeClock
) -> None:
    """Seven of each on one app (PostgreSQL plans generically after five): a row after
    another, each run once its dependency has; and progress written each second."""
    order: list[str] = []

    @app.action
    async def step(ctx: ActionCtx, n: int) -> None:
        order.append(f"step {n}")
        for i in range(7):
            await ctx.progress(i / 6, f"{i} of 6")
            clock.advance(1)

    sched = app.scheduler()
    previous = await sched.run_after(0, step, n=0)
    ids = [previous]
    for n in range(1, 8):
        previous = await sched.run_after(0, step.options(after=[previous]), n=n)
        ids.append(previous)
    await app.executor().run_until_idle()
    assert order == [f"step {n}" for n in range(8)]
    for id in ids:
        row = await row_of(app, id)
        assert (row.state, row.progress, row.progress_message) == (State.SUCCESS, 1.0, "6 of 6")


def test_after_takes_one_to_ten_thousand_rows() -> None:
    from durafn._options import MAX_AFTER, check_after

    ids = [f"01900000-0000-7000-8000-{n:012d}" for n in range(MAX_AFTER + 1)]
    assert len(check_after("after", ids[:MAX_AFTER])) == MAX_AFTER == 10_000
    assert check_after("after", ids[:1]) == (ids[0],)
    with pytest.raises(durafn.OptionError, match="must name 1 to 10000 rows, not 10001"):
        check_after("after", ids)


@pytest.mark.postgres_only  # LISTEN/NOTIFY exists only on PostgreSQL; SQLite polls
async def test_a_dependency_finished_by_another_process_wakes_its_dependent(
    postgres_url: str, tmp_path: Path
) -> None:
    """The rows waited for run in a ``durafn worker`` process (which forbids the join's
    flag); the join runs here, in an executor whose poll is an hour away and which
    forbids the dependencies' flag: only the release trigger's NOTIFY, sent when the
    other process commits the last finish, can start it."""
    async with (
        worker_app_on(postgres_url) as (app, fns),
        app.run_executor(poll_interval=3600, forbidden_flags=("dep",)) as executor,
    ):
        scheduler = app.scheduler()
        deps = await scheduler.run_many(
            [fns.apply.options(flags=["dep"]).call(n, 0.0) for n in range(20)]
        )
        join = await scheduler.run_after(0, fns.apply.options(after=deps, flags=["join"]), 999, 0.0)
        async with worker_processes(postgres_url, 1, tmp_path, *FAST, "--forbid-flag", "join") as [
            worker
        ]:
            row = await executor.wait_for(join, timeout=CEILING)
            assert row.state is State.SUCCESS
            assert worker.returncode is None
            for dep in deps:
                assert (await row_of(app, dep)).state is State.SUCCESS, await row_of(app, dep)
        async with app.engine.connect() as conn:
            found = await conn.execute(select(Applied.key, Applied.pid))
            applied: dict[str, int] = {key: pid for key, pid in found}
    assert applied["m999"] == os.getpid()  # the join ran here
    assert {applied[f"m{n}"] for n in range(20)} == {worker.pid}  # its rows, there


async def _waits_on_a_lock(app: durafn.App, query: str) -> bool:
    """Whether a statement ``LIKE query`` waits for a lock in the app's database."""
    async with app.engine.connect() as conn:
        waiting = await conn.execute(
            text(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND datname = current_database() AND query LIKE :query"
            ),
            {"query": query},
        )
        return bool(waiting.scalar_one())


class _Race:
    """Rows ``after=`` others on PostgreSQL, finished by hand: an app with a no-op mutation
    ``part`` and action ``join``, a listener on the executors' channel (from ``listen()``
    on: the scheduling's own NOTIFYs go out at its commits), and the transactions left
    open (closed at the end)."""

    def __init__(self, url: str) -> None:
        self.app = durafn.App(url)
        self.heard: list[str] = []
        self.opened: list[AsyncConnection] = []

        @self.app.mutation
        async def part(ctx: MutationCtx) -> None:
            pass

        @self.app.action
        async def join(ctx: ActionCtx) -> None:
            pass

        self.part, self.join = part, join

    async def __aenter__(self) -> _Race:
        import asyncpg

        self._listener = await asyncpg.connect(BARE_DSN)
        await self.app.migrate()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        for conn in self.opened:
            await conn.close()
        await self._listener.close()
        await self.app.aclose()

    async def listen(self) -> None:
        await self._listener.add_listener("durafn_wakeup", lambda *args: self.heard.append(args[3]))

    async def finish(self, id: str, result: str | None = None) -> tuple[AsyncConnection, set[str]]:
        """A mutation's finish, as a batch writes it (the trigger's route if it has a
        ``result``), in a transaction left open: the connection, and the rows it noted."""
        from durafn._store import Outcome
        from durafn._store.after_commit import note

        conn = await self.app.engine.connect()
        self.opened.append(conn)
        await conn.begin()
        sid = durafn.ScheduledFunctionId(id)
        outcome = Outcome(id=sid, state=State.SUCCESS, result=result)
        assert await self.app._rt.driver.finish_pending(conn, self.app.clock.now(), [outcome]) == 1
        return conn, set(note(conn).maybe_freed)

    async def look(self, ids: set[str]) -> int:
        """The executor's look after the commits (``FreedRows``)."""

        async def body(conn: AsyncConnection) -> int:
            return await self.app._rt.driver.wake_freed(conn, ids)

        return await self.app._rt.transaction(body, single_statement=True)

    async def heard_at_least(self, count: int) -> list[str]:
        with anyio.fail_after(CEILING):
            while len(self.heard) < count:  # noqa: ASYNC110 - asyncpg delivers by callback
                await anyio.sleep(0.01)
        return self.heard


@pytest.mark.postgres_only  # finishes in flight at once and the NOTIFY; SQLite has one writer
async def test_the_later_of_two_finishes_in_flight_wakes_their_dependent_once_both_commit(
    postgres_url: str,
) -> None:
    """Two finishes delete a row's last two edges at once, and each notes the rows whose
    edges it deleted. The second commits first: its look after the commit waits for the
    other finish (whose edge would otherwise still be there) and, once that commits,
    finds no edge left and sends the NOTIFY. A row that still waits for one nobody has
    finished is not free, and its look waits for nothing."""
    async with _Race(postgres_url) as race:
        app, sched = race.app, race.app.scheduler()
        a, b, c = await sched.run_many([race.part.call() for _ in range(3)])
        both = await sched.run_after(0, race.join.options(after=[a, b]))
        third = await sched.run_after(0, race.join.options(after=[c, a, b]))
        await race.listen()
        first, noted_first = await race.finish(a)
        second, noted_second = await race.finish(b)
        assert noted_first == noted_second == {both, third}
        await second.commit()

        looking_waits = functools.partial(_waits_on_a_lock, app, "%FOR KEY SHARE%")
        freed: list[int] = []
        async with anyio.create_task_group() as tg:

            async def _look() -> None:
                freed.append(await race.look(noted_second))

            tg.start_soon(_look)
            await wait_until(looking_waits, "the look waits for the first finish")
            before = (list(freed), list(race.heard))
            await first.commit()  # (before asserting: the look waits for it)
        assert before == ([], [])
        assert freed == [1]
        assert await race.heard_at_least(1) == ["action,mutation"]
        async with app.engine.connect() as conn:
            left = await conn.execute(text("SELECT row_id::text FROM _durafn_dependencies"))
            assert [row_id for (row_id,) in left] == [third]  # c's edge
        assert await race.look({third}) == 0  # it still waits for c, which nobody finished
        assert race.heard == ["action,mutation"]


@pytest.mark.postgres_only  # finishes in flight at once and the NOTIFY; SQLite has one writer
async def test_a_finish_by_the_trigger_s_route_committed_first_does_not_lose_the_wake_up(
    postgres_url: str,
) -> None:
    """The batch's finish deletes one of a row's two edges and stays open; meanwhile a
    finish by the trigger's route (a result to store) deletes the other and commits,
    with its NOTIFY: too early, since the first edge is still there for everyone else.
    The batch's finish then commits, and its look after the commit finds the row free
    and sends the NOTIFY that counts. (Deciding inside the finish, the edge the trigger
    had not touched yet would have said "not free" and nobody would have told.)"""
    async with _Race(postgres_url) as race:
        sched = race.app.scheduler()
        a, b = await sched.run_many([race.part.call() for _ in range(2)])
        both = await sched.run_after(0, race.join.options(after=[a, b]))
        await race.listen()
        batch, noted = await race.finish(a)
        assert noted == {both}
        by_trigger, _ = await race.finish(b, result='"x"')
        await by_trigger.commit()  # the trigger's NOTIFY goes out now
        await batch.commit()
        assert await race.look(noted) == 1
        # The trigger's, then the look's.
        assert await race.heard_at_least(2) == ["action,mutation", "action,mutation"]


@pytest.mark.postgres_only  # the row lock a finish waits on; SQLite has one writer
async def test_a_dependent_linked_while_its_dependency_s_finish_waits_is_released(
    postgres_url: str,
) -> None:
    """The hot finish releases its rows' dependents itself (``durafn_release``): an edge
    that a scheduler commits while the finish waits for the row's lock must be seen and
    deleted. The running action's row is marked awaited by an open transaction; the action
    returns, its finish waits on that transaction's lock; the transaction commits the
    join's edge; the join must then run (an edge left behind would keep it waiting)."""
    app = durafn.App(postgres_url)
    may_return = anyio.Event()

    @app.action
    async def dependency(ctx: ActionCtx) -> None:
        await may_return.wait()

    @app.action
    async def join(ctx: ActionCtx) -> str:
        return "joined"

    finish_waits_on_a_lock = functools.partial(_waits_on_a_lock, app, "%durafn_release%")

    try:
        await app.migrate()
        dep = await app.scheduler().run_after(0, dependency)
        async with app.run_executor() as executor:

            async def running() -> bool:
                return (await row_of(app, dep)).state is State.IN_PROGRESS

            await wait_until(running, "the dependency runs")
            async with app.engine.connect() as conn:
                await conn.begin()
                join_id = await app.scheduler(conn).run_after(0, join.options(after=[dep]))
                may_return.set()
                await wait_until(finish_waits_on_a_lock, "the finish waits for the lock")
                await conn.commit()
            row = await executor.wait_for(join_id, timeout=CEILING)
            assert (row.state, row.result) == (State.SUCCESS, "joined")
        async with app.engine.connect() as conn:
            edges = await conn.execute(text("SELECT count(*) FROM _durafn_dependencies"))
            assert edges.scalar_one() == 0
            sf = durafn.scheduled_functions
            mark = await conn.execute(select(sf.c.dependents).where(sf.c.id == dep))
            assert mark.scalar_one() == 2  # released by the finish, not by the trigger
    finally:
        await app.aclose()


async def test_a_row_awaited_by_a_mutation_of_its_own_batch_still_releases_its_dependents(
    app: durafn.App,
) -> None:
    """A batch's finish releases the dependents of the rows its claim found awaited (on
    SQLite, in one statement for the batch); a row a mutation of the same batch made
    awaited after the claim is released too (by the trigger), and so are the edges added
    during the batch to a row already awaited."""
    order: list[str] = []

    @app.mutation
    async def awaited(ctx: MutationCtx, name: str) -> None:
        order.append(name)

    @app.mutation
    async def link(ctx: MutationCtx, first: str, second: str) -> None:
        order.append("link")
        for dep in (first, second):
            await ctx.scheduler.run_after(0, join.options(after=[dep]), f"join {dep}")

    @app.action
    async def join(ctx: ActionCtx, name: str) -> None:
        order.append(name)

    sched = app.scheduler()
    first = await sched.run_after(0, awaited, name="first")  # awaited before the claim
    second = await sched.run_after(0, awaited, name="second")  # only during the batch
    await sched.run_after(0, join.options(after=[first]), "join first (before)")
    # Its priority runs ``link`` first in the one batch of all three.
    await sched.run_after(0, link.options(priority=-10), first=first, second=second)
    await app.executor().run_until_idle()
    assert order[:3] == ["link", "first", "second"], order
    assert sorted(order[3:]) == sorted(
        ["join first (before)", f"join {first}", f"join {second}"]
    ), order
    sf = durafn.scheduled_functions
    async with app.engine.connect() as conn:
        edges = await conn.execute(text("SELECT count(*) FROM _durafn_dependencies"))
        assert edges.scalar_one() == 0
        found = await conn.execute(select(sf.c.id, sf.c.dependents))
        marks: dict[str, int] = {str(id): dependents for id, dependents in found}
    # Which route released each: 2, the batch's finish; 1, the trigger. On SQLite the
    # finish knows only what its claim read (``second`` became awaited later); PostgreSQL's
    # reads each row as it writes it.
    assert marks[first] == 2
    assert marks[second] == (1 if app.engine.dialect.name == "sqlite" else 2)


@pytest.mark.postgres_only  # a row lock that claims skip; SQLite's claim waits for the writer
@pytest.mark.parametrize("kind", ["mutation", "action"])
async def test_rows_a_transaction_marks_awaited_are_claimed_once_it_commits(
    postgres_url: str, kind: str
) -> None:
    """Scheduling ``after=`` rows already written marks them awaited, which locks them
    until that transaction commits. A running executor's claim meanwhile skips them
    (``SKIP LOCKED``) and, taking them for rows another claim holds, sleeps: the commit
    wakes the kind of the Pending rows it marked, not only the dependent's (here the
    other kind). The transaction runs in another app, so that nothing of this process
    wakes the executor; on the fake clock its poll never comes: without that wake-up
    the rows would never start."""
    worker = durafn.App(postgres_url, clock=FakeClock())
    writer = worker.using()  # the same functions, a runtime of its own
    await worker.migrate()

    async def body(ctx: object, n: int) -> None:
        pass

    # The join is of the other kind: its own wake-up must not be what starts the parts.
    part: durafn.SchedulableRef[[int], None]
    join: durafn.SchedulableRef[[int], None]
    if kind == "mutation":
        part, join = worker.mutation(name="wf:part")(body), worker.action(name="wf:join")(body)
    else:
        part, join = worker.action(name="wf:part")(body), worker.mutation(name="wf:join")(body)

    @worker.mutation
    async def marker(ctx: MutationCtx) -> None:
        pass

    try:
        parts = await writer.scheduler().run_many([part.call(n) for n in range(3)])
        seen = await worker.scheduler().run_after(0, marker)
        async with writer.engine.connect() as conn:
            await conn.begin()
            join_id = await writer.scheduler(conn).run_after(0, join.options(after=parts), 0)
            async with worker.run_executor() as executor:
                # Its claims ran while the parts were locked: one took the marker.
                assert (await executor.wait_for(seen, timeout=CEILING)).state is State.SUCCESS
                for id in parts:
                    assert (await row_of(worker, id)).state is State.PENDING
                await conn.commit()
                done = await executor.wait_for(join_id, timeout=CEILING)
                assert done.state is State.SUCCESS
        for id in parts:
            assert (await row_of(worker, id)).state is State.SUCCESS
    finally:
        await writer.aclose()
        await worker.aclose()


async def _times_agree_with_the_order_of_events(app: durafn.App) -> None:
    """Every row started no later than it ended, and every dependent started no earlier
    than the last of its dependencies ended (their completions committed before it could
    be claimed). Dependents are told by name: ``join*`` waits for every ``part*``."""
    rows = await all_rows(app)
    for row in rows:
        if row.started_time is not None and row.completed_time is not None:
            assert row.started_time <= row.completed_time, row
    last = max(r.completed_time for r in rows if r.name.startswith("part") and r.completed_time)
    for join in (r for r in rows if r.name.startswith("join")):
        assert join.started_time is not None and join.started_time >= last, (join, last)


@pytest.mark.parametrize("wait", ["connection", "write lock"])
async def test_a_start_is_read_once_the_claim_holds_its_lock(
    db_url: str, engine_name: str, clock: FakeClock, wait: str
) -> None:
    """The issue's fan-in on SQLite, made deterministic. A claim that read the time, then
    waited (for SQLite's write lock, held by another writer; for a pooled connection, on
    both engines) while the last dependency's finish committed, claimed the dependent
    with the time it had read: its ``started_time`` came before the dependency's
    ``completed_time``, though it ran after. The start is now read once the claim holds
    its lock (SQLite: as its statement binds, on the connection's thread, after BEGIN
    IMMEDIATE; PostgreSQL: as the statement is sent on the connection it waited for).
    The claim's own ``now`` (the dispatcher's, read before it claims) still decides what
    is due."""
    if wait == "write lock" and engine_name == "postgres":
        pytest.skip("PostgreSQL's claims take rows SKIP LOCKED: they wait for no finish's lock")
    app = durafn.App(db_url, clock=clock, max_connections=1 if wait == "connection" else None)
    await app.migrate()

    @app.action(name="part")
    async def part(ctx: ActionCtx, n: int) -> None:
        pass

    @app.action(name="join")
    async def join(ctx: ActionCtx) -> None:
        pass

    try:
        parts = await app.scheduler().run_many([part.call(n) for n in range(50)])
        await app.scheduler().run_after(0, join.options(after=parts))
        executor = app.executor()
        claims, finisher = executor._claims, executor._finisher
        claimed = await claims.claim(50)
        assert sorted(r.id for r in claimed) == sorted(parts)
        for row in claimed[:-1]:  # all but the last end, a second apart
            clock.advance(1)
            await finisher.write([Outcome(row.id, State.SUCCESS)])
        last = claimed[-1]
        read = clock.now()  # what the dispatcher read before its claim
        got: list[list[Claimed]] = []

        async def claim() -> None:
            got.append(await claims.claim(10, read, retries=0))

        async with anyio.create_task_group() as tg, app.engine.connect() as held:
            await held.begin()  # SQLite: BEGIN IMMEDIATE, the write lock
            tg.start_soon(claim)  # it waits for ``held`` (its connection, or its lock)
            clock.advance(5)
            driver = app._rt.driver
            worker = claims.worker_id()
            finished = await driver.finish_in_progress(
                held, clock.now(), [Outcome(last.id, State.SUCCESS)], worker
            )
            assert finished == 1
            await held.commit()
        [[dependent]] = got
        assert dependent.name == "join"
        joined = await row_of(app, dependent.id)
        assert joined.started_time is not None
        assert joined.started_time.timestamp() == clock.now() > read
        await finisher.write([Outcome(dependent.id, State.SUCCESS)])
        await _times_agree_with_the_order_of_events(app)
    finally:
        await app.aclose()
