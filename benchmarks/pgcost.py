"""What one run costs PostgreSQL, read from the run's own database and processes only.

Each run gets a scratch database of its own (``scratch``), so that the server's other
work (other databases, other engineers' tests) stays out of the figures. ``Meter`` reads,
between ``Meter.start`` and ``Meter.stop`` (the window: the drain):

* **Database CPU**: the sum, over the database's backends, of ``utime + stime`` from
  ``/proc/PID/stat``. The PIDs come from ``pg_stat_activity WHERE datname = <db>``, polled
  every 0.2 s by a thread of this process on a connection to the ``postgres`` database
  (so the poll is not one of the backends it counts). Each backend's first and last
  reading is kept: one that was there at the start counts from its first reading, one
  born during the window from zero. A backend that exits between two polls loses what it
  spent since the last one (at most 0.2 s of its time); one that starts and exits between
  two polls is missed. Readings are in clock ticks (10 ms). Autovacuum workers on the
  database are counted, and also reported apart; the server's shared processes (WAL
  writer, checkpointer) are not.
* **Worker CPU**: ``utime + stime`` of the worker's process tree: for a worker in this
  process, this process with its threads less the polling thread's CPU; for a worker in
  a child (Graphile Worker's Node), that child and its children.
* **Commits and tuples**: deltas of ``pg_stat_database`` for the database (commits,
  rollbacks, tuples inserted, updated, deleted). PostgreSQL 15 keeps pending statistics
  in each backend and flushes them at most once a second while busy, within 10 s when
  idle, and when it exits (``pg_stat_force_next_flush()`` flushes only the caller's).
  So both readings are taken with none of the database's client backends left: the
  clients are closed before the window opens and after it ends, each backend flushes as it
  exits, and a reading is repeated until two in a row agree. What the clients do between
  the window's end and their close (a worker's stop) is in these counts; it is a few
  statements per run.
* **WAL**: ``pg_waldump`` over the window's LSN range, the records of the run's database
  only: a record whose block references name the database's OID (``rel spc/db/rel``), or
  whose description does (``db OID``, ``base/OID/``), or that belongs to a transaction
  that wrote such a record (its COMMIT). Bytes are counted with and without full-page
  images (``FPW``: the first change of a page after a checkpoint carries the whole page;
  other databases' DROP DATABASE forces checkpoints at any time, so the FPI bytes move
  from run to run while the rest does not), and broken down by relation, named from
  ``pg_class``. A temporary physical replication slot holds the WAL until it is read.

Linux, a PostgreSQL server on this machine, and a user that may read its ``pg_wal``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import asyncpg

from . import cost
from .throughput import pg_admin, pg_dsn

PREFIX = "durafn_rw_"
POLL_SECONDS = 0.2


class Unavailable(Exception):
    """This machine cannot measure a run this way (no pg_waldump, no /proc)."""


_made: list[str] = []


async def scratch(tag: str) -> str:
    """A new, empty database for one run, named ``durafn_rw_PID_N_tag``; ``drop_scratch``
    removes them (dropping one forces a checkpoint, so they are dropped at the end)."""
    name = f"{PREFIX}{os.getpid()}_{len(_made)}_{tag}".lower()
    await pg_admin(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)", f"CREATE DATABASE {name}")
    _made.append(name)
    return name


async def drop_scratch(leftovers: bool = False) -> None:
    """Drop this process's scratch databases; with ``leftovers``, also those of earlier
    runs whose process is gone."""
    conn = await asyncpg.connect(pg_dsn("postgres"))
    try:
        names = list(_made)
        if leftovers:
            for row in await conn.fetch(
                "SELECT datname FROM pg_database WHERE datname LIKE $1", PREFIX + "%"
            ):
                pid = row["datname"][len(PREFIX) :].split("_")[0]
                if pid.isdigit() and not _alive(int(pid)):
                    names.append(row["datname"])
        for name in names:
            await conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        _made.clear()
    finally:
        await conn.close()


def _alive(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists()


def tree_cpu(pid: int) -> float:
    """CPU seconds of ``pid`` and its descendants (live ones, and those it has reaped)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (fields := cost._stat(entry.name)) is not None:
            parents[int(entry.name)] = int(fields[2])
    total, todo = 0.0, [pid]
    while todo:
        current = todo.pop()
        fields = cost._stat(current)
        if fields is not None:
            total += sum(int(f) for f in fields[12:16]) / cost._TICK
        todo += [child for child, parent in parents.items() if parent == current]
    return total


@dataclass
class _Backend:
    kind: str
    first: float
    last: float


class Backends:
    """The CPU of one database's backends, polled from a thread of its own."""

    def __init__(self, database: str) -> None:
        self.database = database
        self._seen: dict[tuple[int, float], _Backend] = {}
        self._born_after = 0.0
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, name="pgcost-poll", daemon=True)
        self._clock: int | None = None
        self._error: BaseException | None = None

    def start(self) -> None:
        """Start polling; returns after the first poll (the readings the window starts from)."""
        self._born_after = time.time()
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            raise self._error

    def thread_cpu(self) -> float:
        """CPU seconds the polling thread has used (to leave out of this process's)."""
        return 0.0 if self._clock is None else time.clock_gettime(self._clock)

    def stop(self) -> None:
        """Poll once more, then stop (blocks until the thread ends)."""
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join()
        if self._error is not None:
            raise self._error

    def cpu(self) -> dict[str, float]:
        """CPU seconds in the window, in all and by backend type."""
        spent: dict[str, float] = {"all": 0.0}
        for backend in self._seen.values():
            used = backend.last - backend.first
            spent["all"] += used
            spent[backend.kind] = spent.get(backend.kind, 0.0) + used
        spent["backends"] = len(self._seen)
        return spent

    def _run(self) -> None:
        self._clock = time.pthread_getcpuclockid(threading.get_ident())
        try:
            asyncio.run(self._poll_until_stopped())
        except BaseException as exc:
            self._error = exc
            self._ready.set()

    async def _poll_until_stopped(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        conn = await asyncpg.connect(pg_dsn("postgres"))
        try:
            await self._poll(conn)
            self._ready.set()
            while not self._stop.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), POLL_SECONDS)
                await self._poll(conn)
        finally:
            await conn.close()

    async def _poll(self, conn: asyncpg.Connection) -> None:
        rows = await conn.fetch(
            "SELECT pid, extract(epoch FROM backend_start)::float8 AS born, backend_type "
            "FROM pg_stat_activity WHERE datname = $1",
            self.database,
        )
        for row in rows:
            fields = cost._stat(row["pid"])
            if fields is None:  # gone since the query: its last reading stands
                continue
            used = (int(fields[12]) + int(fields[13])) / cost._TICK
            key = (row["pid"], row["born"])
            if (known := self._seen.get(key)) is not None:
                known.last = used
            else:
                first = 0.0 if row["born"] >= self._born_after else used
                self._seen[key] = _Backend(row["backend_type"], first, used)


@dataclass
class Wal:
    """The records of one database in a range of WAL, as pg_waldump lists them."""

    records: int = 0
    bytes: int = 0
    fpi_bytes: int = 0
    fpi_blocks: int = 0
    by_part: dict[str, list[int]] = field(default_factory=dict)
    """records, bytes, FPI bytes by relation filenode (``rel:FILENODE[:fork]``) or, for
    records that name none, by kind (``Transaction COMMIT``)."""
    kinds: dict[str, dict[str, list[int]]] = field(default_factory=dict)
    """Each part's records and bytes by kind of record (``Heap HOT_UPDATE``)."""


_RECORD = re.compile(
    r"^rmgr: (\S+)\s+len \(rec/tot\):\s*(\d+)/\s*(\d+), tx:\s*(\d+), lsn: \S+, prev \S+, "
    r"desc: (.*)$"
)
_BLOCK = re.compile(r"rel (\d+)/(\d+)/(\d+)(?: fork (\w+))? blk \d+( FPW)?")
_NAMED_DB = re.compile(r"\bdb (\d+)\b|base/(\d+)/")
_SUBXACTS = re.compile(r"subxacts:((?: \d+)+)")


def parse_waldump(lines: Iterable[str], db_oid: int) -> Wal:
    """Sum pg_waldump's records (one a line) that belong to database ``db_oid``."""
    wal = Wal()
    ours: set[int] = set()  # transactions that wrote a record of the database
    db = str(db_oid)
    for line in lines:
        match = _RECORD.match(line)
        if match is None:
            continue
        rmgr, rec, tot, tx, desc = match.groups()
        part = None
        fpw = 0
        for spc_db_rel in _BLOCK.finditer(desc):
            if spc_db_rel.group(2) == db:
                fork = spc_db_rel.group(4)
                if part is None:
                    part = f"rel:{spc_db_rel.group(3)}" + (f":{fork}" if fork else "")
                fpw += spc_db_rel.group(5) is not None
        xid = int(tx)
        if part is None:
            named = any(db in m.groups() for m in _NAMED_DB.finditer(desc))
            subxacts = _SUBXACTS.search(desc)
            mine = xid in ours or (
                subxacts is not None and any(int(s) in ours for s in subxacts.group(1).split())
            )
            if not (named or mine):
                continue
        kind = f"{rmgr} {desc.split(' ', 1)[0]}".rstrip(" ,;")
        part = part or kind
        if xid:
            ours.add(xid)
        size, image = int(tot), int(tot) - int(rec)
        wal.records += 1
        wal.bytes += size
        wal.fpi_bytes += image
        wal.fpi_blocks += fpw
        counts = wal.by_part.setdefault(part, [0, 0, 0])
        counts[0] += 1
        counts[1] += size
        counts[2] += image
        of_kind = wal.kinds.setdefault(part, {}).setdefault(kind, [0, 0])
        of_kind[0] += 1
        of_kind[1] += size
    return wal


def waldump_binary(server_version_num: int) -> str:
    found = shutil.which("pg_waldump")
    if found:
        return found
    candidate = Path(f"/usr/lib/postgresql/{server_version_num // 10000}/bin/pg_waldump")
    if candidate.is_file():
        return str(candidate)
    raise Unavailable("pg_waldump is not installed (postgresql-NN's bin directory)")


def read_wal(binary: str, wal_dir: str, start: str, end: str, db_oid: int) -> Wal:
    """pg_waldump over ``start``..``end``, parsed as it streams."""
    command = [binary, "--path", wal_dir, "--start", start, "--end", end]
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as process:
        assert process.stdout is not None and process.stderr is not None
        wal = parse_waldump(process.stdout, db_oid)
        problem = process.stderr.read()
    if process.returncode != 0 and wal.records == 0:
        raise Unavailable(f"pg_waldump failed: {problem.strip()}")
    return wal


_COUNTERS = (
    "SELECT xact_commit, xact_rollback, tup_inserted, tup_updated, tup_deleted "
    "FROM pg_stat_database WHERE datname = $1"
)


async def settled_counters(conn: asyncpg.Connection, database: str) -> dict[str, int]:
    """``pg_stat_database``'s counters for ``database`` once every client backend of it
    has gone (each flushes its pending statistics as it exits) and two reads agree."""
    deadline = time.monotonic() + 30
    while await conn.fetchval(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = $1 "
        "AND backend_type = 'client backend'",
        database,
    ):
        if time.monotonic() > deadline:
            raise RuntimeError(f"clients of {database} still connected after 30 s")
        await anyio.sleep(0.02)
    previous: dict[str, int] | None = None
    while True:
        await conn.execute("SELECT pg_stat_clear_snapshot()")
        now = dict(await conn.fetchrow(_COUNTERS, database) or {})
        if now == previous or time.monotonic() > deadline:
            return now
        previous = now
        await anyio.sleep(0.1)


class Meter:
    """One run's window on its scratch database; ``worker_pid`` is the worker's process
    (None: this one). Use ``start``, then ``stop`` at the drain's end, close the clients,
    then ``figures``; ``close`` in a ``finally``.

    ``counters=False``: for a window that opens and closes with clients connected (workers
    already running, a pooler's server connections), which the commits and tuples need
    gone; ``figures`` then has none of them, and the CPU and WAL as ever."""

    def __init__(
        self, database: str, worker_pid: int | None = None, *, counters: bool = True
    ) -> None:
        self.database = database
        self.worker_pid = worker_pid
        self.counters = counters
        self._operator: asyncpg.Connection | None = None
        self._backends = Backends(database)
        self._marks: dict[str, Any] = {}

    def _worker_cpu(self) -> float:
        if self.worker_pid is not None:
            return tree_cpu(self.worker_pid)
        return time.process_time() - self._backends.thread_cpu()

    @classmethod
    async def start(
        cls, database: str, worker_pid: int | None = None, *, counters: bool = True
    ) -> Meter:
        meter = cls(database, worker_pid, counters=counters)
        admin = meter._operator = await asyncpg.connect(pg_dsn("postgres"))
        try:
            version = int(await admin.fetchval("SHOW server_version_num"))
            meter._marks["waldump"] = waldump_binary(version)
            data = await admin.fetchval("SHOW data_directory")
            meter._marks["wal_dir"] = str(Path(data) / "pg_wal")
            if not os.access(meter._marks["wal_dir"], os.R_OK):
                raise Unavailable(f"cannot read {meter._marks['wal_dir']} (run as root)")
            meter._marks["oid"] = await admin.fetchval(
                "SELECT oid FROM pg_database WHERE datname = $1", database
            )
            try:  # holds the window's WAL until it is read; dropped with this session
                await admin.execute(
                    "SELECT pg_create_physical_replication_slot($1, true, true)",
                    f"{PREFIX}{os.getpid()}",
                )
            except asyncpg.PostgresError as exc:
                meter._marks["slot_problem"] = str(exc)
            if counters:
                meter._marks["counters"] = await settled_counters(admin, database)
            await anyio.to_thread.run_sync(meter._backends.start)
            meter._marks["lsn"] = await admin.fetchval("SELECT pg_current_wal_insert_lsn()::text")
            meter._marks["worker"] = meter._worker_cpu()
        except BaseException:
            await meter.close()
            raise
        return meter

    async def stop(self) -> None:
        """The end of the window: the worker's CPU, the backends' last readings, the LSN."""
        assert self._operator is not None
        worker = self._worker_cpu()
        await anyio.to_thread.run_sync(self._backends.stop)
        self._marks["worker_spent"] = worker - self._marks["worker"]
        self._marks["end_lsn"] = await self._operator.fetchval(
            "SELECT pg_current_wal_insert_lsn()::text"
        )

    async def figures(self, jobs: int) -> dict[str, Any]:
        """Per-job figures of the window (after the run's clients have closed)."""
        admin, marks = self._operator, self._marks
        assert admin is not None and "end_lsn" in marks
        after = await settled_counters(admin, self.database) if self.counters else {}
        before = marks.get("counters", {})
        # The WAL writer writes what was inserted within wal_writer_delay (200 ms).
        for _ in range(250):
            if await admin.fetchval(
                "SELECT pg_current_wal_flush_lsn() >= $1::text::pg_lsn", marks["end_lsn"]
            ):
                break
            await anyio.sleep(0.02)
        wal = await anyio.to_thread.run_sync(
            read_wal,
            marks["waldump"],
            marks["wal_dir"],
            marks["lsn"],
            marks["end_lsn"],
            marks["oid"],
        )
        parts = await self._name_parts(wal)
        spent = self._backends.cpu()
        per_1000 = 1_000_000 / jobs
        autovacuum = spent.get("autovacuum worker", 0.0)

        def delta(name: str) -> float:
            return round(float(after[name] - before[name]) / jobs, 4)

        counted = (
            {
                "commits_per_job": delta("xact_commit"),
                "rollbacks_per_job": delta("xact_rollback"),
                "tuples_per_job": {
                    "inserted": delta("tup_inserted"),
                    "updated": delta("tup_updated"),
                    "deleted": delta("tup_deleted"),
                },
            }
            if self.counters
            else {}
        )
        return {
            "db_cpu_ms_per_1000": round(spent["all"] * per_1000, 1),
            "db_autovacuum_cpu_ms_per_1000": round(autovacuum * per_1000, 1),
            "backends": int(spent["backends"]),
            "worker_cpu_ms_per_1000": round(marks["worker_spent"] * per_1000, 1),
            **counted,
            "wal_records_per_job": round(wal.records / jobs, 3),
            "wal_bytes_per_job": round(wal.bytes / jobs, 1),
            "wal_bytes_per_job_without_fpi": round((wal.bytes - wal.fpi_bytes) / jobs, 1),
            "wal_fpi_bytes_per_job": round(wal.fpi_bytes / jobs, 1),
            "wal_fpi_blocks": wal.fpi_blocks,
            "wal_by_relation_per_job": {
                name: {
                    "records": round(counts[0] / jobs, 3),
                    "bytes": round(counts[1] / jobs, 1),
                    "fpi_bytes": round(counts[2] / jobs, 1),
                    "kinds": {
                        kind: {"records": round(k[0] / jobs, 3), "bytes": round(k[1] / jobs, 1)}
                        for kind, k in sorted(kinds.items(), key=lambda kv: -kv[1][1])
                    },
                }
                for name, (counts, kinds) in sorted(parts.items(), key=lambda kv: -kv[1][0][1])
            },
            **({"wal_slot_problem": marks["slot_problem"]} if "slot_problem" in marks else {}),
        }

    async def _name_parts(self, wal: Wal) -> dict[str, tuple[list[int], dict[str, list[int]]]]:
        """``rel:FILENODE`` parts named by ``pg_class`` (looked up in the run's database),
        each with its counts by kind of record."""
        filenodes = {int(part.split(":")[1]) for part in wal.by_part if part.startswith("rel:")}
        conn = await asyncpg.connect(pg_dsn(self.database))
        try:
            rows = await conn.fetch(
                "SELECT pg_relation_filenode(oid)::bigint AS node, relname FROM pg_class "
                "WHERE pg_relation_filenode(oid) = ANY($1::oid[])",
                list(filenodes),
            )
        finally:
            await conn.close()
        names = {row["node"]: row["relname"] for row in rows}
        named: dict[str, tuple[list[int], dict[str, list[int]]]] = {}
        for part, counts in wal.by_part.items():
            name = part
            if part.startswith("rel:"):
                _, node, *fork = part.split(":")
                name = names.get(int(node), f"filenode {node}") + (f" ({fork[0]})" if fork else "")
            total, kinds = named.setdefault(name, ([0, 0, 0], {}))
            for i, value in enumerate(counts):
                total[i] += value
            for kind, (records, size) in wal.kinds[part].items():
                into = kinds.setdefault(kind, [0, 0])
                into[0] += records
                into[1] += size
        return named

    async def close(self) -> None:
        if self._backends._thread.is_alive():
            await anyio.to_thread.run_sync(self._backends.stop)
        if self._operator is not None:
            await self._operator.close()  # its temporary slot goes with it
            self._operator = None
