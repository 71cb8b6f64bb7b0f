"""What a drain costs in CPU, read from ``/proc``: the figure that does not depend on how
fast the machine is today, and what users pay for.

* **The worker**: the CPU time (user + system) of the process(es) that ran the rows: this
  process for an in-process drain (every thread, aiosqlite's included), a child's for a
  peer run as one (Graphile Worker's Node process).
* **The database**: every PostgreSQL server process's CPU, plus what the postmaster has
  reaped of its exited children (``cutime``/``cstime``): a backend that ends during the
  drain keeps its share. The server's background processes (WAL writer, checkpointer,
  autovacuum) are in it too: work the drain caused, and a little that it did not.

Both as CPU milliseconds per 1,000 rows. Linux only; elsewhere the figures are None.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_PROC = Path("/proc")


def _stat(pid: int | str) -> list[str] | None:
    """A process's ``/proc/PID/stat`` fields after its name, or None if it is gone."""
    try:
        text = (_PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    # The name is in parentheses and may hold spaces: split after its closing one.
    name_end = text.rindex(")")
    return [text[text.index("(") + 1 : name_end], *text[name_end + 2 :].split()]


def process_cpu(pid: int) -> float:
    """CPU seconds (user + system) of one process, 0.0 if it is gone."""
    fields = _stat(pid)
    # fields[0] is the name; utime and stime are stat's 14th and 15th fields.
    return (int(fields[12]) + int(fields[13])) / _TICK if fields else 0.0


def postgres_cpu() -> float | None:
    """CPU seconds of the PostgreSQL server on this machine: its live processes, and the
    exited children its postmaster has reaped. None where ``/proc`` is not there."""
    if not _PROC.is_dir():
        return None
    total = 0.0
    for entry in _PROC.iterdir():
        if not entry.name.isdigit():
            continue
        fields = _stat(entry.name)
        if fields is None or fields[0] != "postgres":
            continue
        total += (int(fields[12]) + int(fields[13])) / _TICK
        parent = _stat(fields[2])
        if parent is None or parent[0] != "postgres":  # the postmaster: its reaped children
            total += (int(fields[14]) + int(fields[15])) / _TICK
    return total


@dataclass(frozen=True)
class Reading:
    worker: float
    database: float | None
    wall: float


def read(worker_pid: int | None = None) -> Reading:
    """The counters now: this process's CPU, or ``worker_pid``'s; the server's."""
    worker = time.process_time() if worker_pid is None else process_cpu(worker_pid)
    return Reading(worker, postgres_cpu(), time.perf_counter())


def per_thousand(before: Reading, after: Reading, rows: int) -> dict[str, float | None]:
    """CPU milliseconds per 1,000 rows between two readings, worker and database."""
    scale = 1000 * 1000 / rows
    database = (
        None
        if before.database is None or after.database is None
        else round((after.database - before.database) * scale, 1)
    )
    return {
        "worker_cpu_ms_per_1000": round((after.worker - before.worker) * scale, 1),
        "database_cpu_ms_per_1000": database,
    }
