"""Metrics: counters and histograms recorded as runs end (in the process that ran them),
and gauges read from the database when scraped (cached for ``GAUGE_TTL`` seconds, each a
bounded read).

Kept in prometheus-client's registry, one per app, served as Prometheus text by
``durafn metrics``, ``durafn worker --metrics-port``, the dashboard's ``/metrics`` and
``app.metrics_app()``; the counters and gauges mirrored to the OpenTelemetry metrics API
(meter ``durafn``, observable instruments: the host's SDK, if it configures one, reads
them when it collects).

Every label set is bounded: a function's name, a kind, an outcome, a queue's name, a
cron's name. Never an id, a key or an argument.
"""

from __future__ import annotations

import asyncio
import bisect
import concurrent.futures
import itertools
import logging
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from .._kinds import FunctionKind

logger = logging.getLogger("durafn.telemetry")

GAUGE_TTL = 5.0
"""Seconds a reading of the database's gauges is served before the next scrape reads
again: a scrape every second by several Prometheus servers costs one read per 5 s."""
COLLECT_WAIT = 2.0
"""Seconds an OpenTelemetry collection (from its reader's thread) waits for a stale
reading to be read again before it reports the previous one."""
QUEUE_SERIES = 100
"""How many queues the per-queue gauges cover beyond the app's declared ones: the first
by name. Every label set is bounded, and so is the reading's cost."""
GAUGE_BOUND = 10_000
"""Where the gauges' counts stop (``app.stats(bound=)``, ``app.queues(bound=)``)."""
SECONDS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800)
"""Histogram buckets (seconds) for run durations and start lags: a no-op mutation's 1 ms
to a half-hour action."""
OUTCOMES = ("success", "failed", "retried", "snoozed", "canceled", "lost")


def load() -> Any:
    """prometheus-client, or None where it is not installed."""
    try:
        import prometheus_client
    except ImportError:
        return None
    return prometheus_client


@dataclass
class Reading:
    """The database's gauges at one moment (``Gauges.read``)."""

    at: float
    due: int
    due_capped: bool
    oldest_due_age: float
    running: int
    workers: int
    queues: list[tuple[str, int, int, bool, float]] = field(default_factory=list)
    """(queue, due, pending, paused, how long its longest-waiting due row has waited)."""
    crons: list[tuple[str, float | None]] = field(default_factory=list)
    """(cron, seconds since its last tick, None: never ticked)."""


class Metrics:
    """The instruments of one app."""

    def __init__(self, prometheus: Any, read: Callable[[], Any]) -> None:
        registry = self.registry = prometheus.CollectorRegistry(auto_describe=True)
        self._runs = Counter(
            "durafn_runs",
            "Runs that ended, by function, kind and outcome (success, failed, retried, "
            "snoozed, canceled, lost).",
            ("function", "kind", "outcome"),
        )
        self._scheduled = Counter(
            "durafn_scheduled",
            "Rows scheduled by this process's own transactions, by function.",
            ("function",),
        )
        self._duration = Histogram(
            "durafn_run_duration_seconds",
            "How long a run took, from its call to its end.",
            ("function", "kind"),
        )
        self._lag = Histogram(
            "durafn_start_lag_seconds",
            "From when a row was due to when its run started.",
            ("function", "kind"),
        )
        self._ticks = Counter(
            "durafn_cron_ticks",
            "A cron's ticks written or skipped by the cron leader in this process.",
            ("cron", "outcome"),
        )
        for instrument in (self._runs, self._scheduled, self._duration, self._lag, self._ticks):
            registry.register(instrument)
        self.gauges = Gauges(prometheus, read)
        registry.register(self.gauges)
        _Mirror.load(self)

    def ended(self, name: str, kind: FunctionKind, outcome: str, duration: float | None) -> None:
        self._runs.inc((name, kind, outcome))  # kind: a StrEnum, its own label value
        if duration is not None:
            self._duration.observe((name, kind), duration)

    def ended_many(
        self, kind: FunctionKind, ended: Iterable[tuple[str, str, float | None]]
    ) -> None:
        """``ended`` for each (name, outcome, duration) of a batch, in one loop: a no-op
        mutation's row cost 20 us of CPU, and a call per run per metric was 5% of it."""
        counts, observe = self._runs.values, self._duration.observe
        for name, outcome, duration in ended:
            labels = (name, kind, outcome)  # kind: a StrEnum, its own label value
            counts[labels] = counts.get(labels, 0) + 1
            if duration is not None:
                observe((name, kind), duration)

    def started(self, name: str, kind: FunctionKind, lag: float) -> None:
        self._lag.observe((name, kind), lag)

    @property
    def observe_lag(self) -> Callable[[tuple[str, ...], float], None]:
        """``started`` without its call: the lag histogram's ``observe``."""
        return self._lag.observe

    def scheduled(self, names: Iterable[str]) -> None:
        for name in names:
            self._scheduled.inc((name,))

    def tick(self, cron: str, outcome: str) -> None:
        self._ticks.inc((cron, outcome))


class Counter:
    """A counter family kept as plain numbers per label set, collected by prometheus-client
    (a custom collector: its documented extension point), which writes the exposition.

    Not prometheus-client's own ``Counter`` and ``Histogram``: each of their increments
    takes a lock and each ``labels()`` another, and a run made five of them, 10 us of a
    no-op mutation's 65 (``python -m benchmarks.telemetry``). These are written only from
    the event loop's thread; a scrape from another thread reads a copy."""

    def __init__(self, name: str, documentation: str, labels: Sequence[str]) -> None:
        self.name, self.documentation, self.labels = name, documentation, list(labels)
        self.values: dict[tuple[str, ...], float] = {}

    def inc(self, labels: tuple[str, ...], by: float = 1) -> None:
        self.values[labels] = self.values.get(labels, 0) + by

    def collect(self) -> Iterable[Any]:
        from prometheus_client.core import CounterMetricFamily

        family = CounterMetricFamily(self.name, self.documentation, labels=self.labels)
        for labels, value in list(self.values.items()):
            family.add_metric(labels, value)
        yield family


class Histogram:
    """A histogram family with the ``SECONDS`` buckets, kept as ``Counter`` keeps its
    values: per label set, each bucket's own count (not cumulative), then the sum.

    An observation is appended to its label set's list, and the lists are counted into
    buckets in one loop when ``FOLD_AT`` have gathered: 0.15 us a value where finding each
    one's bucket as it came was 0.6 us, and a run makes two (its start lag and its
    duration). A collection, from any thread, counts the waiting values into its copy;
    the lock keeps it from seeing a fold half done (a value in both places or neither),
    so each collection's counts are at least the last one's."""

    FOLD_AT: ClassVar[int] = 512

    def __init__(self, name: str, documentation: str, labels: Sequence[str]) -> None:
        self.name, self.documentation, self.labels = name, documentation, list(labels)
        self.series: dict[tuple[str, ...], list[float]] = {}
        self._waiting: dict[tuple[str, ...], list[float]] = {}
        self._lock = threading.Lock()

    def observe(self, labels: tuple[str, ...], value: float) -> None:
        waiting = self._waiting.get(labels)
        if waiting is None:
            self.series.setdefault(labels, [0] * (len(SECONDS) + 2))
            waiting = self._waiting.setdefault(labels, [])
        waiting.append(value)
        if len(waiting) >= self.FOLD_AT:
            with self._lock:
                folded = len(waiting)  # appended meanwhile (another thread): left waiting
                _count(self.series[labels], waiting[:folded])
                del waiting[:folded]

    def collect(self) -> Iterable[Any]:
        from prometheus_client.core import HistogramMetricFamily
        from prometheus_client.utils import floatToGoString

        bounds = [*map(floatToGoString, SECONDS), "+Inf"]
        family = HistogramMetricFamily(self.name, self.documentation, labels=self.labels)
        with self._lock:  # one moment's copy
            copies = [
                (labels, counts[:], self._waiting.get(labels, [])[:])
                for labels, counts in list(self.series.items())
            ]
        for labels, counts, waiting in copies:
            _count(counts, waiting)
            cumulative = list(itertools.accumulate(counts[:-1]))
            family.add_metric(labels, list(zip(bounds, cumulative, strict=True)), counts[-1])
        yield family


def _count(counts: list[float], values: list[float]) -> None:
    """Add ``values`` to a histogram's bucket counts (each bucket its own, the sum last)."""
    bucket, total = bisect.bisect_left, 0.0
    for value in values:
        value = value if value > 0.0 else 0.0
        counts[bucket(SECONDS, value)] += 1  # the first bucket with value <= le
        total += value
    counts[-1] += total


class Gauges:
    """A prometheus-client collector of the database's gauges, from the latest reading
    (``refresh`` reads again when it is older than ``GAUGE_TTL``)."""

    def __init__(self, prometheus: Any, read: Callable[[], Any]) -> None:
        from prometheus_client.core import GaugeMetricFamily

        self._family = GaugeMetricFamily
        self._read = read
        self.reading: Reading | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        """The event loop the app's pool is used from (``Telemetry.bind_loop``): where
        ``latest`` reads the database."""
        self._started: set[asyncio.Task[Reading]] = set()

    async def refresh(self, now: float | None = None) -> Reading:
        now = time.monotonic() if now is None else now
        if self.reading is None or now - self.reading.at >= GAUGE_TTL:
            self.reading = await self._read()
            self.reading.at = now
        return self.reading

    def latest(self) -> Reading | None:
        """The reading for a collection from any thread (OpenTelemetry's observable
        gauges: its reader collects from a thread of its own, or from the caller's),
        read again first where it is older than ``GAUGE_TTL``. From another thread it
        waits for the read up to ``COLLECT_WAIT``; on the loop's own thread, which cannot
        wait on itself, it starts the read and serves the previous reading. Before the
        app has used its pool there is no loop to read on, and nothing to report."""
        loop = self.loop
        fresh = self.reading is not None and time.monotonic() - self.reading.at < GAUGE_TTL
        if loop is not None and loop.is_closed():
            return None  # an app whose loop has ended: its reading is of another time
        if fresh or loop is None:
            return self.reading
        try:
            running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            if not self._started:
                task = loop.create_task(self.refresh())
                self._started.add(task)
                task.add_done_callback(self._done)
            return self.reading
        try:
            return asyncio.run_coroutine_threadsafe(self.refresh(), loop).result(COLLECT_WAIT)
        except concurrent.futures.TimeoutError:
            return self.reading
        except Exception:  # a collection must not fail for a database that is away
            logger.warning("the gauges could not be read for a collection", exc_info=True)
            return self.reading

    def _done(self, task: asyncio.Task[Reading]) -> None:
        self._started.discard(task)
        if not task.cancelled() and task.exception() is not None:
            logger.warning("the gauges could not be read", exc_info=task.exception())

    def describe(self) -> Sequence[Any]:
        return []

    def collect(self) -> Iterable[Any]:
        r = self.reading
        if r is None:
            return
        gauge = self._family
        yield gauge(
            "durafn_due_rows",
            f"Pending rows due now, in all queues (counted up to {GAUGE_BOUND}).",
            value=r.due,
        )
        yield gauge(
            "durafn_oldest_due_age_seconds",
            "How long the longest-waiting due row has waited (0: nothing due).",
            value=r.oldest_due_age,
        )
        yield gauge("durafn_running_rows", "Rows InProgress.", value=r.running)
        yield gauge("durafn_workers_alive", "Workers with a live heartbeat row.", value=r.workers)
        due = gauge("durafn_queue_due_rows", "Pending rows due now, per queue.", labels=["queue"])
        pending = gauge("durafn_queue_pending_rows", "Pending rows, per queue.", labels=["queue"])
        paused = gauge("durafn_queue_paused", "1 if the queue is paused.", labels=["queue"])
        oldest = gauge(
            "durafn_queue_oldest_due_age_seconds",
            "How long a queue's longest-waiting due row has waited (0: nothing due; among "
            f"its first {GAUGE_BOUND} due rows in claim order).",
            labels=["queue"],
        )
        for name, d, p, stopped, waited in r.queues:
            due.add_metric([name], d)
            pending.add_metric([name], p)
            paused.add_metric([name], 1 if stopped else 0)
            oldest.add_metric([name], waited)
        yield from (due, pending, paused, oldest)
        age = gauge(
            "durafn_cron_last_tick_age_seconds",
            "Seconds since a cron's last tick (absent: it never ticked).",
            labels=["cron"],
        )
        for name, seconds in r.crons:
            if seconds is not None:
                age.add_metric([name], seconds)
        yield age


class _Mirror:
    """The same metrics through the OpenTelemetry metrics API, read from the registries
    when the host's SDK collects (observable instruments): nothing on the hot path. A
    counter and a histogram recorded per run through the SDK cost 25 us a run, more than
    a no-op mutation's own 20 to 40.

    The API has no observable histogram, so each histogram goes as Prometheus's classic
    form does: ``<name>.bucket`` (runs at or under each bound, attribute ``le``, ``+Inf``
    last), ``<name>.count`` and ``<name>.sum``, each an observable counter; a backend
    computes quantiles from the buckets as it would from Prometheus's. (Native OTel
    histograms: the Collector's ``prometheus`` receiver scraping ``/metrics`` makes them.)

    One set of instruments per process (a meter keeps the first instrument of a name),
    observing every app's metrics that is alive."""

    _apps: ClassVar[weakref.WeakSet[Metrics]] = weakref.WeakSet()
    _made = False

    @classmethod
    def load(cls, owner: Metrics) -> None:
        """Mirror ``owner``'s metrics, where the process uses OpenTelemetry's metrics API
        (a host that never imported it has configured no provider to export to)."""
        if "opentelemetry.metrics" not in sys.modules:
            return
        cls._apps.add(owner)
        if not cls._made:
            cls._made = True
            cls._make()

    @classmethod
    def _make(cls) -> None:
        from opentelemetry import metrics
        from opentelemetry.metrics import Observation

        meter = metrics.get_meter("durafn")
        names = {"function": "durafn.function", "kind": "durafn.kind", "outcome": "durafn.outcome"}

        def counted(
            which: Callable[[Metrics], Any], part: str = "_total"
        ) -> Callable[[Any], list[Any]]:
            """The samples of a family whose names end in ``part``: a counter's total, or
            a histogram's buckets, count or sum."""

            def observe(_: Any) -> list[Any]:
                return [
                    Observation(s.value, {names.get(k, k): v for k, v in s.labels.items()})
                    for app in list(cls._apps)
                    for family in which(app).collect()
                    for s in family.samples
                    if s.name.endswith(part)
                ]

            return observe

        for name, which, what in (
            ("durafn.run_duration", lambda m: m._duration, "How long runs took"),
            ("durafn.start_lag", lambda m: m._lag, "From when rows were due to their start"),
        ):
            for part, unit, said in (
                ("bucket", "1", "runs at or under each bound (le, seconds)"),
                ("count", "1", "runs"),
                ("sum", "s", "seconds in all"),
            ):
                meter.create_observable_counter(
                    f"{name}.{part}",
                    [counted(which, f"_{part}")],
                    unit=unit,
                    description=f"{what}: {said}.",
                )

        def gauge(value: Callable[[Reading], float]) -> Callable[[Any], list[Any]]:
            def observe(_: Any) -> list[Any]:
                readings = [app.gauges.latest() for app in list(cls._apps)]
                return [Observation(value(r)) for r in readings if r is not None][-1:]

            return observe

        meter.create_observable_counter(
            "durafn.runs", [counted(lambda m: m._runs)], description="Runs that ended."
        )
        meter.create_observable_counter(
            "durafn.scheduled", [counted(lambda m: m._scheduled)], description="Rows scheduled."
        )
        meter.create_observable_gauge(
            "durafn.due_rows", [gauge(lambda r: r.due)], description="Rows due now."
        )
        meter.create_observable_gauge(
            "durafn.oldest_due_age",
            [gauge(lambda r: r.oldest_due_age)],
            unit="s",
            description="How long the longest-waiting due row has waited.",
        )
        meter.create_observable_gauge(
            "durafn.workers_alive", [gauge(lambda r: r.workers)], description="Live workers."
        )
