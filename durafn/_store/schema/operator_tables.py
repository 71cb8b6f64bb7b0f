"""The tables of the operators' tools: the audit trail of what operators did, the
dashboard's per-minute rollups of what ended, and operations (an operator's change of
every row a filter matches, run a page at a time). Side tables: nothing on a job's path
writes them."""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    Column,
    Double,
    Index,
    Integer,
    String,
    Table,
    Text,
    literal_column,
)

from ..._latency import BUCKETS
from .base import metadata, partial

# Version 22: what operators did (the dashboard's actions and the command line's
# changes): when, who, through what, which action on what, how many rows, and what came
# of it. Written in the action's own statement after it; kept for the retention period
# (the executor's retention pass removes the older entries, in pages).
audit = Table(
    "_durafn_audit",
    metadata,
    Column("id", BigInteger().with_variant(Integer(), "sqlite"), primary_key=True),
    Column("at", Double, nullable=False),
    Column("who", Text, nullable=False),  # the visitor: "local", "token", the host's user
    Column("via", String(16), nullable=False),  # "dashboard" or "cli"
    Column("action", Text, nullable=False),  # "cancel", "retry", "cron remove", ...
    Column("target", Text, nullable=False),  # a row's id, a filter, a cron or queue name
    Column("rows", Integer, nullable=False),  # how many rows it changed
    Column("outcome", Text, nullable=False),  # what was said on the page
)
# The pages, newest first, read the primary key; the retention pass ranges over ``at``.
Index("ix_durafn_audit_at", audit.c.at)

# Version 25: what ended, per closed minute (``span`` 60) and per hour (3600), by
# function, queue ('' for none) and state: a count, and the start lag's and the
# duration's histograms (``_latency.py``: bucket i in ``lag_i``, ``dur_i``). Written by
# the executor's maintenance pass from the rows that ended in those minutes
# (``_executor/rollups.py``), never on a job's path; read by the dashboard's charts, at
# most a minute or an hour's rows per point. Kept as long as finished rows are.
LAG_COLUMNS = tuple(f"lag_{i:02d}" for i in range(BUCKETS))
DURATION_COLUMNS = tuple(f"dur_{i:02d}" for i in range(BUCKETS))
rollups = Table(
    "_durafn_rollups",
    metadata,
    Column("span", Integer, primary_key=True),  # 60: a minute; 3600: an hour
    Column("start", BigInteger, primary_key=True),  # epoch seconds, a multiple of span
    Column("function_name", Text, primary_key=True),
    Column("queue", Text, primary_key=True),
    Column("state", String(16), primary_key=True),
    Column("count", Integer, nullable=False),
    *(Column(name, Integer, nullable=False) for name in (*LAG_COLUMNS, *DURATION_COLUMNS)),
)
# The primary key (span, start, ...) is the index every read and the pruning range over.
# How far each span is rolled up: every minute (hour) before ``until`` is in, rows or
# none. Moved forward only, by a guarded UPDATE in the transaction that wrote them.
rollup_marks = Table(
    "_durafn_rollup_marks",
    metadata,
    Column("span", Integer, primary_key=True),
    Column("until", BigInteger, nullable=False),
)

# Version 26: operations, an operator's change of every row a filter matches (a failure
# group's retry, a bulk cancel of a million rows), run a page at a time by any process
# (the workers' maintenance, ``app.run_operations()``) from where the last page stopped
# (``cursor``: the last row id it read), each page an UPDATE of this row guarded by the
# cursor it expects: two runners never both take a page, and one killed mid-way leaves
# nothing to clean up (its page's transaction is rolled back; the cursor says where the
# next runner starts). Kept for the retention period, like the audit trail.
operations = Table(
    "_durafn_operations",
    metadata,
    Column("id", BigInteger().with_variant(Integer(), "sqlite"), primary_key=True),
    Column("kind", String(16), nullable=False),  # "cancel", "retry", "reschedule"
    Column("filter", Text, nullable=False),  # the rows it selects, JSON (RowFilter's fields)
    Column("change", Text, nullable=False),  # a reschedule's new values, JSON ({} else)
    Column("who", Text, nullable=False),
    Column("created_at", Double, nullable=False),
    Column("updated_at", Double, nullable=False),  # its last page
    Column("total", Integer, nullable=False),  # matching rows when it started (bounded)
    Column("done", Integer, nullable=False, server_default="0"),  # rows changed so far
    Column("scanned", BigInteger, nullable=False, server_default="0"),  # rows read so far
    Column("cursor", Text, nullable=False, server_default=""),  # '' : from the first id
    Column("state", String(16), nullable=False),
    Column("finished_at", Double),
    Column("error", Text),
    CheckConstraint(
        "state IN ('Running', 'Done', 'Failed', 'Canceled')", name="ck_durafn_operations_state"
    ),
)
# What is left to run: as few entries as operations running (the workers poll it).
Index(
    "ix_durafn_operations_running",
    operations.c.id,
    **partial(operations.c.state == literal_column("'Running'")),
)
# The retention pass removes the ended ones oldest first.
Index(
    "ix_durafn_operations_finished",
    operations.c.finished_at,
    **partial(operations.c.finished_at.is_not(None)),
)
