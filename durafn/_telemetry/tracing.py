"""Traces through the OpenTelemetry API: the scheduling call's context stored on its row,
and a span per run, ``durafn.run <name>`` (kind CONSUMER).

How a run's span relates to the trace it was scheduled in (the row's ``trace_context``):

* the first run of a row scheduled inside a trace is a **child** of the span that
  scheduled it: a request, the mutation that scheduled an action, ...;
* a later attempt (a retry, a re-run after a lost worker) starts a trace of its own,
  **linked** to that span, the link carrying ``durafn.attempt``: a retry a day later
  does not stretch the request's trace over a day;
* a cron's tick has no scheduling trace: its run is a **root** span, with the cron's
  name in ``durafn.cron``.

A run's span starts when the function is called and ends when its outcome commits (a
mutation's with its batch's transaction, an action's with the finisher's write), so the
retry decision, a cancel and the commit are inside it. Inside the function the current
span is the run's: the user's own spans are its children.

A first run whose scheduling trace was sampled out skips the SDK where the host's
sampler would sample it out for that alone (``drops_unsampled_remote_parents``): the
SDK's default, parent-based sampler.

Only this module imports ``opentelemetry``, and only once something asks for tracing; a
process without the package never imports it and stores no context (the column stays
NULL). With the API but no SDK, spans are the API's non-recording ones.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from typing import Any

from .._kinds import FunctionKind

SCOPE = "durafn"
_ABSENT = object()
_EVENT_ATTRIBUTES = ("durafn.attempt", "durafn.retry_at")


def drops_unsampled_remote_parents(sampler: Any) -> bool:
    """Whether ``sampler`` (the host's SDK's) samples out every span whose remote parent
    is not sampled, whatever else it is asked: the SDK's ``ParentBased`` with its default
    ``remote_parent_not_sampled`` (``ALWAYS_OFF``), the SDK's default sampler. Then a run
    scheduled from an unsampled trace needs no SDK call to learn that it records nothing.
    Any other sampler (a custom one, ``ParentBased`` told otherwise) is asked as usual."""
    if type(sampler).__name__ != "ParentBased":
        return False
    not_sampled = getattr(sampler, "_remote_parent_not_sampled", None)
    describe = getattr(not_sampled, "get_description", None)
    return callable(describe) and describe() == "AlwaysOffSampler"


_STORED = re.compile(r'\{"traceparent":"00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})"\}')
"""A stored context as ``capture`` writes it when a W3C ``traceparent`` is all there is
to carry: read without ``json.loads`` and a carrier's dictionary (2 us a run)."""


def unsampled_stored(stored: str) -> tuple[int, int] | None:
    """``unsampled_parent`` of a stored context, where it has ``_STORED``'s form: the
    (trace id, span id) of a parent not sampled; None otherwise (sampled, or another
    form: the caller reads those through the propagators)."""
    found = _STORED.fullmatch(stored)
    if found is None or int(found[3], 16) & 1:
        return None
    trace_id, span_id = int(found[1], 16), int(found[2], 16)
    return (trace_id, span_id) if trace_id and span_id else None


def unsampled_parent(carrier: dict[str, str]) -> tuple[int, int] | None:
    """The (trace id, span id) of a stored W3C ``traceparent`` whose sampled flag is off,
    when it is the carrier's only entry (``tracestate`` aside); else None (sampled, or
    with baggage or another propagator's fields: the propagators read those)."""
    header = carrier.get("traceparent")
    if header is None or any(k not in ("traceparent", "tracestate") for k in carrier):
        return None
    parts = header.split("-")
    if len(parts) != 4 or parts[0] != "00" or len(parts[1]) != 32 or len(parts[2]) != 16:
        return None
    try:
        trace_id, span_id, flags = int(parts[1], 16), int(parts[2], 16), int(parts[3], 16)
    except ValueError:
        return None
    if flags & 1 or not trace_id or not span_id:
        return None
    return trace_id, span_id


def load() -> Any:
    """The OpenTelemetry trace API, or None where it is not installed."""
    try:
        from opentelemetry import trace
    except ImportError:
        return None
    return trace


class Tracing:
    """Spans for runs, through the API's global tracer provider (the host's SDK)."""

    def __init__(self, trace: Any) -> None:
        from opentelemetry import context, propagate
        from opentelemetry.trace import (
            Link,
            NoOpTracerProvider,
            ProxyTracerProvider,
            SpanKind,
            Status,
            StatusCode,
        )

        self._trace = trace
        self._context = context
        self._propagate = propagate
        self._link = Link
        self._consumer = SpanKind.CONSUMER
        self._error = Status(StatusCode.ERROR)
        self._tracer: Any = None
        self._skips: bool | None = None  # drops_unsampled_remote_parents, read once
        self._defaults = (ProxyTracerProvider, NoOpTracerProvider)
        self._provided = False
        self._off = trace.TraceFlags(0)  # not sampled
        # The API keeps the provider set in a module global (None: none set yet), which
        # an environment variable can also name: then the API call decides.
        self._by_env = "OTEL_PYTHON_TRACER_PROVIDER" in os.environ

    def provided(self) -> bool:
        """Whether the host set a tracer provider (the API's defaults record nothing).
        Asked at each run (a host may set its SDK after building its app): once one is
        set it stays (the API refuses to replace it), and until then the API's global
        is read, 0.05 us, where ``get_tracer_provider()`` looked the environment up
        each time, 2 us a run."""
        if self._provided:
            return True
        if getattr(self._trace, "_TRACER_PROVIDER", _ABSENT) is None and not self._by_env:
            return False
        self._provided = not isinstance(self._trace.get_tracer_provider(), self._defaults)
        return self._provided

    @property
    def tracer(self) -> Any:
        # Looked up at first use, not at import: the host configures its SDK after
        # building its app, and the API's proxy tracer would stay a no-op otherwise.
        if self._tracer is None:
            self._tracer = self._trace.get_tracer(SCOPE)
        return self._tracer

    @property
    def skips_unsampled(self) -> bool:
        """Whether a run whose stored parent is not sampled can skip the SDK (see
        ``drops_unsampled_remote_parents``): read from the provider at the first run."""
        if self._skips is None:
            sampler = getattr(self._trace.get_tracer_provider(), "sampler", None)
            self._skips = drops_unsampled_remote_parents(sampler)
        return self._skips

    def capture(self) -> str | None:
        """The current trace context as the row stores it, or None outside a trace."""
        span = self._trace.get_current_span()
        if not span.get_span_context().is_valid:
            return None
        carrier: dict[str, str] = {}
        self._propagate.inject(carrier)
        return json.dumps(carrier, separators=(",", ":")) if carrier else None

    def start(
        self,
        kind: FunctionKind,
        name: str,
        attempt: int,
        stored: str | None,
        destination: str,
    ) -> tuple[Any, Any]:
        """A run's span, and the context to run the function in (its span current).

        Only the attributes a sampler may read (messaging's ``system``, ``operation.type``
        and ``destination.name``) are given at the start; the caller sets the rest where
        the span records. The SDK copies and checks attributes given at the start twice
        (its sampler's result, then the span's), ~2.5 us each: 11 at the start were half
        of what a recorded run's span cost (``benchmarks.telemetry``)."""
        if stored is not None and attempt <= 1 and self.skips_unsampled:
            ids = unsampled_stored(stored)
            if ids is not None:
                return self._unsampled(*ids)
        attributes: dict[str, Any] = {
            "messaging.system": "durafn",
            "messaging.operation.type": "process",
            "messaging.destination.name": destination,
        }
        parent = None
        links: Sequence[Any] = ()
        if stored is not None:
            carrier = json.loads(stored)
            cron = carrier.pop("cron", None)
            if cron is not None:
                attributes["durafn.cron"] = cron
            elif attempt <= 1:
                if self.skips_unsampled and (ids := unsampled_parent(carrier)) is not None:
                    return self._unsampled(*ids)
                parent = self._propagate.extract(carrier)
            else:
                scheduled = self._trace.get_current_span(self._propagate.extract(carrier))
                links = [self._link(scheduled.get_span_context(), {"durafn.attempt": attempt})]
        if parent is None:
            parent = self._context.Context()  # a root: never the executor's own context
        span = self.tracer.start_span(
            f"durafn.run {name}",
            context=parent,
            kind=self._consumer,
            links=links,
            attributes=attributes,
        )
        return span, self._trace.set_span_in_context(span, parent)

    def _unsampled(self, trace_id: int, span_id: int) -> tuple[Any, Any]:
        """A run whose scheduling trace was sampled out, under a sampler that samples out
        every child of such a parent: the SDK would make a non-recording span after its
        sampler said so (about 10 us with the attributes given at the start); this is
        the parent's own context as a non-recording span, current in the function, so
        the user's spans are children of that parent and sampled out too, and log lines
        carry its trace id. (It has no span id of its own: nothing records it.)"""
        trace = self._trace
        context = trace.SpanContext(trace_id, span_id, is_remote=True, trace_flags=self._off)
        span = trace.NonRecordingSpan(context)
        return span, trace.set_span_in_context(span, self._context.Context())

    def attach(self, context: Any) -> Any:
        return self._context.attach(context)

    def detach(self, token: Any) -> None:
        self._context.detach(token)

    def end(self, span: Any, outcome: str, attributes: dict[str, Any]) -> None:
        span.set_attributes({"durafn.outcome": outcome, **attributes})
        if outcome in ("failed", "lost"):
            span.set_status(self._error)
        span.end()

    def event(self, span: Any, name: str, attributes: dict[str, Any]) -> None:
        span.add_event(name, attributes)

    def rescued(self, name: str, stored: str | None, attributes: dict[str, Any]) -> Any:
        """A lost run, as the worker that rescued it saw it: a short span linked to the
        trace the row was scheduled in, with the rescue as its event; its span context
        (the ids the rescue's log line carries)."""
        links: list[Any] = []
        if stored is not None:
            carrier = json.loads(stored)
            if "cron" not in carrier:
                scheduled = self._trace.get_current_span(self._propagate.extract(carrier))
                links.append(self._link(scheduled.get_span_context()))
        span = self.tracer.start_span(
            f"durafn.run {name}",
            context=self._context.Context(),
            kind=self._consumer,
            links=links,
            attributes=attributes,
        )
        span.add_event("durafn.rescue", {"durafn.worker": attributes.get("durafn.worker", "")})
        self.end(span, "lost", {})
        return span.get_span_context()
