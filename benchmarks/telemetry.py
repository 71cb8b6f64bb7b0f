"""The cost of observability: the no-op drain (``throughput.drain``) in three settings,
each in a process of its own, interleaved round by round:

* ``absent``: opentelemetry and prometheus-client cannot be imported (the ``otel`` extra
  not installed);
* ``unused``: installed, and the host uses neither (durafn then imports neither);
* ``on``: an OpenTelemetry SDK with an in-memory span exporter (every span recorded) and
  an in-memory metric reader, and durafn's Prometheus metrics kept;
* ``sampled``: the same with a sampler that keeps one trace in ten
  (``ParentBased(TraceIdRatioBased(0.1))``, a common production setting);
* ``api``: the OpenTelemetry API imported, no SDK set (durafn records nothing);
* ``metrics``: an OpenTelemetry metrics SDK and no tracer provider: durafn's counters
  and histograms kept, no spans (a Prometheus-only deployment).

Reports each setting's median rows/s and the ratios ``on / unused`` (target ≥ 0.90) and
``unused / absent`` (target ≥ 0.98). The ``on`` process also times a bare SDK span
(``start_span`` and ``end``, no attributes, the same provider) after its drain: a run
that makes one can keep at most ``t / (t + span)`` of a drain whose rows cost ``t``
each, the ceiling printed beside the ratio. ``--baseline PATH``: also a checkout of durafn
before this feature (a ``git worktree``), as a fourth setting.
Run: ``python -m benchmarks.telemetry [--rows 20000] [--rounds 5] [--kind mutation]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import anyio

HERE = Path(__file__).resolve().parent.parent
SETTINGS = ("absent", "unused", "on", "sampled", "api", "metrics")

_BLOCK = """
import sys
sys.modules["opentelemetry"] = None
sys.modules["prometheus_client"] = None
"""
_SDK = """
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
provider = TracerProvider()
spans = InMemorySpanExporter()
provider.add_span_processor(SimpleSpanProcessor(spans))
trace.set_tracer_provider(provider)
metrics.set_meter_provider(MeterProvider(metric_readers=[InMemoryMetricReader()]))
"""
_SAMPLED = _SDK.replace(
    "provider = TracerProvider()",
    "from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased\n"
    "provider = TracerProvider(sampler=ParentBased(TraceIdRatioBased(0.1)))",
)
_API = """
from opentelemetry import trace
"""
_METRICS = """
from opentelemetry import metrics
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
metrics.set_meter_provider(MeterProvider(metric_readers=[InMemoryMetricReader()]))
"""
_DRAIN = """
import anyio
from benchmarks import throughput
async def main():
    result = await throughput.drain({url!r}, {rows}, {kind!r})
    print(result["drained_per_s"])
anyio.run(main)
"""
_BARE_SPAN = """
import time
tracer = trace.get_tracer("bare")
started = time.perf_counter()
for _ in range(20_000):
    tracer.start_span("bare").end()
print("span", (time.perf_counter() - started) / 20_000)
"""


def _child(
    setting: str, url: str, rows: int, kind: str, baseline: Path | None
) -> tuple[float, float | None]:
    """The setting's drain rate (rows/s), and for ``on`` a bare span's cost (s)."""
    prelude = {
        "absent": _BLOCK,
        "unused": "",
        "on": _SDK,
        "sampled": _SAMPLED,
        "api": _API,
        "metrics": _METRICS,
        "baseline": "",
    }[setting]
    code = prelude + _DRAIN.format(url=url, rows=rows, kind=kind)
    if setting == "on":
        code += _BARE_SPAN
    root = baseline if setting == "baseline" and baseline is not None else HERE
    env = {k: v for k, v in os.environ.items() if not k.startswith("DURAFN_")}
    env["PYTHONPATH"] = str(root)
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True
    )
    if done.returncode != 0:
        raise SystemExit(f"{setting}: {done.stderr}")
    lines = done.stdout.split("\n")
    span = next((float(x.split()[1]) for x in lines if x.startswith("span ")), None)
    rate = next(float(x) for x in reversed(lines) if x and not x.startswith("span "))
    return rate, span


async def measure(
    engine: str, rows: int, rounds: int, kind: str, baseline: Path | None
) -> dict[str, float]:
    from . import throughput

    settings = (*SETTINGS, "baseline") if baseline is not None else SETTINGS
    rates: dict[str, list[float]] = {s: [] for s in settings}
    spans: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(rounds):
            for setting in settings:
                url = await throughput.fresh_url(engine, tmp, f"otel-{i}-{setting}")
                rate, span = _child(setting, url, rows, kind, baseline)
                rates[setting].append(rate)
                if span is not None:
                    spans.append(span)
    medians = {s: statistics.median(r) for s, r in rates.items()}
    print(f"{engine}, {rows:,} no-op {kind}s, {rounds} interleaved rounds (rows/s):")
    for setting, found in rates.items():
        print(f"  {setting:9} median {medians[setting]:9,.0f}   {[round(r) for r in found]}")
    on, unused, absent = medians["on"], medians["unused"], medians["absent"]
    per_row, span = 1 / unused, statistics.median(spans)
    print(f"  a bare SDK span {span * 1e6:.1f} us; a row, untraced, {per_row * 1e6:.1f} us")
    print(
        f"  on / unused     {on / unused:.3f}  (target >= 0.90;"
        f" a bare span per run allows at most {per_row / (per_row + span):.3f})"
    )
    print(f"  sampled / unused {medians['sampled'] / unused:.3f}")
    print(f"  api / unused    {medians['api'] / unused:.3f}")
    print(f"  metrics / unused {medians['metrics'] / unused:.3f}")
    print(f"  unused / absent {unused / absent:.3f}  (target >= 0.98)")
    if baseline is not None:
        print(f"  absent / before {absent / medians['baseline']:.3f}")
    return medians


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", default="sqlite,postgres")
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--kind", default="mutation", choices=["mutation", "action"])
    parser.add_argument("--baseline", type=Path, default=None)
    args = parser.parse_args()
    for engine in args.engines.split(","):
        anyio.run(measure, engine, args.rows, args.rounds, args.kind, args.baseline)


if __name__ == "__main__":
    cli()
