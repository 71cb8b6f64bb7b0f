"""Retry policies on both engines, driven by the fake clock: backoffs, mutations retried
with their effects committed once, actions retried after a failure, a time limit or a
lost worker, the history of failed runs, retry by hand, and bad policies.

The real-process case (an action's worker ``kill -9``ed, re-run once more under a
policy) is in ``test_workers.py``.
"""

from __future__ import annotations

import gc
import json
import math
import re
import weakref
from collections.abc import Callable
from pathlib import Path

import anyio
import pytest
from sqlalchemy.ext.asyncio import AsyncConnection

import durafn
from durafn import (
    DELAYED_JOB,
    GRAPHILE,
    ActionCtx,
    Exponential,
    Fixed,
    MutationCtx,
    NonRetryableError,
    OptionError,
    Retry,
    State,
)
from durafn._executor.retrying import decide, will_retry
from durafn._store import Outcome, new_id
from durafn._store.rows import RetryState
from durafn.testing import FakeClock

from .support.helpers import effects, has_beaten, row_of, wait_until
from .support.models import Effect
from .test_cli import invoke, invoke_json

pytestmark = pytest.mark.anyio


def test_backoffs_give_each_policys_delays() -> None:
    error = ValueError("x")
    plain = Exponential(base=2, factor=3, max_delay=100, jitter=0)
    assert [plain(n, error) for n in (1, 2, 3, 4, 5, 1000)] == [2, 6, 18, 54, 100, 100]
    spread = [Exponential(base=10, jitter=0.2)(1, error) for _ in range(200)]
    assert all(8 <= d <= 12 for d in spread) and len(set(spread)) > 100
    assert [Fixed(7)(n, error) for n in (1, 9)] == [7, 7]
    assert [GRAPHILE(n, error) for n in (1, 2, 10, 11)] == [
        math.exp(1),
        math.exp(2),
        math.exp(10),
        math.exp(10),
    ]
    assert [DELAYED_JOB(n, error) for n in (1, 2, 3)] == [6, 21, 86]
    seen: list[tuple[int, str]] = []

    def mine(attempt: int, err: BaseException) -> float:
        seen.append((attempt, str(err)))
        return 42.0

    rule = Retry(3, backoff=mine).rule()
    assert (rule.delay(1, error, None), rule.delay(2, error, None)) == (42.0, 42.0)
    assert rule.delay(3, error, None) is None  # the third run was the last
    assert rule.delay(2, error, max_attempts=2) is None  # the row's own limit decides
    assert seen == [(1, "x"), (2, "x")]


def test_whether_a_failure_is_retried_is_known_before_its_transaction(tmp_path: Path) -> None:
    """``will_retry`` (what the action finisher sends a batch as: one statement on
    PostgreSQL when its failures are all retried) says what ``decide`` will do in the
    batch's transaction; a row whose retry state was not read with its claim is not
    known to be retried."""
    app = durafn.App(f"sqlite+aiosqlite:///{tmp_path / 'unused.sqlite3'}")
    policy = Retry(3, give_up_on=(KeyError,)).to_json()
    cases = [
        (RetryState("f", policy, None, 0), ValueError("x"), True),  # attempts left
        (RetryState("f", policy, None, 2), ValueError("x"), False),  # the third run was the last
        (RetryState("f", policy, 5, 2), ValueError("x"), True),  # the row's own limit
        (RetryState("f", policy, None, 0), KeyError("x"), False),  # give_up_on
        (RetryState("f", policy, None, 0), NonRetryableError("x"), False),
        (RetryState("f", None, None, 0), ValueError("x"), False),  # no policy anywhere
    ]
    for state, error, retried in cases:
        outcome = Outcome(new_id(0), State.FAILED, error=error, retry_state=state)
        assert will_retry(app._rt, outcome) is retried, (state, error)
        decide(app._rt, 100.0, outcome, state)
        assert (outcome.state, outcome.retry_at is not None) == (
            (State.PENDING, True) if retried else (State.FAILED, False)
        )
    unknown = Outcome(new_id(0), State.FAILED, error=ValueError("x"))
    assert not will_retry(app._rt, unknown)


async def test_a_retried_mutation_commits_its_effects_once_on_its_success(
    app: durafn.App, clock: FakeClock
) -> None:
    start = clock.now()

    @app.mutation(retry=Retry(3, backoff=Fixed(10)))
    async def flaky(ctx: MutationCtx) -> str:
        ctx.db.add(Effect(key=f"at {clock.now() - start:g}"))
        if clock.now() < start + 20:
            raise ValueError(f"not yet at {clock.now() - start:g}")
        return "done"

    sid = await app.scheduler().run_after(0, flaky)
    executor = app.executor()
    await executor.run_until_idle()
    row = await row_of(app, sid)
    assert (row.state, row.failures, row.max_attempts) == (State.PENDING, 1, 3)
    assert row.error is not None and row.error.message == "not yet at 0"
    assert await executor.next_due() == start + 10
    assert await effects(app) == []  # the failed run left nothing
    clock.advance(10)
    await executor.run_until_idle()
    assert (await row_of(app, sid)).failures == 2
    clock.advance(10)
    await executor.run_until_idle()
    row = await row_of(app, sid)
    assert (row.state, row.result, row.failures) == (State.SUCCESS, "done", 2)
    assert await effects(app) == ["at 20"]  # once, by the run that succeeded
    assert [(h.error.message, h.retry_at and h.retry_at.timestamp()) for h in row.history] == [
        ("not yet at 0", start + 10),
        ("not yet at 10", start + 20),
    ]
    assert executor.stats["retried"] == 2 and executor.stats["mutations"] == 1


async def test_the_last_attempt_fails_the_row_with_its_error_and_every_one_is_kept(
    app: durafn.App, clock: FakeClock
) -> None:
    @app.action(retry=Retry(2, backoff=Fixed(5)))
    async def broken(ctx: ActionCtx, n: int) -> None:
        raise RuntimeError(f"broken {n} at {clock.now():g}")

    sid = await app.scheduler().run_after(0, broken, n=1)
    executor = app.executor()
    await executor.run_until_idle()
    clock.advance(5)
    await executor.run_until_idle()
    row = await row_of(app, sid)
    assert (row.state, row.failures, row.attempts) == (State.FAILED, 2, 2)
    assert row.error is not None and row.error.message == f"broken 1 at {clock.now():g}"
    history = row.history
    assert [(h.attempt, h.error.type) for h in history] == [
        (1, "RuntimeError"),
        (2, "RuntimeError"),
    ]
    # The worker that ran each (a new id for every run of the executor).
    assert all(h.worker_id and h.worker_id.startswith(executor.worker_id[:-8]) for h in history)
    assert history[0].retry_at is not None and history[1].retry_at is None
    # The traceback is kept for the final failure (on the row and in its history).
    assert history[0].error.traceback is None
    assert history[1].error.traceback is not None and "broken" in history[1].error.traceback
    assert row.error.traceback == history[1].error.traceback
    assert executor.stats["failed"] == 1


async def test_a_failed_run_lets_go_of_its_frames_and_the_last_keeps_its_traceback(
    app: durafn.App, clock: FakeClock
) -> None:
    """Outcomes wait for their batch's write; what a failed run's frames held must not
    wait with them (the cyclic collector would have to find it). With the collector off,
    an object local to the failing mutation is gone once each run is recorded."""
    locals_seen: list[weakref.ref[object]] = []

    class Local:
        pass

    @app.mutation(retry=Retry(2, backoff=Fixed(0)))
    async def flaky(ctx: MutationCtx) -> None:
        local = Local()
        locals_seen.append(weakref.ref(local))
        raise RuntimeError("down")

    sid = await app.scheduler().run_after(0, flaky)
    gc.disable()
    try:
        await app.executor().run_until_idle()  # retried at once, then failed for good
        alive = [ref() is not None for ref in locals_seen]
    finally:
        gc.enable()
    assert alive == [False, False]
    row = await row_of(app, sid)
    assert (row.state, row.failures) == (State.FAILED, 2)
    assert row.error is not None and row.error.traceback is not None
    assert "in flaky" in row.error.traceback and "RuntimeError: down" in row.error.traceback
    assert [h.error.traceback is None for h in row.history] == [True, False]


@pytest.mark.parametrize(
    ("policy", "raised", "runs"),
    [
        (Retry(4, retry_on=(KeyError,)), KeyError("k"), 4),
        (Retry(4, retry_on=(KeyError,)), ValueError("v"), 1),
        (Retry(4, give_up_on=(ValueError,)), ValueError("v"), 1),
        (Retry(4, give_up_on=(ValueError,)), UnicodeError("u"), 1),  # a ValueError too
        (Retry(4), NonRetryableError("stop"), 1),
        (Retry(4), durafn.DurafnError("durafn's own"), 4),
    ],
    ids=["retry_on", "not retry_on", "give_up_on", "give_up_on subclass", "NonRetryable", "any"],
)
async def test_which_errors_are_retried(
    app: durafn.App, clock: FakeClock, policy: Retry, raised: Exception, runs: int
) -> None:
    ran = 0

    @app.mutation
    async def fails(ctx: MutationCtx) -> None:
        nonlocal ran
        ran += 1
        raise raised

    sid = await app.scheduler().run_after(0, fails.options(retry=policy))
    executor = app.executor()
    for _ in range(6):
        await executor.run_until_idle()
        clock.advance(3600)
    row = await row_of(app, sid)
    assert (row.state, row.failures, len(row.history)) == (State.FAILED, runs, runs)
    assert ran >= runs  # an optimistic batch re-runs a raising mutation with savepoints


async def test_an_action_without_a_policy_runs_once_and_the_app_policy_applies_to_others(
    app: durafn.App, db_url: str, clock: FakeClock
) -> None:
    runs: list[str] = []
    retrying = durafn.App(db_url, clock=clock, retry=Retry(2, backoff=Fixed(1)))
    try:
        for each in (app, retrying):

            @each.action(name="sends")
            async def sends(ctx: ActionCtx, to: str) -> None:
                runs.append(to)
                raise ConnectionError("the mail server is down")

            sid = await each.scheduler().run_after(0, sends, to=str(each is retrying))
            for _ in range(3):
                await each.executor().run_until_idle()
                clock.advance(1)
            assert (await row_of(each, sid)).state is State.FAILED
    finally:
        await retrying.aclose()
    assert runs == ["False", "True", "True"]


async def test_an_action_past_its_time_limit_is_retried(app: durafn.App, clock: FakeClock) -> None:
    runs = 0

    @app.action(timeout=0.05, retry=Retry(2, backoff=Fixed(1)))
    async def slow(ctx: ActionCtx) -> str:
        nonlocal runs
        runs += 1
        if runs == 1:
            await anyio.Event().wait()
        return "second time"

    sid = await app.scheduler().run_after(0, slow)
    await app.executor().run_until_idle()
    row = await row_of(app, sid)
    assert row.state is State.PENDING
    assert row.error is not None and row.error.type == "durafn.FunctionTimeoutError"
    clock.advance(1)
    await app.executor().run_until_idle()
    assert (await row_of(app, sid)).result == "second time"


async def test_an_action_cut_off_by_a_stop_is_retried(app: durafn.App, clock: FakeClock) -> None:
    started = anyio.Event()
    runs = 0

    @app.action(retry=Retry(2, backoff=Fixed(1)))
    async def stuck_once(ctx: ActionCtx) -> int:
        nonlocal runs
        runs += 1
        if runs == 1:
            started.set()
            await anyio.Event().wait()
        return runs

    sid = await app.scheduler().run_after(0, stuck_once)
    async with app.run_executor(grace_period=0.05):
        await started.wait()
    row = await row_of(app, sid)
    assert row.state is State.PENDING  # delayed_job's raise_signal_exceptions
    assert row.error is not None and row.error.type == "durafn.ExecutorShutdownError"
    clock.advance(1)
    await app.executor().run_until_idle()
    assert (await row_of(app, sid)).result == 2


async def test_a_lost_worker_s_action_with_a_policy_goes_back_to_pending(
    app: durafn.App, clock: FakeClock
) -> None:
    runs: list[str] = []

    @app.action(retry=Retry(3, backoff=Fixed(30)))
    async def victim(ctx: ActionCtx) -> None:
        runs.append(str(ctx.run_id))

    errors: list[tuple[str, str | None]] = []

    @victim.on("error")
    def lost(event: durafn.HookEvent) -> None:  # in the rescuing worker
        errors.append((event.error.type if event.error else "", str(event.state)))

    sid = await app.scheduler().run_after(0, victim)
    rt = app._rt

    async def _claim(conn: AsyncConnection) -> None:  # a worker that then dies silently
        now = rt.clock.now()
        await rt.driver.register_worker(conn, "elsewhere:1:dead", "elsewhere", 1, 1, now)
        assert [r.id for r in await rt.driver.claim_actions(conn, now, 10, "elsewhere:1:dead")]

    await rt.transaction(_claim)
    options: durafn.ExecutorOptions = {"heartbeat_interval": 1.0, "worker_timeout": 5.0}
    async with app.run_executor(**options) as rescuer:
        for _ in range(7):  # past the timeout, one heartbeat at a time
            clock.advance(1)
            await wait_until(
                lambda: has_beaten(app, rescuer.worker_id, clock.now()), "a beat", interval=0.005
            )
        await wait_until(lambda: _retried(app, sid), "the action is rescued", interval=0.005)
        row = await row_of(app, sid)
        assert row.error is not None and row.error.type == "durafn.WorkerLostError"
        assert [h.worker_id for h in row.history] == ["elsewhere:1:dead"]
        assert errors == [("durafn.WorkerLostError", str(State.PENDING))]
        assert runs == []  # not before its backoff
        clock.advance(30)
        await rescuer.wait_for(sid)
    assert runs == [sid]  # once more, by the rescuer


async def test_a_lost_worker_s_retried_action_still_holds_back_the_rows_after_it(
    app: durafn.App, clock: FakeClock
) -> None:
    """Its rescue puts it straight back to Pending: through Failed, a final state, the
    release trigger freed the rows waiting for it, which then ran before it ran again (a
    join in ``make soak`` found its dependencies Pending), and counted a failure on a
    row that cancels when one does."""
    runs: list[str] = []

    @app.action(retry=Retry(3, backoff=Fixed(30)))
    async def victim(ctx: ActionCtx) -> None:
        runs.append("victim")

    @app.mutation
    async def then(ctx: MutationCtx, tag: str) -> None:
        runs.append(tag)

    sched = app.scheduler()
    sid = await sched.run_after(0, victim)
    waiting = await sched.run_after(0, then.options(after=[sid]), "run")
    cancels = await sched.run_after(0, then.options(after=[sid], after_policy="cancel"), "cancel")
    rt = app._rt

    async def _claim(conn: AsyncConnection) -> None:  # a worker that then dies silently
        now = rt.clock.now()
        await rt.driver.register_worker(conn, "elsewhere:1:dead", "elsewhere", 1, 1, now)
        assert [r.id for r in await rt.driver.claim_actions(conn, now, 10, "elsewhere:1:dead")]

    await rt.transaction(_claim)
    options: durafn.ExecutorOptions = {"heartbeat_interval": 1.0, "worker_timeout": 5.0}
    async with app.run_executor(**options) as rescuer:
        for _ in range(7):  # past the timeout, one heartbeat at a time
            clock.advance(1)
            await wait_until(
                lambda: has_beaten(app, rescuer.worker_id, clock.now()), "a beat", interval=0.005
            )
        await wait_until(lambda: _retried(app, sid), "the action is rescued", interval=0.005)
        for row in (waiting, cancels):
            assert (await app.explain(row)).reason == "awaiting"
        assert runs == []
        clock.advance(30)
        await rescuer.wait_for(waiting)
        await rescuer.wait_for(cancels)
    assert runs[0] == "victim" and sorted(runs[1:]) == ["cancel", "run"]


async def _retried(app: durafn.App, id: str) -> bool:
    row = await app.get(id)
    return row is not None and row.state is State.PENDING and row.failures == 1


async def test_retry_puts_failed_rows_back_for_a_fresh_set_of_attempts(
    app: durafn.App, clock: FakeClock
) -> None:
    fixed = anyio.Event()

    @app.mutation(retry=Retry(2, backoff=Fixed(1)))
    async def needs_fix(ctx: MutationCtx) -> str:
        if not fixed.is_set():
            raise LookupError("missing config")
        return "ok"

    sid = await app.scheduler().run_after(0, needs_fix)
    other = await app.scheduler().run_after(3600, needs_fix)
    executor = app.executor()
    for _ in range(2):
        await executor.run_until_idle()
        clock.advance(1)
    assert (await row_of(app, sid)).state is State.FAILED
    assert await app.retry([sid, other, "not-an-id"]) == [sid]  # only Failed rows move
    row = await row_of(app, sid)
    assert (row.state, row.failures, len(row.history)) == (State.PENDING, 0, 2)
    await executor.run_until_idle()  # a fresh set: two more failures before Failed
    assert (await row_of(app, sid)).state is State.PENDING
    fixed.set()
    clock.advance(1)
    await executor.run_until_idle()
    row = await row_of(app, sid)
    assert (row.state, row.result, len(row.history)) == (State.SUCCESS, "ok", 3)
    assert await app.reschedule([other], max_attempts=5) == 1
    assert (await row_of(app, other)).max_attempts == 5
    # Retention deletes a row, its history with it.
    clock.advance(60)
    assert await app.delete_finished(completed_before=clock.now_datetime()) == 1
    assert await app.get(sid) is None


async def test_bad_policies_are_typed_errors_and_write_nothing(app: durafn.App) -> None:
    @app.action
    async def act(ctx: ActionCtx) -> None:
        pass

    makers: list[tuple[Callable[[], object], str]] = [
        (lambda: Retry(0), "max_attempts must be an integer from 1"),
        (lambda: Retry(2, backoff="fast"), "backoff must be"),  # type: ignore[arg-type]
        (lambda: Retry(2, retry_on=ValueError), "retry_on must be a tuple"),  # type: ignore[arg-type]
        (lambda: Exponential(factor=0.5), "factor must be between 1 and 100"),
        (lambda: Fixed(-1), "Fixed seconds must be a number of seconds"),
        (lambda: Exponential(jitter=1), r"jitter must be in \[0, 1\)"),
    ]
    for make, message in makers:
        with pytest.raises(OptionError, match=message):  # a job option's error, as the rest
            make()
    with pytest.raises(OptionError, match=r"retry must be a durafn\.Retry"):
        act.options(retry=3)  # type: ignore[arg-type]
    with pytest.raises(OptionError, match="declare a backoff function on the decorator"):
        act.options(retry=Retry(2, backoff=lambda n, e: 1.0))
    with pytest.raises(durafn.RegistrationError, match=r"retry must be a durafn\.Retry"):
        app.mutation(retry="always")  # type: ignore[call-overload]
    with pytest.raises(durafn.ArgumentError, match=r"retry must be a durafn\.Retry"):
        durafn.App("sqlite+aiosqlite:///:memory:", retry=5)  # type: ignore[arg-type]
    assert (await app.list()).items == []


def test_the_cli_shows_the_history_and_retries_failed_rows(db_url: str) -> None:
    """Sync: the CLI runs its own event loop."""
    app = durafn.App(db_url)

    @app.mutation(name="cli:fails")
    async def fails(ctx: MutationCtx) -> None:
        raise KeyError("no such account")

    async def _fail() -> durafn.ScheduledFunctionId:
        try:
            await app.migrate()
            sid = await app.scheduler().run_after(0, fails)
            await app.executor().run_until_idle()
            return sid
        finally:
            await app.aclose()

    sid = anyio.run(_fail)
    shown = invoke("show", sid, "--url", db_url).stdout
    assert re.search(r"attempt 1 at \S+ on \S+: KeyError: 'no such account' \(not retried\)", shown)
    history = invoke_json("show", sid, "--url", db_url)["history"]
    assert [(h["attempt"], h["error"]["type"], h["retry_at"]) for h in history] == [
        (1, "KeyError", None)
    ]
    # An id that matches no row exits 1, as cancel does; one not Failed is named.
    missing = "01900000-0000-7000-8000-000000000000"
    mixed = invoke("retry", sid, "not-an-id", missing, "--url", db_url, "--json")
    assert mixed.exit_code == 1
    assert json.loads(mixed.stdout) == {
        "retried": [sid],
        "not_failed": [],
        "not_found": ["not-an-id", missing],
    }
    assert "'not-an-id' is not a scheduled function id" in mixed.stderr
    again = invoke("retry", sid, "--url", db_url)
    assert again.exit_code == 0
    assert (
        again.stdout
        == f"0 Failed rows put back to Pending\n{sid}: Pending, not Failed; left as it is\n"
    )
    row = invoke_json("show", sid, "--url", db_url)
    assert (row["state"], row["failures"], len(row["history"])) == ("Pending", 0, 1)
