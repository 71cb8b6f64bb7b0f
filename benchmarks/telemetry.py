"""The cost of observability: the no-op drain (``throughput.drain``) in six settings,
each in a process of its own, interleaved round by round:

* ``absent``: opentelemetry and prometheus-client cannot be imported (the ``otel`` extra
  not installed);
* ``unused``: installed, and the host uses neither (durafn then imports neither);
* ``on``: an OpenTelemetry SDK with every span recorded and given to an exporter that
  counts them (each run's span is checked for) and keeps none, as a deployment's sends
  them away; an in-memory metric reader, and durafn's Prometheus metrics kept;
* ``sampled``: the same with a sampler that keeps one trace in ten
  (``ParentBased(TraceIdRatioBased(0.1))``, a common production setting);
* ``head``: the SDK's default sampler kind, ``ParentBased(TraceIdRatioBased(0.01))``,
  and rows as a web app's requests leave them when sampled at the request, one in a
  hundred: each row's stored ``traceparent`` of a trace of its own, sampled (flags 01)
  for every hundredth row and not for the others (``stamp_requests``), with metrics;
* ``api``: the OpenTelemetry API imported, no SDK set (durafn records nothing);
* ``metrics``: an OpenTelemetry metrics SDK and no tracer provider: durafn's counters
  and histograms kept, no spans (a Prometheus-only deployment).

Reports each setting's median rows/s and the ratios ``on / unused`` (target >= 0.90) and
``unused / absent`` (target >= 0.98). The ``on`` process also times an SDK span after
its drain, with the same provider: bare (``start_span`` and ``end``), and with the 13
attributes durafn sets on a no-op run's span. A run that makes one can keep at most
``t / (t + span)`` of a drain whose rows cost ``t`` each: both ceilings are printed
beside the ratio. ``--baseline PATH``: also a checkout of durafn before this feature (a
``git worktree``), as one more setting.
Also the worker's CPU per row in each setting, as the same ratios (a busy machine sways
them less). ``--micro``: what the telemetry calls alone cost a run, per setting.
Run: ``python -m benchmarks.telemetry [--rows 20000] [--rounds 5] [--kind mutation]``.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import anyio

HERE = Path(__file__).resolve().parent.parent
SETTINGS = ("absent", "unused", "on", "sampled", "head", "api", "metrics")

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
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
provider = TracerProvider()
# Counts the spans it is given and keeps none, as a deployment's exporter sends them
# away: 20,000 spans kept in memory (InMemorySpanExporter) cost 14 us a run more, in the
# garbage collector's passes over them, which no deployment pays.
class Counted(SpanExporter):
    exported = 0
    def export(self, spans):
        Counted.exported += len(spans)
        return SpanExportResult.SUCCESS
spans = Counted()
provider.add_span_processor(SimpleSpanProcessor(spans))
trace.set_tracer_provider(provider)
metrics.set_meter_provider(MeterProvider(metric_readers=[InMemoryMetricReader()]))
"""
_SAMPLED = _SDK.replace(
    "provider = TracerProvider()",
    "from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased\n"
    "provider = TracerProvider(sampler=ParentBased(TraceIdRatioBased(0.1)))",
)
_HEAD = _SDK.replace(
    "provider = TracerProvider()",
    "from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased\n"
    "provider = TracerProvider(sampler=ParentBased(TraceIdRatioBased(0.01)))",
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
from benchmarks import telemetry, throughput
async def main():
    stamp = telemetry.stamp_requests if {head!r} else None
    result = await throughput.drain({url!r}, {rows}, {kind!r}, scheduled=stamp)
    print("cpu", result["worker_cpu_ms_per_1000"] / 1000)
    print(result["drained_per_s"])
anyio.run(main)
"""


async def stamp_requests(app: Any) -> None:
    """Give each Pending row the trace context a request sampled one in a hundred would
    have stored: a trace of its own per row, sampled for every hundredth."""
    from sqlalchemy import bindparam, select, update

    from durafn import scheduled_functions as sf

    async with app.engine.begin() as conn:
        ids = [row.id for row in await conn.execute(select(sf.c.id).order_by(sf.c.seq))]
        contexts = [
            {
                "b_id": id,
                "context": json.dumps(
                    {
                        "traceparent": f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-"
                        + ("01" if n % 100 == 0 else "00")
                    },
                    separators=(",", ":"),
                ),
            }
            for n, id in enumerate(ids)
        ]
        stamp = (
            update(sf)
            .where(sf.c.id == bindparam("b_id"))
            .values(trace_context=bindparam("context"))
        )
        await conn.execute(stamp, contexts)


_BARE_SPAN = """
import time
tracer = trace.get_tracer("bare")
started = time.perf_counter()
for _ in range(20_000):
    tracer.start_span("bare").end()
print("span", (time.perf_counter() - started) / 20_000)
at_start = {"messaging.system": "durafn", "messaging.operation.type": "process",
            "messaging.destination.name": "bench:noop"}
at_run = {"messaging.message.id": "0192f0c4-5b7e-7cc1-8f7e-2a1d9c3b4e5f",
          "durafn.function": "bench:noop", "durafn.kind": "mutation", "durafn.attempt": 1,
          "durafn.priority": 0, "durafn.due_time": 1.8e9, "durafn.start_lag": 0.01,
          "durafn.worker": "host:1234"}
at_end = {"durafn.outcome": "success", "durafn.duration": 0.001}
started = time.perf_counter()
for _ in range(20_000):
    span = tracer.start_span("bare", attributes=at_start)
    span.set_attributes(at_run)
    span.set_attributes(at_end)
    span.end()
print("attributed", (time.perf_counter() - started) / 20_000)
"""


def _child(
    setting: str, url: str, rows: int, kind: str, baseline: Path | None
) -> tuple[float, dict[str, float]]:
    """The setting's drain rate (rows/s), and for ``on`` what a span costs (s), bare
    (``span``) and with a run's attributes (``attributed``)."""
    prelude = {
        "absent": _BLOCK,
        "unused": "",
        "on": _SDK,
        "sampled": _SAMPLED,
        "head": _HEAD,
        "api": _API,
        "metrics": _METRICS,
        "baseline": "",
    }[setting]
    code = prelude + _DRAIN.format(url=url, rows=rows, kind=kind, head=setting == "head")
    if setting == "on":
        code += 'print("exported", Counted.exported)\n' + _BARE_SPAN
    root = baseline if setting == "baseline" and baseline is not None else HERE
    env = {k: v for k, v in os.environ.items() if not k.startswith("DURAFN_")}
    env["PYTHONPATH"] = str(root)
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True
    )
    if done.returncode != 0:
        raise SystemExit(f"{setting}: {done.stderr}")
    timed = dict(line.split() for line in done.stdout.splitlines() if " " in line)
    rate = next(float(x) for x in reversed(done.stdout.splitlines()) if " " not in x)
    return rate, {what: float(seconds) for what, seconds in timed.items()}


async def measure(
    engine: str, rows: int, rounds: int, kind: str, baseline: Path | None
) -> dict[str, float]:
    from . import throughput

    settings = (*SETTINGS, "baseline") if baseline is not None else SETTINGS
    rates: dict[str, list[float]] = {s: [] for s in settings}
    spans: dict[str, list[float]] = {"span": [], "attributed": []}
    cpu: dict[str, list[float]] = {s: [] for s in settings}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(rounds):
            for setting in settings:
                url = await throughput.fresh_url(engine, tmp, f"otel-{i}-{setting}")
                rate, timed = _child(setting, url, rows, kind, baseline)
                rates[setting].append(rate)
                cpu[setting].append(timed.pop("cpu"))
                if setting == "on" and timed.pop("exported") < rows:
                    raise SystemExit("on: a run's span was not recorded")
                for what, seconds in timed.items():
                    spans[what].append(seconds)
    medians = {s: statistics.median(r) for s, r in rates.items()}
    print(f"{engine}, {rows:,} no-op {kind}s, {rounds} interleaved rounds (rows/s):")
    for setting, found in rates.items():
        print(f"  {setting:9} median {medians[setting]:9,.0f}   {[round(r) for r in found]}")
    on, unused, absent = medians["on"], medians["unused"], medians["absent"]
    per_row = 1 / unused
    span, attributed = (statistics.median(spans[what]) for what in ("span", "attributed"))
    print(
        f"  a row, untraced, {per_row * 1e6:.1f} us; an SDK span: bare {span * 1e6:.1f} us,"
        f" with a run's 13 attributes {attributed * 1e6:.1f} us"
    )
    print(
        f"  on / unused     {on / unused:.3f}  (target >= 0.90; a span per run allows at"
        f" most {per_row / (per_row + span):.3f} bare,"
        f" {per_row / (per_row + attributed):.3f} with its attributes)"
    )
    print(f"  sampled / unused {medians['sampled'] / unused:.3f}")
    print(f"  head / unused   {medians['head'] / unused:.3f}  (target >= 0.90)")
    print(f"  metrics / absent {medians['metrics'] / absent:.3f}  (target >= 0.95)")
    print(f"  api / unused    {medians['api'] / unused:.3f}")
    print(f"  metrics / unused {medians['metrics'] / unused:.3f}")
    print(f"  unused / absent {unused / absent:.3f}  (target >= 0.98)")
    # The worker's own CPU per row, as the same ratios (less swayed by a busy machine than
    # the rates: another process's work takes no CPU time from this one's count).
    c = {s: statistics.median(found) for s, found in cpu.items()}
    print(
        f"  worker CPU per row, us: {', '.join(f'{s} {c[s] * 1e3:.1f}' for s in settings)};"
        f" as rate ratios: metrics/absent {c['absent'] / c['metrics']:.3f},"
        f" head/unused {c['unused'] / c['head']:.3f}, on/unused {c['unused'] / c['on']:.3f}"
    )
    if baseline is not None:
        print(f"  absent / before {absent / medians['baseline']:.3f}")
    return medians


_MICRO = """
import json, secrets, time
from dataclasses import dataclass
from durafn._kinds import FunctionKind, State
from durafn._store.rows import Outcome
from durafn._telemetry import Telemetry

@dataclass
class Row:
    id: str
    name: str
    trace_context: str | None
    attempts: int = 0
    available_at: float = 1.0
    priority: int = 0
    queue_name: str | None = None
    flow_key: str | None = None
    job_key: str | None = None

async def gauges():
    raise AssertionError("not read")

telemetry = Telemetry(gauges)
def context(n):
    flags = "01" if n % 100 == 0 else "00"
    header = f"00-{{secrets.token_hex(16)}}-{{secrets.token_hex(8)}}-{{flags}}"
    return json.dumps({{"traceparent": header}}, separators=(",", ":"))
rows = [Row(f"{{n}}", "bench:noop", context(n) if {stamped} else None) for n in range(20_000)]
ended = [Outcome(id=r.id, state=State.SUCCESS, name=r.name) for r in rows]
best = 1.0
for _ in range(7):
    started = time.process_time()  # this process's CPU: other processes' work aside
    for at in range(0, len(rows), 50):  # a batch of 50, as a mutation batch commits them
        for row in rows[at : at + 50]:
            with telemetry.running(FunctionKind.MUTATION, row, 2.0, "host:1"):
                pass
        telemetry.ended(FunctionKind.MUTATION, ended[at : at + 50])
    best = min(best, (time.process_time() - started) / len(rows))
print(best)
"""


def micro(setting: str) -> float:
    """What durafn's telemetry costs a run, by itself: ``running`` around a call that does
    nothing and ``ended`` per batch of 50, for 20,000 rows like the drain's (``head``: 1
    in 100 stored contexts sampled), best of 7 (in a process of its own)."""
    prelude = {"absent": _BLOCK, "metrics": _METRICS, "head": _HEAD, "on": _SDK}[setting]
    code = prelude + _MICRO.format(stamped=setting == "head")
    if setting == "on":  # the SDK's own span with a run's attributes, in the same process
        code += "print(best)\n" + _BARE_SPAN.replace("time.perf_counter", "time.process_time")
    env = {**os.environ, "PYTHONPATH": str(HERE)}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{setting}: {done.stderr}")
    lines = done.stdout.split()
    seconds = float(lines[lines.index("span") - 1] if setting == "on" else lines[-1])
    said = f"  {setting:8} {seconds * 1e6:5.2f} us a run"
    if setting == "on":
        attributed = float(lines[lines.index("attributed") + 1])
        said += (
            f" (the SDK's span with a run's attributes alone {attributed * 1e6:.2f} us: durafn's"
            f" own {(seconds - attributed) / seconds:.0%} of it)"
        )
    print(said)
    return seconds


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", default="sqlite,postgres")
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--kind", default="mutation", choices=["mutation", "action"])
    parser.add_argument("--baseline", type=Path, default=None)
    parser.add_argument("--micro", action="store_true", help="per-run cost only (below)")
    args = parser.parse_args()
    if args.micro:
        for setting in ("absent", "metrics", "head", "on"):
            micro(setting)
        return
    for engine in args.engines.split(","):
        anyio.run(measure, engine, args.rows, args.rounds, args.kind, args.baseline)


if __name__ == "__main__":
    cli()
