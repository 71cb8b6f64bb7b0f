"""PNG charts from a suite report: throughput beside the raw database, the start-lag
distribution, and the backlog curve.

matplotlib comes from the optional ``bench`` extra; without it the suite still writes its
JSON and Markdown and says that the charts were skipped.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

ENGINES = ("sqlite", "postgres")


def write(report: dict[str, Any], out: Path) -> list[Path]:
    """Write the charts next to latest.json; returns their paths."""
    import matplotlib

    matplotlib.use("Agg")  # no display here, and none wanted
    import matplotlib.pyplot as plt

    results = report["results"]
    engines = [e for e in ENGINES if e in results]
    written: list[Path] = []

    # Throughput: durafn's drains beside the raw one-UPDATE-per-transaction limit.
    fig, ax = plt.subplots(figsize=(8, 4.5))
    raw = results["raw"]
    raw_for = {"sqlite": raw["aiosqlite"], "postgres": raw["postgres_1_connection"]}
    labels = ["no-op mutations", "no-op actions", "raw: 1 UPDATE per commit", "best peer"]
    measured = {
        k: float(v["drained_per_s"])
        for k, v in results.get("peers", {}).items()
        if isinstance(v, dict)
    }
    best_peer = {
        "sqlite": max((v for k, v in measured.items() if "SQLite" in k), default=0.0),
        "postgres": max((v for k, v in measured.items() if "SQLite" not in k), default=0.0),
    }
    width = 0.8 / max(1, len(engines))
    for i, engine in enumerate(engines):
        r = results[engine]
        values = [
            r["drain_mutations"]["drained_per_s"],
            r["drain_actions"]["drained_per_s"],
            raw_for[engine],
            best_peer[engine],
        ]
        positions = [x + i * width for x in range(len(labels))]
        bars = ax.bar(positions, values, width, label=engine)
        ax.bar_label(bars, labels=[f"{v:,.0f}" for v in values], fontsize=8)
    ax.set_xticks([x + width * (len(engines) - 1) / 2 for x in range(len(labels))], labels)
    ax.set_ylabel("per second")
    ax.set_title("Drained by one executor, beside the raw database and the best peer")
    ax.legend()
    written.append(_save(fig, out / "throughput.png"))

    # Start lag: the whole distribution, not just its median.
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for engine in engines:
        for key, style in (("lag_due_now", "-"), ("lag_due_at_time", "--")):
            samples = sorted(results[engine][key]["samples_ms"])
            share = [(i + 1) / len(samples) for i in range(len(samples))]
            ax.plot(samples, share, style, label=f"{engine}, {key[4:].replace('_', ' ')}")
    written.append(
        _save_log_x(
            fig,
            ax,
            out / "start_lag.png",
            "start lag (ms, log scale)",
            "share of probes started within",
            "Start lag on an idle executor (cumulative)",
        )
    )

    # Backlog: the cost per job should not grow with the rows already in the table.
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for engine in engines:
        sizes = results[engine].get("backlog", {})
        if sizes:
            rows = [int(k) for k in sizes]
            ax.plot(rows, [v["drained_per_s"] for v in sizes.values()], "o-", label=engine)
    ax.set_ylim(bottom=0)
    written.append(
        _save_log_x(
            fig,
            ax,
            out / "backlog.png",
            "rows already in _scheduled_functions (log scale)",
            "no-op mutations drained per second",
            "Backlog scaling",
        )
    )
    return written


def _save_log_x(fig: Any, ax: Any, path: Path, xlabel: str, ylabel: str, title: str) -> Path:
    """A line chart over a log-scale x axis, labelled, gridded and saved."""
    ax.set_xscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    return _save(fig, path)


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    fig.clf()
    return path
