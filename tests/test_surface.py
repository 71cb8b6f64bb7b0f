"""The public surface under arbitrary input: every exception raised is a ``DurafnError``,
and a refused call writes nothing. On both engines.

Hypothesis generates the values (numbers of every size and kind, NaN and infinities,
strings with NUL and lone surrogates, naive and aware date-times, nested containers).
``DURAFN_HYPOTHESIS_EXAMPLES`` sets the examples per test (default 40, which keeps the
suite's time budget; use a few hundred for a deeper run).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Awaitable, Callable
from datetime import UTC
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import durafn
from durafn import MutationCtx, QueryCtx
from durafn.testing import all_rows

pytestmark = pytest.mark.anyio

EXAMPLES = int(os.environ.get("DURAFN_HYPOTHESIS_EXAMPLES", "40"))
SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,  # a database round trip is slow, not wrong
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    database=None,  # no example database written into the checkout
)

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=10**300, max_value=10**500),
    st.integers(min_value=-(10**500), max_value=-(10**300)),
    st.floats(),
    st.text(),
    st.binary(max_size=8),
    st.datetimes(),
    st.datetimes(timezones=st.just(UTC)),
    st.timedeltas(),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.tuples(inner, inner),
        st.dictionaries(st.text(max_size=5), inner, max_size=4),
    ),
    max_leaves=8,
)
ids = st.one_of(scalars, st.uuids().map(str), st.uuids().map(lambda u: str(u).upper()))


async def refused_cleanly(app: durafn.App, call: Callable[[], Awaitable[Any]]) -> bool:
    """Run ``call``: True if it was refused with a DurafnError and wrote nothing, False if
    it succeeded. Any other exception fails the test (it propagates)."""
    before = len(await all_rows(app))
    try:
        await call()
    except durafn.DurafnError:
        assert len(await all_rows(app)) == before, "a refused call wrote a row"
        return True
    return False


def register(app: durafn.App) -> None:
    """The functions the tests call, once per app (examples share the app)."""
    if "surface:any" in app.functions():
        return

    @app.mutation(name="surface:any")
    async def takes_any(ctx: MutationCtx, x: Any = None) -> Any:
        return x

    @app.mutation(name="surface:float")
    async def takes_float(ctx: MutationCtx, x: float = 0.0) -> None:
        pass

    @app.mutation(name="surface:list")
    async def takes_list(ctx: MutationCtx, x: list[int] | None = None) -> None:
        pass

    @app.query(name="surface:query")
    async def a_query(ctx: QueryCtx, x: Any = None) -> None:
        pass


@SETTINGS
@given(delay=scalars, when=scalars, x=values, name=st.sampled_from(["any", "float", "list"]))
async def test_scheduling(app: durafn.App, delay: Any, when: Any, x: Any, name: str) -> None:
    register(app)
    fn = f"surface:{name}"
    sched = app.scheduler()
    await refused_cleanly(app, lambda: sched.run_after(delay, fn, x=x))
    await refused_cleanly(app, lambda: sched.run_at(when, fn, x=x))
    await refused_cleanly(app, lambda: sched.run_after(0, fn, x=x))
    await refused_cleanly(app, lambda: sched.run_after(0, x))  # the function itself


@SETTINGS
@given(x=values, name=st.sampled_from(["any", "float", "list"]))
async def test_direct_calls(app: durafn.App, x: Any, name: str) -> None:
    register(app)
    ref = app._rt.registry.get_kind(f"surface:{name}", durafn.MutationRef)
    await refused_cleanly(app, lambda: app.run_mutation(ref, x=x))
    query = app._rt.registry.get_kind("surface:query", durafn.QueryRef)
    await refused_cleanly(app, lambda: app.run_query(query, x=x))


@SETTINGS
@given(id=ids)
async def test_ids(app: durafn.App, id: Any) -> None:
    await refused_cleanly(app, lambda: app.get(id))
    await refused_cleanly(app, lambda: app.cancel(id))
    await refused_cleanly(app, lambda: app.retry(id))
    await refused_cleanly(app, lambda: app.retry([id]))
    await refused_cleanly(app, lambda: app.reschedule(id, priority=1))
    await refused_cleanly(app, lambda: app.reschedule([id], max_attempts=id))
    await refused_cleanly(app, lambda: app.row_links(id))
    await refused_cleanly(app, lambda: app.search(id))
    await refused_cleanly(app, lambda: app.operation(id))
    await refused_cleanly(app, lambda: app.cancel_operation(id))
    await refused_cleanly(app, lambda: app.start_operation("cancel", who="t", name=id))


POLICIES: list[tuple[Callable[..., Any], str]] = [
    (durafn.Retry, "max_attempts"),
    (lambda v: durafn.Retry(2, backoff=v), "backoff"),
    (lambda v: durafn.Retry(2, retry_on=v), "retry_on"),
    (lambda v: durafn.Retry(2, give_up_on=v), "give_up_on"),
    (lambda v: durafn.Exponential(base=v), "base"),
    (lambda v: durafn.Exponential(factor=v), "factor"),
    (lambda v: durafn.Exponential(max_delay=v), "max_delay"),
    (lambda v: durafn.Exponential(jitter=v), "jitter"),
    (durafn.Fixed, "seconds"),
    (lambda v: durafn.Retention(success=v), "success"),
]


@SETTINGS
@given(which=st.sampled_from(range(len(POLICIES))), value=values)
def test_policies(which: int, value: Any) -> None:
    """Retry policies and retention periods: any value is accepted or a DurafnError."""
    make, _ = POLICIES[which]
    with contextlib.suppress(durafn.DurafnError):
        make(value)


@SETTINGS
@given(
    state=st.one_of(scalars, values, st.sampled_from(list(durafn.State))),
    name=scalars,
    after=scalars,
    before=scalars,
    limit=st.one_of(scalars, st.integers(-5, 20_000)),
    cursor=scalars,
)
async def test_listing(
    app: durafn.App, state: Any, name: Any, after: Any, before: Any, limit: Any, cursor: Any
) -> None:
    for kwargs in (
        {"state": state},
        {"name": name},
        {"scheduled_after": after, "scheduled_before": before},
        {"limit": limit},
        {"cursor": cursor},
    ):
        await refused_cleanly(app, lambda kw=kwargs: app.list(**kw))  # type: ignore[misc]
    await refused_cleanly(app, lambda: app.count_finished(completed_before=after, states=state))
    await refused_cleanly(
        app, lambda: app.delete_finished(completed_before=before, batch_size=limit)
    )


OPTION_NAMES = [
    "concurrency",
    "batch_size",
    "batch_time",
    "mutation_lanes",
    "poll_interval",
    "retention",
    "retention_interval",
    "retention_batch",
    "grace_period",
    "heartbeat_interval",
    "worker_timeout",
    "worker_name",
]
APP_OPTIONS = [
    "mutation_timeout",
    "action_timeout",
    "query_timeout",
    "max_scheduled_per_run",
    "max_scheduled_args_bytes",
    "auto_migrate",
    "direct_retries",
    "clock",
    "retry",
]


@SETTINGS
@given(option=st.sampled_from(OPTION_NAMES), value=scalars)
async def test_executor_options(app: durafn.App, option: str, value: Any) -> None:
    try:
        executor = app.executor(**{option: value})
    except durafn.DurafnError:
        return
    await executor.run_until_idle()  # accepted options make a working executor


@SETTINGS
@given(option=st.sampled_from(APP_OPTIONS), value=scalars, url=scalars)
def test_app_options(db_url: str, option: str, value: Any, url: Any) -> None:
    with contextlib.suppress(durafn.DurafnError):
        durafn.App(db_url, **{option: value})
    if url is not None:
        with contextlib.suppress(durafn.DurafnError):
            durafn.App(url)
