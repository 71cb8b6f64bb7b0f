"""Durable workflows (``@app.workflow``) on both engines, on the fake clock: steps
journaled once and replayed, sleeps and events as rows, starts and events in the
caller's transaction, gather, children, cancel, the replay that does not match, the
bounds, the generation guard, and retention. Real processes killed at every step
boundary: ``test_durable_workflow_crashes.py``."""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta
from typing import Any

import anyio
import pytest
from sqlalchemy import func, select, text
from sqlalchemy.ext.asyncio import AsyncSession

import durafn
from durafn import ActionCtx, MutationCtx, QueryCtx, WorkflowCtx, WorkflowState
from durafn._workflow import api
from durafn.testing import FakeClock, Harness

from .support.helpers import effects, wait_until
from .support.models import Effect

pytestmark = pytest.mark.anyio

DAY = 86400.0


def kit(app: durafn.App, clock: FakeClock) -> Harness:
    return Harness(app, clock)


def steps_of(wf: durafn.Workflow) -> list[tuple[int, str, str, str]]:
    return [(s.step_no, s.kind, s.name, s.state) for s in wf.steps]


async def test_a_workflow_takes_each_step_once_through_a_30_day_sleep_and_an_event(
    app: durafn.App, clock: FakeClock
) -> None:
    """Every turn replays the body from the start: each mutation's effect is written
    once, each action runs once, the 30-day sleep ends on time on the fake clock, the
    event's payload comes back, and the journal holds each step's outcome."""
    ran: list[str] = []
    start = clock.now()

    @app.mutation(name="wf1:charge")
    async def charge(ctx: MutationCtx, order: str) -> int:
        ctx.db.add(Effect(key=f"charge {order}"))
        return 42

    @app.action(name="wf1:ship")
    async def ship(ctx: ActionCtx, order: str, amount: int) -> str:
        ran.append(f"ship {order} {amount} at {clock.now() - start:g}")
        return f"parcel-{order}"

    @app.query(name="wf1:count")
    async def count(ctx: QueryCtx) -> int:
        return int((await ctx.db.execute(select(func.count()).select_from(Effect))).scalar_one())

    @app.workflow(name="wf1")
    async def order(step: WorkflowCtx, order: str) -> dict[str, Any]:
        amount = await step.run_mutation(charge, order)
        parcel = await step.run_action(ship, order, amount)
        await step.sleep(timedelta(days=30))
        woke = (step.now() - durafn.testing.FakeClock(start).now_datetime()).total_seconds()
        review = await step.wait_for_event("review", timeout=timedelta(days=1))
        effects_seen = await step.run_query(count)
        return {"parcel": parcel, "woke": woke, "review": review, "effects": effects_seen}

    harness = kit(app, clock)
    id = await app.start_workflow(order, "o1")
    await harness.advance(30 * DAY - 1)
    wf = await app.get_workflow(id)
    assert wf is not None and wf.waiting == "step 3: sleep"  # not a second early
    await harness.advance(1)
    wf = await app.get_workflow(id)
    assert wf is not None and wf.state is WorkflowState.RUNNING
    assert wf.waiting == "step 4: event 'review'"
    assert await harness.send_event(wf.id, "review", {"stars": 5})
    done = await harness.finish_workflow(wf.id)
    assert done.state is WorkflowState.SUCCESS, done.error
    assert done.result == {
        "parcel": "parcel-o1",
        "woke": 30 * DAY,
        "review": {"stars": 5},
        "effects": 1,
    }
    assert await effects(app) == ["charge o1"]
    assert ran == ["ship o1 42 at 0"]
    assert steps_of(done) == [
        (1, "mutation", "wf1:charge", "Success"),
        (2, "action", "wf1:ship", "Success"),
        (3, "sleep", "sleep", "Success"),
        (4, "event", "review", "Success"),
        (5, "query", "wf1:count", "Success"),
    ]
    assert done.steps[1].row_id == api.step_row_id(wf.id, 2)  # the action's idempotency key


async def test_start_workflow_commits_with_the_callers_writes_or_not_at_all(
    app: durafn.App, clock: FakeClock
) -> None:
    @app.workflow(name="wf2")
    async def noop(step: WorkflowCtx, n: int) -> int:
        return n

    @app.mutation(name="wf2:signup")
    async def signup(ctx: MutationCtx, fail: bool) -> str:
        ctx.db.add(Effect(key=f"signup {fail}"))
        id = await ctx.scheduler.start_workflow(noop, 7)
        if fail:
            raise ValueError("rolled back")
        return id

    with pytest.raises(ValueError):
        await app.run_mutation(signup, True)
    assert await app.list_workflows() == []
    id = await app.run_mutation(signup, False)
    async with AsyncSession(app.engine) as session, session.begin():
        session.add(Effect(key="mine"))
        other = await app.scheduler(session).start_workflow(noop, 8)
        await session.rollback()
    assert await app.get_workflow(other) is None
    done = await kit(app, clock).finish_workflow(id)
    assert (done.state, done.result) == (WorkflowState.SUCCESS, 7)
    assert await effects(app) == ["signup False"]


async def test_events_before_the_wait_twice_to_a_finished_workflow_and_rolled_back(
    app: durafn.App, clock: FakeClock
) -> None:
    """An event sent before the wait is taken when the wait starts; two events of one
    name are taken by two waits, one each; an event sent in a transaction that rolls
    back never arrives; one sent to a finished workflow is refused (False)."""

    @app.workflow(name="wf3")
    async def waits(step: WorkflowCtx) -> list[Any]:
        await step.sleep(60)
        first = await step.wait_for_event("e")
        second = await step.wait_for_event("e")
        third = await step.wait_for_event("e", timeout=10)
        return [first, second, third]

    harness = kit(app, clock)
    id = await app.start_workflow(waits)
    await harness.run_until_idle()  # asleep: the events come before any wait began
    assert await app.send_event(id, "e", 1)
    async with AsyncSession(app.engine) as session, session.begin():
        assert await app.scheduler(session).send_event(id, "e", "rolled back")
        await session.rollback()
    assert await app.send_event(id, "e", 2)
    wf = await harness.finish_workflow(id)
    assert wf.state is WorkflowState.FAILED  # the third wait timed out
    assert wf.error is not None and wf.error.type == "durafn.WorkflowTimeoutError"
    assert [s.result for s in wf.steps[1:3]] == [1, 2]
    assert not await app.send_event(id, "e", 3)
    with pytest.raises(durafn.WorkflowNotFoundError):
        await app.send_event("01b8dac5-b400-7000-8000-000000000000", "e", 3)


async def test_a_failed_step_raises_in_the_body_and_its_writes_are_rolled_back(
    app: durafn.App, clock: FakeClock
) -> None:
    @app.mutation(name="wf4:half")
    async def half(ctx: MutationCtx) -> None:
        ctx.db.add(Effect(key="never"))
        await ctx.db.flush()
        raise ValueError("no")

    @app.mutation(name="wf4:after")
    async def after(ctx: MutationCtx) -> None:
        ctx.db.add(Effect(key="after"))

    @app.workflow(name="wf4")
    async def recovers(step: WorkflowCtx) -> str:
        try:
            await step.run_mutation(half)
        except durafn.WorkflowStepError as exc:
            await step.run_mutation(after)
            return f"{exc.error_type}: {exc.error_message}"
        return "no error"

    wf = await kit(app, clock).run_workflow(recovers)
    assert (wf.state, wf.result) == (WorkflowState.SUCCESS, "ValueError: no")
    assert await effects(app) == ["after"]


async def test_five_parallel_steps_one_failing_start_in_one_turn(
    app: durafn.App, clock: FakeClock
) -> None:
    ran: list[int] = []

    @app.action(name="wf5:part")
    async def part(ctx: ActionCtx, n: int) -> int:
        ran.append(n)
        if n == 3:
            raise RuntimeError("part 3")
        return n * n

    @app.workflow(name="wf5")
    async def fan(step: WorkflowCtx) -> list[Any]:
        results = await asyncio.gather(
            *(step.run_action(part, n) for n in range(5)), return_exceptions=True
        )
        return [r if isinstance(r, int) else type(r).__name__ for r in results]

    harness = kit(app, clock)
    id = await app.start_workflow(fan)
    assert await harness.run_until_idle() >= 6
    wf = await harness.finish_workflow(id)
    assert wf.result == [0, 1, 4, "WorkflowStepError", 16]
    assert sorted(ran) == [0, 1, 2, 3, 4]
    assert {s.started_at for s in wf.steps} == {wf.created_at}  # all started at once


async def test_branches_that_go_on_at_different_times_replay_in_the_same_order(
    app: durafn.App, clock: FakeClock
) -> None:
    """Three branches of a gather, each a chain of steps that end at different times (an
    action, a sleep, an event): every turn replays the body, and a branch whose steps
    are journaled must not run ahead of the others on replay (its next step would get
    a number another branch had the first time). Each outcome is handed over again in
    the round it was first handed over in, so the body asks for the same steps in the
    same order every time, and each step runs once."""
    ran: list[str] = []

    @app.action(name="br:fetch")
    async def fetch(ctx: ActionCtx, n: int) -> int:
        ran.append(f"fetch {n}")
        return n

    @app.mutation(name="br:note")
    async def note(ctx: MutationCtx, what: str) -> str:
        ran.append(f"note {what}")
        return what

    async def quick(step: WorkflowCtx) -> str:
        a = await step.run_action(fetch, 1)
        b = await step.run_mutation(note, f"quick {a}")
        c = await step.run_action(fetch, 2)
        return f"{b} {c}"

    async def slow(step: WorkflowCtx) -> str:
        await step.sleep(60)
        return await step.run_mutation(note, "slow")

    async def told(step: WorkflowCtx) -> str:
        said = await step.wait_for_event("go")
        return await step.run_mutation(note, f"told {said}")

    @app.workflow(name="br")
    async def branches(step: WorkflowCtx) -> list[str]:
        return list(await asyncio.gather(quick(step), slow(step), told(step)))

    harness = kit(app, clock)
    id = await app.start_workflow(branches)
    await harness.run_until_idle()  # quick's chain runs to its end meanwhile
    await harness.advance(timedelta(seconds=60))  # the sleep ends: slow's note
    await harness.send_event(id, "go", "yes")
    wf = await harness.finish_workflow(id)
    assert (wf.state, wf.error) == (WorkflowState.SUCCESS, None)
    assert wf.result == ["quick 1 2", "slow", "told yes"]
    assert sorted(ran) == ["fetch 1", "fetch 2", "note quick 1", "note slow", "note told yes"]
    assert [(s.kind, s.name) for s in wf.steps] == [
        ("action", "br:fetch"),
        ("sleep", "sleep"),
        ("event", "go"),
        ("mutation", "br:note"),
        ("action", "br:fetch"),
        ("mutation", "br:note"),
        ("mutation", "br:note"),
    ]


async def test_a_replay_that_asks_for_fewer_steps_before_an_outcome_stops_the_workflow(
    app: durafn.App, clock: FakeClock
) -> None:
    """Two steps asked for at once had their outcomes handed over together; code that now
    asks for only one of them before that point cannot be given the same history: the
    workflow is Stopped, its error naming the step it no longer asks for in time."""
    code = {"version": 1}

    @app.mutation(name="fewer:m")
    async def m(ctx: MutationCtx, n: int) -> int:
        return n

    @app.workflow(name="fewer")
    async def fewer(step: WorkflowCtx) -> None:
        if code["version"] == 1:
            await asyncio.gather(step.run_mutation(m, 1), step.run_mutation(m, 2))
        else:
            await step.run_mutation(m, 1)
        await step.sleep(10)

    harness = kit(app, clock)
    id = await app.start_workflow(fewer)
    await harness.run_until_idle()
    code["version"] = 2
    wf = await harness.finish_workflow(id)
    assert wf.state is WorkflowState.STOPPED and wf.error is not None
    assert wf.error.type == "durafn.WorkflowDeterminismError"
    assert "before its journal's step 2 (mutation 'fewer:m')" in wf.error.message


async def test_a_child_workflow_returns_its_result_to_its_parent(
    app: durafn.App, clock: FakeClock
) -> None:
    @app.workflow(name="wf6:child")
    async def child(step: WorkflowCtx, n: int) -> int:
        await step.sleep(5)
        return n + 1

    @app.workflow(name="wf6")
    async def parent(step: WorkflowCtx) -> int:
        a, b = await asyncio.gather(step.run_workflow(child, 1), step.run_workflow(child, 10))
        return a + b

    wf = await kit(app, clock).run_workflow(parent)
    assert (wf.state, wf.result) == (WorkflowState.SUCCESS, 13)
    children = [w for w in await app.list_workflows(name="wf6:child")]
    assert {c.parent_id for c in children} == {wf.id}
    assert {c.state for c in children} == {WorkflowState.SUCCESS}


@pytest.mark.parametrize("during", ["sleep", "event", "action", "child"])
async def test_cancel_during_each_kind_of_wait(
    app: durafn.App, clock: FakeClock, during: str
) -> None:
    """The workflow ends Canceled; its action's row is cancelled (its late completion
    changes nothing), its child is cancelled, its turns in flight are dropped."""

    @app.action(name="wf7:slow")
    async def slow(ctx: ActionCtx) -> None:
        pass

    @app.mutation(name="wf7:after")
    async def after(ctx: MutationCtx) -> None:
        ctx.db.add(Effect(key="after"))

    @app.workflow(name="wf7:child")
    async def child(step: WorkflowCtx) -> None:
        await step.sleep(100)

    @app.workflow(name="wf7")
    async def waits(step: WorkflowCtx, during: str) -> None:
        if during == "sleep":
            await step.sleep(100)
        elif during == "event":
            await step.wait_for_event("go", timeout=100)
        elif during == "action":
            await step.run_action(slow)
        else:
            await step.run_workflow(child)
        await step.run_mutation(after)

    harness = kit(app, clock)
    id = await app.start_workflow(waits, during)
    await app.run_mutation(_turn_of(app), workflow_id=id, generation=0)  # the first turn
    assert await app.cancel_workflow(id)
    assert not await app.cancel_workflow(id)
    await harness.send_event(id, "go") if during == "event" else None
    wf = await harness.finish_workflow(id)
    assert wf.state is WorkflowState.CANCELED and wf.ended_at is not None
    assert await effects(app) == []
    assert [s.state for s in wf.steps] == ["Started"]
    if during == "action":
        row = await app.get(wf.steps[0].row_id or "")
        assert row is not None and row.state is durafn.State.CANCELED
    if during == "child":
        [kid] = await app.list_workflows(name="wf7:child")
        assert kid.state is WorkflowState.CANCELED


def _turn_of(app: durafn.App) -> Any:
    return app._rt.registry.get("durafn:workflow_turn")


async def test_a_replay_that_asks_for_another_step_stops_the_workflow(
    app: durafn.App, clock: FakeClock
) -> None:
    """The code changed under a workflow in flight: its replay asks for step 1 as
    another function than journaled. It is Stopped with an error naming both; once code
    that matches is back, resume runs it on from its journal (step 1 not run again)."""
    code = {"version": 1}
    ran: list[str] = []

    @app.mutation(name="wf8:a")
    async def a(ctx: MutationCtx) -> None:
        ran.append("a")

    @app.mutation(name="wf8:b")
    async def b(ctx: MutationCtx) -> None:
        ran.append("b")

    @app.workflow(name="wf8")
    async def changes(step: WorkflowCtx) -> str:
        await step.run_mutation(a if code["version"] == 1 else b)
        await step.sleep(10)
        await step.run_mutation(b)  # a step past the journal's end: new code is fine
        return "done"

    harness = kit(app, clock)
    id = await app.start_workflow(changes)
    await harness.run_until_idle()
    code["version"] = 2
    wf = await harness.finish_workflow(id)
    assert wf.state is WorkflowState.STOPPED and wf.error is not None
    assert wf.error.type == "durafn.WorkflowDeterminismError"
    assert "replayed step 1 as mutation 'wf8:b'" in wf.error.message
    assert "journal holds mutation 'wf8:a'" in wf.error.message
    assert not await app.resume_workflow(await _running_id(app, "nothing"))
    code["version"] = 1
    assert await app.resume_workflow(id)
    done = await harness.finish_workflow(id)
    assert (done.state, done.result, done.generation) == (WorkflowState.SUCCESS, "done", 1)
    assert ran == ["a", "b"]


async def _running_id(app: durafn.App, name: str) -> str:
    @app.workflow(name=f"wf:{name}")
    async def idle(step: WorkflowCtx) -> None:
        pass

    return await app.start_workflow(idle)


async def test_now_and_ids_are_the_same_on_every_replay(app: durafn.App, clock: FakeClock) -> None:
    """Values read from ``step.now()``, ``step.uuid()`` and ``step.random`` are passed to
    steps as arguments: a replay computing others would not match its journal."""

    @app.mutation(name="wf9:note")
    async def note(ctx: MutationCtx, at: str, id: str, draw: float) -> None:
        pass

    @app.workflow(name="wf9")
    async def stamps(step: WorkflowCtx) -> list[str]:
        seen = []
        for _ in range(3):
            at = step.now().isoformat()
            await step.run_mutation(note, at, str(step.uuid()), step.random.random())
            await step.sleep(3600)
            seen.append(at)
        return seen

    start = clock.now_datetime()
    wf = await kit(app, clock).run_workflow(stamps)
    assert wf.state is WorkflowState.SUCCESS, wf.error
    hours = [(start + timedelta(hours=h)).isoformat() for h in range(3)]
    assert wf.result == hours
    assert len({s.args["id"] for s in wf.steps if s.kind == "mutation"}) == 3


async def test_bounds_fail_the_step_that_would_pass_them_not_the_workflow(
    app: durafn.App, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(api, "MAX_RESULT_BYTES", 100)
    monkeypatch.setattr("durafn._workflow.replay.MAX_RESULT_BYTES", 100)
    monkeypatch.setattr("durafn._workflow.replay.MAX_STEPS", 4)

    @app.mutation(name="wf10:big")
    async def big(ctx: MutationCtx, size: int) -> str:
        return "x" * size

    @app.workflow(name="wf10")
    async def bounded(step: WorkflowCtx) -> list[str]:
        out = []
        for size in (10, 1000, 20, 30, 40):
            try:
                out.append(str(len(await step.run_mutation(big, size))))
            except (durafn.WorkflowStepError, durafn.WorkflowLimitError) as exc:
                out.append(type(exc).__name__)
        return out

    wf = await kit(app, clock).run_workflow(bounded)
    assert wf.result == ["10", "WorkflowLimitError", "20", "30", "WorkflowLimitError"]
    assert wf.steps[1].error is not None and "1002 bytes" in wf.steps[1].error.message
    assert wf.steps[1].error.type == "durafn.WorkflowLimitError"
    assert len(wf.steps) == 4  # the fifth step was refused, never journaled


async def test_a_stale_turn_and_a_second_completion_change_nothing(
    app: durafn.App, clock: FakeClock
) -> None:
    ran: list[str] = []

    @app.mutation(name="wf11:m")
    async def m(ctx: MutationCtx) -> None:
        ran.append("m")

    @app.action(name="wf11:act")
    async def act(ctx: ActionCtx) -> int:
        return 1

    @app.workflow(name="wf11")
    async def once(step: WorkflowCtx) -> int:
        await step.run_mutation(m)
        return await step.run_action(act)

    harness = kit(app, clock)
    wf = await harness.run_workflow(once)
    assert (wf.state, wf.result, ran) == (WorkflowState.SUCCESS, 1, ["m"])
    # A turn of its generation arriving late, and the action's completion again.
    await app.run_mutation(_turn_of(app), workflow_id=wf.id, generation=0)
    done = app._rt.registry.get("durafn:workflow_step_done")
    row = await app.get(wf.steps[1].row_id or "")
    assert row is not None
    completion = durafn.Completion(id=row.id, name=row.name, state=durafn.State.FAILED)
    await app.run_mutation(done, completion)  # type: ignore[arg-type]
    again = await app.get_workflow(wf.id)
    assert again == wf.model_copy(update={"updated_at": again.updated_at}) if again else False
    assert ran == ["m"]


async def test_retention_removes_ended_workflows_with_their_journals_in_pages(
    app: durafn.App, clock: FakeClock
) -> None:
    """The executor's retention pass removes workflows ended longer ago than its period
    (pages of ``retention_batch``), with their journals and events; a Running one
    stays; ``remove_ended_workflows`` does the same by hand."""

    @app.workflow(name="wf12")
    async def quick(step: WorkflowCtx, n: int) -> int:
        await step.wait_for_event("e", timeout=1)
        return n

    harness = kit(app, clock)
    ids = [await app.start_workflow(quick, n) for n in range(5)]
    await harness.send_event(ids[0], "e")
    await harness.finish_all()
    keep = await app.start_workflow(quick, 9)
    await harness.run_until_idle()
    executor = app.executor(retention=3600, retention_batch=2)
    clock.advance(3599)
    await executor.run_maintenance()
    assert len(await app.list_workflows()) == 6
    clock.advance(2)
    await executor.run_maintenance()
    assert [w.id for w in await app.list_workflows()] == [keep]
    async with app.engine.connect() as conn:
        for table in ("_durafn_workflow_steps", "_durafn_workflow_events"):
            query = text(f"SELECT DISTINCT workflow_id FROM {table}")
            assert {str(i) for i in (await conn.execute(query)).scalars()} <= {keep}
    await harness.send_event(keep, "e")
    clock.advance(7200)
    assert await app.remove_ended_workflows(3600) == 1
    assert await app.list_workflows() == []


async def test_a_thousand_workflows_run_in_parallel_and_sleep_as_rows(
    app: durafn.App, clock: FakeClock
) -> None:
    """1,000 workflows started in one transaction run at once; asleep, each is one
    Pending row and nothing else: no action, no connection checked out, no task."""

    @app.workflow(name="wf13")
    async def sleeper(step: WorkflowCtx, n: int) -> int:
        await step.sleep(timedelta(days=1))
        return n

    @app.mutation(name="wf13:start")
    async def start_all(ctx: MutationCtx, count: int) -> list[str]:
        return [await ctx.scheduler.start_workflow(sleeper, n) for n in range(count)]

    harness = kit(app, clock)
    ids = await app.run_mutation(start_all, 1000)
    assert await harness.run_until_idle() == 1000  # one turn each
    asleep = await app.list_workflows(state=WorkflowState.RUNNING, limit=2000)
    assert len(asleep) == 1000 and {w.waiting for w in asleep} == {"step 1: sleep"}
    rows = await durafn.testing.all_rows(app)
    pending = [r for r in rows if r.state is durafn.State.PENDING]
    assert len(pending) == 1000 and {r.name for r in pending} == {"durafn:workflow_turn"}
    assert {r.state for r in rows} == {durafn.State.PENDING, durafn.State.SUCCESS}
    pool = app.engine.pool
    assert pool.checkedout() == 0  # type: ignore[attr-defined]
    tasks = len(asyncio.all_tasks())
    await harness.advance(timedelta(days=1))
    done = await app.list_workflows(state=WorkflowState.SUCCESS, limit=2000)
    assert sorted(w.result for w in done) == list(range(1000))
    assert {w.id for w in done} == set(ids)
    assert len(asyncio.all_tasks()) == tasks  # no body left behind


# PostgreSQL only: SQLite has no stored procedures (from SQLite, send from Python).
@pytest.mark.postgres_only
async def test_an_event_sent_from_sql_wakes_the_workflow_in_the_senders_transaction(
    postgres_url: str, clock: FakeClock
) -> None:
    app = durafn.App(postgres_url, clock=clock)
    await app.migrate()

    @app.workflow(name="wf14")
    async def waits(step: WorkflowCtx) -> Any:
        return await step.wait_for_event("paid")

    try:
        harness = kit(app, clock)
        id = await app.start_workflow(waits)
        await harness.run_until_idle()
        send = text("SELECT durafn.send_event(CAST(:id AS uuid), 'paid', :payload)")
        async with app.engine.connect() as conn, conn.begin() as tx:
            await conn.execute(send, {"id": id, "payload": '{"lost": true}'})
            await tx.rollback()
        assert (await harness.finish_workflow(id)).state is WorkflowState.RUNNING
        async with app.engine.begin() as conn:
            sent = await conn.execute(send, {"id": id, "payload": '{"amount": 12}'})
            assert sent.scalar_one() is True
        wf = await harness.finish_workflow(id)
        assert (wf.state, wf.result) == (WorkflowState.SUCCESS, {"amount": 12})
        async with app.engine.begin() as conn:
            assert (await conn.execute(send, {"id": id, "payload": "1"})).scalar_one() is False
        with pytest.raises(Exception, match=r"durafn\.send_event: no workflow has id"):
            async with app.engine.begin() as conn:
                await conn.execute(send, {"id": str(api.step_row_id(id, 9)), "payload": "1"})
    finally:
        await app.aclose()


async def test_the_order_workflow_example(db_url: str) -> None:
    from examples import order_workflow

    out: list[str] = []
    done = await order_workflow.main(db_url, out)
    assert out[0] == "after two days: Running, waiting for step 4: event 'review'"
    assert done.state is WorkflowState.SUCCESS
    assert str(done.result).startswith("4200 cents, parcel-o-17-")
    assert str(done.result).endswith(", thanked for 5 stars")
    assert [s.kind for s in done.steps] == ["mutation", "action", "sleep", "event", "mutation"]


async def test_the_command_line_lists_shows_cancels_and_resumes(
    app: durafn.App, clock: FakeClock, db_url: str
) -> None:
    @app.workflow(name="wf15")
    async def waits(step: WorkflowCtx, n: int) -> None:
        await step.wait_for_event("e")

    harness = kit(app, clock)
    ids = [await app.start_workflow(waits, n) for n in range(2)]
    turn = (await app.list(name="durafn:workflow_turn")).items[0]
    assert turn.max_attempts == 8  # a failed turn is tried again: never no turn at all
    await harness.run_until_idle()

    def cli(*args: str) -> Any:
        from .test_cli import invoke

        result = invoke("workflows", *args, "--url", db_url)
        assert result.exit_code == 0, result.output
        return result.stdout

    listed = await anyio.to_thread.run_sync(cli, "ls")
    assert all(id in listed for id in ids) and "waits: step 1: event 'e'" in listed
    shown = json.loads(await anyio.to_thread.run_sync(cli, "show", ids[0], "--json"))
    assert (shown["state"], shown["steps"][0]["kind"]) == ("Running", "event")
    assert "journal" in await anyio.to_thread.run_sync(cli, "show", ids[0])
    said = await anyio.to_thread.run_sync(cli, "explain", ids[0])
    assert said == "Running: waits for step 1 (event 'e')\n"
    assert "cancelled" in await anyio.to_thread.run_sync(cli, "cancel", ids[0])
    assert "nothing done" in await anyio.to_thread.run_sync(cli, "resume", ids[0])
    canceled = json.loads(
        await anyio.to_thread.run_sync(cli, "ls", "--state", "Canceled", "--json")
    )
    assert [w["id"] for w in canceled] == [ids[0]]
    assert [e.action for e in await app.audit_log()] == ["workflow resume", "workflow cancel"]


async def test_explain_says_what_a_workflow_waits_for(app: durafn.App, clock: FakeClock) -> None:
    @app.action(name="wf16:later")
    async def later(ctx: ActionCtx) -> None:
        pass

    @app.workflow(name="wf16")
    async def waits(step: WorkflowCtx) -> None:
        await step.sleep(60)
        await step.run_action(later.options(queue="wf16"))

    harness = kit(app, clock)
    id = await app.start_workflow(waits)
    await harness.run_until_idle()
    asleep = await app.explain_workflow(id)
    assert asleep == "Running: waits for step 1 (sleep 'sleep') until 2030-01-01T00:01:00+00:00"
    await app.pause_queue("wf16")
    clock.advance(60)
    await harness.run_until_idle()
    said = await app.explain_workflow(id)
    assert said.startswith("Running: waits for step 2 (action 'wf16:later'): its row ")
    assert "paused" in said
    await app.resume_queue("wf16")
    await harness.finish_all()
    assert await app.explain_workflow(id) == "Success"


async def test_two_executors_finishing_parallel_steps_record_each_once(
    app: durafn.App, clock: FakeClock
) -> None:
    """Two executors at once: the completions of one workflow's parallel steps land on
    both, each running a turn of it; the workflow's row lock orders those turns, so each
    step is journaled once, each action runs once, and every workflow ends once."""
    ran: list[tuple[int, int]] = []

    @app.action(name="wf17:part")
    async def part(ctx: ActionCtx, w: int, n: int) -> int:
        ran.append((w, n))
        return n

    @app.workflow(name="wf17")
    async def fan(step: WorkflowCtx, w: int) -> int:
        parts = await asyncio.gather(*(step.run_action(part, w, n) for n in range(5)))
        return sum(parts) + await step.run_action(part, w, 10)

    ids = [await app.start_workflow(fan, w) for w in range(20)]

    async def all_ended() -> bool:
        done = await app.list_workflows(state=WorkflowState.SUCCESS, limit=100)
        return len(done) == len(ids)

    async with app.run_executor(concurrency=4), app.run_executor(concurrency=4):
        await wait_until(all_ended, "every workflow ends")
    assert sorted(ran) == sorted((w, n) for w in range(20) for n in (*range(5), 10))
    for id in ids:
        wf = await app.get_workflow(id)
        assert wf is not None and wf.result == 20 and len(wf.steps) == 6
        assert {s.state for s in wf.steps} == {"Success"}


async def test_the_dashboard_lists_shows_and_cancels_workflows(
    app: durafn.App, clock: FakeClock
) -> None:
    from .support.dashboard_kit import XSS, client, csrf_of

    @app.workflow(name="wf18")
    async def waits(step: WorkflowCtx, note: str) -> None:
        await step.sleep(60)
        await step.wait_for_event("e")

    harness = kit(app, clock)
    id = await app.start_workflow(waits, XSS)
    await harness.finish_all()
    async with client(app.dashboard()) as web:
        listed = await web.get("/workflows?state=Running")
        assert listed.status_code == 200 and f'href="/workflows/{id}"' in listed.text
        page = await web.get(f"/workflows/{id}")
        assert page.status_code == 200
        assert "Running: waits for step 2 (event &#39;e&#39;)" in page.text
        assert XSS not in page.text and 'id="journal"' in page.text
        done = await web.post(f"/workflows/{id}/cancel", data={"csrf": csrf_of(page)})
        assert done.status_code == 303
        assert (await web.get("/workflows/nothing")).status_code == 404
        assert (await web.get("/workflows?state=Lost")).status_code == 400
    wf = await app.get_workflow(id)
    assert wf is not None and wf.state is WorkflowState.CANCELED
    assert [e.action for e in await app.audit_log()] == ["workflow cancel"]


async def test_an_action_step_refuses_options_that_would_hand_it_to_another_row(
    app: durafn.App, clock: FakeClock
) -> None:
    @app.action(name="wf19:act")
    async def act(ctx: ActionCtx) -> None:
        pass

    @app.workflow(name="wf19")
    async def keyed(step: WorkflowCtx) -> str:
        try:
            await step.run_action(act.options(key="k"))
        except durafn.SchedulingError as exc:
            return str(exc)
        return "accepted"

    wf = await kit(app, clock).run_workflow(keyed)
    assert wf.result is not None and wf.result.startswith("an action step cannot take a job key")
    assert wf.steps == []


async def test_a_replay_that_ends_before_its_journal_does_stops_the_workflow(
    app: durafn.App, clock: FakeClock
) -> None:
    """New code that returns before a step the journal holds (a step removed from the
    middle, say) does not end the workflow as if that step had never been: Stopped."""
    code = {"short": False}

    @app.mutation(name="wf20:m")
    async def m(ctx: MutationCtx) -> None:
        pass

    @app.workflow(name="wf20")
    async def shrinks(step: WorkflowCtx) -> str:
        await step.run_mutation(m)
        if code["short"]:
            return "short"
        await step.sleep(10)
        return "long"

    harness = kit(app, clock)
    id = await app.start_workflow(shrinks)
    await harness.run_until_idle()
    code["short"] = True
    wf = await harness.finish_workflow(id)
    assert wf.state is WorkflowState.STOPPED and wf.error is not None
    assert "ended its replay after step 1, but its journal holds step 2" in wf.error.message


async def test_synchronous_code_starts_workflows_and_sends_events_in_its_transaction(
    app: durafn.App, clock: FakeClock
) -> None:
    """Django, Flask, sync SQLAlchemy: ``app.sync.scheduler(session)`` starts a workflow
    and sends it an event in the caller's transaction (a rollback unsends it)."""
    from sqlalchemy import create_engine
    from sqlalchemy.orm import Session

    from .test_sync import _busy, sync_url

    @app.workflow(name="wf21")
    async def waits(step: WorkflowCtx, n: int) -> int:
        return int(await step.wait_for_event("e")) + n

    engine = create_engine(sync_url(app), connect_args=_busy(app))

    def start() -> str:
        with Session(engine) as session, session.begin():
            return app.sync.scheduler(session).start_workflow(waits, 1)

    def send(id: str, value: int, keep: bool) -> bool:
        with Session(engine) as session, session.begin():
            sent = app.sync.scheduler(session).send_event(id, "e", value)
            if not keep:
                session.rollback()
            return sent

    try:
        harness = kit(app, clock)
        id = await anyio.to_thread.run_sync(start)
        assert await anyio.to_thread.run_sync(send, id, 99, False)
        assert (await harness.finish_workflow(id)).state is WorkflowState.RUNNING
        assert await anyio.to_thread.run_sync(send, id, 41, True)
        assert (await harness.finish_workflow(id)).result == 42
    finally:
        engine.dispose()


async def test_steps_asked_for_by_tasks_the_body_made_start_in_the_same_turn(
    app: durafn.App, clock: FakeClock
) -> None:
    """A TaskGroup whose tasks gather steps two levels down, while the body's own task
    waits for an event: the turn waits until every task of the body is blocked, so the
    actions run before the event comes, not after."""
    ran: list[int] = []

    @app.action(name="wf22:part")
    async def part(ctx: ActionCtx, n: int) -> int:
        ran.append(n)
        return n

    async def two(step: WorkflowCtx, base: int) -> int:
        got = await asyncio.gather(step.run_action(part, base), step.run_action(part, base + 1))
        return sum(got)

    async def nested(step: WorkflowCtx) -> int:
        return sum(await asyncio.gather(two(step, 0), two(step, 10)))

    @app.workflow(name="wf22")
    async def grouped(step: WorkflowCtx) -> list[Any]:
        async with asyncio.TaskGroup() as tg:
            parts = tg.create_task(nested(step))
            event = await step.wait_for_event("go")
        return [event, parts.result()]

    harness = kit(app, clock)
    id = await app.start_workflow(grouped)
    await harness.finish_all()
    assert sorted(ran) == [0, 1, 10, 11]  # before any event
    assert await harness.send_event(id, "go", "now")
    done = await harness.finish_workflow(id)
    assert (done.state, done.result) == (WorkflowState.SUCCESS, ["now", 22])


async def test_a_turn_that_fails_is_rolled_back_and_tried_again(
    app: durafn.App, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fault in a turn (here: the first run of every turn raises) rolls back what it
    did (the mutation step's write too) and the turn runs again after its backoff: the
    workflow ends, each step once."""
    from durafn._workflow import turns

    real = turns.play
    failed: list[str] = []

    async def flaky(*args: Any) -> None:
        await real(*args)
        if len(failed) < 2:
            failed.append("once")
            raise RuntimeError("a fault after the turn's work")

    monkeypatch.setattr(turns, "play", flaky)

    @app.mutation(name="wf23:m")
    async def m(ctx: MutationCtx) -> None:
        ctx.db.add(Effect(key="m"))

    @app.workflow(name="wf23")
    async def two(step: WorkflowCtx) -> str:
        await step.run_mutation(m)
        await step.sleep(5)
        return "done"

    wf = await kit(app, clock).run_workflow(two)
    assert (wf.state, wf.result, failed) == (WorkflowState.SUCCESS, "done", ["once", "once"])
    assert await effects(app) == ["m"]
