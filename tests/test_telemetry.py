"""Traces, metrics and JSON logs, on both engines: a request's trace followed through
the mutation and the action it led to, retries as links, a cron's tick as a root span;
counters and histograms that move by exactly the runs made, gauges that match a direct
count, the Prometheus text parsed by prometheus-client's own parser; and, without the
``otel`` extra, nothing imported and nothing stored."""

from __future__ import annotations

import contextlib
import io
import json
import logging
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import anyio.to_thread
import httpx2
import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import text
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

import durafn
from durafn import ActionCtx, MutationCtx
from durafn.testing import FakeClock

from .support.helpers import CEILING, has_beaten, true, wait_until
from .test_heartbeats import OPTIONS as HEARTBEATS
from .test_heartbeats import _dead_worker_claims

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import ReadableSpan
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

pytestmark = pytest.mark.anyio
ROOT = str(Path(__file__).resolve().parent.parent)


@dataclass
class Otel:
    """The process's OpenTelemetry SDK, set up once (OpenTelemetry sets a provider once):
    spans recorded in memory while a test of this module runs, and dropped otherwise, so
    that the tests that run after these in the same process pay next to nothing."""

    spans: InMemorySpanExporter
    tracer: Any
    recording: list[bool]
    metrics: Any
    """The SDK's in-memory metric reader."""


_OTEL: Otel | None = None


def _otel() -> Otel:
    global _OTEL
    if _OTEL is None:
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
            InMemorySpanExporter,
        )
        from opentelemetry.sdk.trace.sampling import Decision, Sampler, SamplingResult

        recording = [False]

        class Switch(Sampler):
            def should_sample(self, *args: Any, **kwargs: Any) -> SamplingResult:
                if not recording[0]:
                    return SamplingResult(Decision.DROP)
                attributes = kwargs.get("attributes", args[4] if len(args) > 4 else None)
                return SamplingResult(Decision.RECORD_AND_SAMPLE, attributes)

            def get_description(self) -> str:
                return "durafn tests"

        from opentelemetry import metrics
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader

        exporter = InMemorySpanExporter()
        provider = TracerProvider(sampler=Switch())
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        trace.set_tracer_provider(provider)
        reader = InMemoryMetricReader()
        metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
        _OTEL = Otel(exporter, trace.get_tracer("tests"), recording, reader)
    return _OTEL


@pytest.fixture
def otel() -> Iterator[Otel]:
    found = _otel()
    found.spans.clear()
    found.recording[0] = True
    try:
        yield found
    finally:
        found.recording[0] = False
        found.spans.clear()


def _named(found: tuple[ReadableSpan, ...], name: str) -> list[ReadableSpan]:
    return [s for s in found if s.name == name]


async def test_a_requests_trace_goes_on_through_the_mutation_and_the_action(
    app: durafn.App, clock: FakeClock, otel: Otel
) -> None:
    """POST /order (a Starlette handler's span) schedules a mutation, which schedules an
    action: both runs are in the request's trace, each a child of what scheduled it, and
    the action's own span is a child of its run. Its retry is a trace of its own, linked
    to the mutation's span with the attempt number."""
    from opentelemetry.trace import SpanKind

    SERVER, CONSUMER = SpanKind.SERVER, SpanKind.CONSUMER
    tries: list[int] = []

    @app.action(name="orders:email", retry=durafn.Retry(2, backoff=durafn.Fixed(1)))
    async def email(ctx: ActionCtx, n: int) -> None:
        with otel.tracer.start_as_current_span("smtp.send"):
            tries.append(n)
            if len(tries) == 1:
                raise ConnectionError("smtp away")

    @app.mutation(name="orders:place")
    async def place(ctx: MutationCtx, n: int) -> None:
        await ctx.scheduler.run_after(0, email, n)

    async def order(request: Request) -> PlainTextResponse:
        with otel.tracer.start_as_current_span("POST /order", kind=SERVER):
            await app.scheduler().run_after(0, place.options(key="order-7"), 7)
        return PlainTextResponse("ok")

    web = Starlette(routes=[Route("/order", order, methods=["POST"])])
    transport = httpx2.ASGITransport(app=web)
    async with httpx2.AsyncClient(transport=transport, base_url="http://shop") as client:
        assert (await client.post("/order")).status_code == 200
    executor = app.executor()
    await executor.run_until_idle()  # the mutation, then the action's first try
    clock.advance(1)
    await executor.run_until_idle()  # its retry
    assert tries == [7, 7]
    found = otel.spans.get_finished_spans()
    [request] = _named(found, "POST /order")
    [mutation] = _named(found, "durafn.run orders:place")
    first, second = sorted(
        _named(found, "durafn.run orders:email"), key=lambda s: s.start_time or 0
    )
    smtp = sorted(_named(found, "smtp.send"), key=lambda s: s.start_time or 0)
    trace_id = request.context.trace_id
    assert mutation.context.trace_id == trace_id == first.context.trace_id
    assert mutation.parent is not None and mutation.parent.span_id == request.context.span_id
    assert first.parent is not None and first.parent.span_id == mutation.context.span_id
    assert smtp[0].parent is not None and smtp[0].parent.span_id == first.context.span_id
    assert mutation.kind is CONSUMER
    assert (mutation.attributes or {})["durafn.outcome"] == "success"
    assert (mutation.attributes or {})["durafn.kind"] == "mutation"
    assert (mutation.attributes or {})["durafn.job_key"] == "order-7"
    first_attributes = first.attributes or {}
    assert (first_attributes["durafn.attempt"], first_attributes["durafn.outcome"]) == (
        1,
        "retried",
    )
    assert [e.name for e in first.events] == ["durafn.retry"]
    # The retry: a root of its own trace, linked to the span that scheduled the row.
    assert second.parent is None and second.context.trace_id != trace_id
    [link] = second.links
    assert link.context.span_id == mutation.context.span_id
    assert (link.attributes or {})["durafn.attempt"] == 2
    assert (second.attributes or {})["durafn.outcome"] == "success"
    assert smtp[1].parent is not None and smtp[1].parent.span_id == second.context.span_id


async def test_a_crons_tick_runs_as_a_root_span(
    app: durafn.App, clock: FakeClock, otel: Otel
) -> None:
    @app.mutation(name="nightly:report")
    async def report(ctx: MutationCtx) -> None:
        pass

    app.cron("nightly", "0 3 * * *", report.call())
    executor = app.executor()
    with otel.tracer.start_as_current_span("an unrelated span"):  # not the tick's parent
        await executor.run_until_idle()  # registers it
        clock.advance(86400)
        await executor.run_until_idle()  # the tick, and its run
    [run] = _named(otel.spans.get_finished_spans(), "durafn.run nightly:report")
    assert run.parent is None and not run.links
    assert (run.attributes or {})["durafn.cron"] == "nightly"


def _samples(page: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a Prometheus text page, parsed by prometheus-client's parser."""
    out = {}
    for family in text_string_to_metric_families(page):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


async def _scrape(asgi: Any) -> str:
    transport = httpx2.ASGITransport(app=asgi)
    async with httpx2.AsyncClient(transport=transport, base_url="http://metrics") as client:
        answer = await client.get("/metrics")
    assert answer.status_code == 200, answer.text
    return answer.text


async def test_a_crons_last_tick_age_is_read_from_its_row_and_never_negative(
    app: durafn.App, clock: FakeClock
) -> None:
    """The gauge is the clock's now less the cron's last tick; a process whose clock is
    behind the tick's (a skewed host, a test's fake clock) reads 0, not a negative age.
    The tick's row counts as a row scheduled, by the process whose leader wrote it."""

    @app.mutation(name="m:tick")
    async def tick(ctx: MutationCtx) -> None:
        pass

    app.cron("hourly", "0 * * * *", tick.call())
    endpoint = app.metrics_app()  # counted from here
    executor = app.executor()
    await executor.run_until_idle()  # registers it: its first tick is the next hour's
    [cron] = await app.crons()
    assert cron.next_run_at is not None
    clock.set(cron.next_run_at.timestamp())
    await executor.run_until_idle()  # the tick
    clock.advance(90)
    key = ("durafn_cron_last_tick_age_seconds", (("cron", "hourly"),))
    samples = _samples(await _scrape(endpoint))
    assert samples[key] == 90
    assert samples[("durafn_cron_ticks_total", (("cron", "hourly"), ("outcome", "triggered")))] == 1
    assert samples[("durafn_scheduled_total", (("function", "m:tick"),))] == 1
    await app.trigger_cron("hourly")  # by hand, with no hook registered: counted the same
    samples = _samples(await _scrape(endpoint))
    assert samples[("durafn_cron_ticks_total", (("cron", "hourly"), ("outcome", "triggered")))] == 2
    assert samples[("durafn_scheduled_total", (("function", "m:tick"),))] == 2
    behind = app.using(clock=FakeClock(clock.now() - 3600))
    try:
        assert _samples(await _scrape(behind.metrics_app()))[key] == 0
    finally:
        await behind.aclose()


async def test_counters_and_histograms_move_by_the_runs_and_gauges_match_the_table(
    app: durafn.App, clock: FakeClock
) -> None:
    @app.mutation(name="m:ok")
    async def ok(ctx: MutationCtx) -> None:
        pass

    @app.mutation(name="m:bad")
    async def bad(ctx: MutationCtx) -> None:
        raise ValueError("no")

    asgi = app.metrics_app()  # counting from here on, as a worker with --metrics-port does
    sched = app.scheduler()
    for _ in range(3):
        await sched.run_after(0, ok)
    await sched.run_after(0, bad)
    await app.executor().run_until_idle()
    await sched.run_many([ok.options(queue="later").call().after(60) for _ in range(2)])
    await sched.run_after(0, ok.options(queue="now"))
    clock.advance(1)
    samples = _samples(await _scrape(asgi))

    def runs(function: str, outcome: str) -> float:
        labels = (("function", function), ("kind", "mutation"), ("outcome", outcome))
        return samples[("durafn_runs_total", labels)]

    assert (runs("m:ok", "success"), runs("m:bad", "failed")) == (3, 1)
    by = (("function", "m:ok"), ("kind", "mutation"))
    assert samples[("durafn_run_duration_seconds_count", by)] == 3
    assert samples[("durafn_start_lag_seconds_count", by)] == 3
    assert samples[("durafn_scheduled_total", (("function", "m:ok"),))] == 6
    # The gauges, against a count of the table.
    async with app.engine.connect() as conn:
        due = (
            await conn.execute(
                text(
                    "SELECT count(*) FROM _scheduled_functions "
                    "WHERE state = 'Pending' AND available_at <= :now"
                ),
                {"now": clock.now()},
            )
        ).scalar_one()
    assert samples[("durafn_due_rows", ())] == due == 1
    assert samples[("durafn_queue_pending_rows", (("queue", "later"),))] == 2
    assert samples[("durafn_queue_due_rows", (("queue", "now"),))] == 1
    waited = "durafn_queue_oldest_due_age_seconds"
    assert samples[(waited, (("queue", "now"),))] == pytest.approx(1.0)
    assert samples[(waited, (("queue", "later"),))] == 0  # none due yet
    assert samples[("durafn_running_rows", ())] == 0
    assert samples[("durafn_workers_alive", ())] == 0
    assert samples[("durafn_oldest_due_age_seconds", ())] == pytest.approx(1.0)
    # Labels: function names, kinds, outcomes, queues, crons; never an id.
    for (_, labels), _value in samples.items():
        assert {k for k, _ in labels} <= {"function", "kind", "outcome", "queue", "cron", "le"}


async def test_with_metrics_alone_a_running_action_cancelled_is_counted_with_its_duration(
    app: durafn.App, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Metrics without spans or JSON logs keep no run's fields (``_Timed``): a running
    action's cancel is still counted, as canceled, with the time it ran."""
    from durafn._telemetry import Telemetry, _Timed

    # A host with no tracer provider (another test of this process may have set one).
    monkeypatch.setattr(Telemetry, "tracing", property(lambda self: None))
    started = anyio.Event()

    @app.action(name="a:waits")
    async def waits(ctx: ActionCtx) -> None:
        started.set()
        await ctx.wait_for_cancel()

    asgi = app.metrics_app()
    id = await app.scheduler().run_after(0, waits)
    async with app.run_executor():
        with anyio.fail_after(CEILING):
            await started.wait()
        assert [type(run) for run in app._rt.telemetry._runs.values()] == [_Timed]
        assert await app.cancel(id)
        await wait_until(lambda: true(_counted(app, "a:waits") == 1), "the cancel counted")
    samples = _samples(await _scrape(asgi))
    labels = (("function", "a:waits"), ("kind", "action"), ("outcome", "canceled"))
    assert samples[("durafn_runs_total", labels)] == 1
    by = (("function", "a:waits"), ("kind", "action"))
    assert samples[("durafn_run_duration_seconds_count", by)] == 1
    assert samples[("durafn_start_lag_seconds_count", by)] == 1


def _counted(app: durafn.App, name: str) -> float:
    metrics = app._rt.telemetry.metrics
    assert metrics is not None
    return sum(v for labels, v in metrics._runs.values.items() if labels[0] == name)


def test_a_histogram_counts_every_value_across_its_folds_and_threads() -> None:
    """Observations wait in a list and are counted into buckets a few hundred at a time
    (``Histogram.FOLD_AT``): a collection between folds counts the waiting ones, and
    collections from another thread while values keep coming never go back (a value
    counted twice, or not at all, for a moment would read as a counter reset)."""
    import threading

    from durafn._telemetry.metrics import SECONDS, Histogram

    histogram = Histogram("h_seconds", "test", ("function",))
    labels = ("f",)

    def read() -> tuple[float, float, float]:
        [family] = histogram.collect()
        by = {s.name: s.value for s in family.samples if s.labels.get("le") in (None, "0.01")}
        return by["h_seconds_count"], by["h_seconds_sum"], by["h_seconds_bucket"]

    values = [0.002, 0.02, 7.0, -1.0]  # a negative duration counts as 0 (a clock step)
    total = Histogram.FOLD_AT * 2 + 3
    for n in range(total):
        histogram.observe(labels, values[n % 4])
    count, summed, small = read()
    expected = [values[n % 4] for n in range(total)]
    assert count == total
    assert summed == pytest.approx(sum(max(0.0, v) for v in expected))
    assert small == sum(1 for v in expected if v <= 0.01)  # 0.002 and the clamped -1
    assert SECONDS[2] == 0.01

    readings: list[float] = []
    stop = threading.Event()

    def scrape() -> None:
        while not stop.is_set():
            readings.append(read()[0])

    scraper = threading.Thread(target=scrape)
    scraper.start()
    try:
        for n in range(Histogram.FOLD_AT * 20):
            histogram.observe(labels, values[n % 4])
    finally:
        stop.set()
        scraper.join()
    assert readings == sorted(readings), "a collection went back"
    assert read()[0] == total + Histogram.FOLD_AT * 20


async def test_the_queue_gauges_cover_the_declared_queues_and_a_bounded_number_of_others(
    app_url: tuple[str, bool], clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A queue per user: the per-queue gauges cover the first QUEUE_SERIES queues by
    name and every declared queue, whatever their number (5 here, for speed), so that
    neither the series nor the reading grows with the users."""
    from durafn._telemetry import reading

    monkeypatch.setattr(reading, "QUEUE_SERIES", 5)
    url, ready = app_url
    app = durafn.App(url, clock=clock, queues={"zz:declared": durafn.Queue(concurrency=2)})

    @app.mutation(name="m:per_user")
    async def per_user(ctx: MutationCtx) -> None:
        pass

    try:
        if not ready:
            await app.migrate()
        calls = [per_user.options(queue=f"user:{i}").call() for i in range(7)]
        await app.scheduler().run_many([*calls, per_user.options(queue="zz:declared").call()])
        samples = _samples(await _scrape(app.metrics_app()))
    finally:
        await app.aclose()
    covered = {dict(labels)["queue"] for name, labels in samples if name.startswith("durafn_queue")}
    assert covered == {*(f"user:{i}" for i in range(5)), "zz:declared"}
    assert samples[("durafn_queue_due_rows", (("queue", "zz:declared"),))] == 1
    assert samples[("durafn_due_rows", ())] == 8  # every queue's rows, in the totals


async def test_the_dashboard_serves_the_metrics_to_a_scraper_with_the_token(
    app: durafn.App,
) -> None:
    asgi = app.dashboard(token="s3cret")
    transport = httpx2.ASGITransport(app=asgi)
    async with httpx2.AsyncClient(transport=transport, base_url="http://localhost") as client:
        refused = await client.get("/metrics")
        wrong = await client.get("/metrics", headers={"authorization": "Bearer nope"})
        served = await client.get("/metrics", headers={"authorization": "Bearer s3cret"})
    assert (refused.status_code, wrong.status_code, served.status_code) == (403, 403, 200)
    assert ("durafn_workers_alive", ()) in _samples(served.text)


async def test_json_logs_carry_a_runs_fields_and_its_trace_id(app: durafn.App, otel: Otel) -> None:
    @app.mutation(name="logged:fails")
    async def fails(ctx: MutationCtx) -> None:
        logging.getLogger("user.code").warning("inside the run")
        raise ValueError("boom")

    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(durafn.json_log_formatter())
    loggers = [logging.getLogger("durafn"), logging.getLogger("user.code")]
    for logger in loggers:
        logger.addHandler(handler)
    try:
        sid = await app.scheduler().run_after(0, fails)
        executor = app.executor()
        await executor.run_until_idle()
    finally:
        for logger in loggers:
            logger.removeHandler(handler)
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]  # each parses
    [inside] = [r for r in lines if r["message"] == "inside the run"]
    [ended] = [r for r in lines if r.get("id") == sid]
    assert (ended["function"], ended["kind"], ended["state"]) == (
        "logged:fails",
        "mutation",
        "Failed",
    )
    assert ended["attempt"] == 1 and ended["level"] == "WARNING"
    assert ended["worker"] == executor.worker_id and ended["duration"] >= 0 and "lag" in ended
    [span] = _named(otel.spans.get_finished_spans(), "durafn.run logged:fails")
    assert ended["trace_id"] == inside["trace_id"] == f"{span.context.trace_id:032x}"
    assert inside["span_id"] == f"{span.context.span_id:016x}"


@contextlib.contextmanager
def json_lines(level: int = logging.DEBUG) -> Iterator[list[dict[str, Any]]]:
    """durafn's log records, as ``json_log_formatter`` writes them (parsed at the end)."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(durafn.json_log_formatter())
    logger = logging.getLogger("durafn")
    before = logger.level
    logger.addHandler(handler)
    logger.setLevel(level)
    found: list[dict[str, Any]] = []
    try:
        yield found
    finally:
        logger.removeHandler(handler)
        logger.setLevel(before)
        found.extend(json.loads(line) for line in stream.getvalue().splitlines())


def _runs(otel: Otel) -> dict[tuple[str, int], ReadableSpan]:
    """The runs' spans by (row id, attempt)."""
    found = {}
    for span in otel.spans.get_finished_spans():
        attributes = span.attributes or {}
        if span.name.startswith("durafn.run ") and "durafn.attempt" in attributes:
            key = (str(attributes["messaging.message.id"]), int(str(attributes["durafn.attempt"])))
            assert key not in found, key
            found[key] = span
    return found


def _assert_lines_carry_their_spans(
    lines: list[dict[str, Any]], spans: dict[tuple[str, int], ReadableSpan]
) -> None:
    """Each line about a run names its run's span: the trace and span ids, the attempt
    and the worker its span has."""
    assert lines
    for line in lines:
        span = spans.get((str(line["id"]), int(line.get("attempt") or 0)))
        assert span is not None, f"no span for the run of this line: {line}"
        attributes = span.attributes or {}
        assert span.context is not None
        assert (line["trace_id"], line["span_id"], line["worker"]) == (
            f"{span.context.trace_id:032x}",
            f"{span.context.span_id:016x}",
            attributes["durafn.worker"],
        ), line


@pytest.mark.parametrize("how", ["run_until_idle", "a running executor"])
async def test_every_json_line_about_a_run_carries_its_spans_fields(
    app: durafn.App, clock: FakeClock, otel: Otel, how: str
) -> None:
    """Every line durafn writes about a run (its start, its end, its retry), down to
    DEBUG, carries the run's ``trace_id``, ``span_id``, ``attempt`` and ``worker``, as its
    span has them: an action's first line was written at its claim, before its span
    began, with none of the four."""
    failures: list[int] = []

    @app.mutation(name="lines:mutate")
    async def mutate(ctx: MutationCtx) -> None:
        pass

    @app.action(name="lines:act")
    async def act(ctx: ActionCtx, n: int) -> int:
        return n

    @app.action(name="lines:flaky", retry=durafn.Retry(2, backoff=durafn.Fixed(0)))
    async def flaky(ctx: ActionCtx) -> None:
        if not failures:
            failures.append(1)
            raise ValueError("the first run fails")

    @app.action(name="lines:batched", batch=durafn.Batch(max_size=10, max_wait=0))
    async def batched(ctx: ActionCtx, items: list[int]) -> list[int]:
        return items

    executor = app.executor()
    with json_lines() as lines:
        scheduler = app.scheduler()
        ids = [
            await scheduler.run_after(0, mutate),
            await scheduler.run_after(0, act, 1),
            await scheduler.run_after(0, flaky),
            await scheduler.run_after(0, batched, 1),
            await scheduler.run_after(0, batched, 2),
        ]
        if how == "run_until_idle":
            await executor.run_until_idle()
        else:
            async with executor:
                for id in ids:
                    await executor.wait_for(id)
    about_runs = [line for line in lines if line.get("id") is not None]
    assert {line["id"] for line in about_runs} == set(ids)
    started = [line for line in about_runs if "-> InProgress" in line["message"]]
    # Each action's runs: the flaky one's two, each batched item's.
    assert sorted((line["function"], line.get("attempt")) for line in started) == [
        ("lines:act", 1),
        ("lines:batched", 1),
        ("lines:batched", 1),
        ("lines:flaky", 1),
        ("lines:flaky", 2),
    ]
    _assert_lines_carry_their_spans(about_runs, _runs(otel))


async def test_a_lost_runs_line_carries_its_rescues_span(
    app: durafn.App, clock: FakeClock, otel: Otel
) -> None:
    """A run lost with its worker is a short span on the worker that rescues it: the
    rescue's line carries that span's ids, its worker (the rescuer), the run's attempt,
    and the lost worker."""
    sid = await _dead_worker_claims(app, "elsewhere:4242:dead")
    with json_lines(logging.WARNING) as lines:
        async with app.run_executor(**HEARTBEATS) as rescuer:
            worker = rescuer.worker_id  # this run's (the next has another)
            await wait_until(lambda: has_beaten(app, rescuer.worker_id, clock.now()), "a beat")
            for _ in range(6):  # past the 5 s timeout of the rescuer's own beats
                clock.advance(1)
                await wait_until(lambda: has_beaten(app, rescuer.worker_id, clock.now()), "a beat")
            finished = otel.spans.get_finished_spans
            await wait_until(
                lambda: true(bool(_named(finished(), "durafn.run victim"))), "the rescue's span"
            )
    [line] = [line for line in lines if line.get("id") == sid]
    assert "its worker was lost" in line["message"]
    assert (line.get("attempt"), line.get("lost_worker")) == (1, "elsewhere:4242:dead")
    assert line.get("worker") == worker
    _assert_lines_carry_their_spans([line], _runs(otel))


def test_without_the_extra_nothing_is_imported_nor_stored(tmp_path: Path) -> None:
    """A process where neither opentelemetry nor prometheus_client can be imported:
    rows are scheduled and run, their trace context is NULL, and asking for metrics
    says what to install."""
    script = textwrap.dedent(
        f"""
        import sys
        sys.modules["opentelemetry"] = None  # as if not installed
        sys.modules["prometheus_client"] = None
        import anyio, durafn

        app = durafn.App("sqlite+aiosqlite:///{tmp_path}/plain.db")

        @app.mutation(name="plain")
        async def plain(ctx) -> None:
            pass

        async def main() -> None:
            await app.migrate()
            sid = await app.scheduler().run_after(0, plain)
            await app.executor().run_until_idle()
            async with app.engine.connect() as conn:
                found = (await conn.exec_driver_sql(
                    "SELECT state, trace_context FROM _scheduled_functions")).one()
            try:
                app.metrics_app()
            except durafn.ArgumentError as exc:
                print(exc)
            print(tuple(found))
            print(sorted(m for m in sys.modules if m.startswith(("opentelemetry", "prometheus"))
                         and sys.modules[m] is not None))
            await app.aclose()

        anyio.run(main)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, check=False
    )
    assert done.returncode == 0, done.stderr
    said, row, imported = done.stdout.splitlines()
    assert "pip install 'durafn[otel]'" in said
    assert row == "('Success', None)" and imported == "[]"


def test_the_shipped_rules_and_dashboard_name_only_metrics_that_exist() -> None:
    """ops/: the Prometheus alert rules parse, and every metric they and the Grafana
    dashboard's queries name is one durafn exposes."""
    import re

    import yaml

    from durafn._telemetry.metrics import Metrics

    async def _reading() -> Any:
        raise AssertionError("not read")

    import prometheus_client

    exposed: set[str] = set()
    for family in Metrics(prometheus_client, _reading).registry.collect():
        kind = family.type
        if kind == "counter":
            exposed.add(family.name + "_total")
        elif kind == "histogram":
            exposed |= {family.name + s for s in ("_bucket", "_count", "_sum")}
        else:
            exposed.add(family.name)
    from durafn._telemetry import metrics as module

    source = Path(module.__file__).read_text()
    exposed |= set(re.findall(r'gauge\(\s*"(durafn_[a-z_]+)"', source))
    ops = Path(ROOT) / "ops"
    rules = yaml.safe_load((ops / "prometheus" / "durafn-alerts.yml").read_text())
    exprs = [r["expr"] for g in rules["groups"] for r in g["rules"]]
    assert {r["alert"] for g in rules["groups"] for r in g["rules"]} >= {
        "DurafnBacklogGrowing",
        "DurafnStartLagHigh",
        "DurafnNoWorkers",
        "DurafnCronTickMissed",
        "DurafnFailureRateHigh",
    }
    board = json.loads((ops / "grafana" / "durafn-dashboard.json").read_text())
    exprs += [t["expr"] for p in board["panels"] for t in p.get("targets", [])]
    named = {n for e in exprs for n in re.findall(r"\bdurafn_[a-z_]+", e)}
    assert named and named <= exposed, sorted(named - exposed)


async def test_the_counters_and_gauges_reach_the_opentelemetry_metrics_api(
    otel: Otel, app_url: tuple[str, bool]
) -> None:
    """Where the host uses OpenTelemetry's metrics API, an app built then keeps metrics
    from the start, and the host's SDK reads the counters and the gauges when it collects,
    with nothing scraping the Prometheus endpoint: from its reader's thread (as a periodic
    reader does) the gauges are read for the collection; from the event loop's own thread
    the read starts, and the next collection has it. (Its own app, on the test's
    database: built after the SDK, as a host builds it.)"""
    import uuid

    from durafn._telemetry.metrics import SECONDS

    url, ready = app_url
    app = durafn.App(url)
    name = f"otel:{uuid.uuid4().hex[:8]}"  # the provider is the process's: a name of its own

    @app.mutation(name=name)
    async def noted(ctx: MutationCtx) -> None:
        pass

    def points() -> dict[tuple[str, tuple[tuple[str, Any], ...]], Any]:
        data = otel.metrics.get_metrics_data()
        return {
            (m.name, tuple(sorted(p.attributes.items()))): p.value
            for rm in data.resource_metrics
            for sm in rm.scope_metrics
            for m in sm.metrics
            for p in m.data.data_points
        }

    try:
        if not ready:
            await app.migrate()
        for _ in range(2):
            await app.scheduler().run_after(0, noted)
        await app.executor().run_until_idle()
        await app.scheduler().run_after(0, noted)  # due, not run
        from_reader = await anyio.to_thread.run_sync(points)
        labels = (("durafn.function", name), ("durafn.kind", "mutation"))
        assert from_reader[("durafn.runs", (*labels, ("durafn.outcome", "success")))] == 2
        assert from_reader[("durafn.scheduled", (("durafn.function", name),))] == 3
        assert from_reader[("durafn.due_rows", ())] == 1  # the row due now, counted
        assert from_reader[("durafn.workers_alive", ())] == 0
        assert from_reader[("durafn.oldest_due_age", ())] >= 0
        # The histograms, as Prometheus's classic form: a counter per bucket bound.
        buckets = {
            dict(attributes)["le"]: value
            for (metric, attributes), value in from_reader.items()
            if metric == "durafn.run_duration.bucket" and dict(attributes).get(labels[0][0]) == name
        }
        assert buckets["+Inf"] == 2 and len(buckets) == len(SECONDS) + 1
        assert sorted(buckets.values()) == [buckets[b] for b in sorted(buckets, key=float)]
        assert from_reader[("durafn.run_duration.count", labels)] == 2
        assert from_reader[("durafn.start_lag.count", labels)] == 2
        assert from_reader[("durafn.run_duration.sum", labels)] > 0
        await app.scheduler().run_after(0, noted)
        gauges = app._rt.telemetry.metrics.gauges  # type: ignore[union-attr]
        gauges.reading = None  # as if older than GAUGE_TTL, with nothing read before
        assert ("durafn.due_rows", ()) not in points()  # on the loop: the read starts

        async def read() -> bool:
            return gauges.reading is not None

        await wait_until(read, "the collection's read ends")
        from_loop = points()
    finally:
        await app.aclose()
    assert from_loop[("durafn.due_rows", ())] == 2


async def test_the_metrics_command_serves_the_gauges(app: durafn.App, db_url: str) -> None:
    """``durafn metrics`` in a process of its own: the database's gauges, as Prometheus
    text, equal to what the table holds."""
    import socket
    import sys

    from .support.processes import owned

    @app.mutation(name="gauged")
    async def gauged(ctx: MutationCtx) -> None:
        pass

    from datetime import UTC, datetime

    past = datetime(2000, 1, 1, tzinfo=UTC)  # due in the test's fake time and in real time
    for _ in range(3):
        await app.scheduler().run_at(past, gauged)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}/metrics"

    async def answers() -> bool:
        try:
            async with httpx2.AsyncClient() as client:
                return (await client.get(url)).status_code == 200
        except httpx2.TransportError:
            return False

    command = [sys.executable, "-m", "_durafn_cli", "metrics", "--url", db_url]
    async with owned() as owner:
        await owner.start([*command, "--port", str(port)], cwd=ROOT)
        await wait_until(answers, "the metrics answer")
        async with httpx2.AsyncClient() as client:
            samples = _samples((await client.get(url)).text)
    assert samples[("durafn_due_rows", ())] == 3
    assert samples[("durafn_workers_alive", ())] == 0
