"""The system tables, as SQLAlchemy ``MetaData`` so users can add them to Alembic.

Each hot query names the index it relies on; keep the two in step.
"""

from __future__ import annotations

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    Double,
    Identity,
    Index,
    Integer,
    String,
    Table,
    Text,
    and_,
    false,
    literal_column,
)
from sqlalchemy.dialects.postgresql import JSONB

# What every table module shares, and the side tables, declared on the same metadata in
# modules of their own: named here too, as what imports the schema imports them from here.
from .base import ID_TYPE as ID_TYPE
from .base import metadata as metadata
from .base import partial as partial
from .operator_tables import DURATION_COLUMNS as DURATION_COLUMNS
from .operator_tables import LAG_COLUMNS as LAG_COLUMNS
from .operator_tables import audit as audit
from .operator_tables import operations as operations
from .operator_tables import rollup_marks as rollup_marks
from .operator_tables import rollups as rollups
from .workflow_tables import workflow_events as workflow_events
from .workflow_tables import workflow_steps as workflow_steps
from .workflow_tables import workflows as workflows

SCHEMA_VERSION = 27
"""Bump with a new step in ``migrations.MIGRATIONS`` whenever the tables change."""

ERROR_KEYS = ("attempt", "at", "worker", "type", "message", "traceback", "retry_at")
"""An entry of a row's ``errors``: which failed run of the row it was (1 for the first,
again after ``app.retry``), when, on which worker, the error, and when it was to be tried
again (null: not retried)."""

scheduled_functions = Table(
    "_scheduled_functions",
    metadata,
    Column("id", ID_TYPE, primary_key=True),
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
    Column("parent_id", ID_TYPE),
    Column("attempts", Integer, nullable=False, server_default="0"),
    Column("error_type", Text),
    Column("error_message", Text),
    Column("error_traceback", Text),  # version 3
    Column("result", Text),
    Column("worker_id", Text),
    # Job options (durafn/_options.py). Lower priority runs first.
    Column("priority", Integer, nullable=False, server_default="0"),
    Column("queue_name", Text),
    # Held by at most one row that is not Success (ix_scheduled_functions_key).
    Column("job_key", Text),
    # Retry policies (durafn/_retries.py), version 5: the row's own limit on runs, its
    # policy as data (None: its function's or the app's, looked up when it fails), and
    # how many of its runs failed since it was scheduled (or retried by hand).
    Column("max_attempts", Integer),
    Column("flags", Text),  # version 4: ",a,b," (sorted), so "carries x" is one LIKE
    Column("retry", Text),
    Column("failures", Integer, nullable=False, server_default="0"),
    # Version 6: the completion callback (``on_complete``) as data, JSON: which mutation
    # to schedule, with which options, when the row finishes for good (_store/write/completions.py).
    Column("on_complete", Text),
    # Version 10: each failed run, a JSON array of objects with ERROR_KEYS (written in
    # _store/write/failures.py); the error columns above hold the last one.
    Column("errors", JSON(none_as_null=True).with_variant(JSONB(), "postgresql")),
    # Version 8, flow control (durafn/_flow.py): the row's flow key, the key's knobs as
    # JSON, and a debounced row's latest run time (its first call plus max_wait).
    Column("flow_key", Text),
    Column("flow", Text),
    Column("flow_until", Double),
    # Version 11: the order rows were written in, which claims take rows due at the same
    # instant in (a queue's or a key's included): ids are made by each scheduling process,
    # so two processes' ids within one millisecond sort in no such order. PostgreSQL's
    # identity; on SQLite the row's rowid, written with it (``NEXT_SEQ``).
    Column("seq", BigInteger, Identity(), nullable=False),
    # Version 13: the W3C trace context of the code that scheduled the row (a JSON object
    # of ``traceparent``/``tracestate``), or ``{"cron": name}`` for a cron's tick; None
    # where no trace was active or OpenTelemetry is not installed (``_telemetry``).
    Column("trace_context", Text),
    # Version 14: how many times the row snoozed (``durafn.Snooze``: back to Pending, not
    # a failure), and a running row's progress (``ctx.progress``): a fraction from 0 to 1
    # and a message, kept after it ends.
    Column("snoozes", Integer, nullable=False, server_default="0"),
    Column("progress", Double),
    Column("progress_message", Text),
    # Version 15, dependencies (``after=``, ``write/dependencies.py``): how many of the
    # rows it waits for have not finished for good, how many of them ended other than
    # Success, what it does then (``after_policy``: run, cancel, fail; None: no
    # dependencies), and whether rows wait for it (``dependents``: its finish releases
    # them, in the trigger of ``schema/dependencies.py``).
    Column("awaiting", Integer, nullable=False, server_default="0"),
    Column("after_failed", Integer, nullable=False, server_default="0"),
    Column("after_policy", String(16)),
    Column("dependents", Integer, nullable=False, server_default="0"),
    # Version 17: a batched action's row (``durafn.Batch``) holds its batch key ('' when
    # its function batches without one); None for every other row.
    Column("batch_key", Text),
    CheckConstraint(
        "state IN ('Pending', 'InProgress', 'Success', 'Failed', 'Canceled')",
        name="ck_scheduled_functions_state",
    ),
    CheckConstraint("kind IN ('mutation', 'action')", name="ck_scheduled_functions_kind"),
)
sf = scheduled_functions

# Claims and "when is the next row due": only Pending rows are in them, so they stay as
# small as the backlog of unstarted work however many finished rows await retention.
# Four classes of Pending rows, each with its own indexes: unqueued, queued, keyed (a
# flow key: flow control, claimed per key by _store/claim/flow.py), and batched (a batched
# action's: claimed a batch at a time by _store/claim/batched.py; never queued nor keyed).
# The states are literals, not bound parameters, so that a query written with these same
# predicates (a bounded count, say) matches the partial index under a generic plan too
# (see ix_scheduled_functions_key below).
_PENDING = sf.c.state == literal_column("'Pending'")
UNQUEUED = and_(
    _PENDING, sf.c.queue_name.is_(None), sf.c.flow_key.is_(None), sf.c.batch_key.is_(None)
)
QUEUED = and_(_PENDING, sf.c.queue_name.is_not(None), sf.c.flow_key.is_(None))
KEYED = and_(_PENDING, sf.c.flow_key.is_not(None))
BATCHED = and_(_PENDING, sf.c.batch_key.is_not(None))
# Priority comes before time (and the order written, ``seq``, after it): a claim reads each
# priority level present as one range
# (``priority = p AND available_at <= now``, in order), so neither a future row nor a row
# of a later level is read to find a due one (claim/take.py). Unqueued and queued rows have
# an index each, so that finding the few due rows of named queues never reads through a
# backlog of unqueued ones, nor the other way round.
Index(
    "ix_scheduled_functions_claim",
    sf.c.kind,
    sf.c.priority,
    sf.c.available_at,
    sf.c.seq,
    **partial(UNQUEUED),
)
# queue_name last, so that finding which queues have due rows reads the index alone.
Index(
    "ix_scheduled_functions_claim_queued",
    sf.c.kind,
    sf.c.priority,
    sf.c.available_at,
    sf.c.seq,
    sf.c.queue_name,
    **partial(QUEUED),
)
# "Is a queued row due?": the fast path's guard, one probe (its first entry) planned in
# microseconds (the same read over the priority levels took 0.3 ms to plan).
Index(
    "ix_scheduled_functions_queued_due",
    sf.c.kind,
    sf.c.available_at,
    **partial(QUEUED),
)
# The head of each named queue: a claim that found rows of queue Q re-reads Q's first
# due rows in queue order, holding Q's lock, so a queue starts its rows in order.
ix_queue = Index(
    "ix_scheduled_functions_queue",
    sf.c.queue_name,
    sf.c.priority,
    sf.c.available_at,
    sf.c.seq,
    **partial(QUEUED),
)
# Keyed rows. "Is a keyed row due?" (the fast path's guard, and the next due time).
Index(
    "ix_scheduled_functions_keyed_due",
    sf.c.kind,
    sf.c.available_at,
    **partial(KEYED),
)
# Which keys have due rows: a loose scan, one probe per key (claim/flow.py's DUE_KEYS).
Index(
    "ix_scheduled_functions_keys",
    sf.c.kind,
    sf.c.flow_key,
    sf.c.available_at,
    **partial(KEYED),
)
# A key's head: its first due rows in claim order, read holding the key's lock.
Index(
    "ix_scheduled_functions_key_head",
    sf.c.flow_key,
    sf.c.priority,
    sf.c.available_at,
    sf.c.seq,
    **partial(KEYED),
)
# Batched rows. A batch: a key's first due rows, in order (claim/batched.py's PEEK, TAKE).
Index(
    "ix_scheduled_functions_batch",
    sf.c.name,
    sf.c.batch_key,
    sf.c.available_at,
    sf.c.seq,
    **partial(BATCHED),
)
# When the next batched row falls due (claim/take.py's NEXT_DUE), and which keys of a
# function have due rows, oldest first (claim/batched.py's KEYS: one function's entries
# among those of every batched function; few apps have many).
Index(
    "ix_scheduled_functions_batched",
    sf.c.kind,
    sf.c.available_at,
    sf.c.name,
    **partial(BATCHED),
)
# How many rows of a key run: as many entries as keyed actions running anywhere.
_IN_PROGRESS = sf.c.state == literal_column("'InProgress'")
RUNNING_KEYED = and_(_IN_PROGRESS, sf.c.flow_key.is_not(None))
Index(
    "ix_scheduled_functions_key_running",
    sf.c.flow_key,
    **partial(RUNNING_KEYED),
)
# Job keys: one row holds a key until it succeeds (or gives the key up to a new row).
# Also the upserts' conflict target (``ON CONFLICT (job_key) WHERE <this>``), which is why
# its state is a literal, not a bound parameter: PostgreSQL matches the clause to this
# partial index when it plans the statement, and under a generic plan (asyncpg prepares
# every statement; from its sixth run on a connection PostgreSQL may plan it generically)
# ``state <> $1`` implies nothing, so no index matches and the upsert fails.
KEY_HOLDER = and_(sf.c.job_key.is_not(None), sf.c.state != literal_column("'Success'"))
ix_key = Index(
    "ix_scheduled_functions_key",
    sf.c.job_key,
    unique=True,
    **partial(KEY_HOLDER),
)
# Transitive cancel walks children by parent.
Index(
    "ix_scheduled_functions_parent",
    sf.c.parent_id,
    **partial(sf.c.parent_id.is_not(None)),
)
# Retention deletes the oldest finished rows first.
Index(
    "ix_scheduled_functions_completed",
    sf.c.completed_time,
    **partial(sf.c.completed_time.is_not(None)),
)
# Listing in time order, keyset-paginated.
Index("ix_scheduled_functions_scheduled", sf.c.scheduled_time, sf.c.id)
# Lost-worker rescue and per-worker counts look only at running actions: as small as the
# number of actions running across all workers.
RUNNING_ROWS = _IN_PROGRESS
ix_running = Index(
    "ix_scheduled_functions_running",
    sf.c.worker_id,
    **partial(RUNNING_ROWS),
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
    # Version 8: what it serves, for ``app.explain``: its queues (a JSON list; None: every
    # row) and its forbidden flags (a JSON list; None: none).
    Column("serves", Text),
    Column("forbidden", Text),
    # No index on heartbeat_at: one row per live worker, read by a full scan.
)

# Version 12: the workers declared lost (no heartbeat for ``worker_timeout``), each with
# what its rescue did, for operators (``app.lost_workers()``, the dashboard's workers page).
# Written by the rescue that removed the worker's row, in its transaction; kept 7 days.
lost_workers = Table(
    "_durafn_lost_workers",
    metadata,
    Column("id", Text, primary_key=True),
    Column("hostname", Text, nullable=False),
    Column("pid", Integer, nullable=False),
    Column("started_at", Double, nullable=False),
    Column("heartbeat_at", Double, nullable=False),  # its last
    Column("lost_at", Double, nullable=False),  # when the rescue ran
    Column("rescued_by", Text, nullable=False),  # the worker whose rescue it was
    Column("failed", Integer, nullable=False),  # its actions recorded Failed for good
    Column("retried", Integer, nullable=False),  # its actions put back by their retry policy
)
# The newest first, and the pruning of the oldest.
Index("ix_durafn_lost_workers_lost_at", lost_workers.c.lost_at)

dependencies = Table(
    "_durafn_dependencies",
    metadata,
    # One row per dependency not yet finished for good: ``row_id`` waits for ``dep_id``.
    # The trigger that releases a finished row's dependents deletes its rows here, so
    # what is left is what each row still awaits (``explain``).
    Column("dep_id", ID_TYPE, primary_key=True),
    Column("row_id", ID_TYPE, primary_key=True),
)
# What a row still awaits (``explain``, in order), and whether it awaits a row nobody is
# finishing (``durafn_may_be_free``: read from the highest ``dep_id`` down, since rows
# finish about in the order they were written, the newest edge is the one most likely
# still there); the primary key serves the release, by dep_id. Version 19 added ``dep_id``.
Index("ix_durafn_dependencies_row", dependencies.c.row_id, dependencies.c.dep_id)

queues = Table(
    "_durafn_queues",
    metadata,
    # One row per named queue, written when a row of it is first scheduled (and by an
    # executor for the queues its app declares). Claims lock it (FOR UPDATE SKIP LOCKED on
    # PostgreSQL) while they choose a queue's rows, so two claims never both start one.
    Column("name", Text, primary_key=True),
    Column("concurrency", Integer),  # None: no limit
    Column("paused", Boolean, nullable=False, server_default=false()),
    Column("created_at", Double, nullable=False),
)
# Claims exclude paused queues: as few entries as paused queues, however many queues.
Index(
    "ix_durafn_queues_paused",
    queues.c.name,
    **partial(queues.c.paused),
)

# The cron registry (version 7): one row per recurring schedule, declared in code (and
# reconciled when an executor starts) or registered at run time. A tick's row in
# _scheduled_functions has an id made from the cron's name and the tick's time, so that
# a second writer of the same tick is a no-op (_store/crons.py).
crons = Table(
    "_durafn_crons",
    metadata,
    Column("name", Text, primary_key=True),
    Column("schedule", Text, nullable=False),
    Column("timezone", Text, nullable=False),
    Column("function", Text, nullable=False),
    Column("kind", String(16), nullable=False),
    Column("args", Text, nullable=False),
    Column("options", Text, nullable=False),  # the tick rows' options, resolved, as JSON
    Column("overlap", String(16), nullable=False),
    Column("catch_up", String(16), nullable=False),
    Column("enabled", Boolean, nullable=False),
    Column("description", Text),
    Column("source", String(8), nullable=False),  # 'code' or 'api'
    Column("created_at", Double, nullable=False),
    Column("updated_at", Double, nullable=False),
    Column("last_run_at", Double),
    Column("next_run_at", Double),  # None while disabled
    Column("run_count", Integer, nullable=False, server_default="0"),
    Column("last_row_id", Text),
    Column("last_skip_at", Double),
    Column("last_skip_reason", Text),
    # Version 11: an operator's enable_cron/disable_cron where it differs from ``enabled``
    # (the declaration's); it wins until the declaration's ``enabled`` changes. None: as
    # declared.
    Column("operator_enabled", Boolean),
    # Version 16, the operator's extras: jitter, max_runs, until, pause_after (JSON, as
    # declared), and the consecutive failed ticks counted for pause_after, with the last
    # row counted (each row once).
    Column("limits", Text),
    Column("failed_ticks", Integer, nullable=False, server_default="0"),
    Column("failed_row", Text),
)
# The cron loop's one query: the enabled crons due by now, and the earliest next one.
Index(
    "ix_durafn_crons_next",
    crons.c.next_run_at,
    **partial(crons.c.next_run_at.is_not(None)),
)
# Flow keys (version 8): one row per key with rows scheduled, made by the first claim
# that meets it. Claims lock it (FOR UPDATE SKIP LOCKED) while they choose the key's rows;
# ``tat`` is its rate budget (the GCRA's theoretical arrival time, _flow.py).
flow_keys = Table(
    "_durafn_flow_keys",
    metadata,
    Column("key", Text, primary_key=True),
    Column("tat", Double, nullable=False, server_default="0"),
)
# Leading-edge debounce and throttle windows (version 9): one row per function and flow
# key (two functions sharing a key never coalesce: their arguments differ), locked by the
# calls that write through it (``_store/write/debounce.py``), never by claims. ``last_run``:
# when the key's latest run is due; ``quiet_until``: a leading-edge burst's end (its last
# call plus ``quiet``); ``row_id``: that run's row.
flow_windows = Table(
    "_durafn_flow_windows",
    metadata,
    Column("name", Text, primary_key=True),
    Column("key", Text, primary_key=True),
    Column("last_run", Double),
    Column("quiet_until", Double),
    Column("row_id", ID_TYPE),
)
# Leases: who evaluates the crons (one leader at a time, taken over once it expires).
leases = Table(
    "_durafn_leases",
    metadata,
    Column("name", Text, primary_key=True),
    Column("holder", Text, nullable=False),
    Column("expires_at", Double, nullable=False),
)

schema_version = Table(
    "_durafn_schema",
    metadata,
    Column("version", Integer, primary_key=True),
    Column("applied_at", Double, nullable=False),
)
