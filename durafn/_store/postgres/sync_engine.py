"""PostgreSQL for synchronous callers (``app.sync``): a psycopg 3 engine on the app's
server (``durafn[sync]``), for the calls that commit on their own and the reads.

Its statements are the async engine's, run through ``_sync_bridge``: they are SQLAlchemy
Core and ``text()`` with named parameters, which SQLAlchemy renders in psycopg's
paramstyle as it does in asyncpg's; the arrays of the multi-row INSERT are Python lists,
which psycopg adapts as asyncpg does. Through a pooler in transaction mode
(``pooling.py``) psycopg prepares nothing on the server (``prepare_threshold=None``).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import create_engine
from sqlalchemy.engine import Engine

from ..._errors import DatabaseError
from ..engine import pool_arguments
from .listener import CONNECT_TIMEOUT
from .pooling import DIALECT_ONLY, Pooling


def sync_engine(pooling: Pooling, max_connections: int) -> Engine:
    """A sync engine on the app's server, through the same pooler if the URL has one."""
    try:
        import psycopg  # noqa: F401
    except ImportError:
        raise DatabaseError(
            "synchronous calls on PostgreSQL (app.sync) use psycopg 3: pip install "
            "'durafn[sync]' (or psycopg[binary])"
        ) from None
    connect_args: dict[str, Any] = {"connect_timeout": int(CONNECT_TIMEOUT)}
    if pooling.transaction_mode:
        connect_args["prepare_threshold"] = None
    url = pooling.engine_url.set(drivername="postgresql+psycopg").difference_update_query(
        DIALECT_ONLY
    )
    return create_engine(
        url, connect_args=connect_args, pool_pre_ping=False, **pool_arguments(max_connections)
    )
