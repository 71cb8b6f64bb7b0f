"""The rollups (``_durafn_rollups``): what ended in each closed minute and hour, written
by the executor's maintenance pass once, read by ``app.activity`` for the dashboard's
charts, removed with the rows retention removes."""

from __future__ import annotations

from datetime import timedelta

import anyio
import pytest
from sqlalchemy import func, select

import durafn
from durafn import MutationCtx, State
from durafn._store.schema.tables import rollups
from durafn.testing import FakeClock

pytestmark = pytest.mark.anyio

T0 = 1_800_000_000.0
"""A whole hour (and so a whole minute), in epoch seconds."""


def _functions(app: durafn.App) -> tuple[durafn.MutationRef, durafn.MutationRef]:  # type: ignore[type-arg]
    @app.mutation
    async def ok(ctx: MutationCtx) -> None:
        pass

    @app.mutation
    async def bad(ctx: MutationCtx) -> None:
        raise ValueError("no")

    return ok, bad


async def _end(app: durafn.App, fn: object, n: int, *, lag: float = 0.0) -> None:
    """``n`` rows of ``fn`` due now, run ``lag`` seconds later (so they end then)."""
    clock = app.clock
    assert isinstance(clock, FakeClock)
    for _ in range(n):
        await app.scheduler().run_after(0, fn)  # type: ignore[call-overload]
    clock.advance(lag)
    await app.executor().run_until_idle()


async def _rollup_rows(app: durafn.App) -> int:
    async with app.engine.connect() as conn:
        return int((await conn.execute(select(func.count()).select_from(rollups))).scalar_one())


async def test_rows_ended_in_known_minutes_are_counted_once_their_minute_has_closed(
    app: durafn.App, clock: FakeClock
) -> None:
    ok, bad = _functions(app)
    clock.set(T0 + 5)
    await _end(app, ok, 3, lag=2.0)  # minute 0: 3 Success, started 2 s late
    await _end(app, bad, 1)  # and 1 Failed
    clock.set(T0 + 65)
    await _end(app, ok, 2)  # minute 1: 2 Success, 1 Canceled
    canceled = await app.scheduler().run_after(0, ok)
    await app.cancel(canceled)
    executor = app.executor()
    # At 2:30 minute 1 ended 30 s ago: within the grace a late commit may still land in.
    clock.set(T0 + 150)
    await executor.run_maintenance()
    seen = await app.activity(within=3600)
    assert seen.step == 60 and len(seen.points) == 60
    assert seen.until == durafn._clock.to_datetime(T0 + 60)
    last = seen.points[-1]
    assert last.start == durafn._clock.to_datetime(T0)
    assert last.ended == {State.SUCCESS: 3, State.FAILED: 1, State.CANCELED: 0}
    assert sum(p.ended[State.SUCCESS] for p in seen.points) == 3
    # The three rows that started 2 s late: their median lag is within 1-2.5 s (its
    # bucket); the Failed one started at once.
    assert last.lag.total == 4
    assert last.lag.counts[0] == 1
    p50 = last.lag.percentile(0.75)
    assert p50 is not None and 1.0 <= p50 <= 2.5
    # Minutes that closed since, with no pass yet, are not shown (as empty): the window
    # ends where the rollups' mark is.
    clock.set(T0 + 180)  # minute 1 closed, the last pass before it
    assert (await app.activity(within=3600)).until == durafn._clock.to_datetime(T0 + 60)
    # A pass later, minute 1 is in too; a second pass adds nothing.
    clock.set(T0 + 181)
    await executor.run_maintenance()
    groups = await _rollup_rows(app)
    await executor.run_maintenance()
    assert await _rollup_rows(app) == groups
    seen = await app.activity(within=3600)
    assert seen.points[-1].ended == {State.SUCCESS: 2, State.FAILED: 0, State.CANCELED: 1}
    assert seen.ended == {State.SUCCESS: 5, State.FAILED: 1, State.CANCELED: 1}
    by_name = {f.name: f.ended for f in seen.functions}
    assert by_name[bad.name] == {State.SUCCESS: 0, State.FAILED: 1, State.CANCELED: 0}
    only = await app.activity(within=3600, name=bad.name)
    assert only.ended == {State.SUCCESS: 0, State.FAILED: 1, State.CANCELED: 0}
    assert (await app.activity(within=3600, queue="none such")).ended[State.SUCCESS] == 0
    assert (await app.activity(within=3600, queue="")).ended[State.SUCCESS] == 5


async def test_two_workers_passes_at_once_roll_a_minute_up_once(
    app: durafn.App, clock: FakeClock
) -> None:
    ok, _ = _functions(app)
    clock.set(T0 + 1)
    await _end(app, ok, 4)
    clock.set(T0 + 600)
    other = durafn.App(app.engine.url.render_as_string(hide_password=False), clock=clock)
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(app.executor().run_maintenance)
            tg.start_soon(other.executor().run_maintenance)
        # Again, a minute rolled up already adds nothing, from either; and the mark of
        # what is rolled up never moves back (a pass with a clock behind).
        driver = app._rt.driver
        async with app.engine.begin() as conn:
            assert await driver.roll_up_minutes(conn, int(T0), int(T0) + 60) == 0
            mark = (await driver.rollup_marks(conn))[0]
            assert mark == int(T0) + 540  # the passes' time (T0 + 600) less the grace
            assert not await driver.advance_rollup_mark(conn, 60, int(T0) + 60)
            assert not await driver.advance_rollup_mark(conn, 60, mark)
            assert (await driver.rollup_marks(conn))[0] == mark
        assert (await app.activity(within=3600)).ended[State.SUCCESS] == 4
        assert (await other.activity(within=3600)).ended[State.SUCCESS] == 4
    finally:
        await other.aclose()


async def test_a_day_and_a_week_read_hours_and_the_minutes_of_the_hour_under_way(
    app: durafn.App, clock: FakeClock
) -> None:
    ok, bad = _functions(app)
    clock.set(T0 + 30)
    await _end(app, ok, 2)  # hour 0
    clock.set(T0 + 3600 + 30)
    await _end(app, bad, 1)  # hour 1, its first minute
    clock.set(T0 + 3600 + 300)
    await app.executor().run_maintenance()
    async with app.engine.connect() as conn:
        spans = (await conn.execute(select(rollups.c.span, rollups.c.start))).all()
    assert (3600, int(T0)) in spans  # hour 0 rolled into an hour
    assert all(start >= T0 + 3600 for span, start in spans if span == 60 and start > T0 + 3599)
    for within in (timedelta(days=1), timedelta(days=7)):
        seen = await app.activity(within=within)
        assert seen.step == 3600
        assert len(seen.points) in (within // timedelta(hours=1), within // timedelta(hours=1) + 1)
        assert seen.points[-2].ended[State.SUCCESS] == 2
        assert seen.points[-1].ended[State.FAILED] == 1  # from the minutes of hour 1
        assert seen.ended == {State.SUCCESS: 2, State.FAILED: 1, State.CANCELED: 0}
    with pytest.raises(durafn.ArgumentError):
        await app.activity(within=timedelta(days=8))


async def test_an_hour_whose_sum_is_not_written_yet_is_read_from_its_minutes(
    app: durafn.App, clock: FakeClock
) -> None:
    """The last pass ran before the hour closed: its minutes are rolled up, its hour's
    sum is not, and a day's chart reads those minutes rather than show the hour empty."""
    ok, _ = _functions(app)
    clock.set(T0 + 30)
    await _end(app, ok, 2)
    clock.set(T0 + 3500)
    await app.executor().run_maintenance()
    clock.set(T0 + 3600 + 90)  # the hour has closed; no pass since
    seen = await app.activity(within=timedelta(days=1))
    assert seen.points[-1].start == durafn._clock.to_datetime(T0)
    assert seen.points[-1].ended[State.SUCCESS] == 2
    clock.set(T0 + 7200 + 90)  # an hour later, its sum written by a pass: the same figure
    await app.executor().run_maintenance()
    seen = await app.activity(within=timedelta(days=1))
    assert seen.points[-2].ended[State.SUCCESS] == 2
    assert seen.ended[State.SUCCESS] == 2


async def test_rollups_are_removed_with_the_rows_retention_removes(
    app: durafn.App, clock: FakeClock
) -> None:
    ok, _ = _functions(app)
    clock.set(T0 + 30)
    await _end(app, ok, 2)
    executor = app.executor()
    clock.set(T0 + 7200)
    await executor.run_maintenance()
    assert await _rollup_rows(app) == 4  # the minute and its hour, each with its sum
    clock.set(T0 + 8 * 86400)
    await executor.run_maintenance()
    assert await _rollup_rows(app) == 0


def test_a_percentile_is_placed_in_the_bucket_that_holds_it() -> None:
    """Pure: the histograms' buckets (1-2.5-5 steps), and a quantile within its bucket."""
    from durafn._latency import BUCKETS, EDGES, bucket_of, percentile

    assert [bucket_of(v) for v in (-1.0, 0.0, 0.001, 0.3, 1.0, 499.9, 500.0, 1e9)] == [
        *(0, 0, 1, 8, 10, BUCKETS - 2, BUCKETS - 1, BUCKETS - 1),
    ]
    counts = [0] * BUCKETS
    for v in [0.2] * 98 + [3.0, 30.0]:
        counts[bucket_of(v)] += 1
    p50, p99, top = percentile(counts, 0.5), percentile(counts, 0.99), percentile(counts, 1)
    assert p50 is not None and EDGES[6] <= p50 <= EDGES[7]  # 0.1-0.25 s holds 0.2
    assert p99 is not None and EDGES[10] <= p99 <= EDGES[11]  # 2.5-5 s holds 3.0
    assert top is not None and EDGES[13] <= top <= EDGES[14]  # 25-50 s holds 30
    assert percentile([0] * BUCKETS, 0.5) is None


async def test_a_pass_after_a_long_quiet_stretch_counts_what_ended_on_both_sides(
    app: durafn.App, clock: FakeClock
) -> None:
    """Rows that ended before and after three quiet days: one pass jumps over the empty
    hours (the next row that ended says where), counting both minutes and their hours,
    and writes nothing for the hours between."""
    ok, _ = _functions(app)
    clock.set(T0 + 5)
    await _end(app, ok, 2)
    executor = app.executor()
    clock.set(T0 + 3 * 86_400 + 10)
    await _end(app, ok, 1)
    clock.set(T0 + 3 * 86_400 + 2 * 3600)
    await executor.run_maintenance()
    async with app.engine.connect() as conn:
        found = (
            await conn.execute(
                select(rollups.c.span, rollups.c.start, rollups.c.count)
                .where(rollups.c.function_name != "")
                .order_by(rollups.c.span, rollups.c.start)
            )
        ).all()
    later = int(T0) + 3 * 86_400
    assert [tuple(r) for r in found] == [
        (60, int(T0), 2),
        (60, later, 1),
        (3600, int(T0), 2),
        (3600, later, 1),
    ]
