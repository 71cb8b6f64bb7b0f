"""``next_after`` of durafn.cron against croniter and cronsim, same machine, same run.

    python -m benchmarks.cron [--rounds 5] [--json PATH]

For each expression, the three are timed in turn, ``rounds`` times (interleaved, so that
the machine's drift falls on all three alike); the figure is the median microseconds to
parse an expression and give its next fire time from a fixed start, in UTC (croniter and
cronsim build their object from the start), and for durafn also ``next_after`` alone on a
parsed schedule. "never" expressions fire at no time: durafn
knows it at once; croniter and cronsim search and give up (their time is shown as they
take it, or "refused" if they refuse the expression). Nothing here is asserted.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import croniter
import cronsim

from durafn import cron

START = datetime(2026, 3, 14, 15, 9, 26, tzinfo=UTC)
EXPRESSIONS = {
    "every minute": "* * * * *",
    "every 15 minutes": "*/15 * * * *",
    "weekdays at 09:00": "0 9 * * 1-5",
    "a list of minutes and hours": "5,35 8-18/2 * * *",
    "1st and 15th at midnight": "0 0 1,15 * *",
    "yearly": "0 0 1 1 *",
    "leap day (rare)": "0 0 29 2 *",
    "Friday the 13th, AND (rare)": "0 0 */13 * 5",
    "31 February (never)": "0 0 31 2 *",
}


def _time(call: Callable[[], object], number: int) -> float:
    started = time.perf_counter()
    for _ in range(number):
        call()
    return (time.perf_counter() - started) / number * 1e6


def _calls(expression: str) -> dict[str, Callable[[], object] | None]:
    ours = cron.parse(expression)
    calls: dict[str, Callable[[], object] | None] = {
        # Parse and first fire time, as the other two are measured (their objects are
        # built from a start), and the next fire time of a parsed schedule alone.
        "durafn": lambda: cron.parse(expression).next_after(START),
        "durafn next_after": lambda: ours.next_after(START),
    }
    try:
        croniter.croniter(expression, START)
        calls["croniter"] = lambda: croniter.croniter(expression, START).get_next(datetime)
    except Exception:
        calls["croniter"] = None
    try:
        cronsim.CronSim(expression, START)
        calls["cronsim"] = lambda: next(cronsim.CronSim(expression, START), None)
    except Exception:
        calls["cronsim"] = None
    return calls


def _safe(call: Callable[[], object]) -> Callable[[], object]:
    def run() -> object:
        try:
            return call()
        except Exception:  # croniter gives up on an expression that never fires
            return None

    return run


def main(rounds: int) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for label, expression in EXPRESSIONS.items():
        calls = _calls(expression)
        samples: dict[str, list[float]] = {name: [] for name in calls}
        for _ in range(rounds):
            for name, call in calls.items():
                if call is None:
                    continue
                number = 20 if "never" in label or "rare" in label else 200
                samples[name].append(_time(_safe(call), number))
        row = {
            name: round(statistics.median(values), 1) if values else "refused"
            for name, values in samples.items()
        }
        results[label] = {"expression": expression, "us_per_next": row}
        print(f"{label:32} {expression:16} " + "  ".join(f"{k} {v}" for k, v in row.items()))
    return results


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    results = main(args.rounds)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    cli()
