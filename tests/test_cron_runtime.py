"""Crons at run time, on both engines, under the fake clock: each tick written once
whichever executors race for it, the lease, catch-up after downtime, overlap, and the
reconciliation of declarations with the registry."""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar
from zoneinfo import ZoneInfo

import anyio
import pytest
from sqlalchemy import select

import durafn
from durafn import MutationCtx, State
from durafn.cron import daily, every, hourly, monthly, weekly
from durafn.testing import FakeClock, advance

from .apps import cron_app
from .support.helpers import effects, wait_until
from .support.models import Effect
from .test_cli import invoke, invoke_json

pytestmark = pytest.mark.anyio

crons_table = durafn.metadata.tables["_durafn_crons"]
T = TypeVar("T")


async def registry(app: durafn.App) -> dict[str, dict[str, Any]]:
    async with app.engine.connect() as conn:
        rows = await conn.execute(select(crons_table))
        return {row.name: dict(row._mapping) for row in rows}


def _report(app: durafn.App) -> durafn.MutationRef[[str], None]:
    @app.mutation(name="report")
    async def report(ctx: MutationCtx, what: str) -> None:
        ctx.db.add(Effect(key=f"{what} {ctx.now().isoformat(timespec='minutes')}"))

    return report


def _at(hour: int, minute: int = 0) -> float:
    return datetime(2030, 1, 1, hour, minute, tzinfo=UTC).timestamp()


async def test_each_tick_is_written_once_whichever_executors_race(
    app: durafn.App, clock: FakeClock
) -> None:
    """Four executors race at every tick of a simulated week (every 4 hours: 42 ticks;
    the lease lapses between ticks, so any of them may lead at each: the tick's id and
    the guarded move of the cron keep it to one row)."""
    report = _report(app)
    app.cron("report-4h", "0 */4 * * *", report.call("sales"), description="sales")
    executors = [app.executor() for _ in range(4)]
    await executors[0].run_until_idle()  # registers it: next run at 04:00
    for n in range(1, 43):
        clock.set(_at(0) + n * 4 * 3600)
        async with anyio.create_task_group() as tg:  # four at once, at the same moment
            for executor in executors:
                tg.start_soon(executor.run_until_idle)
    ticks = await effects(app)
    assert len(ticks) == 42 == len(set(ticks))
    assert (
        ticks[0] == "sales 2030-01-01T04:00+00:00" and ticks[-1] == "sales 2030-01-08T00:00+00:00"
    )
    cron = (await registry(app))["report-4h"]
    assert (cron["run_count"], cron["last_run_at"]) == (42, _at(0) + 7 * 86400)
    assert cron["next_run_at"] == _at(4) + 7 * 86400 and cron["description"] == "sales"
    rows = [r for r in (await app.list(limit=100)).items if r.name == "report"]
    assert len(rows) == 42 and all(r.state is State.SUCCESS for r in rows)


async def test_after_downtime_the_latest_missed_tick_runs_once(
    app: durafn.App, clock: FakeClock
) -> None:
    report = _report(app)
    app.cron("catches-up", hourly(minute=0), report.call("latest"))
    app.cron("skips", hourly(minute=0), report.call("none"), catch_up="none")
    executor = app.executor()
    await executor.run_until_idle()
    clock.set(_at(5, 30))  # down from 00:00 to 05:30: five ticks missed
    await executor.run_until_idle()
    assert await effects(app) == ["latest 2030-01-01T05:30+00:00"]  # run once, now
    [row] = (await app.list(name="report")).items
    assert row.scheduled_time.timestamp() == _at(5)  # for the latest missed tick
    found = await registry(app)
    assert found["catches-up"]["next_run_at"] == found["skips"]["next_run_at"] == _at(6)
    assert found["skips"]["last_skip_reason"] == "missed"
    clock.set(_at(6))
    await executor.run_until_idle()
    assert sorted(await effects(app))[-2:] == [
        "latest 2030-01-01T06:00+00:00",
        "none 2030-01-01T06:00+00:00",
    ]


@pytest.mark.parametrize(
    ("schedule", "step", "down", "fill"),
    [
        ("* * * * * *", 1.0, timedelta(hours=28), timedelta(minutes=2)),  # 100,800 missed
        ("* * * * *", 60.0, timedelta(days=70), timedelta(hours=3)),  # 100,800 missed
        ("@every 1s", 1.0, timedelta(days=400), timedelta(minutes=5)),
    ],
    ids=["per-second-28h", "per-minute-70d", "every-second-400d"],
)
async def test_after_a_long_downtime_catch_up_counts_from_now(
    app: durafn.App,
    clock: FakeClock,
    schedule: str,
    step: float,
    down: timedelta,
    fill: timedelta,
) -> None:
    """More than 100,000 ticks missed: the latest is the one just before now (not one
    hours stale), a backfill writes its window's ticks (not nothing, recorded missed),
    and each goes on from now; each row runs."""

    @app.mutation(name="report")
    async def report(ctx: MutationCtx, what: str) -> None:
        pass

    app.cron("latest", schedule, report.call("latest"))
    app.cron("fill", schedule, report.call("fill"), backfill=fill)
    executor = app.executor()
    await executor.run_until_idle()
    back_at = clock.now() + down.total_seconds() + step / 2  # between two ticks
    clock.set(back_at)
    await executor.run_until_idle()
    latest = back_at - step / 2
    written = (await app.list(name="report", limit=10_000)).items
    rows = {
        name: [r.scheduled_time.timestamp() for r in written if r.args["what"] == name]
        for name in ("latest", "fill")
    }
    assert rows["latest"] == [latest]
    window = fill.total_seconds()
    expected_fill = [latest - n * step for n in range(int(window // step), -1, -1)]
    assert rows["fill"] == [t for t in expected_fill if t >= back_at - window]
    assert {r.state for r in written} == {State.SUCCESS}
    found = await registry(app)
    for name in ("latest", "fill"):
        assert found[name]["next_run_at"] == latest + step
        assert found[name]["last_run_at"] == latest
        assert found[name]["last_skip_reason"] is None


async def test_a_backfill_longer_than_its_schedule_allows_is_refused(app: durafn.App) -> None:
    report = _report(app)
    with pytest.raises(
        durafn.RegistrationError,
        match=r"1 day, 4:00:00 may hold 100,800 ticks .* at most 1 day, 3:46:40",
    ):
        app.cron("dense", "* * * * * *", report.call("x"), backfill=timedelta(hours=28))
    app.cron("dense", "* * * * * *", report.call("x"), backfill=timedelta(hours=27))
    with pytest.raises(durafn.RegistrationError, match="at most 69 days, 10:40:00"):
        app.cron("minutes", "* * * * *", report.call("x"), backfill=timedelta(days=366))
    app.cron("minutes", "* * * * *", report.call("x"), backfill=timedelta(days=69))
    app.cron("daily", daily(hour=3), report.call("x"), backfill=timedelta(days=366))


async def test_a_tick_is_skipped_while_the_previous_run_waits(
    app: durafn.App, clock: FakeClock
) -> None:
    @app.mutation(name="queued", queue="held")
    async def queued(ctx: MutationCtx, n: int) -> None:
        pass

    app.cron("skipper", every(minutes=1), queued.call(1))
    app.cron("allower", every(minutes=1), queued.call(2), overlap="allow")
    told: list[tuple[str, str | None, int | None, str | None]] = []

    @app.on("cron.triggered")
    @app.on("cron.skipped")
    def tell(event: durafn.HookEvent) -> None:
        told.append((event.hook, event.cron, event.run_count, event.reason))

    await app.pause_queue("held")  # their rows stay Pending
    executor = app.executor()
    await executor.run_until_idle()
    for _ in range(3):
        clock.advance(60)
        await executor.run_until_idle()
    found = await registry(app)
    assert (found["skipper"]["run_count"], found["allower"]["run_count"]) == (1, 3)
    assert found["skipper"]["last_skip_reason"] == "overlap_skip"
    assert sorted(told, key=str) == sorted(
        [("cron.triggered", "allower", n, None) for n in (1, 2, 3)]
        + [("cron.triggered", "skipper", 1, None)]
        + [("cron.skipped", "skipper", None, "overlap_skip")] * 2,
        key=str,
    )
    pending = [r.args["n"] for r in (await app.list(state=State.PENDING)).items]
    assert sorted(pending) == [1, 2, 2, 2]
    lags: list[float] = []
    app.on("cron.triggered")(
        lambda e: lags.append(e.actual_at.timestamp() - e.scheduled_at.timestamp())
    )
    clock.advance(75)  # the next tick was due 60 s on: written 15 s late
    await executor.run_until_idle()
    assert lags == [15.0]


async def test_declarations_are_reconciled_when_an_executor_starts(
    app: durafn.App, db_url: str, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    report = _report(app)
    app.cron("kept", daily(hour=9), report.call("a"))
    app.cron("dropped", weekly("mon", hour=9), report.call("b"))
    await app.executor().run_until_idle()
    assert set(await registry(app)) == {"kept", "dropped"}
    async with durafn.App(db_url, clock=clock) as again:  # the next deploy
        report2 = _report(again)
        again.cron("kept", daily(hour=10), report2.call("a"), timezone="Europe/London")
        again.cron("new", monthly(day=1), report2.call("c"), enabled=False)
        with caplog.at_level(logging.INFO, logger="durafn.cron"):
            caplog.clear()  # only this executor's reconciliation
            await again.executor().run_until_idle()
        found = await registry(again)
    assert set(found) == {"kept", "new"}
    assert (found["kept"]["schedule"], found["kept"]["timezone"]) == ("0 10 * * *", "Europe/London")
    assert found["kept"]["next_run_at"] == _at(10)  # 10:00 in London is 10:00 UTC in January
    assert found["new"]["next_run_at"] is None  # disabled
    logged = {r.getMessage() for r in caplog.records if r.name == "durafn.cron"}
    assert logged == {"cron changed kept", "cron added new", "cron removed dropped"}


async def test_bad_declarations_are_refused(app: durafn.App) -> None:
    report = _report(app)
    bad: Any = "sometimes"
    for kwargs, message in [
        ({"name": "Bad Name"}, "a cron's name is"),
        ({"schedule": "61 * * * *"}, "61"),
        ({"timezone": "EST"}, "EST"),
        ({"overlap": bad}, "overlap must be one of skip, allow"),
        ({"catch_up": bad}, "catch_up must be one of latest, none"),
        ({"call": report.call("x").after(5)}, "no .after"),
        ({"tz": "UTC"}, "app.cron: no setting 'tz'; the settings are timezone, overlap"),
    ]:
        args: dict[str, Any] = {"name": "ok", "schedule": hourly(), "call": report.call("x")}
        args.update(kwargs)
        with pytest.raises(durafn.RegistrationError, match=message):
            app.cron(args.pop("name"), args.pop("schedule"), args.pop("call"), **args)
    with pytest.raises(durafn.ArgumentError, match="invalid arguments"):
        app.cron("typed", hourly(), report.call(5))  # type: ignore[arg-type]
    app.cron("once", hourly(), report.call("x"))
    with pytest.raises(durafn.RegistrationError, match="already declared"):
        app.cron("once", hourly(), report.call("x"))
    with pytest.raises(durafn.CronSyntaxError, match="minute must be an integer from 0 to 59"):
        hourly(minute=60)
    assert (every(hours=1, minutes=30), weekly("fri", hour=17)) == ("@every 1h30m", "0 17 * * fri")


async def test_a_running_executor_writes_the_ticks_as_they_fall_due(
    app: durafn.App, clock: FakeClock
) -> None:
    report = _report(app)
    app.cron("background", hourly(minute=0), report.call("bg"))
    async with app.run_executor():
        for hour in (1, 2):
            clock.set(_at(hour))  # wakes the cron loop, which sleeps on the app's clock
            await wait_until(functools.partial(_has_effects, app, hour), f"{hour}:00 ran")
    assert await effects(app) == ["bg 2030-01-01T01:00+00:00", "bg 2030-01-01T02:00+00:00"]


async def _has_effects(app: durafn.App, count: int) -> bool:
    return len(await effects(app)) == count


def test_the_registry_from_the_api_and_the_command_line(db_url: str, clock: FakeClock) -> None:
    """The command line runs its own event loop: this test is synchronous, and each use of
    the app is an ``anyio.run`` of its own (with an app of its own: a PostgreSQL pool
    belongs to one event loop)."""

    def on_app(body: Callable[[durafn.App], Awaitable[T]]) -> T:
        async def _run() -> T:
            async with cron_app.make_app(db_url, clock) as app:
                return await body(app)

        return anyio.run(_run)

    async def _registered(app: durafn.App) -> list[durafn.CronInfo]:
        await app.migrate()
        await app.executor().run_until_idle()  # reconciles: the cron is registered
        return await app.crons()

    assert invoke("migrate", "--url", db_url).exit_code == 0
    none_yet = invoke("crons", "--url", db_url)  # before any worker of the app started
    assert none_yet.exit_code == 0, none_yet.output
    assert "no crons registered" in none_yet.stdout
    assert "registered when a worker of it starts" in none_yet.stdout
    [info] = on_app(_registered)
    assert (info.name, info.function, info.args) == ("nightly-digest", "cron:digest", {"to": "ops"})
    assert info.describe.startswith("at 02:00") and info.next_run_at == to_dt(_at(2))
    assert [c["name"] for c in invoke_json("crons", "--url", db_url)] == ["nightly-digest"]
    assert "nightly-digest" in invoke("crons", "--url", db_url).stdout
    assert invoke("cron", "disable", "nightly-digest", "--url", db_url).exit_code == 0
    [info] = on_app(lambda app: app.crons(enabled=False))
    assert info.next_run_at is None
    on_app(lambda app: app.enable_cron("nightly-digest"))
    found = on_app(lambda app: app.get_cron("nightly-digest"))
    assert found is not None and found.enabled and found.next_run_at == to_dt(_at(2))
    url = ["--url", db_url, "--app", "tests.apps.cron_app:app"]
    triggered = invoke_json("cron", "trigger", "nightly-digest", *url)
    row = on_app(lambda app: app.get(triggered["id"]))
    assert row is not None and row.name == "cron:digest" and row.args == {"to": "ops"}
    assert invoke("cron", "remove", "nightly-digest", "--url", db_url).exit_code == 0
    assert on_app(lambda app: app.crons()) == []
    missing = invoke("cron", "remove", "nightly-digest", "--url", db_url)
    assert missing.exit_code == 1 and "no cron named 'nightly-digest'" in missing.stderr
    with pytest.raises(durafn.ArgumentError, match="no cron named 'nope'"):
        on_app(lambda app: app.disable_cron("nope"))


async def test_a_triggered_run_carries_everything_a_tick_carries(
    app: durafn.App, clock: FakeClock
) -> None:
    """The cron's options (queue, priority, retry, key, flags), its overlap policy, and a
    CronTick marked as triggered; it counts as a run, and the schedule goes on."""
    seen: list[durafn.CronTick] = []
    fired: list[tuple[str | None, int | None]] = []

    @app.mutation(name="digest", queue="digests", retry=durafn.Retry(3), flags=["report"])
    async def digest(ctx: MutationCtx, to: str, tick: durafn.CronTick | None = None) -> None:
        assert tick is not None
        seen.append(tick)

    app.on("cron.triggered")(lambda e: fired.append((e.reason, e.run_count)))
    keyed = digest.options(priority=-7, key="digest", key_mode="preserve_run_at")
    app.cron("digest", daily(hour=2), keyed.call("ops"), overlap="allow")
    app.cron("skipping", daily(hour=3), digest.call("skip"), overlap="skip")
    executor = app.executor()
    await executor.run_until_idle()  # registers them
    id = await app.trigger_cron("digest")
    row = await app.get(id)
    assert row is not None
    assert (row.queue, row.priority, row.key, row.flags, row.max_attempts) == (
        "digests",
        -7,
        "digest",
        ["report"],
        3,
    )
    assert row.scheduled_time.timestamp() == clock.now()
    # A second trigger before it ran replaces it, as a tick with that key would.
    assert await app.trigger_cron("digest") == id
    await executor.run_until_idle()
    assert [(t.ts.timestamp(), t.triggered, t.backfilled) for t in seen] == [
        (clock.now(), True, False)
    ]
    info = await app.get_cron("digest")
    assert info is not None and (info.run_count, info.last_row_id) == (2, id)
    assert info.next_run_at == to_dt(_at(2))  # the schedule goes on as it was
    assert fired == [("triggered", 1), ("triggered", 2)]
    # overlap="skip": refused while the previous run waits (its queue is paused).
    await app.pause_queue("digests")
    first = await app.trigger_cron("skipping")
    with pytest.raises(durafn.SchedulingError, match=f"previous run {first} is still Pending"):
        await app.trigger_cron("skipping")
    clock.set(_at(3))  # the tick itself is skipped for the same reason
    await executor.run_until_idle()
    skipped = await app.get_cron("skipping")
    assert skipped is not None and skipped.last_skip_reason == "overlap_skip"
    with pytest.raises(durafn.ArgumentError, match="no cron named 'nope'"):
        await app.trigger_cron("nope")


async def test_a_cron_disabled_by_hand_stays_disabled_until_enabled(
    app: durafn.App, db_url: str, clock: FakeClock
) -> None:
    """Across restarts with the same declaration, and changes of its other fields; a
    declaration whose ``enabled`` changes is a new decision, and clears the switch."""
    report = _report(app)
    app.cron("nightly", daily(hour=2), report.call("a"))
    await app.executor().run_until_idle()
    await app.disable_cron("nightly")

    async def deploy(schedule: str = daily(hour=2), enabled: bool = True) -> durafn.CronInfo:
        async with durafn.App(db_url, clock=clock) as again:
            again.cron("nightly", schedule, _report(again).call("a"), enabled=enabled)
            await again.executor().run_until_idle()
            info = await again.get_cron("nightly")
        assert info is not None
        return info

    for schedule in (daily(hour=2), daily(hour=4)):  # the same, then another schedule
        info = await deploy(schedule)
        assert (info.enabled, info.switched_by_hand, info.next_run_at) == (False, True, None)
        assert info.schedule == schedule
    clock.set(_at(5))
    await app.executor().run_until_idle()
    assert await effects(app) == []  # its 04:00 did not run
    await app.enable_cron("nightly")
    info = await deploy(daily(hour=4))
    assert (info.enabled, info.switched_by_hand) == (True, False)
    assert info.next_run_at == to_dt(_at(4) + 86400)
    # Enabled by hand against a declaration that says disabled: that holds too...
    info = await deploy(daily(hour=4), enabled=False)
    assert (info.enabled, info.next_run_at) == (False, None)
    await app.enable_cron("nightly")
    info = await deploy(daily(hour=4), enabled=False)
    assert (info.enabled, info.switched_by_hand) == (True, True)
    # ... until the declaration's enabled changes: the code decides again.
    info = await deploy(daily(hour=4), enabled=True)
    assert (info.enabled, info.switched_by_hand) == (True, False)
    await app.disable_cron("nightly")
    info = await deploy(daily(hour=4), enabled=False)
    assert (info.enabled, info.switched_by_hand) == (False, False)


def to_dt(t: float) -> datetime:
    return datetime.fromtimestamp(t, UTC)


async def test_cancel_previous_and_enqueue(
    app: durafn.App, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    @app.mutation(name="held", queue="held")
    async def held(ctx: MutationCtx) -> None:
        pass

    @app.mutation(name="plain")
    async def plain(ctx: MutationCtx) -> None:
        pass

    app.cron("replacer", every(minutes=1), held, overlap="cancel_previous")
    app.cron("queuer", every(minutes=1), plain, overlap="enqueue")
    await app.pause_queue("held")
    executor = app.executor()
    await executor.run_until_idle()
    clock.advance(60)
    await executor.run_until_idle()  # the first ticks: "queuer"'s ran, in its own queue
    await app.pause_queue("cron:queuer")
    with caplog.at_level(logging.WARNING, logger="durafn.cron"):
        for _ in range(3):
            clock.advance(60)
            await executor.run_until_idle()
    rows = (await app.list(limit=100)).items
    replaced = [r.state for r in rows if r.name == "held"]
    assert replaced == [State.CANCELED, State.CANCELED, State.CANCELED, State.PENDING]
    queued = [(r.queue, r.state) for r in rows if r.name == "plain"]
    assert queued == [("cron:queuer", State.SUCCESS)] + [("cron:queuer", State.PENDING)] * 3
    assert any("3 runs wait for the one before them" in r.getMessage() for r in caplog.records)
    with pytest.raises(durafn.RegistrationError, match="already has queue 'held'"):
        app.cron("bad", every(minutes=1), held, overlap="enqueue")


async def test_clocks_apart_or_stepped_back_write_no_tick_twice(
    app: durafn.App, db_url: str, clock: FakeClock
) -> None:
    """Two executors whose clocks are 5 s apart race on every tick for 10 minutes; then the
    clock steps back an hour and forward again: each tick is written once."""
    app.cron("minutely", every(minutes=1), _report(app).call("m"))
    ahead = FakeClock(start=clock.now() + 5)
    async with durafn.App(db_url, clock=ahead) as other:
        other.cron("minutely", every(minutes=1), _report(other).call("m"))
        await app.executor().run_until_idle()
        for _ in range(10):
            clock.advance(60)
            ahead.advance(60)
            async with anyio.create_task_group() as tg:
                tg.start_soon(app.executor().run_until_idle)
                tg.start_soon(other.executor().run_until_idle)
    assert len(await effects(app)) == 10
    clock.set(clock.now() - 3600)  # stepped back an hour: nothing is due
    await app.executor().run_until_idle()
    clock.set(clock.now() + 3600 + 60)
    await app.executor().run_until_idle()
    ticks = [r.scheduled_time for r in (await app.list(name="report", limit=100)).items]
    assert len(ticks) == len(set(ticks)) == 11


async def test_backfill_writes_every_missed_tick_and_a_cron_tick_says_which(
    app: durafn.App, clock: FakeClock
) -> None:
    seen: list[tuple[str, str, bool]] = []

    @app.mutation(name="hourly-sum")
    async def hourly_sum(ctx: MutationCtx, table: str, tick: durafn.CronTick | None = None) -> None:
        assert tick is not None  # the cron gives it
        seen.append((table, tick.ts.strftime("%H:%M"), tick.backfilled))

    app.cron("sums", hourly(), hourly_sum.call("sales"), backfill=timedelta(hours=3))
    executor = app.executor()
    await executor.run_until_idle()
    clock.set(_at(5, 30))  # down since 00:00: the ticks of the last three hours are filled
    await executor.run_until_idle()
    assert seen == [("sales", "03:00", True), ("sales", "04:00", True), ("sales", "05:00", False)]
    found = (await registry(app))["sums"]
    assert (found["run_count"], found["catch_up"], found["next_run_at"]) == (
        3,
        "fill:10800",
        _at(6),
    )
    with pytest.raises(durafn.RegistrationError, match="is given each tick"):
        app.cron("bad", hourly(), hourly_sum.call("x", tick=durafn.CronTick(ts=datetime.now(UTC))))
    with pytest.raises(durafn.RegistrationError, match="backfill must be a timedelta"):
        app.cron("bad", hourly(), hourly_sum.call("x"), backfill=timedelta(0))


async def test_a_graphile_crontab(app: durafn.App, clock: FakeClock) -> None:
    @app.mutation(name="send_digest")
    async def send_digest(ctx: MutationCtx, to: str, tick: durafn.CronTick | None = None) -> None:
        assert tick is not None
        ctx.db.add(Effect(key=f"{to} {tick.ts.strftime('%d %H:%M')} {tick.backfilled}"))

    names = app.crontab(
        """
        # Graphile Worker's format: UTC, its day rule, its options and a JSON5 payload.
        0 * * * * send_digest ?id=hourly-digest&max=3&queue=mail&priority=5 {to: 'ops'}
        30 4 */2 * * send_digest ?fill=1d {to: "every-other-day"}
        """
    )
    assert names == ["hourly-digest", "send_digest"]
    executor = app.executor()
    await executor.run_until_idle()
    clock.set(_at(1))
    await executor.run_until_idle()
    [row] = (await app.list(name="send_digest")).items
    assert (row.queue, row.priority, row.max_attempts) == ("mail", 5, 3)
    assert row.args["to"] == "ops" and row.args["tick"]["backfilled"] is False
    found = await registry(app)
    assert found["hourly-digest"]["source"] == found["send_digest"]["source"] == "crontab"
    assert (found["hourly-digest"]["catch_up"], found["send_digest"]["catch_up"]) == (
        "none",
        "fill:86400",
    )
    # Day 1 is odd (*/2 from 1): 04:30 on the 1st, then the 3rd; the 2nd never fires.
    assert found["send_digest"]["next_run_at"] == _at(4, 30)
    with pytest.raises(durafn.RegistrationError, match="no mutation or action of this app"):
        app.crontab("0 * * * * nobody_here")
    with pytest.raises(durafn.RegistrationError, match="Could not process line '1'"):
        app.crontab("every hour send_digest")


@pytest.mark.parametrize(
    ("bad", "error"),
    [
        ("0 * * * * nobody_here", "no mutation or action of this app is named 'nobody_here'"),
        ("0 * * * * send ?priority=99999999999", "crontab, cron 'send': priority"),
        ("0 * * * * send {to: 5}", "crontab, cron 'send': invalid arguments"),
        ("0 * * * * send ?id=taken", "cron 'taken': a cron named 'taken' is already declared"),
    ],
)
async def test_a_crontab_is_declared_whole_or_not_at_all(
    app: durafn.App, bad: str, error: str
) -> None:
    """As Graphile's parser takes the whole text or rejects it: a bad line anywhere (a
    task the app lacks, an option or a payload durafn refuses) declares none of them."""

    @app.mutation(name="send")
    async def send(ctx: MutationCtx, to: str = "ops") -> None:
        pass

    app.cron("taken", daily(hour=1), send)
    text = f"""
        0 4 * * * send ?id=first {{to: 'a'}}
        {bad}
        0 5 * * * send ?id=third
    """
    with pytest.raises(durafn.DurafnError, match=error):
        app.crontab(text)
    assert app.crontab("0 4 * * * send ?id=first") == ["first"]  # nothing else was kept
    await app.executor().run_until_idle()
    assert set(await registry(app)) == {"taken", "first"}


async def test_a_cron_registered_at_run_time_is_kept_by_reconciliation(
    app: durafn.App, clock: FakeClock
) -> None:
    report = _report(app)
    app.cron("declared", hourly(), report.call("d"))
    info = await app.register_cron("added-later", every(minutes=30), report.call("api"))
    assert (info.source, info.next_run_at) == ("api", to_dt(_at(0, 30)))
    again = await app.register_cron("added-later", every(minutes=15), report.call("api"))
    assert again.next_run_at == to_dt(_at(0, 15))  # an upsert: the new schedule
    await app.executor().run_until_idle()  # reconciles the declared ones; keeps it
    assert set(await registry(app)) == {"declared", "added-later"}
    clock.set(_at(0, 15))
    await app.executor().run_until_idle()
    assert await effects(app) == ["api 2030-01-01T00:15+00:00"]
    with pytest.raises(durafn.RegistrationError, match="is declared in code"):
        await app.register_cron("declared", hourly(), report.call("x"))
    bad_setting: Any = {"every": 5}
    with pytest.raises(durafn.RegistrationError, match="register_cron: no setting 'every'"):
        await app.register_cron("misspelt", hourly(), report.call("x"), **bad_setting)


async def test_a_cron_that_cannot_be_evaluated_is_disabled_and_the_others_go_on(
    app: durafn.App, clock: FakeClock
) -> None:
    report = _report(app)
    app.cron("fine", hourly(), report.call("fine"))
    await app.register_cron("broken", hourly(), report.call("broken"))  # not reconciled
    await app.executor().run_until_idle()
    async with app.engine.begin() as conn:  # as a later version might have stored it
        await conn.execute(
            crons_table.update().where(crons_table.c.name == "broken").values(schedule="61 * * * *")
        )
    clock.set(_at(1))
    await app.executor().run_until_idle()
    assert await effects(app) == ["fine 2030-01-01T01:00+00:00"]
    broken = await app.get_cron("broken")
    assert broken is not None and not broken.enabled and broken.next_run_at is None
    assert broken.last_skip_reason is not None
    assert broken.last_skip_reason.startswith("error: CronSyntaxError")


async def test_daylight_saving_days_skip_the_gap_with_a_report_and_fire_the_fold_once(
    app: durafn.App, clock: FakeClock
) -> None:
    report = _report(app)
    skipped: list[tuple[str | None, str | None, datetime | None]] = []

    @app.on("cron.skipped")
    def tell(event: durafn.HookEvent) -> None:
        skipped.append((event.cron, event.reason, event.scheduled_at))

    app.cron("ny", daily(hour=2, minute=30), report.call("ny"), timezone="America/New_York")
    app.cron("ldn", daily(hour=1, minute=30), report.call("ldn"), timezone="Europe/London")
    clock.set(utc(2030, 3, 9, 12))
    executor = app.executor()
    await executor.run_until_idle()
    # 2030-03-10 02:30 does not exist in New York: the next run is the 11th, 02:30 EDT.
    assert (await registry(app))["ny"]["next_run_at"] == utc(2030, 3, 11, 6, 30)
    clock.set(utc(2030, 3, 11, 6, 30))
    await executor.run_until_idle()
    gap = datetime(2030, 3, 10, 2, 30, tzinfo=ZoneInfo("America/New_York"))
    assert skipped == [("ny", "dst_skip", gap.astimezone(UTC))]  # reported, not silent
    assert (await registry(app))["ny"]["last_skip_reason"] == "dst_skip"
    # 2030-10-27 01:30 happens twice in London (BST, then GMT): it fires once, the first.
    clock.set(utc(2030, 10, 27, 0, 30))
    await executor.run_until_idle()
    ldn = (await registry(app))["ldn"]
    assert (ldn["last_run_at"], ldn["next_run_at"]) == (
        utc(2030, 10, 27, 0, 30),
        utc(2030, 10, 28, 1, 30),
    )


def utc(year: int, month: int, day: int, hour: int, minute: int = 0) -> float:
    return datetime(year, month, day, hour, minute, tzinfo=UTC).timestamp()


async def test_an_app_with_no_cron_in_code_runs_the_registered_ones(
    app: durafn.App, db_url: str, clock: FakeClock
) -> None:
    report = _report(app)
    await app.register_cron("from-the-api", every(minutes=10), report.call("api"))
    async with durafn.App(db_url, clock=clock) as worker:  # declares no cron
        _report(worker)
        clock.advance(600)
        await worker.executor().run_until_idle()
        async with worker.run_executor():  # the background loop finds it too
            clock.advance(600)
            await wait_until(functools.partial(_has_effects, app, 2), "the second tick ran")
    assert await effects(app) == ["api 2030-01-01T00:10+00:00", "api 2030-01-01T00:20+00:00"]


async def test_a_crontab_line_with_a_job_key_replaces_its_pending_row(
    app: durafn.App, clock: FakeClock
) -> None:
    @app.mutation(name="digest")
    async def digest(ctx: MutationCtx, to: str) -> None:
        pass

    app.crontab("* * * * * digest ?jobKey=the-digest&queue=held {to: 'ops'}")
    await app.pause_queue("held")  # the rows wait: each tick replaces the one before
    executor = app.executor()
    await executor.run_until_idle()
    for _ in range(3):
        clock.advance(60)
        await executor.run_until_idle()
    rows = (await app.list(name="digest")).items
    assert [(r.key, r.state) for r in rows] == [("the-digest", State.PENDING)]
    assert rows[0].scheduled_time.timestamp() == _at(0, 3)  # the latest tick's time


async def test_a_flowed_functions_ticks_carry_its_flow_key(
    app: durafn.App, clock: FakeClock
) -> None:
    @app.mutation(name="sync", flow=durafn.Flow(key=lambda a: f"tenant:{a['tenant']}"))
    async def sync(ctx: MutationCtx, tenant: int) -> None:
        pass

    app.cron("sync-7", every(minutes=1), sync.options(flow=durafn.Flow(key="fixed")).call(1))
    app.cron("sync-9", every(minutes=1), sync.call(9))
    executor = app.executor()
    await executor.run_until_idle()
    clock.advance(60)
    await executor.run_until_idle()
    rows = (await app.list(name="sync")).items
    assert sorted(r.flow_key or "" for r in rows) == ["fixed", "tenant:9"]
    # The key function sees the validated arguments (a datetime here), also for a
    # function that is given the tick.
    since_key = durafn.Flow(key=lambda a: f"since:{a['since'].year}")

    @app.mutation(name="catch_up", flow=since_key)
    async def catch_up(
        ctx: MutationCtx, since: datetime, tick: durafn.CronTick | None = None
    ) -> None:
        pass

    app.cron("catch-up", every(minutes=1), catch_up.call(datetime(2029, 1, 1, tzinfo=UTC)))
    executor = app.executor()  # a new one reconciles the new declaration
    await executor.run_until_idle()
    clock.advance(60)
    await executor.run_until_idle()
    [ticked] = (await app.list(name="catch_up")).items
    assert ticked.flow_key == "since:2029"
    slow = durafn.Flow(key="t", throttle=durafn.Throttle(per=60))
    with pytest.raises(durafn.RegistrationError, match="writes one row per tick already"):
        app.cron("sync-throttled", every(minutes=1), sync.options(flow=slow).call(1))


async def test_the_test_kit_steps_through_a_month_of_ticks(
    app: durafn.App, clock: FakeClock
) -> None:
    """``durafn.testing.advance`` stops at each tick (each run sees its own time), and at
    rows due between them; a row held back (a paused queue) does not stop it."""
    report = _report(app)
    app.cron("daily-report", daily(hour=6), report.call("daily"))
    app.cron("weekly-report", weekly(day="mon", hour=7), report.call("weekly"))
    await app.pause_queue("held")
    await app.scheduler().run_after(0, report.options(queue="held"), "held")
    await app.scheduler().run_after(86400 * 3 + 60, report, "once")
    executor = app.executor()
    ran = await advance(executor, clock, timedelta(days=31))
    runs = await effects(app)
    assert ran == len(runs) == 31 + 4 + 1  # January 2030: 31 days, 4 Mondays, the row
    assert runs[0] == "daily 2030-01-01T06:00+00:00" and "once 2030-01-04T00:01+00:00" in runs
    assert next(r for r in runs if r.startswith("weekly")) == "weekly 2030-01-07T07:00+00:00"
    assert clock.now() == _at(0) + 31 * 86400
