"""How a PostgreSQL URL says that it reaches the server through a connection pooler, and
where LISTEN goes then: two options of the URL's query, read here and taken off before the
URL reaches SQLAlchemy and asyncpg (which would pass them to the server as settings).

``pooler=transaction``
    The URL's host is a pooler in transaction mode (PgBouncer's ``pool_mode =
    transaction``): each transaction may run on another server connection, and nothing
    set on one outlives its transaction. durafn then keeps no prepared statement on the
    server (asyncpg's statement cache off: each statement is sent unnamed, parsed with its
    execution), looks up the backend of a transaction from inside it
    (``pg_backend_pid()``; the pooler's own process key names no backend), and never
    LISTENs through the pooler (the notifications would reach whichever client has the
    server connection next, or nobody).
``listen=HOST[:PORT][/DATABASE]``
    Where the LISTEN connection goes instead of the URL's host: the server itself (its
    user, password and other options are the URL's). One per process and server
    (``postgres/listener.py``). ``listen=off``: no LISTEN; executors find new work and
    other processes' cancels by polling, every ``poll_interval``.

With ``pooler=transaction`` and no ``listen``, there is no LISTEN either (and a warning
says so once): a pooler in transaction mode cannot carry one.
"""

from __future__ import annotations

import dataclasses
from urllib.parse import urlsplit

from sqlalchemy.engine import URL

from ..._errors import DatabaseError

POOLER = "pooler"
LISTEN = "listen"
OPTIONS = (POOLER, LISTEN)
"""durafn's options in a PostgreSQL URL's query."""
OFF = "off"

# Options of SQLAlchemy's asyncpg dialect, not of asyncpg: a URL may carry them for the
# engine, but asyncpg.connect, given the URL as a DSN, would send them to the server as
# settings, which it refuses ("unrecognized configuration parameter").
DIALECT_ONLY = ("prepared_statement_cache_size", "prepared_statement_name_func", "async_fallback")


@dataclasses.dataclass(frozen=True)
class Pooling:
    """What a URL's ``pooler`` and ``listen`` say (``pooling_of``)."""

    engine_url: URL
    """The URL without durafn's options: what the engine connects to."""
    transaction_mode: bool
    """``pooler=transaction``: no server-side state outlives a transaction."""
    listen_url: URL | None
    """Where the LISTEN connection goes: the URL's own server unless ``listen`` says
    otherwise; None for no LISTEN (``listen=off``, or a pooler and no ``listen``)."""
    listen_off: bool
    """``listen=off``: no LISTEN, and no warning about it."""

    @property
    def dsn(self) -> str:
        """The engine's URL as asyncpg takes it, for the connections outside the pool."""
        return asyncpg_dsn(self.engine_url)

    @property
    def admin_dsn(self) -> str:
        """Where a statement is stopped from (``PostgresDriver.abandon``): through a pooler,
        the server itself if ``listen`` names it, as a pooler whose every server connection
        is busy (one with the statement to stop) would make the stop wait its turn."""
        if self.transaction_mode and self.listen_url is not None:
            return asyncpg_dsn(self.listen_url)
        return self.dsn


def asyncpg_dsn(url: URL) -> str:
    """``url`` as asyncpg takes it: its scheme, and none of the dialect's own options."""
    plain = url.set(drivername="postgresql").difference_update_query(DIALECT_ONLY)
    return plain.render_as_string(hide_password=False)


def pooling_of(url: URL) -> Pooling:
    """Read (and check) the ``pooler`` and ``listen`` options of a PostgreSQL URL."""
    mode = _one(url, POOLER)
    listen = _one(url, LISTEN)
    engine_url = url.difference_update_query(OPTIONS)
    if mode is not None and mode != "transaction":
        hint = (
            "a pooler in session mode keeps each client on one server connection, so "
            "it needs no option: leave pooler= out"
            if mode == "session"
            else "the one value is pooler=transaction (PgBouncer's pool_mode = transaction)"
        )
        raise DatabaseError(f"unknown pooler={mode!r} in the database URL: {hint}")
    pooled = mode is not None
    if listen is None:
        return Pooling(engine_url, pooled, None if pooled else engine_url, False)
    if listen == OFF:
        return Pooling(engine_url, pooled, None, True)
    return Pooling(engine_url, pooled, _direct(engine_url, listen), False)


def _one(url: URL, name: str) -> str | None:
    value = url.query.get(name)
    if isinstance(value, tuple):
        raise DatabaseError(
            f"{name}= is given {len(value)} times in the database URL; give it once"
        )
    return value


def _direct(url: URL, listen: str) -> URL:
    """The URL of the server that ``listen=HOST[:PORT][/DATABASE]`` names."""
    problem = None
    try:
        parts = urlsplit(f"//{listen}")
        host, port = parts.hostname, parts.port
        database = parts.path.lstrip("/")
    except ValueError as exc:
        problem = str(exc)
    else:
        if not host or parts.username or parts.password or parts.query or "/" in database:
            problem = "not HOST[:PORT][/DATABASE]"
    if problem is not None:
        raise DatabaseError(
            f"listen={listen!r} in the database URL cannot be read ({problem}): give the "
            "server's own address, e.g. listen=db.internal:5432 (or listen=db.internal:5432/"
            "dbname where the pooler's database name differs), or listen=off to poll"
        )
    # A multi-host URL names its hosts in the query: the server named here replaces them.
    return url.difference_update_query(("host",)).set(
        host=host, port=port, database=database or url.database
    )
