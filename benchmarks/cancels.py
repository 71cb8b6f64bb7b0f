"""How long a cancel takes to reach a running action in another process: from
``app.cancel(id)`` being called to the action's ``ctx.wait_for_cancel()`` returning in a
worker process (``durafn worker``), one action at a time, on each engine. PostgreSQL
delivers it by NOTIFY; SQLite by the worker's poll of its running rows (``poll_interval``:
the default 0.5 s, and 0.05 s).

    python -m benchmarks.cancels [--engines sqlite,postgres] [--samples 50]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio

import durafn

from . import throughput
from .worker_app import register
from .workers import _percentile, _until, _workers_are, workers


def _seen(path: Path, word: str, id: str) -> float | None:
    """When the action of ``id`` wrote ``word`` (started, seen), or None yet."""
    if not path.exists():
        return None
    for line in path.read_text().splitlines():
        what, row, at = line.split()
        if what == word and row == id:
            return float(at)
    return None


async def latencies(url: str, samples: int, *worker_args: str) -> list[float]:
    """Seconds from cancel() to the action observing it, ``samples`` times."""
    app = durafn.App(url)
    fns = register(app)
    await app.migrate()
    out: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "trace.txt"
        try:
            async with workers(url, 1, *worker_args):
                await _until(app, lambda: _workers_are(app, 1))
                for _ in range(samples):
                    sid = await app.scheduler().run_after(0, fns.until_cancelled, str(trace))
                    await _wait_for(trace, "start", sid)
                    await anyio.sleep(0.01)  # waiting for its cancel
                    asked = time.monotonic()
                    await app.cancel(sid)
                    out.append(await _wait_for(trace, "seen", sid) - asked)
        finally:
            await app.aclose()
    return out


async def _wait_for(path: Path, word: str, id: str, timeout: float = 60) -> float:
    deadline = time.monotonic() + timeout
    while (at := _seen(path, word, id)) is None:
        if time.monotonic() > deadline:
            raise TimeoutError(f"the action never wrote {word!r}")
        await anyio.sleep(0.005)
    return at


def summary(values: list[float]) -> dict[str, float]:
    ms = [v * 1000 for v in values]
    return {
        "median_ms": round(statistics.median(ms), 2),
        "p99_ms": round(_percentile(ms, 0.99), 2),
        "max_ms": round(max(ms), 2),
    }


async def measure(url_for: Any, samples: int, engine: str) -> dict[str, Any]:
    cases: list[tuple[str, tuple[str, ...]]] = [("default poll", ())]
    if engine == "sqlite":
        cases.append(("poll 0.05 s", ("--poll-interval", "0.05")))
    out: dict[str, Any] = {}
    for i, (label, args) in enumerate(cases):
        got = summary(await latencies(await url_for(f"cancel-{i}"), samples, *args))
        out[label] = got
        print(f"{engine}, {label}: cancel() to the action seeing it: {got}", flush=True)
    return out


async def main(engines: list[str], samples: int) -> None:
    await throughput.per_engine(engines, lambda url_for, engine: measure(url_for, samples, engine))


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", default="sqlite,postgres")
    parser.add_argument("--samples", type=int, default=50)
    args = parser.parse_args()
    anyio.run(main, args.engines.split(","), args.samples)


if __name__ == "__main__":
    cli()
