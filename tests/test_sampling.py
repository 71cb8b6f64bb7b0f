"""Runs scheduled from a sampled-out trace: under the SDK's default sampler (parent-based,
a remote parent not sampled means not sampled) durafn decides without calling the SDK;
under any other sampler it asks the sampler as before.

These build an SDK provider of their own (OpenTelemetry's global one is set once per
process, by ``test_telemetry.py``), counting the sampler's calls."""

from __future__ import annotations

import json
from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk")

from opentelemetry import trace
from opentelemetry.sdk.trace import (
    TracerProvider,
    sampling,
)
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
    InMemorySpanExporter,
)

from durafn._kinds import FunctionKind
from durafn._telemetry.tracing import (
    Tracing,
    drops_unsampled_remote_parents,
    unsampled_parent,
    unsampled_stored,
)

TRACE_ID = 0x4BF92F3577B34DA6A3CE929D0E0E4736
SPAN_ID = 0x00F067AA0BA902B7


def _carrier(flags: str, **more: str) -> dict[str, str]:
    return {"traceparent": f"00-{TRACE_ID:032x}-{SPAN_ID:016x}-{flags}", **more}


class ParentBased(sampling.ParentBased):
    """The SDK's ParentBased, counting the calls it is asked (its name is what durafn
    reads, as it would of the SDK's own)."""

    asked = 0

    def should_sample(self, *args: Any, **kwargs: Any) -> sampling.SamplingResult:
        type(self).asked += 1
        return super().should_sample(*args, **kwargs)


def _tracing(sampler: Any) -> tuple[Tracing, InMemorySpanExporter]:
    provider = TracerProvider(sampler=sampler)
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing = Tracing(trace)
    tracing._tracer = provider.get_tracer("durafn")
    tracing._skips = drops_unsampled_remote_parents(provider.sampler)
    return tracing, exporter


def _run(tracing: Tracing, carrier: dict[str, str], attempt: int = 1, compact: bool = False) -> Any:
    """A run of a row storing ``carrier`` (``compact``: as ``capture`` writes it)."""
    stored = json.dumps(carrier, separators=(",", ":") if compact else None)
    span, _ = tracing.start(FunctionKind.ACTION, "f", attempt, stored, "f")
    tracing.end(span, "success", {})
    return span


def test_which_samplers_let_durafn_decide() -> None:
    always_on, always_off = sampling.ALWAYS_ON, sampling.ALWAYS_OFF
    assert drops_unsampled_remote_parents(sampling.ParentBased(always_on))
    assert drops_unsampled_remote_parents(sampling.ParentBased(sampling.TraceIdRatioBased(0.01)))
    assert drops_unsampled_remote_parents(TracerProvider().sampler)  # the SDK's default
    told_otherwise = sampling.ParentBased(always_on, remote_parent_not_sampled=always_on)
    assert not drops_unsampled_remote_parents(told_otherwise)
    for other in (always_on, always_off, sampling.TraceIdRatioBased(0.5), None, object()):
        assert not drops_unsampled_remote_parents(other)


def test_only_a_plain_unsampled_traceparent_is_read_here() -> None:
    assert unsampled_parent(_carrier("00")) == (TRACE_ID, SPAN_ID)
    assert unsampled_parent(_carrier("00", tracestate="k=v")) == (TRACE_ID, SPAN_ID)
    assert unsampled_parent(_carrier("02")) == (TRACE_ID, SPAN_ID)  # other flags, not sampled
    assert unsampled_parent(_carrier("01")) is None  # sampled: the SDK decides
    assert unsampled_parent(_carrier("00", baggage="user=1")) is None  # a propagator reads it
    for bad in ("01-00", f"00-{TRACE_ID:032x}-{0:016x}-00", f"00-{'x' * 32}-{SPAN_ID:016x}-00"):
        assert unsampled_parent({"traceparent": bad}) is None
    assert unsampled_parent({}) is None


def test_a_stored_context_in_captures_form_is_read_as_its_carrier_would_be() -> None:
    """``unsampled_stored`` reads the stored text of a lone ``traceparent`` (as
    ``capture`` writes it) without parsing JSON: the same answer as ``unsampled_parent``
    of its carrier; any other form is left to the propagators (None)."""

    def compact(carrier: dict[str, str]) -> str:
        return json.dumps(carrier, separators=(",", ":"))

    plain = [_carrier(flags) for flags in ("00", "01", "02", "03")]
    bad = ["01-00", f"00-{TRACE_ID:032x}-{0:016x}-00", f"00-{0:032x}-{SPAN_ID:016x}-00"]
    for carrier in [*plain, *({"traceparent": b} for b in bad)]:
        assert unsampled_stored(compact(carrier)) == unsampled_parent(carrier)
    assert unsampled_stored(compact(_carrier("00"))) == (TRACE_ID, SPAN_ID)
    others = [
        compact(_carrier("00", tracestate="k=v")),
        compact(_carrier("00", cron="c")),
        json.dumps(_carrier("00")),  # spaced: not capture's form
    ]
    assert [unsampled_stored(stored) for stored in others] == [None, None, None]


def test_an_unsampled_parent_under_the_default_sampler_costs_no_sdk_call() -> None:
    tracing, exporter = _tracing(ParentBased(sampling.ALWAYS_ON))
    ParentBased.asked = 0
    assert not _run(tracing, _carrier("00"), compact=True).is_recording()  # read as text
    span = _run(tracing, _carrier("00"))  # through its carrier
    assert ParentBased.asked == 0 and exporter.get_finished_spans() == ()
    # The function runs under its scheduler's own context: its spans are that parent's
    # children (and sampled out by the same rule), its log lines carry that trace's id.
    context = span.get_span_context()
    assert not span.is_recording()
    assert (context.trace_id, context.span_id, context.trace_flags.sampled) == (
        TRACE_ID,
        SPAN_ID,
        False,
    )
    # A sampled parent, a retry (a root linked to its first trace), and a cron's tick go
    # through the sampler as before.
    _run(tracing, _carrier("01"), compact=True)
    _run(tracing, _carrier("00"), attempt=2, compact=True)
    assert ParentBased.asked == 2
    [recorded, retry] = exporter.get_finished_spans()
    assert recorded.parent is not None and recorded.parent.span_id == SPAN_ID
    assert retry.parent is None and retry.links[0].context.span_id == SPAN_ID


def test_a_sampler_told_to_keep_unsampled_parents_children_is_asked() -> None:
    keep = ParentBased(sampling.ALWAYS_ON, remote_parent_not_sampled=sampling.ALWAYS_ON)
    tracing, exporter = _tracing(keep)
    ParentBased.asked = 0
    span = _run(tracing, _carrier("00"), compact=True)
    assert ParentBased.asked == 1 and span.is_recording() is False  # ended
    [recorded] = exporter.get_finished_spans()
    assert recorded.parent is not None and recorded.parent.span_id == SPAN_ID
