"""The steps from each version of the system tables to the next (``MIGRATIONS``), and
what they need of the tables they replaced; ``tables`` holds the tables as they are now
(``SCHEMA_VERSION``). A fresh database gets those in one go; an older one runs these,
one recorded step per version (``engine.migrate``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from sqlalchemy import (
    Column,
    Double,
    Index,
    Integer,
    MetaData,
    Table,
    Text,
    bindparam,
    inspect,
    select,
    text,
    update,
)
from sqlalchemy.engine import Connection

from .tables import (
    ERROR_KEYS,
    ID_TYPE,
    audit,
    crons,
    dependencies,
    flow_keys,
    flow_windows,
    ix_running,
    leases,
    lost_workers,
    operations,
    queues,
    rollup_marks,
    rollups,
    scheduled_functions,
    workers,
    workflow_events,
    workflow_steps,
    workflows,
)


class SchemaDialect(Protocol):
    """What a migration asks of its engine (the driver's schema hooks, ``EngineDriver``):
    the SQL each engine writes its own way, so that no step asks which engine it is on."""

    def install_release_trigger(self, conn: Connection) -> None:
        """The release trigger of ``dependencies.py`` (and whatever it calls)."""

    def install_release_functions(self, conn: Connection) -> None:
        """The hot finish's functions, made again (an engine whose finish has none: nothing)."""

    def install_schedule_function(self, conn: Connection) -> None:
        """``durafn.schedule`` in SQL (an engine without one: nothing)."""

    def add_seq_column(self, conn: Connection) -> None:
        """``seq`` added to ``_scheduled_functions`` and numbered (version 11)."""

    def set_storage(self, conn: Connection) -> None:
        """The hot table's storage settings (an engine without any: nothing)."""

    def set_autovacuum(self, conn: Connection) -> None:
        """The hot table's autovacuum thresholds (an engine without autovacuum: nothing)."""


# Versions 5 to 9 kept every failed run of a row in a table of its own; version 10 moves
# them into the row's ``errors`` and drops it. Not in ``metadata``: only the steps use it.
failed_attempts = Table(
    "_durafn_failed_attempts",
    MetaData(),
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("function_id", ID_TYPE, nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("failed_at", Double, nullable=False),
    Column("worker_id", Text),
    Column("error_type", Text, nullable=False),
    Column("error_message", Text, nullable=False),
    Column("error_traceback", Text),
    Column("retry_at", Double),
)
Index("ix_durafn_failed_attempts_function", failed_attempts.c.function_id, failed_attempts.c.id)


def _step_2(conn: Connection, dialect: SchemaDialect) -> None:
    """Version 2: worker heartbeats (``_durafn_workers``) and the running-actions index."""
    workers.create(conn, checkfirst=True)
    ix_running.create(conn, checkfirst=True)


def _step_3(conn: Connection, dialect: SchemaDialect) -> None:
    """Version 3: a failed run's traceback (``error_traceback``). A nullable column without
    a default: a change of the catalogue only, on both engines, however many rows."""
    columns = {c["name"] for c in inspect(conn).get_columns(scheduled_functions.name)}
    if "error_traceback" not in columns:  # tables adopted from durafn.metadata have it
        conn.execute(text("ALTER TABLE _scheduled_functions ADD COLUMN error_traceback TEXT"))


def _step_4(conn: Connection, dialect: SchemaDialect) -> None:
    """Version 4: job options. ``flags``; the claim index with priority before time (it
    replaces ``ix_scheduled_functions_due``); queue heads; job keys; ``_durafn_queues``.
    Building the indexes reads the table once (seconds at 10^6 rows, writes wait)."""
    columns = {c["name"] for c in inspect(conn).get_columns(scheduled_functions.name)}
    if "flags" not in columns:
        conn.execute(text("ALTER TABLE _scheduled_functions ADD COLUMN flags TEXT"))
    conn.execute(text("DROP INDEX IF EXISTS ix_scheduled_functions_due"))
    for index in scheduled_functions.indexes:
        # Their predicates name version 8's (and version 17's) columns.
        if index.name not in _VERSION_8 | _VERSION_17:
            index.create(conn, checkfirst=True)
    queues.create(conn, checkfirst=True)  # with its index


def _step_5(conn: Connection, dialect: SchemaDialect) -> None:
    """Version 5: retry policies. ``retry``, ``failures`` (a constant default: a change of
    the catalogue only on both engines) and ``_durafn_failed_attempts``."""
    columns = {c["name"] for c in inspect(conn).get_columns(scheduled_functions.name)}
    if "retry" not in columns:
        conn.execute(text("ALTER TABLE _scheduled_functions ADD COLUMN retry TEXT"))
    if "failures" not in columns:
        conn.execute(
            text("ALTER TABLE _scheduled_functions ADD COLUMN failures INTEGER NOT NULL DEFAULT 0")
        )
    failed_attempts.create(conn, checkfirst=True)  # with its index


def _step_6(conn: Connection, dialect: SchemaDialect) -> None:
    """Version 6: completion callbacks, ``on_complete``."""
    columns = {c["name"] for c in inspect(conn).get_columns(scheduled_functions.name)}
    if "on_complete" not in columns:
        conn.execute(text("ALTER TABLE _scheduled_functions ADD COLUMN on_complete TEXT"))


def _step_7(conn: Connection, dialect: SchemaDialect) -> None:
    """Version 7: the cron registry and the leader's lease (new tables only)."""
    crons.create(conn, checkfirst=True)  # with its index
    leases.create(conn, checkfirst=True)


# The indexes whose predicates version 8 changed (keyed rows left out of them), and all
# that name its columns.
_REDEFINED = (
    "ix_scheduled_functions_claim",
    "ix_scheduled_functions_claim_queued",
    "ix_scheduled_functions_queued_due",
    "ix_scheduled_functions_queue",
)
_VERSION_8 = frozenset(
    (
        *_REDEFINED,
        "ix_scheduled_functions_keyed_due",
        "ix_scheduled_functions_keys",
        "ix_scheduled_functions_key_head",
        "ix_scheduled_functions_key_running",
    )
)


_ENDING_WITH_SEQ = (
    "ix_scheduled_functions_claim",
    "ix_scheduled_functions_claim_queued",
    "ix_scheduled_functions_queue",
    "ix_scheduled_functions_key_head",
)
"""Ended with ``id`` until version 11."""


def _step_8(conn: Connection, dialect: SchemaDialect) -> None:
    """Version 8: flow control. Three nullable columns (a change of the catalogue only),
    the claim indexes rebuilt without keyed rows (each reads the table once: seconds at
    10^6 rows, while writes wait), the keyed rows' indexes, ``_durafn_flow_keys``."""
    columns = {c["name"] for c in inspect(conn).get_columns(scheduled_functions.name)}
    for name, kind in (("flow_key", "TEXT"), ("flow", "TEXT"), ("flow_until", "DOUBLE PRECISION")):
        if name not in columns:
            conn.execute(text(f"ALTER TABLE _scheduled_functions ADD COLUMN {name} {kind}"))
    found = {c["name"] for c in inspect(conn).get_columns(workers.name)}
    for name in ("serves", "forbidden"):
        if name not in found:
            conn.execute(text(f"ALTER TABLE _durafn_workers ADD COLUMN {name} TEXT"))
    for name in _REDEFINED:
        conn.execute(text(f"DROP INDEX IF EXISTS {name}"))
    for index in scheduled_functions.indexes:
        # Version 11's column (made by its step), version 17's.
        if index.name not in {*_ENDING_WITH_SEQ, *_VERSION_17}:
            index.create(conn, checkfirst=True)
    flow_keys.create(conn, checkfirst=True)


def _step_9(conn: Connection, dialect: SchemaDialect) -> None:
    """Version 9: leading-edge debounce and throttle, ``_durafn_flow_windows``."""
    flow_windows.create(conn, checkfirst=True)


def _step_10(conn: Connection, dialect: SchemaDialect) -> None:
    """Version 10: the failed runs move into their rows (``errors``, a nullable column: a
    change of the catalogue only), read out of ``_durafn_failed_attempts`` in order, a
    thousand rows' at a time, which is then dropped."""
    columns = {c["name"] for c in inspect(conn).get_columns(scheduled_functions.name)}
    if "errors" not in columns:
        kind = scheduled_functions.c.errors.type.compile(dialect=conn.dialect)
        conn.execute(text(f"ALTER TABLE _scheduled_functions ADD COLUMN errors {kind}"))
    if not inspect(conn).has_table(failed_attempts.name):
        return
    fa, sf = failed_attempts, scheduled_functions
    # A chunk of rows at a time, so that memory does not grow with the old table.
    after: Any = None
    while True:
        chunk = select(fa.c.function_id).distinct().order_by(fa.c.function_id).limit(_CHUNK)
        if after is not None:
            chunk = chunk.where(fa.c.function_id > after)
        ids = list(conn.execute(chunk).scalars())
        if not ids:
            break
        after = ids[-1]
        entries = conn.execute(
            select(fa.c.function_id, *(fa.c[c] for c in _OLD_ENTRY))
            .where(fa.c.function_id.in_(ids))
            .order_by(fa.c.function_id, fa.c.id)
        )
        errors: dict[str, list[Any]] = {}
        for function_id, *values in entries:
            errors.setdefault(str(function_id), []).append(
                dict(zip(ERROR_KEYS, values, strict=True))
            )
        # Entries a row has already (none, normally) come after the older ones.
        for id, newer in conn.execute(select(sf.c.id, sf.c.errors).where(sf.c.id.in_(ids))):
            if newer and str(id) in errors:
                errors[str(id)].extend(newer)
        conn.execute(
            update(sf).where(sf.c.id == bindparam("b_id")).values(errors=bindparam("b_errors")),
            [{"b_id": id, "b_errors": e} for id, e in errors.items()],
        )
    fa.drop(conn)  # with its index


_CHUNK = 1000
"""Rows whose history ``_step_10`` moves at a time."""

# The old history's columns, in ERROR_KEYS' order.
_OLD_ENTRY = (
    "attempt",
    "failed_at",
    "worker_id",
    "error_type",
    "error_message",
    "error_traceback",
    "retry_at",
)


def _step_11(conn: Connection, dialect: SchemaDialect) -> None:
    """Version 11: the order rows were written in, ``seq`` (claims take rows due at the
    same instant in that order), numbered in the order the rows lie in the table (which is
    the order they were written, near enough: ids made by one process were), and the four
    indexes that end with it rebuilt (each reads the table once: seconds at 10^6 rows,
    while writes wait); an operator's switch of a cron, ``operator_enabled`` (a nullable
    column: a change of the catalogue only)."""
    columns = {c["name"] for c in inspect(conn).get_columns(scheduled_functions.name)}
    if "seq" not in columns:
        dialect.add_seq_column(conn)
    for name in _ENDING_WITH_SEQ:
        conn.execute(text(f"DROP INDEX IF EXISTS {name}"))
    for index in scheduled_functions.indexes:
        if index.name not in _VERSION_17:
            index.create(conn, checkfirst=True)
    columns = {c["name"] for c in inspect(conn).get_columns(crons.name)}
    if "operator_enabled" not in columns:
        conn.execute(text("ALTER TABLE _durafn_crons ADD COLUMN operator_enabled BOOLEAN"))


def _step_12(conn: Connection, dialect: SchemaDialect) -> None:
    """Version 12: the workers declared lost, with what their rescue did
    (``_durafn_lost_workers``): a new table, nothing else read or rewritten."""
    lost_workers.create(conn, checkfirst=True)


def _step_13(conn: Connection, dialect: SchemaDialect) -> None:
    """Version 13: the trace context a row was scheduled in (``trace_context``): a
    nullable column without a default, a change of the catalogue only."""
    columns = {c["name"] for c in inspect(conn).get_columns(scheduled_functions.name)}
    if "trace_context" not in columns:
        conn.execute(text("ALTER TABLE _scheduled_functions ADD COLUMN trace_context TEXT"))


def _step_14(conn: Connection, dialect: SchemaDialect) -> None:
    """Version 14: a row's snoozes (``snoozes``, 0 for every row written before) and
    its progress (``progress``, ``progress_message``): a catalogue change only on both
    engines (PostgreSQL 11+ keeps a constant default without rewriting the table)."""
    _add_columns(
        conn,
        scheduled_functions.name,
        {
            "snoozes": "INTEGER NOT NULL DEFAULT 0",
            "progress": "DOUBLE PRECISION",
            "progress_message": "TEXT",
        },
    )


def _add_columns(conn: Connection, table: str, added: dict[str, str]) -> None:
    """Add these columns (name: DDL) to ``table``, those it lacks: a step run again
    after a crash part-way adds only the rest."""
    columns = {c["name"] for c in inspect(conn).get_columns(table)}
    for name, ddl in added.items():
        if name not in columns:
            conn.execute(text(f"ALTER TABLE {table} ADD COLUMN {name} {ddl}"))


def _step_15(conn: Connection, dialect: SchemaDialect) -> None:
    """Version 15: dependencies (``after=``): the table of edges, four columns with
    constant defaults (a catalogue change on both engines), and the trigger that deletes
    a finished row's edges (``dependencies.py``)."""
    dependencies.create(conn, checkfirst=True)
    for index in dependencies.indexes:
        index.create(conn, checkfirst=True)
    _add_columns(
        conn,
        scheduled_functions.name,
        {
            "awaiting": "INTEGER NOT NULL DEFAULT 0",
            "after_failed": "INTEGER NOT NULL DEFAULT 0",
            "after_policy": "VARCHAR(16)",
            "dependents": "INTEGER NOT NULL DEFAULT 0",
        },
    )
    dialect.install_release_trigger(conn)


def _step_16(conn: Connection, dialect: SchemaDialect) -> None:
    """Version 16: the SQL schedule function ``durafn.schedule`` (PostgreSQL only:
    ``schedule_function.py``), and the crons' extras (``limits``, and the
    count of consecutive failed ticks): three columns, a catalogue change."""
    _add_columns(
        conn,
        crons.name,
        {"limits": "TEXT", "failed_ticks": "INTEGER NOT NULL DEFAULT 0", "failed_row": "TEXT"},
    )
    install_functions(conn, dialect)


_VERSION_17 = frozenset(
    (
        "ix_scheduled_functions_claim",
        "ix_scheduled_functions_batch",
        "ix_scheduled_functions_batched",
    )
)
"""Indexes whose predicates name ``batch_key`` (version 17): made by its step."""


def _step_17(conn: Connection, dialect: SchemaDialect) -> None:
    """Version 17: batched actions (``durafn.Batch``). Their rows carry ``batch_key``
    (a catalogue change) and leave the unqueued claim index, which is made again with
    ``batch_key IS NULL`` in its predicate, for two indexes of their own."""
    _add_columns(conn, scheduled_functions.name, {"batch_key": "TEXT"})
    conn.execute(text("DROP INDEX IF EXISTS ix_scheduled_functions_claim"))
    for index in scheduled_functions.indexes:
        if index.name in _VERSION_17:
            index.create(conn, checkfirst=True)


def _step_18(conn: Connection, dialect: SchemaDialect) -> None:
    """Version 18: on PostgreSQL, ``durafn_release``, with which the hot finish releases
    its rows' dependents itself (``dependencies.py``). The trigger is unchanged: not made
    again, since dropping it would lock the table against every claim and finish."""
    dialect.install_release_functions(conn)


def _step_19(conn: Connection, dialect: SchemaDialect) -> None:
    """Version 19: on PostgreSQL, ``durafn_release`` returns the rows waiting for those
    its finish released and sends no NOTIFY; ``durafn_may_be_free`` is new; the executor
    looks with it after the commit and sends the NOTIFY for rows left with no edge only
    (``_executor/releases.py``). ``ix_durafn_dependencies_row`` is made again with
    ``dep_id`` after ``row_id``, which that look reads from the top (it locks
    ``_durafn_dependencies``, which holds only the edges of rows still waiting)."""
    conn.execute(text("DROP INDEX IF EXISTS ix_durafn_dependencies_row"))
    for index in dependencies.indexes:
        index.create(conn, checkfirst=True)
    dialect.install_release_functions(conn)


def _step_20(conn: Connection, dialect: SchemaDialect) -> None:
    """Version 20: on PostgreSQL, ``durafn.schedule`` made again: it refuses a queue name
    with a comma or a space at an end, as scheduling from Python now does (a worker's
    ``--queues`` separates names with commas and strips them: such a queue's rows could
    never be served by name)."""
    dialect.install_schedule_function(conn)


def _step_21(conn: Connection, dialect: SchemaDialect) -> None:
    """Version 21: on PostgreSQL, ``durafn.schedule`` made again: ``options => NULL`` is
    no options, as ``'{}'`` is (it was refused as not a JSON object)."""
    dialect.install_schedule_function(conn)


def _step_22(conn: Connection, dialect: SchemaDialect) -> None:
    """Version 22: ``_durafn_audit``, what operators did, kept across restarts (the
    dashboard kept its last 200 actions in memory)."""
    audit.create(conn, checkfirst=True)  # and its index


def _step_23(conn: Connection, dialect: SchemaDialect) -> None:
    """Version 23: on PostgreSQL, ``_scheduled_functions`` leaves half of each page free
    for the new versions of its rows (``fillfactor``): a catalogue change; rows written
    from now on are placed so (``postgres/driver.py``' ``set_storage`` says why)."""
    dialect.set_storage(conn)


def _step_24(conn: Connection, dialect: SchemaDialect) -> None:
    """Version 24: on PostgreSQL, ``_scheduled_functions`` gets autovacuum thresholds of
    its own, a fixed number of dead rows plus 1% of the table instead of 20%, so that a
    table that keeps its finished rows is vacuumed every minute or two under load rather
    than once its dead rows reach a fifth of it: a catalogue change (``postgres/driver.py``'
    ``set_autovacuum`` says why, with the figures)."""
    dialect.set_autovacuum(conn)


def _step_25(conn: Connection, dialect: SchemaDialect) -> None:
    """Version 25: ``_durafn_rollups``, what ended per minute and per hour, for the
    dashboard's charts, and ``_durafn_rollup_marks``, how far each is rolled up (new
    tables: rows that ended before them are rolled up by the next maintenance pass, as
    far back as retention keeps them)."""
    rollups.create(conn, checkfirst=True)
    rollup_marks.create(conn, checkfirst=True)


def _step_26(conn: Connection, dialect: SchemaDialect) -> None:
    """Version 26: ``_durafn_operations``, an operator's change of every row a filter
    matches, run a page at a time by the workers' maintenance and resumed where it stopped
    (``durafn/_operations.py``)."""
    operations.create(conn, checkfirst=True)  # and its indexes


def _step_27(conn: Connection, dialect: SchemaDialect) -> None:
    """Version 27: durable workflows (``durafn/_workflow``): three new tables and their
    indexes, nothing else read or rewritten; on PostgreSQL, ``durafn.send_event`` (with
    ``durafn.schedule``, made again)."""
    for table in (workflows, workflow_steps, workflow_events):
        table.create(conn, checkfirst=True)
    dialect.install_schedule_function(conn)


def install_functions(conn: Connection, dialect: SchemaDialect) -> None:
    """What the migrations install besides tables: the release trigger (with, where the
    dialect has them, the hot finish's functions) and the SQL ``durafn.schedule``."""
    dialect.install_release_trigger(conn)
    dialect.install_schedule_function(conn)


MIGRATIONS: dict[int, Callable[[Connection, SchemaDialect], None]] = {
    2: _step_2,
    3: _step_3,
    4: _step_4,
    5: _step_5,
    6: _step_6,
    7: _step_7,
    8: _step_8,
    9: _step_9,
    10: _step_10,
    11: _step_11,
    12: _step_12,
    13: _step_13,
    14: _step_14,
    15: _step_15,
    16: _step_16,
    17: _step_17,
    18: _step_18,
    19: _step_19,
    20: _step_20,
    21: _step_21,
    22: _step_22,
    23: _step_23,
    24: _step_24,
    25: _step_25,
    26: _step_26,
    27: _step_27,
}
"""Steps from version N-1 to N. A fresh database gets the latest tables in one go."""
