"""The cron operator's extras on both engines, under the fake clock: jitter (the row due
a little later, the tick written once), pause after consecutive failed ticks and resume,
``until`` and ``max_runs`` (both ends), skipping the next tick, and ``durafn crons --next``
with daylight saving marked."""

from __future__ import annotations

from datetime import UTC, datetime

import anyio
import pytest
from sqlalchemy import select

import durafn
from durafn import MutationCtx
from durafn.testing import FakeClock

from .support.helpers import effects
from .support.models import Effect
from .test_cli import invoke, invoke_json

pytestmark = pytest.mark.anyio

HOUR = 3600.0


def _at(hour: int, minute: int = 0, day: int = 1) -> float:
    return datetime(2030, 1, day, hour, minute, tzinfo=UTC).timestamp()


def _report(app: durafn.App) -> durafn.MutationRef[[str], None]:
    @app.mutation(name="report")
    async def report(ctx: MutationCtx, what: str) -> None:
        ctx.db.add(Effect(key=f"{what} {ctx.now().isoformat(timespec='minutes')}"))

    return report


async def test_jitter_spreads_each_tick_s_row_and_the_tick_is_written_once(
    app: durafn.App, clock: FakeClock
) -> None:
    clock.set(_at(0))
    report = _report(app)
    # overlap="allow": at each hour the previous tick's row may still wait for its offset.
    app.cron("spread", "0 * * * *", report.call("s"), jitter=600, overlap="allow")
    executors = [app.executor() for _ in range(3)]
    await executors[0].run_until_idle()
    for n in range(1, 7):
        clock.set(_at(0) + n * HOUR)
        async with anyio.create_task_group() as tg:  # three leaders race for each tick
            for executor in executors:
                tg.start_soon(executor.run_until_idle)
    sf = durafn.scheduled_functions
    async with app.engine.connect() as conn:
        found = await conn.execute(
            select(sf.c.scheduled_time, sf.c.available_at).where(sf.c.name == "report")
        )
        rows = found.all()
    assert len(rows) == 6  # one per tick, whoever wrote it
    assert all(tick % HOUR == 0 for tick, _ in rows)
    offsets = [due - tick for tick, due in rows]
    assert all(0 <= o <= 600 for o in offsets)
    assert len(set(offsets)) > 1  # spread, not one fixed delay
    clock.advance(600)
    await executors[0].run_until_idle()
    assert len(await effects(app)) == 6


async def test_a_cron_pauses_after_its_failed_ticks_and_resumes(
    app: durafn.App, clock: FakeClock
) -> None:
    clock.set(_at(0))
    failing = {"on": True}

    @app.mutation(name="flaky")
    async def flaky(ctx: MutationCtx) -> None:
        if failing["on"]:
            raise RuntimeError("the upstream is down")
        ctx.db.add(Effect(key=f"ok {ctx.now().isoformat(timespec='minutes')}"))

    app.cron("pausing", "0 * * * *", flaky, pause_after=2)
    executor = app.executor()
    await executor.run_until_idle()
    for hour in (1, 2):  # two ticks, each row Failed
        clock.set(_at(hour))
        await executor.run_until_idle()
    info = await app.get_cron("pausing")
    assert info is not None and info.failed_ticks == 1 and info.enabled  # the 2nd not yet judged
    clock.set(_at(3))
    await executor.run_until_idle()  # judges the 2nd: two in a row, paused; this tick skipped
    info = await app.get_cron("pausing")
    assert info is not None
    assert (info.enabled, info.switched_by_hand, info.next_run_at) == (False, True, None)
    assert (info.last_skip_reason, info.failed_ticks, info.run_count) == ("paused", 2, 2)
    clock.set(_at(5))
    await executor.run_until_idle()
    assert (await app.get_cron("pausing")).run_count == 2  # type: ignore[union-attr]
    failing["on"] = False
    await app.enable_cron("pausing")
    info = await app.get_cron("pausing")
    assert info is not None and (info.enabled, info.failed_ticks) == (True, 0)
    clock.set(_at(6))
    await executor.run_until_idle()
    assert await effects(app) == ["ok 2030-01-01T06:00+00:00"]


async def test_until_and_max_runs_end_a_cron_at_both_ends_of_their_ranges(
    app: durafn.App, clock: FakeClock
) -> None:
    clock.set(_at(0))
    report = _report(app)
    app.cron("once", "0 * * * *", report.call("once"), max_runs=1)
    app.cron("three", "0 * * * *", report.call("three"), max_runs=3)
    app.cron(
        "till", "0 * * * *", report.call("till"), until=datetime.fromtimestamp(_at(2, 30), UTC)
    )
    executor = app.executor()
    await executor.run_until_idle()
    for hour in range(1, 6):
        clock.set(_at(hour))
        await executor.run_until_idle()
    done = await effects(app)
    assert [e for e in done if e.startswith("once")] == ["once 2030-01-01T01:00+00:00"]
    assert len([e for e in done if e.startswith("three")]) == 3
    assert [e for e in done if e.startswith("till")] == [
        "till 2030-01-01T01:00+00:00",
        "till 2030-01-01T02:00+00:00",
    ]
    for name, runs in (("once", 1), ("three", 3), ("till", 2)):
        info = await app.get_cron(name)
        assert info is not None and (info.run_count, info.next_run_at) == (runs, None), name
    info = await app.get_cron("three")
    assert info is not None and info.max_runs == 3 and info.until is None


async def test_skip_next_tick(app: durafn.App, clock: FakeClock) -> None:
    clock.set(_at(0))
    report = _report(app)
    app.cron("hourly", "0 * * * *", report.call("h"))
    executor = app.executor()
    await executor.run_until_idle()
    skipped = await app.skip_next_tick("hourly")
    assert skipped.timestamp() == _at(1)
    info = await app.get_cron("hourly")
    assert info is not None and info.next_run_at is not None
    assert info.next_run_at.timestamp() == _at(2)
    assert info.last_skip_reason == "skipped_by_operator"
    clock.set(_at(1, 30))
    await executor.run_until_idle()
    assert await effects(app) == []
    clock.set(_at(2))
    await executor.run_until_idle()
    assert await effects(app) == ["h 2030-01-01T02:00+00:00"]
    with pytest.raises(durafn.ArgumentError, match="no cron named 'nope'"):
        await app.skip_next_tick("nope")
    await app.disable_cron("hourly")
    with pytest.raises(durafn.ArgumentError, match="no next tick to skip"):
        await app.skip_next_tick("hourly")


async def test_bad_extras_are_refused(app: durafn.App) -> None:
    report = _report(app)
    naive = datetime(2030, 1, 1)
    for settings, message in (
        ({"jitter": 0}, "jitter must be seconds, more than 0 and at most 86400"),
        ({"jitter": 86_400.5}, "jitter must be seconds"),
        ({"jitter": True}, "jitter must be seconds"),
        ({"max_runs": 0}, "max_runs must be an integer between 1 and"),
        ({"pause_after": 10_001}, "pause_after must be an integer between 1 and 10000"),
        ({"until": naive}, "until must be an aware datetime"),
    ):
        with pytest.raises(durafn.RegistrationError, match=message):
            app.cron("bad", "0 * * * *", report.call("x"), **settings)
    # The top of each range is accepted.
    app.cron(
        "top", "0 * * * *", report.call("x"), jitter=86_400, max_runs=10**9, pause_after=10_000
    )


def test_a_next_run_already_past_is_marked_missed_and_the_times_after_it_are_to_come(
    db_url: str,
) -> None:
    """No worker has ticked since 2020: the stored next run is shown, marked missed (not
    as the next to come), the times after it are after now, and skipping it says it
    was due already."""

    async def _register() -> None:
        async with durafn.App(db_url, clock=FakeClock(datetime(2020, 1, 1, tzinfo=UTC))) as app:
            await app.migrate()
            await app.register_cron("hourly", "0 * * * *", _report(app).call("h"))

    anyio.run(_register)
    now = datetime.now(UTC)
    [hourly] = invoke_json("crons", "--next", "3", "--url", db_url)
    first, *later = hourly["next"]
    assert first == "2020-01-01T01:00:00+00:00  (missed: due while no worker ran; its " + (
        "catch_up decides whether it runs)"
    )
    assert [datetime.fromisoformat(line) > now for line in later] == [True, True]
    assert "(missed: no worker ran)" in invoke("crons", "--url", db_url).stdout
    skipped = invoke("cron", "skip", "hourly", "--url", db_url)
    assert "the tick at 2020-01-01T01:00:00+00:00 (it was due already" in skipped.stdout


def test_crons_next_marks_daylight_saving(db_url: str) -> None:
    """The fire times of a cron at 02:30 around New York's spring-forward gap (02:30 does
    not exist on 10 March 2030, the second Sunday of March) and of one at 01:30 around the
    autumn fold (01:30 happens twice on 3 November 2030, the first Sunday of November)."""

    async def _register() -> None:
        clock = FakeClock(datetime(2030, 3, 8, tzinfo=UTC))
        async with durafn.App(db_url, clock=clock) as app:
            await app.migrate()
            report = _report(app)
            zone = "America/New_York"
            await app.register_cron("spring", "30 2 * * *", report.call("s"), timezone=zone)
            clock.set(datetime(2030, 10, 30, tzinfo=UTC).timestamp())
            await app.register_cron("fall", "30 1 * * *", report.call("f"), timezone=zone)

    anyio.run(_register)
    by_name = {c["name"]: c["next"] for c in invoke_json("crons", "--next", "5", "--url", db_url)}
    spring = by_name["spring"]
    assert len(spring) == 5
    gap = [line for line in spring if "DST gap" in line]
    assert len(gap) == 1 and "02:30 skipped before it" in gap[0]
    assert gap[0].startswith("2030-03-11T02:30:00-04:00")
    fall = by_name["fall"]
    folds = [line for line in fall if "DST fold" in line]
    assert folds == ["2030-11-03T01:30:00-04:00  (DST fold: the first 01:30)"]
    text = invoke("crons", "--next", "1", "--url", db_url)
    assert text.exit_code == 0 and "spring: 30 2 * * * (America/New_York)" in text.stdout
    assert invoke("crons", "--next", "0", "--url", db_url).exit_code == 2  # out of range
    skipped = invoke_json("cron", "skip", "fall", "--url", db_url)
    assert skipped["skipped"] == "2030-10-30T05:30:00+00:00"  # 01:30 in New York
