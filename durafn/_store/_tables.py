"""The system tables, as SQLAlchemy ``MetaData`` so users can add them to Alembic.

Each hot query names the index it relies on; keep the two in step.
"""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy import (
    CheckConstraint,
    Column,
    Double,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    Uuid,
    inspect,
    text,
)
from sqlalchemy.engine import Connection

SCHEMA_VERSION = 3
"""Bump with a new step in ``MIGRATIONS`` whenever the tables change."""

metadata = MetaData()

# Native uuid on PostgreSQL (16 bytes, cheap to compare); readable text on SQLite.
_ID = Uuid(as_uuid=False).with_variant(String(36), "sqlite")

scheduled_functions = Table(
    "_scheduled_functions",
    metadata,
    Column("id", _ID, primary_key=True),
    Column("name", Text, nullable=False),
    Column("kind", String(16), nullable=False),
    Column("args", Text, nullable=False),
    Column("state", String(16), nullable=False),
    # Times are float seconds since the epoch: exact to the microsecond for centuries,
    # equally cheap to compare on both engines, and free of time-zone conversions.
    Column("scheduled_time", Double, nullable=False),
    # When the row may next be claimed: scheduled_time, pushed back by internal retries.
    Column("available_at", Double, nullable=False),
    Column("started_time", Double),
    Column("completed_time", Double),
    Column("parent_id", _ID),
    Column("attempts", Integer, nullable=False, server_default="0"),
    Column("error_type", Text),
    Column("error_message", Text),
    Column("error_traceback", Text),  # version 3
    Column("result", Text),
    Column("worker_id", Text),
    # Reserved for priorities, serial queues, dedupe keys and retry policies (next issue);
    # present now so that adding them is not a table rewrite.
    Column("priority", Integer, nullable=False, server_default="0"),
    Column("queue_name", Text),
    Column("job_key", Text),
    Column("max_attempts", Integer),
    CheckConstraint(
        "state IN ('Pending', 'InProgress', 'Success', 'Failed', 'Canceled')",
        name="ck_scheduled_functions_state",
    ),
    CheckConstraint("kind IN ('mutation', 'action')", name="ck_scheduled_functions_kind"),
)
sf = scheduled_functions

# Claims and "when is the next row due": only Pending rows are in it, so the index stays
# as small as the backlog of unstarted work however many finished rows await retention.
Index(
    "ix_scheduled_functions_due",
    sf.c.kind,
    sf.c.available_at,
    sf.c.id,
    postgresql_where=sf.c.state == "Pending",
    sqlite_where=sf.c.state == "Pending",
)
# Transitive cancel walks children by parent.
Index(
    "ix_scheduled_functions_parent",
    sf.c.parent_id,
    postgresql_where=sf.c.parent_id.is_not(None),
    sqlite_where=sf.c.parent_id.is_not(None),
)
# Retention deletes the oldest finished rows first.
Index(
    "ix_scheduled_functions_completed",
    sf.c.completed_time,
    postgresql_where=sf.c.completed_time.is_not(None),
    sqlite_where=sf.c.completed_time.is_not(None),
)
# Listing in time order, keyset-paginated.
Index("ix_scheduled_functions_scheduled", sf.c.scheduled_time, sf.c.id)
# Lost-worker rescue and per-worker counts look only at running actions: as small as the
# number of actions running across all workers.
ix_running = Index(
    "ix_scheduled_functions_running",
    sf.c.worker_id,
    postgresql_where=sf.c.state == "InProgress",
    sqlite_where=sf.c.state == "InProgress",
)

workers = Table(
    "_durafn_workers",
    metadata,
    # Unique per executor run (name + random suffix): a restarted worker never inherits the
    # rows its previous incarnation had InProgress; those are rescued as lost.
    Column("id", Text, primary_key=True),
    Column("hostname", Text, nullable=False),
    Column("pid", Integer, nullable=False),
    Column("concurrency", Integer, nullable=False),
    Column("started_at", Double, nullable=False),
    Column("heartbeat_at", Double, nullable=False),
    # No index on heartbeat_at: one row per live worker, read by a full scan.
)

schema_version = Table(
    "_durafn_schema",
    metadata,
    Column("version", Integer, primary_key=True),
    Column("applied_at", Double, nullable=False),
)


def _step_2(conn: Connection) -> None:
    """Version 2: worker heartbeats (``_durafn_workers``) and the running-actions index."""
    workers.create(conn, checkfirst=True)
    ix_running.create(conn, checkfirst=True)


def _step_3(conn: Connection) -> None:
    """Version 3: a failed run's traceback (``error_traceback``). A nullable column without
    a default: a change of the catalogue only, on both engines, however many rows."""
    columns = {c["name"] for c in inspect(conn).get_columns(scheduled_functions.name)}
    if "error_traceback" not in columns:  # tables adopted from durafn.metadata have it
        conn.execute(text("ALTER TABLE _scheduled_functions ADD COLUMN error_traceback TEXT"))


MIGRATIONS: dict[int, Callable[[Connection], None]] = {2: _step_2, 3: _step_3}
"""Steps from version N-1 to N. A fresh database gets the latest tables in one go."""
