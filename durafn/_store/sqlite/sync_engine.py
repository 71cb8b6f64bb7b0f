"""A SQLite connection's settings, which both engines give theirs, and the engine of
synchronous callers (``app.sync``): a pysqlite engine on the app's file, set up as the
async one is, so that its transactions behave the same.

Each connection is durafn's ``calls.Connection`` (sqlite3's, which gives the file's write
turn back as its transaction ends), in WAL mode with the driver's ``synchronous`` and busy
timeout. A writer's transaction takes the turn (``turns.py``) and then begins IMMEDIATE,
a reader's DEFERRED (``READ_ONLY_OPTION``), as on the async engine: writers of both
engines, in this process and in others, wait for each other in one line.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, event
from sqlalchemy.engine import URL, Engine

from ..engine import pool_arguments
from .calls import BEGIN_WRITE, Connection, begin_now
from .turns import turn_for

READ_ONLY_OPTION = "durafn_read_only"
"""Execution option: begin DEFERRED (a reader) rather than IMMEDIATE (a writer)."""


def set_up(dbapi_conn: Any, synchronous: str, busy_ms: int) -> None:
    """A new connection's settings (the async engine's, and ``sync_engine``'s)."""
    # Take transaction control away from the sqlite3 module so that BEGIN is ours.
    dbapi_conn.isolation_level = None
    cursor = dbapi_conn.cursor()
    cursor.execute("PRAGMA journal_mode")
    if cursor.fetchone()[0] != "wal":
        try:
            cursor.execute("PRAGMA journal_mode=WAL")
        except sqlite3.OperationalError as exc:
            # A file this process may not write (a backup, another user's file): read it
            # in the mode it has; any write will say it is read-only.
            if "readonly" not in str(exc):
                raise
    cursor.execute(f"PRAGMA synchronous={synchronous}")
    cursor.execute(f"PRAGMA busy_timeout={busy_ms}")
    cursor.close()


def sync_engine(
    url: URL, database: str, max_connections: int, *, busy_timeout: float, synchronous: str
) -> Engine:
    """A sync engine on ``url``'s file (its driver pysqlite, the standard library's)."""
    engine = create_engine(
        url.set(drivername="sqlite+pysqlite"),
        connect_args={"timeout": busy_timeout, "factory": Connection, "check_same_thread": False},
        **pool_arguments(max_connections),
    )
    turn = turn_for(str(Path(database).expanduser().resolve()))
    busy_ms = int(busy_timeout * 1000)

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.turn, dbapi_conn.turn_wait = turn, busy_timeout
        set_up(dbapi_conn, synchronous, busy_ms)

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        read = conn.get_execution_options().get(READ_ONLY_OPTION)
        begin_now(conn.connection.dbapi_connection, "BEGIN DEFERRED" if read else BEGIN_WRITE)

    return engine
