"""The synchronous transactions ``app.sync.scheduler(within)`` writes in, each as a
``_writers.Joined``: its connection (behind ``_sync_bridge.Bridge``) and its commit.

* a SQLAlchemy ``Session`` (or a ``scoped_session``, as Flask-SQLAlchemy's ``db.session``:
  the session of the current scope, looked up at each call) or ``Connection``: the rows
  go through ``session.connection()``; the wake-up waits for SQLAlchemy's
  ``after_commit`` (``commit`` for a connection);
* a Django database connection (``django.db.connection``, or ``connections[alias]``):
  the rows go through the DB-API connection Django holds, in the transaction
  ``transaction.atomic()`` opened on it (or, outside one, in Django's autocommit); the
  wake-up is a ``transaction.on_commit`` (Django discards it on a rollback).

Django's DB-API connection reaches SQLAlchemy through an engine whose pool creates each
connection from it (``_Borrowed``): committing, rolling back and closing it are Django's
business, so on it they do nothing, and SQLAlchemy's per-connection set-up (a notice
handler, SQL functions) is not added to Django's connection.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any

from sqlalchemy import create_engine, event
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession
from sqlalchemy.orm import Session, scoped_session
from sqlalchemy.pool import NullPool

from ._errors import ArgumentError
from ._sync_bridge import Bridge
from ._writers import Joined


def joined(within: object, backend: str) -> Joined:
    """The transaction ``within`` as a ``Joined``; ``backend``: the app's dialect name
    (``sqlite``, ``postgresql``), which the transaction's must be."""
    if isinstance(within, AsyncSession | AsyncConnection):
        raise ArgumentError(
            f"app.sync.scheduler() takes a synchronous session or connection, not "
            f"{type(within).__name__}: from async code use app.scheduler(within)"
        )
    if isinstance(within, Session | Connection | scoped_session):
        return _SQLAlchemyJoined(within, backend)
    alias = _django_alias(within)
    if alias is not None:
        return _DjangoJoined(alias, backend)
    raise ArgumentError(
        "app.sync.scheduler() takes a SQLAlchemy Session (or scoped_session, such as "
        "Flask-SQLAlchemy's db.session) or Connection, or a Django database connection "
        f"(django.db.connection), not {type(within).__name__}"
    )


def _same_backend(name: str, backend: str, what: str) -> None:
    if name != backend:
        raise ArgumentError(
            f"{what} is on {name}, and the app on {backend}: durafn's rows must be written "
            "in the database its workers read; give the app that database's URL"
        )


class _SQLAlchemyJoined:
    """A ``Session``, ``scoped_session`` or ``Connection`` of the caller's."""

    def __init__(self, target: Session | Connection | scoped_session[Any], backend: str) -> None:
        self._target = target
        self._backend = backend

    def _session(self) -> Session | Connection:
        target = self._target
        return target() if isinstance(target, scoped_session) else target

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[AsyncConnection]:
        target = self._session()
        conn = target.connection() if isinstance(target, Session) else target
        _same_backend(conn.dialect.name, self._backend, "this session")
        yield Bridge(conn).as_async()

    def after_commit(self, callback: Callable[[], object]) -> None:
        target = self._session()
        if isinstance(target, Session):
            event.listen(target, "after_commit", lambda _s: callback(), once=True)
        else:
            event.listen(target, "commit", lambda _c: callback(), once=True)


# -- Django -------------------------------------------------------------------------------


def _django_alias(within: object) -> str | None:
    """The alias of a Django connection (``django.db.connection`` is a proxy of the
    default one's), or None if ``within`` is none. Django is imported only if the caller
    has imported it already."""
    if "django.db" not in sys.modules:
        return None
    from django.db.backends.base.base import BaseDatabaseWrapper
    from django.utils.connection import ConnectionProxy

    if isinstance(within, BaseDatabaseWrapper):
        return str(within.alias)
    if isinstance(within, ConnectionProxy):
        return str(within._alias)  # the thread's connection of that alias, at each call
    return None


class _DjangoJoined:
    """The transaction of Django's connection ``alias`` in the calling thread."""

    def __init__(self, alias: str, backend: str) -> None:
        self._alias = alias
        self._backend = backend

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[AsyncConnection]:
        from django.db import connections

        wrapper = connections[self._alias]
        wrapper.ensure_connection()
        raw = wrapper.connection
        held: dict[str, tuple[Any, Connection]] = _lent.__dict__.setdefault("held", {})
        found = held.get(self._alias)
        if found is None or found[0] is not raw or found[1].invalidated:
            engine = _engine_for(raw, wrapper.vendor)
            where = f"Django's database {self._alias!r}"
            _same_backend(engine.dialect.name, self._backend, where)
            # One SQLAlchemy connection over Django's DB-API connection of this alias,
            # kept for the thread (as Django keeps its own) until Django replaces it:
            # making one per call cost ~80 us of CPU.
            if found is not None:
                found[1].close()  # (on a connection Django closed: nothing to do)
            _lent.raw = raw
            try:
                found = held[self._alias] = (raw, engine.connect())
            finally:
                _lent.raw = None
        yield Bridge(found[1]).as_async()

    def after_commit(self, callback: Callable[[], object]) -> None:
        from django.db import transaction

        transaction.on_commit(callback, using=self._alias)


_lent = threading.local()
"""The DB-API connection the next ``engine.connect()`` of this thread borrows."""

_engines: dict[str, Engine] = {}
_engines_lock = threading.Lock()


def _engine_for(raw: Any, vendor: str) -> Engine:
    """An engine of the dialect of Django's connection ``raw`` whose connections are the
    one lent (``_lent``)."""
    if vendor == "postgresql":
        module = type(raw).__module__
        url = "postgresql+psycopg2://" if module.startswith("psycopg2") else "postgresql+psycopg://"
    elif vendor == "sqlite":
        url = "sqlite+pysqlite://"
    else:
        raise ArgumentError(
            f"durafn runs on PostgreSQL and SQLite; this Django connection is {vendor}"
        )
    with _engines_lock:
        engine = _engines.get(url)
        if engine is None:
            # Nothing of the dialect's first-connect set-up touches Django's connection
            # but reads (its version, its settings); the hstore look-up, which wants the
            # DB-API connection itself, is skipped (durafn has no hstore column).
            native = {"use_native_hstore": False} if vendor == "postgresql" else {}
            engine = _engines[url] = create_engine(
                url,
                creator=_borrow,
                poolclass=NullPool,
                pool_reset_on_return=None,
                **native,
            )
        return engine


def _is_psycopg(raw: Any) -> bool:
    return type(raw).__module__.startswith("psycopg.") or type(raw).__module__ == "psycopg"


def _borrow() -> _Borrowed:
    raw = getattr(_lent, "raw", None)
    assert raw is not None, "a Django connection is lent only inside _DjangoJoined"
    return _Borrowed(raw)


class _Borrowed:
    """Django's DB-API connection as SQLAlchemy's pool holds it (see the module)."""

    __slots__ = ("_raw",)

    def __init__(self, raw: Any) -> None:
        self._raw = raw

    def cursor(self, *args: Any, **kwargs: Any) -> Any:
        if _is_psycopg(self._raw):
            # Server-side binding, as SQLAlchemy's psycopg dialect has it. Django's
            # cursors bind on the client (ClientCursor): the multi-row INSERT's arrays were
            # quoted into its text and parsed again by the server each time (a schedule
            # through Django's connection took 794 us against 430 us so).
            import psycopg

            return psycopg.Cursor(self._raw)
        return self._raw.cursor(*args, **kwargs)

    def commit(self) -> None:
        pass

    def rollback(self) -> None:
        pass

    def close(self) -> None:
        pass

    def add_notice_handler(self, handler: Any) -> None:
        pass

    def create_function(self, *args: Any, **kwargs: Any) -> None:
        pass  # (SQLAlchemy's regexp() would replace Django's own)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._raw, name)
