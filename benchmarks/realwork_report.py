"""``benchmarks.realwork``'s report as markdown: the table of figures, durafn's ratios
round by round, the targets, and where each system's WAL goes."""

from __future__ import annotations

from typing import Any

TARGETS = [
    "W1, W2 against Graphile batched: DB CPU per job <= 1.0x, WAL <= 1.2x, worker CPU "
    "<= 1.5x; durafn's share of the ideal rate >= 0.95",
    "W3: durafn's inserting mutations <= 1.1x the worker CPU and <= 1.2x the DB CPU of the "
    "same INSERT through SQLAlchemy's AsyncConnection committing in the same batch sizes; "
    "a no-op mutation's WAL <= 400 bytes/job; on SQLite the insert mutation's cost at or "
    "below its raw loop's",
]

_NONE = "—"


def _num(value: Any, digits: int = 0) -> str:
    if value is None:
        return _NONE
    return f"{value:,.{digits}f}"


def _rate(got: dict[str, Any]) -> str:
    text = _num(got["jobs_per_s"])
    if got.get("of_ideal") is not None:
        text += f" ({got['of_ideal']:.2f})"
    return text


def _wal(got: dict[str, Any]) -> str:
    if got.get("wal_bytes_per_job") is None:
        return _NONE
    fpi = got["wal_fpi_bytes_per_job"]
    return _num(got["wal_bytes_per_job"]) + (f" ({_num(fpi)} FPI)" if fpi else "")


def _tuples(got: dict[str, Any]) -> str:
    t = got.get("tuples_per_job")
    if not t:
        return _NONE
    return " / ".join(f"{t[k]:.2f}" for k in ("inserted", "updated", "deleted"))


def _label(label: str, got: dict[str, Any]) -> str:
    if "every B" in label and got.get("batch_rows"):
        return label.replace("every B", f"every {got['batch_rows']:.0f}")
    return label


def figures_table(report: dict[str, Any]) -> list[str]:
    lines = [
        "| workload | system | jobs/s (of ideal) | DB CPU ms /1,000 jobs | worker CPU ms "
        "/1,000 | commits /job | WAL bytes /job (of it FPI) | WAL records /job | "
        "tuples ins / upd / del /job |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for key, entry in report["workloads"].items():
        first = f"{key}: {entry['title']} ({entry['jobs']:,} jobs)"
        for label, system in entry["systems"].items():
            got = system["median"]
            if not isinstance(got, dict):
                lines.append(f"| {first} | {label} | {got} | | | | | | |")
            else:
                cells = [
                    first,
                    _label(label, got),
                    _rate(got),
                    _num(got.get("db_cpu_ms_per_1000"), 1),
                    _num(got.get("worker_cpu_ms_per_1000"), 1),
                    _num(got.get("commits_per_job"), 3),
                    _wal(got),
                    _num(got.get("wal_records_per_job"), 2),
                    _tuples(got),
                ]
                lines.append("| " + " | ".join(cells) + " |")
            first = ""
    return lines


_RATIO_COLUMNS = (
    ("jobs_per_s", "jobs/s"),
    ("db_cpu_ms_per_1000", "DB CPU"),
    ("worker_cpu_ms_per_1000", "worker CPU"),
    ("commits_per_job", "commits"),
    ("wal_bytes_per_job", "WAL"),
    ("wal_bytes_per_job_without_fpi", "WAL without FPI"),
)


def ratios_table(report: dict[str, Any]) -> list[str]:
    lines = [
        "| workload | ratio | " + " | ".join(name for _, name in _RATIO_COLUMNS) + " |",
        "|---|---|" + "---|" * len(_RATIO_COLUMNS),
    ]
    for key, entry in report["workloads"].items():
        for pair, ratios in entry["ratios"].items():
            cells = []
            for column, _ in _RATIO_COLUMNS:
                got = ratios.get(column)
                cells.append(
                    _NONE
                    if got is None
                    else f"**{got['median']:.2f}** ({', '.join(f'{r:.2f}' for r in got['rounds'])})"
                )
            lines.append(f"| {key} | {pair} | " + " | ".join(cells) + " |")
    return lines


def wal_parts(report: dict[str, Any], top: int = 7) -> list[str]:
    """Each PostgreSQL system's WAL by relation, from its round with the median WAL."""
    lines = [
        "| workload | system | WAL bytes /job by relation (records /job), the round with "
        "the median WAL; the largest relation's by kind of record in brackets |",
        "|---|---|---|",
    ]
    for key, entry in report["workloads"].items():
        for label, system in entry["systems"].items():
            runs = [r for r in system["runs"] if isinstance(r, dict) and r.get("wal_bytes_per_job")]
            if not runs:
                continue
            run = sorted(runs, key=lambda r: r["wal_bytes_per_job"])[len(runs) // 2]
            parts = list(run["wal_by_relation_per_job"].items())
            shown = [(name, p) for name, p in parts[:top] if p["bytes"] >= 1]
            text = [f"{name} {p['bytes']:,.0f} ({p['records']:.2f})" for name, p in shown]
            if shown and len(kinds := shown[0][1].get("kinds", {})) > 1:  # the largest's
                text[0] += (
                    " ["
                    + ", ".join(
                        f"{kind} {k['bytes']:,.0f} ({k['records']:.2f})"
                        for kind, k in kinds.items()
                    )
                    + "]"
                )
            if rest := parts[len(shown) :]:
                text.append(f"{len(rest)} others {sum(p['bytes'] for _, p in rest):,.1f}")
            lines.append(f"| {key} | {_label(label, run)} | {'; '.join(text)} |")
    return lines


def markdown(report: dict[str, Any]) -> str:
    lines = [
        f"Jobs that do work, PostgreSQL (and SQLite in W3): medians of {report['rounds']} "
        "interleaved rounds, each system draining in a database of its own.",
        "",
        *figures_table(report),
        "",
        "durafn's ratios, **median of the rounds' ratios** (each round's):",
        "",
        *ratios_table(report),
        "",
        "Targets:",
        "",
        *[f"- {t}" for t in TARGETS],
        "",
        "Where the WAL goes:",
        "",
        *wal_parts(report),
    ]
    return "\n".join(lines) + "\n"


def section(report: dict[str, Any] | None) -> list[str]:
    """The head of ``make bench``'s results (nothing where PostgreSQL was not measured)."""
    if not report:
        return []
    body = [report["skipped"]] if "skipped" in report else [markdown(report)]
    return ["## Jobs that do work, against Graphile Worker", "", *body, "", "## No-op drains", ""]
