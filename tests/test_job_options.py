"""Job options in one process, on both engines: priority, named queues (serial, limited,
paused), flags, worker pools, job keys in every mode and state, batches, bad options.

The cross-process guarantees (a serial queue under 4 racing worker processes, a limit
across processes, pools) are in ``test_queue_workers.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from sqlalchemy import func, select

import durafn
from durafn import ActionCtx, Flow, MutationCtx, Queue, State
from durafn._store import Outcome
from durafn.testing import FakeClock, all_rows

from .support.helpers import CEILING, effects, row_of
from .support.models import Effect

pytestmark = pytest.mark.anyio


# -- priority ---------------------------------------------------------------------------


@pytest.mark.parametrize("written", ["one call each", "in one batch"])
async def test_due_rows_run_by_priority_then_due_time_then_id(
    app: durafn.App, clock: FakeClock, written: str
) -> None:
    @app.mutation
    async def note(ctx: MutationCtx, tag: str) -> None:
        ctx.db.add(Effect(key=tag))

    sched = app.scheduler()
    # (tag, priority, delay): scheduled in an order that is none of the expected ones.
    plan = [
        ("p5-t1", 5, 1),
        ("p0-t3", 0, 3),
        ("m7-t2", -7, 2),
        ("p0-t1a", 0, 1),
        ("p0-t1b", 0, 1),  # same time as p0-t1a: the id (scheduling order) decides
        ("m7-t1", -7, 1),
    ]
    if written == "one call each":
        ids = [await sched.run_after(d, note.options(priority=p), tag) for tag, p, d in plan]
    else:
        # A batch is written in claim order (_writers._in_claim_order): the ids returned
        # still follow the calls, and ties still go by scheduling order.
        ids = await sched.run_many([note.options(priority=p).call(t).after(d) for t, p, d in plan])
    rows = {r.id: r for r in await all_rows(app)}
    assert [(rows[i].args, rows[i].priority) for i in ids] == [({"tag": t}, p) for t, p, _ in plan]
    clock.advance(10)
    await app.executor(batch_size=2).run_until_idle()
    assert await effects(app) == ["m7-t1", "m7-t2", "p0-t1a", "p0-t1b", "p0-t3", "p5-t1"]


async def test_actions_are_claimed_by_priority_too(app: durafn.App, clock: FakeClock) -> None:
    order: list[str] = []

    @app.action
    async def act(ctx: ActionCtx, tag: str) -> None:
        order.append(tag)

    for tag, priority in [("low", 10), ("mid", 0), ("high", -10)]:
        await app.scheduler().run_after(1, act.options(priority=priority), tag)
    clock.advance(2)
    await app.executor(concurrency=1).run_until_idle()
    assert order == ["high", "mid", "low"]


async def test_priority_never_runs_a_future_row_early(app: durafn.App, clock: FakeClock) -> None:
    @app.mutation
    async def note(ctx: MutationCtx, tag: str) -> None:
        ctx.db.add(Effect(key=tag))

    await app.scheduler().run_after(60, note.options(priority=-100), "urgent-but-later")
    await app.scheduler().run_after(0, note.options(priority=100), "lowly-but-due")
    executor = app.executor()
    await executor.run_until_idle()
    assert await effects(app) == ["lowly-but-due"]
    assert await executor.next_due() == clock.now() + 60
    clock.advance(60)
    await executor.run_until_idle()
    assert await effects(app) == ["lowly-but-due", "urgent-but-later"]


# -- options: layers, rows, errors ------------------------------------------------------


async def test_options_layer_call_over_decorator_over_queue(app: durafn.App) -> None:
    app = durafn.App(app.engine.url.render_as_string(hide_password=False), clock=app.clock)
    app._rt.queues["mail"] = Queue(priority=-10)

    @app.action(queue="mail", flags=["email"])
    async def send(ctx: ActionCtx, to: str) -> None:
        pass

    try:
        plain = await app.scheduler().run_after(0, send, "a@example.com")
        custom = await app.scheduler().run_after(
            0, send.options(priority=3, key="welcome:1", flags=["email", "bulk"]), "b"
        )
        elsewhere = await app.scheduler().run_after(0, send.options(queue="user:1"), "c")
        first, second, third = [await row_of(app, i) for i in (plain, custom, elsewhere)]
        assert (first.queue, first.priority, first.flags, first.key) == (
            "mail",
            -10,  # the queue's default priority
            ["email"],
            None,
        )
        assert (second.queue, second.priority, second.flags, second.key) == (
            "mail",
            3,
            ["bulk", "email"],
            "welcome:1",
        )
        assert (third.queue, third.priority) == ("user:1", 0)
        assert send.job_options.priority is None  # options() left the reference alone
        assert [r.id for r in (await app.list(flag="bulk")).items] == [custom]
        assert [r.id for r in (await app.list(queue="mail")).items] == [plain, custom]
        assert [r.id for r in (await app.list(key="welcome:1")).items] == [custom]
    finally:
        await app.aclose()


BAD_OPTIONS: list[tuple[dict[str, object], str]] = [
    ({"priority": "high"}, "priority must be an integer"),
    ({"priority": 2**40}, "priority must be an integer between"),
    ({"priority": True}, "priority must be an integer"),
    ({"queue": ""}, "queue must be a non-empty name"),
    ({"queue": "x" * 256}, "at most 255"),
    ({"queue": "mail,sms"}, "'mail,sms' has a comma or a space at an end"),
    ({"queue": "mail "}, "'mail ' has a comma or a space at an end"),
    ({"key": ""}, "key must be a non-empty string"),
    ({"key_mode": "overwrite"}, "key_mode must be one of replace, preserve_run_at"),
    ({"flags": "urgent"}, "flags must be a list or set of strings"),
    ({"flags": ["a,b"]}, "is not a flag"),
    ({"flags": [7]}, "is not a flag"),
]


async def test_bad_options_are_typed_errors_and_write_nothing(app: durafn.App) -> None:
    @app.mutation
    async def noop(ctx: MutationCtx) -> None:
        pass

    for n, (options, message) in enumerate(BAD_OPTIONS):
        with pytest.raises(durafn.OptionError, match=message):
            await app.scheduler().run_after(0, noop.options(**options))  # type: ignore[arg-type, call-overload]
        with pytest.raises(durafn.RegistrationError, match=message):
            app.mutation(name=f"other{n}", **options)  # type: ignore[call-overload]
    assert await all_rows(app) == []


async def test_a_queue_name_with_a_space_inside_is_served_by_name(app: durafn.App) -> None:
    """The other side of the comma and end-space rule: a space inside a name is fine, and
    an executor given the name (as ``--queues`` passes it, stripped) serves its rows."""

    @app.mutation
    async def noop(ctx: MutationCtx) -> None:
        pass

    sid = await app.scheduler().run_after(0, noop.options(queue="user:1 eu"))
    await app.executor(queues=["user:1 eu"]).run_until_idle()
    row = await app.get(sid)
    assert row is not None and row.state is State.SUCCESS
    with pytest.raises(durafn.ArgumentError, match="has a comma or a space at an end"):
        app.executor(queues=["mail,sms"])


async def test_a_key_mode_without_a_key_is_refused_when_scheduled(app: durafn.App) -> None:
    @app.mutation
    async def noop(ctx: MutationCtx) -> None:
        pass

    with pytest.raises(durafn.OptionError, match="without a key"):
        await app.scheduler().run_after(0, noop.options(key_mode="preserve_run_at"))
    assert await all_rows(app) == []


# -- named queues -----------------------------------------------------------------------


async def test_a_serial_queue_runs_one_row_at_a_time_in_queue_order(app: durafn.App) -> None:
    running = 0
    most = 0
    order: list[str] = []

    @app.action
    async def step(ctx: ActionCtx, tag: str) -> None:
        nonlocal running, most
        running += 1
        most = max(most, running)
        order.append(tag)
        for _ in range(5):  # let every other claimed action start meanwhile
            await anyio.lowlevel.checkpoint()
        running -= 1

    @app.mutation
    async def note(ctx: MutationCtx, tag: str) -> None:
        order.append(tag)

    sched = app.scheduler()
    serial = step.options(queue="account:1")
    await sched.run_after(0, serial, "a1")
    await sched.run_after(0, note.options(queue="account:1"), "m2")  # a mutation in line
    await sched.run_after(0, serial.options(priority=-1), "a0")  # queue order is priority too
    await sched.run_after(0, serial, "a3")
    executor = app.executor(concurrency=8)
    await executor.run_until_idle()
    assert order == ["a0", "a1", "m2", "a3"]
    assert most == 1
    [queue] = await app.queues()
    assert (queue.name, queue.concurrency, queue.pending, queue.running) == ("account:1", 1, 0, 0)


async def test_an_ending_action_hands_its_queue_to_the_next_without_a_claim(
    app: durafn.App,
) -> None:
    """Each row of a serial queue is started by its predecessor's finish (one
    transaction), not by a claim. Deterministic: between the finish and the start there
    is no commit in which the queue is free, so a claim never finds it so."""
    order: list[int] = []

    @app.action
    async def step(ctx: ActionCtx, n: int) -> None:
        order.append(n)

    await app.scheduler().run_many([step.options(queue="serial").call(n) for n in range(6)])
    driver = app._rt.driver
    handed: list[str] = []
    claimed = 0
    hand_off, claim_actions = driver.hand_off, driver.claim_actions

    async def counted_hand_off(*args: Any, **kwargs: Any) -> Any:
        rows = await hand_off(*args, **kwargs)
        handed.extend(r.id for r in rows)
        return rows

    async def counted_claim(*args: Any, **kwargs: Any) -> Any:
        nonlocal claimed
        rows = await claim_actions(*args, **kwargs)
        claimed += len(rows)
        return rows

    driver.hand_off = counted_hand_off  # type: ignore[method-assign]
    driver.claim_actions = counted_claim  # type: ignore[method-assign]
    try:
        async with app.run_executor(concurrency=4) as executor:
            with anyio.fail_after(CEILING):
                await executor.wait_until_idle()
    finally:
        del driver.hand_off, driver.claim_actions
    assert order == list(range(6))
    rows = sorted(await all_rows(app), key=lambda r: r.args["n"])
    assert [r.state for r in rows] == [State.SUCCESS] * 6
    assert handed == [r.id for r in rows[1:]]
    assert claimed == 1  # the first row


async def test_a_next_row_a_stopping_pool_refuses_goes_back_to_pending(app: durafn.App) -> None:
    """The stop can begin while a finish is handing a queue on: the pool refuses the
    row the finish started, which is then returned to Pending, never run and never lost."""

    @app.action
    async def step(ctx: ActionCtx, n: int) -> None:
        pass

    first, second = await app.scheduler().run_many(
        [step.options(queue="q").call(n) for n in range(2)]
    )
    executor = app.executor()
    claims, finisher = executor._claims, executor._finisher
    [row] = await claims.claim(5)
    assert row.id == first

    offered: list[str] = []

    class Stopping:
        def room(self) -> int:
            return 1  # asked before the finish's transaction: not stopping yet

        def accept(self, rows: list[Any]) -> bool:
            offered.extend(r.id for r in rows)
            return False  # ... and stopping once it has committed

    finisher.successors = Stopping()
    await finisher.write([Outcome(first, State.SUCCESS, queue="q")])
    assert offered == [second]
    by_id = {r.id: r for r in await all_rows(app)}
    assert (by_id[first].state, by_id[second].state) == (State.SUCCESS, State.PENDING)
    assert by_id[second].attempts == 0
    assert claims.idle  # nothing of this worker's left to record


async def test_rows_of_one_queue_run_one_after_another_in_a_mutation_batch(
    app: durafn.App,
) -> None:
    @app.mutation
    async def note(ctx: MutationCtx, tag: str) -> None:
        ctx.db.add(Effect(key=tag))

    calls = [note.options(queue="q").call(f"q{n}") for n in range(5)]
    calls += [note.call(f"free{n}") for n in range(3)]
    await app.scheduler().run_many(calls)
    executor = app.executor(batch_size=64)
    assert await executor.run_until_idle() == 8
    queued = [e for e in await effects(app) if e.startswith("q")]
    assert queued == [f"q{n}" for n in range(5)]


# -- order under a background executor (docs/concepts/executor.md#order) ---------------


async def _run_in_the_background(
    app: durafn.App, clock: FakeClock, *, lanes: int, steps: int
) -> None:
    """A background executor with ``lanes`` mutation lanes and 8 action workers, while
    the clock moves on 10 ms at a time for ``steps`` steps (each a wake-up), then until
    nothing is left."""
    async with app.run_executor(mutation_lanes=lanes, concurrency=8) as executor:
        with anyio.fail_after(CEILING):
            for _ in range(steps):
                clock.advance(0.01)
                for _ in range(10):  # the woken lanes and workers claim meanwhile
                    await anyio.lowlevel.checkpoint()
            await executor.wait_until_idle()


async def test_a_serial_queue_starts_its_rows_in_order_across_lanes_and_workers(
    app: durafn.App, clock: FakeClock
) -> None:
    """The one strict order: a serial queue's rows, mutations and actions in one line,
    due 10 ms apart, each start only once the one before has ended, while four mutation
    lanes and eight action workers run unqueued rows due at the same times beside them
    (those may start in any order across lanes: the issue's ``41, 43, 42, 44``)."""
    events: list[tuple[str, int]] = []
    free: list[int] = []

    @app.mutation(name="order:queued_m")
    async def queued_m(ctx: MutationCtx, n: int) -> None:
        events.append(("start", n))
        await ctx.db.execute(select(func.count()).select_from(Effect))  # a round trip
        events.append(("end", n))

    @app.action(name="order:queued_a")
    async def queued_a(ctx: ActionCtx, n: int) -> None:
        events.append(("start", n))
        for _ in range(5):  # every other running row may go on meanwhile
            await anyio.lowlevel.checkpoint()
        events.append(("end", n))

    @app.mutation(name="order:free")
    async def unqueued(ctx: MutationCtx, n: int) -> None:
        free.append(n)
        await ctx.db.execute(select(func.count()).select_from(Effect))

    queued = [(queued_m if n % 3 else queued_a).options(queue="line") for n in range(30)]
    calls = [ref.call(n).after(0.01 * n) for n, ref in enumerate(queued)]
    calls += [unqueued.call(n).after(0.01 * (n // 2)) for n in range(60)]
    await app.scheduler().run_many(calls)
    await _run_in_the_background(app, clock, lanes=4, steps=30)
    expected = [(what, n) for n in range(30) for what in ("start", "end")]
    assert events == expected
    assert sorted(free) == list(range(60))  # each once; in no promised order across lanes
    rows = [r for r in await all_rows(app) if r.queue == "line"]
    assert all(r.state is State.SUCCESS for r in rows)


@pytest.mark.parametrize("lanes", [1, 4])
async def test_mutations_start_in_claim_order_where_batches_cannot_overlap(
    app: durafn.App, clock: FakeClock, engine_name: str, lanes: int
) -> None:
    """Claim order, in the background: priority, then due time, then the order written.
    One lane runs its batches one after another, each in claim order; so do any number
    of lanes on SQLite, where a batch holds the one write lock. Four lanes on PostgreSQL
    run their batches at once: nothing is promised across them, and nothing asserted."""
    if lanes > 1 and engine_name == "postgres":
        pytest.skip("PostgreSQL's lanes run their batches at once: no order across them")
    started: list[str] = []

    @app.mutation(name="order:note")
    async def note(ctx: MutationCtx, tag: str) -> None:
        started.append(tag)
        await ctx.db.execute(select(func.count()).select_from(Effect))  # a round trip

    # Two rows due at each instant, 10 ms apart, every fifth at a higher priority (a
    # lower number), written last to first: none of the expected orders.
    plan = [(f"{n:03}", -1 if n % 5 == 0 else 0, 0.01 * (n // 2)) for n in range(80)]
    written = list(reversed(plan))
    await app.scheduler().run_many(
        [note.options(priority=p).call(t).after(d) for t, p, d in written]
    )
    clock.advance(1)  # every row due
    await _run_in_the_background(app, clock, lanes=lanes, steps=1)
    order = sorted(written, key=lambda row: (row[1], row[2], written.index(row)))
    assert started == [tag for tag, _, _ in order]


async def test_a_queue_with_concurrency_3_never_runs_more_than_3(
    app: durafn.App, db_url: str, clock: FakeClock
) -> None:
    limited = durafn.App(db_url, clock=clock, queues={"pool": Queue(concurrency=3)})
    running = 0
    most = 0

    @limited.action
    async def work(ctx: ActionCtx, n: int) -> None:
        nonlocal running, most
        running += 1
        most = max(most, running)
        for _ in range(5):
            await anyio.lowlevel.checkpoint()
        running -= 1

    try:
        await limited.scheduler().run_many([work.options(queue="pool").call(n) for n in range(10)])
        async with limited.run_executor(concurrency=10) as executor:
            with anyio.fail_after(CEILING):
                await executor.wait_until_idle()
        assert most == 3
        rows = await all_rows(limited)
        assert [r.state for r in rows] == [State.SUCCESS] * 10
        [queue] = await limited.queues()
        assert queue.concurrency == 3
    finally:
        await limited.aclose()


async def test_a_paused_queue_keeps_its_rows_pending_until_resumed(app: durafn.App) -> None:
    @app.mutation
    async def note(ctx: MutationCtx, tag: str) -> None:
        ctx.db.add(Effect(key=tag))

    assert await app.pause_queue("reports") == 1  # before its first row
    assert await app.pause_queue("reports") == 0
    held = await app.scheduler().run_after(0, note.options(queue="reports"), "held")
    await app.scheduler().run_after(0, note.options(queue="other"), "other")
    await app.scheduler().run_after(0, note, "free")
    executor = app.executor()
    await executor.run_until_idle()
    assert sorted(await effects(app)) == ["free", "other"]
    assert (await row_of(app, held)).state is State.PENDING
    reports = {q.name: q for q in await app.queues()}["reports"]
    assert (reports.paused, reports.due, reports.pending) == (True, 1, 1)
    assert await app.resume_queue("reports") == 1
    await executor.run_until_idle()
    assert (await row_of(app, held)).state is State.SUCCESS


def test_a_bad_queue_attribute_is_an_option_error_naming_it() -> None:
    """Both ends of the documented ranges are accepted; one step out is refused."""
    assert Queue(concurrency=1).concurrency == 1
    assert Queue(concurrency=100_000).concurrency == 100_000
    makers: list[tuple[Callable[[], object], str]] = [
        (lambda: Queue(concurrency=0), "Queue concurrency must be an integer between 1 and"),
        (lambda: Queue(concurrency=100_001), "Queue concurrency must be an integer between 1"),
        (lambda: Queue(priority="high"), "Queue priority must be an integer"),  # type: ignore[arg-type]
        (lambda: Queue(flow=Flow(key="k")), "cannot be in a queue with a concurrency limit"),
    ]
    for make, message in makers:
        with pytest.raises(durafn.OptionError, match=message):
            make()


async def test_a_queue_paused_before_any_row_or_worker_keeps_its_declared_concurrency(
    app: durafn.App, db_url: str, clock: FakeClock
) -> None:
    """The pause creates the queue as its first row would: with the app's ``Queue``
    concurrency (it was created serial, and read so until a worker started)."""
    declaring = durafn.App(db_url, clock=clock, queues={"mail": Queue(concurrency=2)})

    @declaring.action
    async def send(ctx: ActionCtx, to: str) -> None:
        pass

    try:
        assert await declaring.pause_queue("mail", "undeclared") == 2
        await declaring.scheduler().run_after(3600, send.options(queue="mail"), "x")
        found = {q.name: (q.concurrency, q.paused) for q in await declaring.queues()}
        assert found == {"mail": (2, True), "undeclared": (1, True)}
    finally:
        await declaring.aclose()


# -- flags and pools --------------------------------------------------------------------


async def test_a_worker_skips_rows_with_forbidden_flags(app: durafn.App) -> None:
    @app.mutation
    async def note(ctx: MutationCtx, tag: str) -> None:
        ctx.db.add(Effect(key=tag))

    @app.action(flags=["heavy"])
    async def crunch(ctx: ActionCtx) -> None:
        pass

    heavy = await app.scheduler().run_after(0, note.options(flags=["heavy", "x"]), "heavy")
    heavy_queued = await app.scheduler().run_after(
        0, note.options(flags=["heavy"], queue="q"), "heavy-q"
    )
    crunching = await app.scheduler().run_after(0, crunch)
    await app.scheduler().run_after(0, note.options(flags=["light"]), "light")
    await app.executor(forbidden_flags=["heavy"]).run_until_idle()
    assert await effects(app) == ["light"]
    for id in (heavy, heavy_queued, crunching):
        assert (await row_of(app, id)).state is State.PENDING
    await app.executor().run_until_idle()
    assert sorted(await effects(app)) == ["heavy", "heavy-q", "light"]


@pytest.mark.parametrize("rows", ["unqueued", "queued", "keyed"])
async def test_flags_are_exact_strings(app: durafn.App, rows: str) -> None:
    """As Graphile's forbiddenFlags: ``bulk`` is not ``Bulk`` (SQLite's LIKE once took
    them for one), and ``a_b`` is not ``axb`` (nor is ``%`` anything but itself)."""

    @app.mutation
    async def note(ctx: MutationCtx, tag: str) -> None:
        ctx.db.add(Effect(key=tag))

    classes: dict[str, dict[str, Any]] = {
        "unqueued": {},
        "queued": {"queue": "q"},
        "keyed": {"flow": durafn.Flow(key="k", concurrency=5)},
    }
    where = classes[rows]
    for flag in ("Bulk", "axb", "a-b"):
        await app.scheduler().run_after(0, note.options(flags=[flag], **where), flag)
    assert [r.flags for r in (await app.list(flag="bulk")).items] == []
    assert [r.flags for r in (await app.list(flag="Bulk")).items] == [["Bulk"]]
    assert [r.flags for r in (await app.list(flag="a_b")).items] == []
    await app.executor(forbidden_flags=["bulk", "a_b", "a.b"]).run_until_idle()
    assert sorted(await effects(app)) == ["Bulk", "a-b", "axb"]


async def test_a_worker_with_queues_serves_only_those(app: durafn.App) -> None:
    @app.mutation
    async def note(ctx: MutationCtx, tag: str) -> None:
        ctx.db.add(Effect(key=tag))

    for queue in ("mail", "reports", None):
        await app.scheduler().run_after(0, note.options(queue=queue), str(queue))
    await app.executor(queues=["mail"]).run_until_idle()
    assert await effects(app) == ["mail"]
    await app.executor(queues=["reports", "mail"]).run_until_idle()
    assert await effects(app) == ["mail", "reports"]
    await app.executor().run_until_idle()  # no queue option: every queue, and unqueued rows
    assert await effects(app) == ["mail", "reports", "None"]


# -- job keys ---------------------------------------------------------------------------


async def test_replace_updates_the_pending_holder_and_returns_its_id(
    app: durafn.App, clock: FakeClock
) -> None:
    @app.mutation
    async def note(ctx: MutationCtx, tag: str) -> None:
        ctx.db.add(Effect(key=tag))

    keyed = note.options(key="sync:1")
    first = await app.scheduler().run_after(60, keyed, "old")
    second = await app.scheduler().run_after(30, keyed.options(priority=4), "new")
    assert second == first
    [row] = await all_rows(app)
    assert (row.args, row.priority, row.key) == ({"tag": "new"}, 4, "sync:1")
    assert row.scheduled_time.timestamp() == clock.now() + 30
    kept = await app.scheduler().run_after(90, keyed.options(key_mode="preserve_run_at"), "kept")
    [row] = await all_rows(app)
    assert kept == first and row.args == {"tag": "kept"}
    assert row.scheduled_time.timestamp() == clock.now() + 30  # not attempted: time kept
    clock.advance(30)
    await app.executor().run_until_idle()
    assert await effects(app) == ["kept"]


async def test_a_finished_or_running_holder_gives_its_key_up_to_a_new_row(
    app: durafn.App, clock: FakeClock
) -> None:
    release = anyio.Event()
    started = anyio.Event()

    @app.action
    async def slow(ctx: ActionCtx, n: int) -> None:
        if n == 0:
            started.set()
            await release.wait()

    @app.mutation
    async def fail(ctx: MutationCtx, n: int) -> None:
        raise ValueError("no")

    keyed = slow.options(key="k")
    running = await app.scheduler().run_after(0, keyed, 0)
    async with app.run_executor() as executor:
        with anyio.fail_after(CEILING):
            await started.wait()
        replacement = await app.scheduler().run_after(60, keyed, 1)
        release.set()
        with anyio.fail_after(CEILING):
            await executor.wait_until_idle()
    assert replacement != running
    old, new = await row_of(app, running), await row_of(app, replacement)
    assert (old.state, old.key) == (State.SUCCESS, None)  # gave its key up while running
    assert (new.state, new.key) == (State.PENDING, "k")

    # Failed and Canceled holders keep their key until a replace takes it...
    failing = await app.scheduler().run_after(0, fail.options(key="f"), 0)
    await app.executor().run_until_idle()
    assert (await row_of(app, failing)).key == "f"
    # ... and unsafe_dedupe returns them as they are: nothing new runs.
    dedupe = fail.options(key="f", key_mode="unsafe_dedupe")
    assert await app.scheduler().run_after(0, dedupe, 1) == failing
    again = await app.scheduler().run_after(0, fail.options(key="f"), 2)
    assert again != failing and (await row_of(app, failing)).key is None
    await app.cancel(again)
    third = await app.scheduler().run_after(0, fail.options(key="f"), 3)
    assert third not in (again, failing)

    # A Success row holds no key: every mode writes a new row.
    done = await app.scheduler().run_after(0, slow.options(key="s"), 5)
    clock.advance(1)
    await app.executor().run_until_idle()
    assert (await row_of(app, done)).state is State.SUCCESS
    fresh = await app.scheduler().run_after(0, slow.options(key="s", key_mode="unsafe_dedupe"), 6)
    assert fresh != done and (await row_of(app, done)).key == "s"


async def test_unsafe_dedupe_keeps_the_pending_holder_unchanged(app: durafn.App) -> None:
    @app.mutation
    async def note(ctx: MutationCtx, tag: str) -> None:
        pass

    first = await app.scheduler().run_after(10, note.options(key="d"), "first")
    dedupe = note.options(key="d", key_mode="unsafe_dedupe", priority=9)
    assert await app.scheduler().run_after(0, dedupe, "second") == first
    [row] = await all_rows(app)
    assert (row.args, row.priority) == ({"tag": "first"}, 0)


async def test_racing_schedulers_on_one_key_leave_one_pending_row(app: durafn.App) -> None:
    release = anyio.Event()
    started = anyio.Event()

    @app.action
    async def hold(ctx: ActionCtx, n: int) -> None:
        if n < 0:
            started.set()
            await release.wait()

    ids: list[str] = []

    async def schedule(n: int) -> None:
        # Later, so that no executor takes the new holder while the others race.
        ids.append(await app.scheduler().run_after(60, hold.options(key="race"), n))

    # Against a Pending holder, and then against an InProgress one (the give-up path).
    async with anyio.create_task_group() as tg:
        for n in range(12):
            tg.start_soon(schedule, n)
    assert len(set(ids)) == 1
    await app.cancel(ids[0])
    await app.scheduler().run_after(0, hold.options(key="race"), -1)
    async with app.run_executor() as executor:
        with anyio.fail_after(CEILING):
            await started.wait()
        ids.clear()
        async with anyio.create_task_group() as tg:
            for n in range(12):
                tg.start_soon(schedule, 100 + n)
        assert len(set(ids)) == 1
        pending = (await app.list(state=State.PENDING, key="race")).items
        assert [r.id for r in pending] == ids[:1]
        release.set()
        with anyio.fail_after(CEILING):
            await executor.wait_until_idle()


async def test_a_keyed_schedule_in_a_mutation_commits_or_rolls_back_with_it(
    app: durafn.App,
) -> None:
    @app.mutation
    async def note(ctx: MutationCtx, tag: str) -> None:
        pass

    @app.mutation
    async def plan(ctx: MutationCtx, fail: bool) -> str:
        await ctx.scheduler.run_after(0, note, "before")
        id = await ctx.scheduler.run_after(5, note.options(key="plan"), "keyed")
        again = await ctx.scheduler.run_after(9, note.options(key="plan"), "replaced")
        assert again == id
        if fail:
            raise RuntimeError("abort")
        return id

    with pytest.raises(RuntimeError):
        await app.run_mutation(plan, True)
    assert await all_rows(app) == []
    id = await app.run_mutation(plan, False)
    rows = {r.args["tag"]: r for r in await all_rows(app)}
    assert sorted(rows) == ["before", "replaced"] and rows["replaced"].id == id


# -- batches ----------------------------------------------------------------------------


async def test_run_many_schedules_calls_of_several_functions_with_their_options(
    app: durafn.App, clock: FakeClock
) -> None:
    @app.mutation
    async def note(ctx: MutationCtx, tag: str) -> None:
        ctx.db.add(Effect(key=tag))

    @app.action
    async def ping(ctx: ActionCtx, n: int = 0) -> None:
        pass

    ids = await app.scheduler().run_many(
        [
            note.call("now"),
            note.options(priority=-1, key="k").call(tag="keyed").after(5),
            ping.options(queue="q").call(3).at(clock.now() + 60),
            ping.call(),
        ]
    )
    rows = {r.id: r for r in await all_rows(app)}
    assert [rows[i].name for i in ids] == [note.name, note.name, ping.name, ping.name]
    assert rows[ids[1]].key == "k" and rows[ids[1]].priority == -1
    assert rows[ids[2]].queue == "q"
    assert rows[ids[2]].scheduled_time.timestamp() == clock.now() + 60
    again = await app.scheduler().run_many([note.options(key="k").call("again")])
    assert again == [ids[1]]


async def test_run_many_in_a_mutation_that_raises_writes_nothing(app: durafn.App) -> None:
    @app.mutation
    async def note(ctx: MutationCtx, tag: str) -> None:
        pass

    @app.mutation
    async def fan_out(ctx: MutationCtx, n: int) -> None:
        await ctx.scheduler.run_many([note.call(str(i)) for i in range(n)])
        await ctx.scheduler.run_many([note.options(key="k", queue="q").call("k")])
        raise RuntimeError("abort")

    with pytest.raises(RuntimeError):
        await app.run_mutation(fan_out, 500)
    assert await all_rows(app) == []
    with pytest.raises(durafn.SchedulingLimitError, match="at most 1000 functions"):
        await app.run_mutation(fan_out, 1001)
    assert await all_rows(app) == []


async def test_run_many_refuses_bad_batches_and_writes_nothing(app: durafn.App) -> None:
    @app.mutation
    async def note(ctx: MutationCtx, tag: str) -> None:
        pass

    sched = app.scheduler()
    with pytest.raises(durafn.OptionError, match="unsafe_dedupe"):
        await sched.run_many([note.options(key="k", key_mode="unsafe_dedupe").call("a")])
    with pytest.raises(durafn.OptionError, match="appears twice"):
        await sched.run_many([note.options(key="k").call("a"), note.options(key="k").call("b")])
    with pytest.raises(durafn.ArgumentError, match="invalid arguments"):
        await sched.run_many([note.call("a"), note.call(5)])  # type: ignore[arg-type]
    with pytest.raises(durafn.SchedulingError, match="item 1"):
        await sched.run_many([note.call("a"), "note"])  # type: ignore[list-item]
    with pytest.raises(durafn.SchedulingLimitError, match="one call from outside"):
        await sched.run_many([note.call("x")] * 10_001)
    assert await all_rows(app) == []
    assert await sched.run_many([]) == []


async def test_queues_lists_each_queue_with_its_rows(app: durafn.App, clock: FakeClock) -> None:
    @app.mutation
    async def note(ctx: MutationCtx, tag: str) -> None:
        pass

    await app.scheduler().run_many(
        [note.options(queue="a").call("1"), note.options(queue="a").call("2").after(60)]
    )
    async with app.engine.connect() as conn:
        assert (
            await conn.execute(
                select(func.count()).select_from(durafn.metadata.tables["_durafn_queues"])
            )
        ).scalar() == 1
    [a] = await app.queues()
    assert (a.name, a.due, a.pending, a.running, a.paused) == ("a", 1, 2, 0, False)


def test_each_job_option_is_declared_once_and_every_route_knows_it() -> None:
    """A job option is declared in ``JobOptionArgs`` (its type, for mypy) and checked by
    its entry in ``CHECKS``; ``JobOptions`` holds the checked values: the three name the
    same options. The SQL route takes some of them and refuses the others by name; the
    row's columns and the claim's are each declared once and derived (NewRowColumns,
    Claimed). docs/contributing.md lists the places a new option touches."""
    import re
    from dataclasses import fields

    from durafn._options import CHECKS, JobOptions
    from durafn._registry import JobOptionArgs
    from durafn._store.claim.columns import CLAIM_COLUMNS
    from durafn._store.postgres.schedule_function import FUNCTION
    from durafn._store.rows import NEW_ROW_COLUMNS, Claimed

    names = {f.name for f in fields(JobOptions)}
    assert names == set(CHECKS) == set(JobOptionArgs.__annotations__)
    taken = re.search(r"WHERE k NOT IN \(([^)]*)\)", FUNCTION)
    assert taken is not None
    in_sql = {n.strip(" '") for n in taken.group(1).split(",")} - {"kind"}
    assert in_sql <= names
    for name in in_sql:
        assert f"options ? '{name}'" in FUNCTION, name  # each one taken is checked
    assert [c.name for c in CLAIM_COLUMNS] == list(Claimed._fields)
    assert len(set(NEW_ROW_COLUMNS)) == len(NEW_ROW_COLUMNS)
