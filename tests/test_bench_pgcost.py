"""The per-database measuring of ``benchmarks.realwork`` (``benchmarks/pgcost.py``): its
figures must count the run's own database and nothing else. PostgreSQL only: it reads
PostgreSQL's backends, statistics and WAL (SQLite's cost is the worker's own CPU)."""

from __future__ import annotations

import os
from pathlib import Path

import asyncpg
import pytest

from benchmarks import pgcost

from .conftest import require_postgres

DB, OTHER = 16384, 16390

LINES = [
    # Ours: a heap insert and its index entry, with a full-page image on the first.
    f"rmgr: Heap        len (rec/tot):     59/  8251, tx:        700, lsn: 0/01000028, "
    f"prev 0/01000000, desc: INSERT off 1 flags 0x00, blkref #0: rel 1663/{DB}/24580 blk 0 FPW",
    f"rmgr: Btree       len (rec/tot):     64/    64, tx:        700, lsn: 0/01002090, "
    f"prev 0/01000028, desc: INSERT_LEAF off 1, blkref #0: rel 1663/{DB}/24583 blk 1",
    # Another database's transaction, and its commit.
    f"rmgr: Heap        len (rec/tot):     59/    59, tx:        701, lsn: 0/010020D0, "
    f"prev 0/01002090, desc: INSERT off 2 flags 0x00, blkref #0: rel 1663/{OTHER}/24580 blk 0",
    "rmgr: Transaction len (rec/tot):     34/    34, tx:        701, lsn: 0/01002110, "
    "prev 0/010020D0, desc: COMMIT 2026-12-02 04:42:17.492634 UTC",
    # Our commit: no relation in it, ours by its transaction.
    "rmgr: Transaction len (rec/tot):     34/    34, tx:        700, lsn: 0/01002138, "
    "prev 0/01002110, desc: COMMIT 2026-12-02 04:42:17.497995 UTC",
    # Ours by name: a lock naming the database; and a visibility-map change (a fork).
    f"rmgr: Standby     len (rec/tot):     42/    42, tx:        702, lsn: 0/01002160, "
    f"prev 0/01002138, desc: LOCK xid 702 db {DB} rel 24580 ",
    f"rmgr: Heap2       len (rec/tot):     64/    64, tx:          0, lsn: 0/01002190, "
    f"prev 0/01002160, desc: VISIBLE cutoff xid 700 flags 0x01, blkref #0: rel "
    f"1663/{DB}/24580 fork vm blk 0, blkref #1: rel 1663/{DB}/24580 blk 0",
    # The server's own: no database, no transaction.
    "rmgr: Standby     len (rec/tot):     50/    50, tx:          0, lsn: 0/010021D0, "
    "prev 0/01002190, desc: RUNNING_XACTS nextXid 703 latestCompletedXid 702 "
    "oldestRunningXid 703",
    # A commit whose work was all in a subtransaction of ours.
    f"rmgr: Heap        len (rec/tot):     59/    59, tx:        705, lsn: 0/01002208, "
    f"prev 0/010021D0, desc: INSERT off 3 flags 0x00, blkref #0: rel 1663/{DB}/24580 blk 0",
    "rmgr: Transaction len (rec/tot):     38/    38, tx:        704, lsn: 0/01002248, "
    "prev 0/01002208, desc: COMMIT 2026-12-02 04:42:18.000000 UTC; subxacts: 705",
    "pg_waldump: error: error in WAL record at 0/01002270: invalid record length",
]


def test_waldump_counts_the_records_of_one_database_only() -> None:
    wal = pgcost.parse_waldump(LINES, DB)
    assert wal.records == 7
    assert wal.bytes == 8251 + 64 + 34 + 42 + 64 + 59 + 38
    assert (wal.fpi_bytes, wal.fpi_blocks) == (8251 - 59, 1)
    assert wal.by_part == {
        "rel:24580": [2, 8251 + 59, 8251 - 59],
        "rel:24583": [1, 64, 0],
        "Transaction COMMIT": [2, 34 + 38, 0],
        "Standby LOCK": [1, 42, 0],
        "rel:24580:vm": [1, 64, 0],
    }
    assert wal.kinds["rel:24580"] == {"Heap INSERT": [2, 8251 + 59]}
    assert wal.kinds["Transaction COMMIT"] == {"Transaction COMMIT": [2, 34 + 38]}
    other = pgcost.parse_waldump(LINES, OTHER)
    assert (other.records, other.bytes) == (2, 59 + 34)


@pytest.fixture
def local_postgres() -> None:
    """The server, on this machine, with its pg_wal readable by this user."""
    require_postgres()
    if not os.access("/var/lib/postgresql", os.R_OK) or not Path("/proc/self/stat").exists():
        pytest.skip("pg_wal is not readable here (the server runs elsewhere, or not as root)")


@pytest.mark.postgres_only  # what it measures is PostgreSQL's: backends, statistics, WAL
@pytest.mark.anyio
async def test_a_window_counts_its_database_and_not_the_servers_other_work(
    local_postgres: None,
) -> None:
    """Writes to another database in the same window are in none of the figures; the
    window's own are, from statistics its clients flushed as they closed."""
    ours, theirs = await pgcost.scratch("test_ours"), await pgcost.scratch("test_theirs")
    dsn = "postgresql://postgres@127.0.0.1:5432/"
    try:
        for database, table in ((ours, "ours"), (theirs, "theirs")):
            conn = await asyncpg.connect(dsn + database)
            await conn.execute(f"CREATE TABLE {table} (id serial PRIMARY KEY, n int)")
            await conn.close()
        meter = await pgcost.Meter.start(ours)
        try:
            mine, other = await asyncpg.connect(dsn + ours), await asyncpg.connect(dsn + theirs)
            for batch in range(10):
                async with mine.transaction():
                    for i in range(10):
                        await mine.execute("INSERT INTO ours (n) VALUES ($1)", batch * 10 + i)
                await other.execute("INSERT INTO theirs (n) SELECT generate_series(1, 50)")
            await meter.stop()
            await mine.close()
            await other.close()
            figures = await meter.figures(100)
        finally:
            await meter.close()
    finally:
        await pgcost.drop_scratch()
    assert figures["tuples_per_job"] == {"inserted": 1.0, "updated": 0.0, "deleted": 0.0}
    # Its 10 transactions and the one a backend commits as it starts; not the other's 10.
    assert figures["commits_per_job"] == 0.11
    parts = figures["wal_by_relation_per_job"]
    # A record per row in the table and in its index (the index's first also makes its root).
    assert parts["ours"]["records"] >= 1.0 and parts["ours_pkey"]["records"] >= 1.0
    assert parts["Transaction COMMIT"]["records"] == 0.1
    assert "theirs" not in parts and "theirs_pkey" not in parts
    assert figures["backends"] == 1  # the client of ours; the poll's is in postgres
