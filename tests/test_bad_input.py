"""Every bad input gets its typed error, and nothing is written.

The ``# type: ignore[...]`` comments are assertions too: mypy --strict runs with
warn_unused_ignores, so if a wrong call here stopped being a type error, `make test` fails.
"""

from __future__ import annotations

import math
import warnings
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
import pytest
from pydantic import BaseModel
from sqlalchemy import insert

import durafn
from durafn import ActionCtx, MutationCtx, QueryCtx, State
from durafn.testing import FakeClock, all_rows

from .support.helpers import count
from .support.models import Message

pytestmark = pytest.mark.anyio


class Address(BaseModel):
    city: str
    zip: str


async def assert_nothing_written(app: durafn.App) -> None:
    assert await all_rows(app) == []
    assert await count(app, Message) == 0


async def test_bad_arguments_fail_when_scheduled(app: durafn.App, clock: FakeClock) -> None:
    @app.mutation
    async def target(ctx: MutationCtx, n: int, address: Address) -> None:
        pass

    good = Address(city="Oslo", zip="0150")
    sched = app.scheduler()
    with pytest.raises(
        durafn.ArgumentError, match=r"invalid arguments .*: n: Input should be a valid integer"
    ):
        await sched.run_after(1, target, n="not a number", address=good)  # type: ignore[call-overload]
    with pytest.raises(durafn.ArgumentError, match="missing a required argument: 'address'"):
        await sched.run_after(1, target, n=1)  # type: ignore[call-overload]
    with pytest.raises(durafn.ArgumentError, match=r"unexpected keyword argument 'extra'"):
        await sched.run_after(1, target, n=1, address=good, extra=2)  # type: ignore[call-overload]
    with pytest.raises(durafn.ArgumentError, match=r"address\.city: Field required"):
        await sched.run_after(1, target, n=1, address={"zip": "1"})  # type: ignore[call-overload]
    await assert_nothing_written(app)


async def test_unstorable_argument(app: durafn.App) -> None:
    @app.mutation
    async def takes_anything(ctx: MutationCtx, thing: Any) -> None:
        pass

    with pytest.raises(durafn.ArgumentError, match="cannot be stored as JSON"):
        await app.scheduler().run_after(0, takes_anything, thing=object())
    await assert_nothing_written(app)


async def test_arguments_round_trip(app: durafn.App, clock: FakeClock) -> None:
    seen: list[tuple[datetime, Address, list[int]]] = []

    @app.mutation
    async def target(ctx: MutationCtx, when: datetime, address: Address, ns: list[int]) -> Address:
        seen.append((when, address, ns))
        return address

    when = datetime(2031, 5, 6, 7, 8, 9, 123456, tzinfo=UTC)
    sid = await app.scheduler().run_after(
        0, target, when, Address(city="Oslo", zip="0150"), ns=[1, 2]
    )
    await app.executor().run_until_idle()
    assert seen == [(when, Address(city="Oslo", zip="0150"), [1, 2])]
    row = await app.get(sid)
    assert row is not None
    assert row.result == {"city": "Oslo", "zip": "0150"}


async def test_stored_arguments_that_leave_out_a_parameter_with_a_default_take_it(
    app: durafn.App, db_url: str, clock: FakeClock
) -> None:
    """One rule on every route: a parameter left out takes its default when the row runs.
    Rows stored without it (scheduled before the parameter was added, as here, or from
    SQL, which cannot see defaults) ran into ``loud: Field required``. The default
    reaches the function as Python's own scheduling would have stored it (validated,
    then through JSON); a parameter without a default is still required."""

    @app.mutation(name="r:greet")
    async def greet(ctx: MutationCtx, name: str) -> None:
        pass

    @app.action(name="r:greet_later")
    async def greet_later(ctx: ActionCtx, name: str) -> None:
        pass

    @app.mutation(name="r:strict")
    async def strict(ctx: MutationCtx, name: str) -> None:
        pass

    sched = app.scheduler()
    ids = [
        await sched.run_after(0, greet, "ada"),
        await sched.run_after(0, greet_later, "bob"),
        await sched.run_after(0, strict, "eve"),
    ]
    seen: list[tuple[str, bool, Address, datetime]] = []
    noon = datetime(2031, 5, 6, 12, tzinfo=UTC)
    async with durafn.App(db_url, clock=clock) as again:  # the next deploy adds parameters

        @again.mutation(name="r:greet")
        async def greet2(
            ctx: MutationCtx,
            name: str,
            loud: bool = False,
            address: Address = Address(city="Oslo", zip="0150"),  # noqa: B008
            when: datetime = noon,
        ) -> None:
            seen.append((name, loud, address, when))

        @again.action(name="r:greet_later")
        async def greet_later2(ctx: ActionCtx, name: str, times: int = 2) -> int:
            return times

        @again.mutation(name="r:strict")
        async def strict2(ctx: MutationCtx, name: str, level: int) -> None:
            pass

        await again.executor().run_until_idle()
        rows = [await again.get(id) for id in ids]
    assert seen == [("ada", False, Address(city="Oslo", zip="0150"), noon)]
    assert [(r.state, r.result) for r in rows if r is not None][:2] == [
        (State.SUCCESS, None),
        (State.SUCCESS, 2),
    ]
    failed = rows[2]
    assert failed is not None and failed.state is State.FAILED
    assert failed.error is not None
    assert failed.error.message == (
        "stored arguments no longer match 'r:strict': level: Field required"
    )


async def test_unknown_function(app: durafn.App) -> None:
    other = durafn.App("sqlite+aiosqlite:///unused.sqlite3")

    @other.mutation
    async def elsewhere(ctx: MutationCtx) -> None:
        pass

    with pytest.raises(durafn.UnknownFunctionError, match="no function is registered as 'nope'"):
        await app.scheduler().run_after(0, "nope")
    with pytest.raises(durafn.UnknownFunctionError):
        await app.scheduler().run_after(0, elsewhere)  # registered on another app
    await assert_nothing_written(app)


@pytest.mark.parametrize(
    ("method", "when", "match"),
    [
        ("run_after", -1, "must not be negative"),
        ("run_after", math.nan, "finite"),
        ("run_after", math.inf, "finite"),
        ("run_after", True, "seconds"),
        ("run_after", "5", "seconds"),
        ("run_after", timedelta(days=5 * 366), "5 years"),
        ("run_at", datetime(2030, 1, 1), "naive"),
        ("run_at", math.inf, "finite"),
        ("run_at", "tomorrow", "aware datetime or epoch"),
        ("run_at", datetime(2040, 1, 1, tzinfo=UTC), "5 years"),
        ("run_at", -1e12, "before 1970"),
        ("run_at", datetime(1, 1, 1, tzinfo=UTC), "before 1970"),
    ],
)
async def test_bad_times(app: durafn.App, method: str, when: Any, match: str) -> None:
    @app.mutation
    async def noop(ctx: MutationCtx) -> None:
        pass

    with pytest.raises(durafn.SchedulingError, match=match):
        await getattr(app.scheduler(), method)(when, noop)
    await assert_nothing_written(app)


async def test_past_run_at_runs_at_once_and_keeps_its_time(
    app: durafn.App, clock: FakeClock
) -> None:
    @app.mutation
    async def noop(ctx: MutationCtx) -> None:
        pass

    past = clock.now_datetime() - timedelta(days=3)
    sid = await app.scheduler().run_at(past, noop)
    assert await app.executor().run_until_idle() == 1
    row = await app.get(sid)
    assert row is not None
    assert row.state is durafn.State.SUCCESS
    assert row.scheduled_time == past


async def test_queries_cannot_write_or_schedule(app: durafn.App) -> None:
    @app.mutation
    async def noop(ctx: MutationCtx) -> None:
        pass

    @app.query
    async def schedules(ctx: QueryCtx) -> None:
        await ctx.scheduler.run_after(0, noop)

    @app.query
    async def orm_write(ctx: QueryCtx) -> None:
        ctx.db.add(Message(body="x", author="y"))
        await ctx.db.flush()

    @app.query
    async def sql_write(ctx: QueryCtx) -> None:
        await ctx.db.execute(insert(Message).values(body="x", author="y"))

    for query in (schedules, orm_write, sql_write):
        with pytest.raises(durafn.ReadOnlyError):
            await app.run_query(query)
    with pytest.raises(durafn.SchedulingError, match="is a query; only mutations and actions"):
        await app.scheduler().run_after(0, schedules)  # type: ignore[call-overload]
    await assert_nothing_written(app)


async def test_a_list_of_ids_where_one_is_taken_says_so(app: durafn.App) -> None:
    """``retry`` and ``reschedule`` take many ids; ``cancel``, ``get`` and ``explain`` one.
    A list given to them was read as a malformed id ("['...'] is not a scheduled function
    id"), which hid the mistake."""

    @app.mutation(name="ids:noop")
    async def noop(ctx: MutationCtx) -> None:
        pass

    sid = await app.scheduler().run_after(60, noop)
    many: Any = [sid]
    with pytest.raises(
        durafn.ArgumentError, match=r"cancel takes one id, not a list of 1; .*cancel_where"
    ):
        await app.cancel(many)
    with pytest.raises(durafn.ArgumentError, match=r"get takes one id, not a tuple of 2"):
        await app.get((sid, sid))  # type: ignore[arg-type]
    with pytest.raises(durafn.ArgumentError, match=r"explain takes one id, not a set of 1"):
        await app.explain({sid})  # type: ignore[arg-type]
    row = await app.get(sid)
    assert row is not None and row.state is State.PENDING  # nothing cancelled


async def test_a_function_run_as_another_kind_names_both_kinds(app: durafn.App) -> None:
    @app.mutation(name="k:mutation")
    async def mutation(ctx: MutationCtx) -> None:
        pass

    @app.action(name="k:action")
    async def action(ctx: ActionCtx) -> None:
        pass

    wrong: Any = action
    with pytest.raises(
        durafn.ArgumentError, match=r"is an action, not a mutation; call it with run_action"
    ):
        await app.run_mutation(wrong)
    wrong = mutation
    with pytest.raises(
        durafn.ArgumentError, match=r"is a mutation, not an action; call it with run_mutation"
    ):
        await app.run_action(wrong)
    await assert_nothing_written(app)


async def test_schedule_count_limit_aborts_the_whole_mutation(app: durafn.App) -> None:
    @app.mutation
    async def noop(ctx: MutationCtx, i: int) -> None:
        pass

    @app.mutation
    async def too_many(ctx: MutationCtx, swallow: bool) -> None:
        ctx.db.add(Message(body="x", author="y"))
        try:
            for i in range(1001):
                await ctx.scheduler.run_after(0, noop, i=i)
        except durafn.SchedulingLimitError:
            if not swallow:
                raise

    for swallow in (False, True):  # catching the error does not save the mutation
        with pytest.raises(durafn.SchedulingLimitError, match="at most 1000 functions"):
            await app.run_mutation(too_many, swallow)
    await assert_nothing_written(app)


async def test_schedule_bytes_limit(db_url: str, clock: FakeClock) -> None:
    app = durafn.App(db_url, clock=clock, max_scheduled_args_bytes=1000)
    await app.migrate()
    try:

        @app.mutation
        async def takes(ctx: MutationCtx, blob: str) -> None:
            pass

        @app.mutation
        async def big(ctx: MutationCtx) -> None:
            await ctx.scheduler.run_after(0, takes, blob="x" * 600)
            await ctx.scheduler.run_after(0, takes, blob="x" * 600)

        sid = await app.scheduler().run_after(0, big)
        await app.executor().run_until_idle()
        rows = await all_rows(app)
        assert [r.id for r in rows] == [sid]  # nothing big scheduled was kept
        assert rows[0].state is durafn.State.FAILED
        assert rows[0].error is not None
        assert "at most 1000 bytes" in rows[0].error.message
    finally:
        await app.aclose()


def test_registration_errors() -> None:
    app = durafn.App("sqlite+aiosqlite:///unused.sqlite3")

    def not_async(ctx: MutationCtx) -> None:
        pass

    async def no_ctx() -> None:
        pass

    async def no_ctx_but_args(body: str) -> None:
        pass

    async def wrong_ctx(ctx: QueryCtx) -> None:
        pass

    async def star_args(ctx: MutationCtx, *args: int) -> None:
        pass

    async def unresolvable(ctx: MutationCtx, x: NotDefinedAnywhere) -> None:  # type: ignore[name-defined]  # noqa: F821
        pass

    cases: list[tuple[Any, str]] = [
        (not_async, "async def"),
        (no_ctx, "first parameter"),
        (no_ctx_but_args, "first parameter"),
        (wrong_ctx, "receives a MutationCtx"),
        (star_args, r"\*args"),
        (unresolvable, "cannot resolve the type hints"),
    ]
    for fn, match in cases:
        with pytest.raises(durafn.RegistrationError, match=match):
            app.mutation(fn)

    async def fine(ctx: MutationCtx) -> None:
        pass

    ref = app.mutation(fine)
    assert ref.name == f"{__name__}:test_registration_errors.<locals>.fine"
    with pytest.raises(durafn.RegistrationError, match="already registered"):
        app.mutation(name=ref.name)(fine)
    assert app.functions() == [ref.name]


def test_bad_urls() -> None:
    with pytest.raises(durafn.DatabaseError, match="not a database URL"):
        durafn.App("::nonsense::")
    with pytest.raises(durafn.DatabaseError, match="SQLite or PostgreSQL"):
        durafn.App("mysql://localhost/db")
    with pytest.raises(durafn.SchemaError, match="SQLite \\*file\\*"):
        _ = durafn.App("sqlite://").engine


async def test_an_empty_url_is_refused_not_taken_for_the_default_file(
    app: durafn.App, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An empty URL (a template's, a variable's default) is an error, from the argument
    and from DURAFN_DATABASE_URL: falling back to ./durafn.sqlite3 would write rows where
    no worker looks. Left out (None), the variable or the default file is used."""
    monkeypatch.chdir(tmp_path)
    for blank in ("", "  "):
        with pytest.raises(durafn.DatabaseError, match="the database URL is empty"):
            durafn.App(blank)
        with pytest.raises(durafn.DatabaseError, match="the database URL is empty"):
            app.using(blank)
        monkeypatch.setenv("DURAFN_DATABASE_URL", blank)
        with pytest.raises(durafn.DatabaseError, match="DURAFN_DATABASE_URL is set, but it is"):
            durafn.App()
    monkeypatch.delenv("DURAFN_DATABASE_URL")
    assert durafn.App().engine.url.database == "durafn.sqlite3"  # built, not connected
    assert app.using().engine.url == app.engine.url
    assert [found async for found in anyio.Path(tmp_path).iterdir()] == []  # no file made


async def test_non_finite_floats_are_rejected_when_scheduled(app: durafn.App) -> None:
    """JSON has no NaN or infinity: storing one would come back as null and fail the run."""

    @app.mutation
    async def target(ctx: MutationCtx, x: float, xs: list[float]) -> None:
        pass

    for x, xs in [(math.nan, [1.0]), (math.inf, [1.0]), (1.0, [-math.inf])]:
        with pytest.raises(durafn.ArgumentError, match="finite number"):
            await app.scheduler().run_after(0, target, x=x, xs=xs)
    await assert_nothing_written(app)


class Reading(BaseModel):
    value: float  # a model's own config allows NaN: only durafn's check refuses it


async def test_non_finite_floats_are_refused_anywhere_in_arguments_and_results(
    app: durafn.App,
) -> None:
    """Inside Any, lists, dicts, nested structures and models too, on every route: a NaN
    stored as null would run the function with other arguments than it was given."""

    @app.mutation
    async def takes(ctx: MutationCtx, x: Any = None, r: Reading | None = None) -> None:
        pass

    @app.mutation
    async def returns(ctx: MutationCtx, which: int) -> Any:
        return [{"a": 1.0}, {"b": [math.nan]}][which]

    bad: list[dict[str, Any]] = [
        {"x": [1.0, math.inf]},
        {"x": {"a": math.nan}},
        {"x": {"deep": [{"deeper": (1, -math.inf)}]}},
        {"r": Reading(value=math.nan)},
    ]
    for kwargs in bad:
        with pytest.raises(durafn.ArgumentError, match="NaN or an infinity"):
            await app.scheduler().run_after(0, takes, **kwargs)
        with pytest.raises(durafn.ArgumentError, match="NaN or an infinity"):
            await app.run_mutation(takes, **kwargs)
    await assert_nothing_written(app)
    # A null that is a None is fine, and stays a None.
    fine = await app.scheduler().run_after(0, takes, x=[None, 1.5])
    ok = await app.scheduler().run_after(0, returns, which=0)
    nan = await app.scheduler().run_after(0, returns, which=1)
    await app.executor().run_until_idle()
    rows = {r.id: r for r in await all_rows(app)}
    assert rows[fine].state is durafn.State.SUCCESS
    assert rows[ok].result == {"a": 1.0}
    refused = rows[nan]
    assert refused.state is durafn.State.FAILED
    assert refused.error is not None and "NaN or an infinity" in refused.error.message


async def test_huge_numbers_and_bad_values_are_typed_errors(app: durafn.App) -> None:
    """Each of these escaped as a raw Python exception once."""

    @app.mutation
    async def target(ctx: MutationCtx) -> None:
        pass

    sched = app.scheduler()
    with pytest.raises(durafn.SchedulingError, match="delay"):
        await sched.run_after(10**400, target)
    with pytest.raises(durafn.SchedulingError, match="run_at"):
        await sched.run_at(10**400, target)
    with pytest.raises(durafn.ArgumentError, match="limit"):
        await app.list(limit="5")  # type: ignore[arg-type]
    with pytest.raises(durafn.ArgumentError, match="'bogus' is not one of"):
        await app.list(state="bogus")  # type: ignore[arg-type]
    with pytest.raises(durafn.ArgumentError, match="scheduled_after must be an aware datetime"):
        await app.list(scheduled_after="2020-01-01")  # type: ignore[arg-type]
    with pytest.raises(durafn.ArgumentError, match="not valid Unicode"):
        await app.list(name="\ud800")
    with pytest.raises(durafn.ArgumentError, match="NUL"):
        await app.list(name="a\x00b")
    with pytest.raises(durafn.ArgumentError, match="mutation_timeout"):
        durafn.App("sqlite+aiosqlite:///unused.db", mutation_timeout="5")  # type: ignore[arg-type]
    with pytest.raises(durafn.ArgumentError, match="completed_before"):
        await app.delete_finished(completed_before=datetime(2020, 1, 1))
    with pytest.raises(durafn.ArgumentError, match="batch_size"):
        await app.executor(batch_size=10**30).run_until_idle()
    await assert_nothing_written(app)


def test_durable_names_both_engines_can_store() -> None:
    app = durafn.App("sqlite+aiosqlite:///unused.db")
    for name in ("bad\x00name", "lone\ud800surrogate"):
        with pytest.raises(durafn.RegistrationError, match="durable name"):

            @app.mutation(name=name)
            async def f(ctx: MutationCtx) -> None:
                pass

    with pytest.raises(durafn.RegistrationError, match="timeout"):

        @app.mutation(timeout="5")  # type: ignore[call-overload, untyped-decorator]
        async def g(ctx: MutationCtx) -> None:
            pass


def test_a_function_registered_from_main_warns() -> None:
    """``python first.py`` stores ``__main__:f``, which no worker importing the app by its
    module name can run: say so at registration, with the fix."""
    app = durafn.App("sqlite+aiosqlite:///unused.db")
    namespace: dict[str, Any] = {"__name__": "__main__", "MutationCtx": MutationCtx}
    exec("async def send(ctx: MutationCtx) -> None:\n    pass\n", namespace)
    with pytest.warns(durafn.DurableNameWarning, match=r"'__main__:send'.*name=") as caught:
        app.mutation(namespace["send"])
    # It points at the user's line, the registration, whichever form it took.
    assert [w.filename for w in caught] == [__file__]
    namespace["ActionCtx"] = durafn.ActionCtx
    exec("async def notify(ctx: ActionCtx) -> None:\n    pass\n", namespace)
    with pytest.warns(durafn.DurableNameWarning) as caught:
        app.action(queue="q")(namespace["notify"])
    assert [w.filename for w in caught] == [__file__]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        namespace["send"].__module__ = "__main__"
        app.mutation(name="messages:send")(namespace["send"])  # named: no warning


async def test_every_form_of_an_id_finds_the_same_row(app: durafn.App) -> None:
    """Upper case, braces and urn:uuid: name the row on both engines; text that is no id is
    NotFoundError (saying it is malformed) or None, never a driver error."""

    @app.mutation
    async def target(ctx: MutationCtx) -> None:
        pass

    first = await app.scheduler().run_after(60, target)
    second = await app.scheduler().run_after(60, target)
    for form in (first.upper(), "{" + first + "}", "urn:uuid:" + first):
        row = await app.get(form)
        assert row is not None and row.id == first
    result = await app.cancel("urn:uuid:" + second.upper())
    assert result.canceled and result.id == second
    for junk in ("nope", "urn:uuid:zz", first + "0", first[:-1], "\ud800", ""):
        assert await app.get(junk) is None
        with pytest.raises(durafn.NotFoundError, match="not a scheduled function id"):
            await app.cancel(junk)


@pytest.mark.parametrize(
    "bad_call",
    ["argument", "time", "function", "query"],
)
async def test_bad_input_inside_a_mutation_aborts_it(app: durafn.App, bad_call: str) -> None:
    """Inside a mutation the same errors are raised where the call is made, and the
    mutation's own writes roll back with it: nothing is written."""

    @app.query
    async def a_query(ctx: QueryCtx) -> None:
        pass

    @app.mutation
    async def target(ctx: MutationCtx, n: int) -> None:
        pass

    @app.mutation
    async def post(ctx: MutationCtx) -> None:
        ctx.db.add(Message(body="hello", author="ann"))
        await ctx.db.flush()
        await ctx.scheduler.run_after(0, target, n=1)  # a good one first: rolled back too
        if bad_call == "argument":
            await ctx.scheduler.run_after(0, target, n="x")  # type: ignore[call-overload]
        elif bad_call == "time":
            await ctx.scheduler.run_at(datetime(2030, 1, 1), target, n=1)
        elif bad_call == "function":
            await ctx.scheduler.run_after(0, "no:such")
        else:
            await ctx.scheduler.run_after(0, a_query)  # type: ignore[call-overload]

    expected = {
        "argument": durafn.ArgumentError,
        "time": durafn.SchedulingError,
        "function": durafn.UnknownFunctionError,
        "query": durafn.SchedulingError,
    }[bad_call]
    with pytest.raises(expected):
        await app.run_mutation(post)
    sid = await app.scheduler().run_after(0, post)
    await app.executor().run_until_idle()
    row = await app.get(sid)
    assert row is not None and row.state is durafn.State.FAILED
    assert row.error is not None and row.error.type == f"durafn.{expected.__name__}"
    assert [r.id for r in await all_rows(app)] == [sid]
    assert await count(app, Message) == 0


async def test_outside_schedulers_apply_the_limits_per_call(db_url: str, clock: FakeClock) -> None:
    app = durafn.App(db_url, clock=clock, max_scheduled_per_run=2)
    await app.migrate()

    @app.mutation
    async def noop(ctx: MutationCtx) -> None:
        pass

    @app.mutation
    async def fan_out(ctx: MutationCtx, n: int) -> None:
        for _ in range(n):
            await ctx.scheduler.run_after(0, noop)

    try:
        sched = app.scheduler()
        for _ in range(5):  # each call commits alone: five separate "executions"
            await sched.run_after(0, noop)
        await app.run_mutation(fan_out, 2)
        with pytest.raises(durafn.SchedulingLimitError, match="at most 2 functions"):
            await app.run_mutation(fan_out, 3)
        assert len(await all_rows(app)) == 7
    finally:
        await app.aclose()
