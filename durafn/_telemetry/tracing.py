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

Only this module imports ``opentelemetry``, and only once something asks for tracing; a
process without the package never imports it and stores no context (the column stays
NULL). With the API but no SDK, spans are the API's non-recording ones.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

from .._kinds import FunctionKind

SCOPE = "durafn"
_ABSENT = object()
_EVENT_ATTRIBUTES = ("durafn.attempt", "durafn.retry_at")


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
        self._defaults = (ProxyTracerProvider, NoOpTracerProvider)
        self._provided = False
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
