"""``benchmarks.soak``'s report as markdown: the counts that prove nothing was lost or
doubled, each worker's memory over its life, the long-lived workers' memory minute by
minute, and ``_scheduled_functions``' size and dead tuples over the run."""

from __future__ import annotations

import re
import tracemalloc
from pathlib import Path
from typing import Any

from .realwork_report import markdown as realwork_markdown

MB = 1024 * 1024
READY = 20.0


def _at(series: list[Any], seconds: float, key: Any = lambda s: s[0]) -> Any:
    """The sample of ``series`` (in time order) nearest ``seconds``."""
    return min(series, key=lambda s: abs(key(s) - seconds)) if series else None


def _mb(kb: int | None) -> str:
    return "—" if kb is None else f"{kb / 1024:.1f}"


def _lives(report: dict[str, Any]) -> list[str]:
    lines = [
        "| worker | database | life (min) | RSS at start, MB | at 5 min | at end | most |",
        "|---|---|---|---|---|---|---|",
    ]
    for life in report["lives"]:
        rss = life["rss_kb"]
        if not rss:
            continue
        start, end = life["started"], life["ended"] or rss[-1][0]
        # Its first sample once it runs: 20 s in (an interpreter starting is 6 MB).
        up = next((s for s in rss if s[0] >= start + READY), rss[-1])
        five = _at(rss, start + 300) if end - start >= 300 else None
        lines.append(
            f"| {life['label']} {life['pid']}{' (killed)' if life['killed'] else ''} "
            f"| {life['database']} | {start / 60:.1f}-{end / 60:.1f} | {_mb(up[1])} "
            f"| {_mb(five[1] if five else None)} | {_mb(rss[-1][1])} "
            f"| {_mb(max(kb for _, kb in rss))} |"
        )
    return lines


def _minutes(report: dict[str, Any]) -> list[int]:
    last = max(s["at"] for samples in report["samples"].values() for s in samples)
    return list(range(0, int(last // 60) + 1))


def _long_lived(report: dict[str, Any]) -> list[str]:
    lives = [
        life
        for life in report["lives"]
        if life["label"].startswith("long-lived") and life["rss_kb"]
    ]
    head = " | ".join(f"{life['database']}, {life['label']}: RSS, MB" for life in lives)
    lines = [f"| minute | {head} |", "|---|" + "---|" * len(lives)]
    for minute in _minutes(report):
        cells = [_mb(_at(life["rss_kb"], minute * 60)[1]) for life in lives]
        lines.append(f"| {minute} | {' | '.join(cells)} |")
    return lines


def _table(report: dict[str, Any]) -> list[str]:
    names = list(report["samples"])
    head = " | ".join(f"{n}: total MB, heap MB, live, dead, autovacuums" for n in names)
    lines = [f"| minute | {head} |", "|---|" + "---|" * len(names)]
    for minute in _minutes(report):
        cells = []
        for name in names:
            s = _at(report["samples"][name], minute * 60, key=lambda s: s["at"])
            cells.append(
                f"{s['total_bytes'] / MB:.1f}, {s['heap_bytes'] / MB:.1f}, {s['n_live_tup']:,}, "
                f"{s['n_dead_tup']:,}, {s['autovacuum_count']}"
            )
        lines.append(f"| {minute} | {' | '.join(cells)} |")
    return lines


def _bounds(report: dict[str, Any]) -> list[str]:
    """Each database's hot table: its largest size and dead tuples after the first
    quarter of the run against the first quarter's (growth that keeps on shows here)."""
    lines = [
        "| database | total MB, end | most, 1st half | most, 2nd half | dead tuples, most "
        "1st half | most 2nd half | autovacuums | rows updated HOT |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, samples in report["samples"].items():
        half = samples[-1]["at"] / 2
        first = [s for s in samples if s["at"] <= half]
        second = [s for s in samples if s["at"] > half] or first
        hot = samples[-1]["n_tup_hot_upd"] / max(1, samples[-1]["n_tup_upd"])
        lines.append(
            f"| {name} | {samples[-1]['total_bytes'] / MB:.1f} "
            f"| {max(s['total_bytes'] for s in first) / MB:.1f} "
            f"| {max(s['total_bytes'] for s in second) / MB:.1f} "
            f"| {max(s['n_dead_tup'] for s in first):,} | {max(s['n_dead_tup'] for s in second):,} "
            f"| {samples[-1]['autovacuum_count']} | {hot:.0%} |"
        )
    return lines


def _counts(report: dict[str, Any]) -> list[str]:
    names = list(report["counts"])
    lines = [f"| check | {' | '.join(names)} |", "|---|" + "---|" * len(names)]
    for check in report["counts"][names[0]]["problems"]:
        values = [str(report["counts"][n]["problems"][check]) for n in names]
        lines.append(f"| {check} | {' | '.join(values)} |")
    for label, part, key in (
        ("writes planned (each a row under a unique key)", "writes", "planned"),
        ("joins planned (each after 23 rows)", "joins", "planned"),
        ("actions planned", "actions", "planned"),
        ("action rows Success / Failed", "actions", None),
        ("action attempts (rows' count) / starts", "actions", "attempts"),
        ("batch items planned / never started (Failed: lost with a kill)", "batches", None),
        ("cron ticks (mutation, every 10 s) / pings (action, every 30 s)", "crons", None),
    ):
        values = []
        for n in names:
            got = report["counts"][n][part]
            if part == "actions" and key is None:
                values.append(f"{got['succeeded']:,} / {got['failed']:,}")
            elif key == "attempts":
                values.append(f"{got['attempts']:,} / {got['starts']:,}")
            elif part == "batches":
                values.append(f"{got['planned']:,} / {got['never_started']:,}")
            elif part == "crons":
                values.append(f"{got['ticks']:,} / {got['pings']:,}")
            else:
                values.append(f"{got[key]:,}")
        lines.append(f"| {label} | {' | '.join(values)} |")
    return lines


_VACUUM = re.compile(r'automatic vacuum of table "(\w+)\.public\._scheduled_functions"')
_USAGE = re.compile(r"CPU: user: ([\d.]+) s, system: ([\d.]+) s, elapsed: ([\d.]+) s")
_WAL = re.compile(r"WAL usage: (\d+) records, (\d+) full page images, (\d+) bytes")


def autovacuums(log: Path) -> dict[str, dict[str, float]]:
    """Each database's autovacuum runs of ``_scheduled_functions``, from the server's log
    (``log_autovacuum_min_duration = 0``): how many, their CPU, wall time and WAL."""
    found: dict[str, dict[str, float]] = {}
    current: dict[str, float] | None = None
    for line in log.read_text(errors="replace").splitlines() if log.exists() else []:
        if (start := _VACUUM.search(line)) is not None:
            current = found.setdefault(
                start[1], {"runs": 0, "cpu_s": 0.0, "elapsed_s": 0.0, "wal_bytes": 0}
            )
            current["runs"] += 1
        elif current is not None and (wal := _WAL.search(line)) is not None:
            current["wal_bytes"] += int(wal[3])
        elif current is not None and (usage := _USAGE.search(line)) is not None:
            current["cpu_s"] = round(current["cpu_s"] + float(usage[1]) + float(usage[2]), 2)
            current["elapsed_s"] = round(current["elapsed_s"] + float(usage[3]), 2)
            current = None
    return found


def _vacuums(report: dict[str, Any]) -> list[str]:
    runs = report.get("autovacuums") or {}
    lines = [
        "| database | autovacuums of the table | their CPU, s | wall, s | WAL, MB |",
        "|---|---|---|---|---|",
    ]
    for name, got in runs.items():
        lines.append(
            f"| {name} | {got['runs']:g} | {got['cpu_s']:g} | {got['elapsed_s']:g} "
            f"| {got['wal_bytes'] / MB:.1f} |"
        )
    return lines if runs else []


def growth(folder: Path, top: int = 15) -> dict[str, Any] | None:
    """What the traced worker held more at its last snapshot than at its first (after
    its warm-up), by line: the biggest ``top`` differences."""
    snaps = sorted(folder.glob("snap-*.bin"))
    if len(snaps) < 2:
        return None
    first, last = (tracemalloc.Snapshot.load(str(p)) for p in (snaps[0], snaps[-1]))
    diff = last.compare_to(first, "lineno")
    return {
        "from": snaps[0].name,
        "to": snaps[-1].name,
        "total_kb": round(sum(d.size_diff for d in diff) / 1024, 1),
        "lines": [
            {"where": str(d.traceback), "kb": round(d.size_diff / 1024, 1), "count": d.count_diff}
            for d in diff[:top]
        ],
    }


def _growth(report: dict[str, Any]) -> list[str]:
    got = report.get("growth")
    if not got:
        return []
    lines = [
        "",
        f"### Held more from {got['from']} to {got['to']} (tracemalloc): {got['total_kb']:,} kB",
        "",
        "| where | kB | blocks |",
        "|---|---|---|",
    ]
    lines += [f"| `{g['where']}` | {g['kb']:,} | {g['count']:,} |" for g in got["lines"]]
    return lines


def markdown(report: dict[str, Any]) -> str:
    kills = len(report["kills"])
    out = [
        f"## Soak: {report['minutes']:g} minutes, a kill -9 every "
        f"{report['kill_every_minutes']:g} minutes ({kills} kills)",
        "",
        f"`{report.get('command', 'python -m benchmarks.soak')}`; rows scheduled: "
        + ", ".join(f"{n} {v:,}" for n, v in report["produced_rows"].items())
        + "; settled after the end in "
        + ", ".join(f"{n} {v:g} s" for n, v in report["settle_seconds"].items())
        + ". Settings: "
        + "; ".join(
            f"{n}: as migrated{f', then `ALTER TABLE _scheduled_functions {v}`' if v else ''}"
            for n, v in report["settings"].items()
        )
        + f"; {report.get('history_rows', 0):,} finished rows in the table at the start.",
        "",
        "### Nothing lost or doubled (every problem 0)",
        "",
        *_counts(report),
        "",
        "### Worker memory, each life",
        "",
        *_lives(report),
        "",
        "### The long-lived workers' memory",
        "",
        *_long_lived(report),
        *_growth(report),
        "",
        "### `_scheduled_functions`: bounded?",
        "",
        *_bounds(report),
        "",
        *_vacuums(report),
        "",
        *_table(report),
    ]
    if "realwork" in report:
        out += ["", "### W1-W4 on the scratch cluster", "", realwork_markdown(report["realwork"])]
    return "\n".join(out) + "\n"


def cli() -> None:
    """``python -m benchmarks.soak_report REPORT.json [SERVER.log]``: the markdown of a
    report written by ``benchmarks.soak --json`` (its autovacuums read from the log)."""
    import json
    import sys

    report = json.loads(Path(sys.argv[1]).read_text())
    if len(sys.argv) > 2:
        found = autovacuums(Path(sys.argv[2]))
        report["autovacuums"] = {n: found[n] for n in report["settings"] if n in found}
    print(markdown(report))


if __name__ == "__main__":
    cli()
