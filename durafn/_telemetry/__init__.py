"""Observability of an app's runs: traces (``tracing``), metrics (``metrics``), JSON logs
(``logs``), and the Prometheus endpoint (``endpoint``).

``Telemetry`` is what the executor and the writers call, at five points: a row is
written (``capture`` its trace context; ``scheduled``), a run begins (``begin``: its span
and start lag) and its function returns (the context manager ``begin`` returns, which
also makes the run's span current inside the function), its outcome commits (``ended``),
a running action's row is cancelled (``cancelled``), a lost worker's runs are rescued
(``lost``). Each part is on where its package is installed (``durafn[otel]``): tracing
with ``opentelemetry-api``, metrics with ``prometheus-client``; with neither, ``on`` is
False and the executor skips every call.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from .._kinds import FunctionKind, State
from . import logs, metrics, tracing
from .metrics import Metrics, Reading
from .tracing import Tracing

__all__ = ["Reading", "Telemetry"]


_NOTHING = nullcontext()


class _Timed:
    """A run between its start and its committed outcome, where only metrics are kept
    (no span, no log line's fields): its name, kind and times, nothing else.

    With metrics alone, ``begin``'s ``_Run`` and a histogram's bucket found per value
    cost 3.4 us a run (``python -m benchmarks.telemetry --micro``, less the 0.5 us of
    the calls without telemetry), a sixth of a no-op mutation's 20 us of CPU; this, the
    histograms' gathered values (``metrics.Histogram``) and a batch's outcomes counted in
    one loop (``Metrics.ended_many``), 1.0 us."""

    __slots__ = ("ended_at", "kind", "name", "started")

    def __init__(self, name: str, kind: FunctionKind) -> None:
        self.name, self.kind = name, kind
        self.started = time.perf_counter()
        self.ended_at: float | None = None

    def __enter__(self) -> None:
        pass

    def __exit__(self, *_: object) -> None:
        self.ended_at = time.perf_counter()


class _Run:
    """A run between its start and its committed outcome."""

    __slots__ = (
        *("attempt", "context", "ended_at", "kind", "name", "span", "started", "token"),
        *("tracing", "lag", "worker"),
    )

    def __init__(
        self, name: str, kind: FunctionKind, attempt: int, tracing: Tracing | None
    ) -> None:
        self.name, self.kind, self.attempt, self.tracing = name, kind, attempt, tracing
        self.span: Any = None
        self.context: Any = None
        self.token: Any = None
        self.started = time.perf_counter()
        self.ended_at: float | None = None
        self.lag = 0.0
        self.worker: str | None = None

    def __enter__(self) -> None:
        if self.context is not None and self.tracing is not None:
            self.token = self.tracing.attach(self.context)

    def __exit__(self, *_: object) -> None:
        self.ended_at = time.perf_counter()
        if self.token is not None and self.tracing is not None:
            self.tracing.detach(self.token)
            self.token = None


def _unobserved(labels: tuple[str, ...], value: float) -> None:
    """The lag histogram's ``observe`` before metrics are kept (never called then)."""


class Telemetry:
    """One app's traces and metrics (``Runtime.telemetry``)."""

    def __init__(self, read_gauges: Callable[[], Awaitable[Reading]]) -> None:
        self._read_gauges = read_gauges
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tracing: Tracing | None = None
        self.metrics: Metrics | None = None
        """Counters, histograms and gauges: kept from the first ``measure()`` on (the
        Prometheus endpoint asks for it), or from the start where the process uses the
        OpenTelemetry metrics API."""
        self._observe_lag: Callable[[tuple[str, ...], float], None] = _unobserved
        if "opentelemetry.metrics" in sys.modules:
            self.measure()
        self._runs: dict[str, _Run | _Timed] = {}

    @property
    def tracing(self) -> Tracing | None:
        """Spans, once the process uses OpenTelemetry's trace API and has set a tracer
        provider (an SDK): a host that never imported the API has no span to follow and
        pays nothing, not even the import (~50 ms a process); one with the API's default
        provider would only make non-recording spans, 12 us a run for nothing."""
        if self._tracing is None:
            if "opentelemetry.trace" not in sys.modules:
                return None
            trace = tracing.load()
            if trace is None:
                return None
            self._tracing = Tracing(trace)
        return self._tracing if self._tracing.provided() else None

    @property
    def on(self) -> bool:
        """Whether anything is recorded (else the executor calls nothing here): metrics,
        spans, or the runs' fields for JSON log lines."""
        return self.metrics is not None or logs.in_use or self.tracing is not None

    def measure(self) -> Metrics | None:
        """Keep metrics from now on (None: prometheus-client is not installed)."""
        if self.metrics is None:
            prometheus = metrics.load()
            if prometheus is not None:
                self.metrics = Metrics(prometheus, self._read_gauges)
                self.metrics.gauges.loop = self._loop
                self._observe_lag = self.metrics.observe_lag
        return self.metrics

    def bind_loop(self) -> None:
        """The app's pool is (again) in use from the running event loop: where the
        gauges are read for an OpenTelemetry collection (``Gauges.latest``)."""
        self._loop = asyncio.get_running_loop()
        if self.metrics is not None:
            self.metrics.gauges.loop = self._loop

    # -- scheduling ----------------------------------------------------------------------

    def capture(self) -> str | None:
        """The current trace context, for a row about to be written."""
        tracing = self.tracing
        return tracing.capture() if tracing is not None else None

    def scheduled(self, names: Iterable[str]) -> None:
        if self.metrics is not None:
            self.metrics.scheduled(names)

    # -- runs ----------------------------------------------------------------------------

    def running(
        self, kind: FunctionKind, row: Any, now: float | None, worker: str | None
    ) -> AbstractContextManager[None]:
        """``with`` it around a claimed row's function call (``row``: the store's
        ``Claimed``; ``now``: when its run started): ``begin`` where anything is
        recorded, else a context that does nothing."""
        tracing = self.tracing
        if tracing is None and not logs.in_use:
            metrics = self.metrics
            if metrics is None:
                return _NOTHING
            name = row.name
            timed = self._runs[row.id] = _Timed(name, kind)
            self._observe_lag((name, kind), 0.0 if now is None else now - row.available_at)
            return timed
        return self.begin(kind, row, now, worker, tracing)

    def begin(
        self,
        kind: FunctionKind,
        row: Any,
        now: float | None,
        worker: str | None,
        tracing: Tracing | None,
    ) -> _Run:
        """A claimed row's run begins; ``with`` the result around the function's call
        (``tracing``: ``self.tracing``, asked once by the caller)."""
        attempt = row.attempts if kind is FunctionKind.ACTION else row.attempts + 1
        run = _Run(row.name, kind, attempt, tracing)
        stale = self._runs.pop(row.id, None)
        if isinstance(stale, _Run) and stale.span is not None and tracing is not None:
            tracing.end(stale.span, "rerun", {})  # its batch was run again
        self._runs[row.id] = run
        lag = run.lag = 0.0 if now is None else now - row.available_at
        run.worker = worker
        if self.metrics is not None:
            self.metrics.started(row.name, kind, lag)
        if tracing is not None:
            run.span, run.context = tracing.start(
                kind, row.name, attempt, row.trace_context, row.queue_name or row.name
            )
            if run.span.is_recording():  # a sampled-out run builds none of these
                attributes: dict[str, Any] = {
                    "messaging.message.id": str(row.id),  # the row's id
                    "durafn.function": row.name,
                    "durafn.kind": kind.value,
                    "durafn.attempt": attempt,
                    "durafn.priority": row.priority,
                    "durafn.due_time": row.available_at,
                    "durafn.start_lag": lag,
                }
                if worker is not None:
                    attributes["durafn.worker"] = worker
                if row.queue_name is not None:
                    attributes["durafn.queue"] = row.queue_name
                if row.flow_key is not None:
                    attributes["durafn.flow_key"] = row.flow_key
                if row.job_key is not None:
                    attributes["durafn.job_key"] = row.job_key
                run.span.set_attributes(attributes)
        return run

    def fields(self, id: str) -> dict[str, Any]:
        """A run's fields for its log line (``logs``), while its outcome is being
        recorded: the same as its span's, the trace's id among them."""
        run = self._runs.get(id)
        if not isinstance(run, _Run):
            return {}
        found: dict[str, Any] = {"durafn_attempt": run.attempt, "durafn_lag": run.lag}
        if run.ended_at is not None:
            found["durafn_duration"] = run.ended_at - run.started
        if run.worker is not None:
            found["durafn_worker"] = run.worker
        if run.span is not None:
            context = run.span.get_span_context()
            if context.is_valid:
                found["trace_id"] = f"{context.trace_id:032x}"
                found["span_id"] = f"{context.span_id:016x}"
        return found

    def ended(self, kind: FunctionKind, outcomes: Sequence[Any]) -> None:
        """Outcomes committed (the store's ``Outcome``s): count them, end their spans."""
        metrics, runs = self.metrics, self._runs
        counted: list[tuple[str, str, float | None]] = []
        for o in outcomes:
            run = runs.pop(o.id, None)
            if o.unwritten or o.state is State.CANCELED:
                outcome = "canceled"
            elif o.snoozed:
                outcome = "snoozed"
            elif o.state is State.SUCCESS:
                outcome = "success"
            elif o.retry_at is not None:
                outcome = "retried"
            else:
                outcome = "failed"
            duration = None
            if run is not None and run.ended_at is not None:
                duration = run.ended_at - run.started
            counted.append((o.name, outcome, duration))
            if isinstance(run, _Run) and run.span is not None and run.span.is_recording():
                self._end_span(run, o, outcome, duration)
        if metrics is not None:
            metrics.ended_many(kind, counted)

    @staticmethod
    def _end_span(run: _Run, o: Any, outcome: str, duration: float | None) -> None:
        """A recording span's end (a sampled-out run's span records nothing: not called)."""
        tracing = run.tracing
        assert tracing is not None
        if outcome == "retried":
            tracing.event(
                run.span,
                "durafn.retry",
                {"durafn.attempt": run.attempt, "durafn.retry_at": o.retry_at},
            )
        extra: dict[str, Any] = {}
        if o.error_type is not None:
            extra["error.type"] = o.error_type
        if duration is not None:
            extra["durafn.duration"] = duration
        tracing.end(run.span, outcome, extra)

    def cancelled(self, ids: Iterable[str]) -> None:
        """Running actions whose rows were cancelled (the cancel wrote their end)."""
        for id in ids:
            run = self._runs.pop(id, None)
            if run is None:
                continue
            if self.metrics is not None:
                duration = run.ended_at - run.started if run.ended_at is not None else None
                self.metrics.ended(run.name, run.kind, "canceled", duration)
            if isinstance(run, _Run) and run.span is not None and run.tracing is not None:
                run.tracing.event(run.span, "durafn.cancel", {})
                run.tracing.end(run.span, "canceled", {})

    def lost(self, rows: Sequence[Any], worker: str) -> dict[str, dict[str, Any]]:
        """Runs of lost workers, rescued by ``worker`` (the store's ``LostAction``s); each
        one's fields for its log line (``logs``), as its rescue's span has them."""
        tracing = self.tracing
        found: dict[str, dict[str, Any]] = {}
        for row in rows:
            if self.metrics is not None:
                self.metrics.ended(row.name, FunctionKind.ACTION, "lost", None)
            fields = found[row.id] = {
                "durafn_attempt": row.attempts,
                "durafn_worker": worker,
                "durafn_lost_worker": row.worker_id or "",
            }
            if tracing is not None:
                attributes = {
                    "messaging.message.id": str(row.id),
                    "durafn.function": row.name,
                    "durafn.kind": FunctionKind.ACTION.value,
                    "durafn.attempt": row.attempts,
                    "durafn.worker": worker,
                    "durafn.lost_worker": row.worker_id or "",
                }
                context = tracing.rescued(row.name, row.trace_context, attributes)
                if context.is_valid:
                    fields["trace_id"] = f"{context.trace_id:032x}"
                    fields["span_id"] = f"{context.span_id:016x}"
        return found

    def tick(self, cron: str, outcome: str) -> None:
        if self.metrics is not None:
            self.metrics.tick(cron, outcome)
