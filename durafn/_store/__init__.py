"""The only package that knows SQL and which database it talks to. Its face to the rest
of durafn is ``interface.Store`` (every operation, on one page) and what this module
exports; ``Dialect`` says what an engine's driver provides."""

from __future__ import annotations

from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError as _SAArgumentError

from .._errors import DatabaseError
from . import workflows as workflow_sql  # durable workflows' statements (``_workflow``)
from .after_commit import AfterCommit, take_notes
from .claim.batched import BatchClaim, BatchSpec
from .claim.columns import StartTime
from .claim.flow import FlowCursor
from .claim.hints import FastPathHint, LevelFloor
from .claim.take import SERVE_ALL, ClaimFilter
from .crons import (
    CRON_LEASE,
    DECLARED,
    CronChange,
    CronMove,
    CronRow,
    NewCron,
    StoredCron,
    tick_id,
)
from .driver import Driver
from .filters import RowFilter
from .interface import Dialect, Store
from .read.explain import HELD_SHOWN, Facts, KeyCounts
from .rollups import HOUR, MINUTE, RollupRow
from .rows import (
    DEBOUNCE_KEY,
    Claimed,
    LostAction,
    NewRow,
    NewRowColumns,
    Outcome,
    RetryState,
    decode_cursor,
    new_id,
    new_row,
    new_row_model,
)
from .schema.tables import SCHEMA_VERSION, metadata, scheduled_functions, schema_version
from .sqlite.driver import SQLiteDriver
from .workflows import StepRow, WorkflowRow

__all__ = [
    "AfterCommit",
    "BatchClaim",
    "BatchSpec",
    "CRON_LEASE",
    "ClaimFilter",
    "Claimed",
    "CronChange",
    "CronMove",
    "CronRow",
    "DEBOUNCE_KEY",
    "DECLARED",
    "Dialect",
    "Driver",
    "Facts",
    "FastPathHint",
    "FlowCursor",
    "HELD_SHOWN",
    "HOUR",
    "KeyCounts",
    "LevelFloor",
    "LostAction",
    "MINUTE",
    "NewCron",
    "NewRow",
    "NewRowColumns",
    "Outcome",
    "RetryState",
    "RollupRow",
    "RowFilter",
    "SCHEMA_VERSION",
    "SERVE_ALL",
    "StartTime",
    "StepRow",
    "Store",
    "StoredCron",
    "WorkflowRow",
    "decode_cursor",
    "driver_for_url",
    "metadata",
    "new_id",
    "new_row",
    "new_row_model",
    "normalize_url",
    "scheduled_functions",
    "schema_version",
    "take_notes",
    "tick_id",
    "workflow_sql",
]


def normalize_url(url: str | URL) -> URL:
    """Accept plain ``sqlite:///`` and ``postgresql://`` URLs and pick the async driver."""
    try:
        parsed = make_url(url)
    except _SAArgumentError:
        raise DatabaseError(
            f"{str(url)!r} is not a database URL; use sqlite+aiosqlite:///path.db or "
            "postgresql+asyncpg://user@host/dbname"
        ) from None
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        return parsed.set(drivername="sqlite+aiosqlite")
    if backend in ("postgresql", "postgres"):
        return parsed.set(drivername="postgresql+asyncpg")
    raise DatabaseError(
        f"durafn runs on SQLite or PostgreSQL, not {backend!r} (from {parsed.render_as_string()!r})"
    )


def driver_for_url(url: str | URL) -> Driver:
    parsed = normalize_url(url)
    if parsed.get_backend_name() == "sqlite":
        return SQLiteDriver(parsed)
    # Imported here: asyncpg and SQLAlchemy's PostgreSQL dialect cost a SQLite app's
    # process (a worker, every CLI command) ~0.1 s to import.
    from .postgres.driver import PostgresDriver

    return PostgresDriver(parsed)
