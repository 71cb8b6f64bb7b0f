"""One LISTEN connection per process and server: every executor, ``app.watch()`` and
dashboard stream of this process that listens on one server hears through it.

A connection each cost a backend each: a dashboard with ten live pages open held ten,
and a process running several apps' executors one per executor. Through a pooler in
transaction mode the LISTEN connection goes to the server itself (``pooling.py``), outside
the pool, so it is what a worker host adds to the server's ``max_connections``: one per
process is what that costs at least.

Each listener runs a keeper task in its own task group (``listening``); the keepers of
one hub take turns (its lock) to connect when there is no connection, and each wakes its
listener after every new connection, since work may have been scheduled while nobody
listened. The last listener to leave closes the connection.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import AsyncIterator, Callable, Collection
from contextlib import asynccontextmanager
from typing import Any

import anyio
import asyncpg

from ..._kinds import FunctionKind
from .multirow import CHANNEL

logger = logging.getLogger("durafn.store")

CANCEL_PREFIX = "cancel:"
"""On CHANNEL, a payload that names rows cancelled (their running actions are told)."""
CONNECT_TIMEOUT = 10.0
ALL_KINDS = frozenset({FunctionKind.MUTATION, FunctionKind.ACTION})

OnWake = Callable[[Collection[FunctionKind]], None]
OnCancel = Callable[[list[str]], None]


class _Listener:
    """One ``listening`` block: where its notifications go."""

    def __init__(self, on_wake: OnWake, on_cancel: OnCancel) -> None:
        self.on_wake = on_wake
        self.on_cancel = on_cancel


class _Hub:
    """The LISTEN connection to one server, for this event loop's listeners of it."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.listeners: set[_Listener] = set()
        self.conn: asyncpg.Connection[Any] | None = None
        self.generation = 0
        """How many connections this hub has made: a keeper that saw an older one wakes
        its listener (work may have been scheduled while nobody listened)."""
        self.lost = anyio.Event()
        self.turn = anyio.Lock()

    def deliver(self, _conn: Any, _pid: int, _channel: str, payload: str) -> None:
        if payload.startswith(CANCEL_PREFIX):
            ids = payload.removeprefix(CANCEL_PREFIX).split(",")
            for listener in list(self.listeners):
                listener.on_cancel(ids)
            return
        # Our own notifications are heard too. That costs an idle executor a second
        # claim after its own process's writes, but the in-process wake-up of a write
        # joined to a caller's connection fires before the COMMIT completes (SQLAlchemy's
        # "commit" event): the echo is what wakes the executor once the row is visible.
        kinds = {k for k in ALL_KINDS if k.value in payload.split(",")} or ALL_KINDS
        for listener in list(self.listeners):
            listener.on_wake(kinds)

    def dropped(self, conn: Any) -> None:
        if conn is self.conn:
            logger.warning("LISTEN connection lost; reconnecting")
            self.conn = None
            self.lost.set()

    async def connect(self) -> None:
        """Connect and LISTEN, retrying with backoff until it works (or is cancelled)."""
        delay = 0.1
        while True:
            try:
                conn = await asyncpg.connect(self.dsn, timeout=CONNECT_TIMEOUT)
            except (OSError, asyncpg.PostgresError) as exc:
                logger.warning("LISTEN connection failed (%s); retrying in %.1fs", exc, delay)
                await anyio.sleep(delay)
                delay = min(delay * 2, 5.0)
                continue
            try:
                conn.add_termination_listener(self.dropped)
                await conn.add_listener(CHANNEL, self.deliver)
            except (
                OSError,
                asyncpg.PostgresError,
                asyncpg.InterfaceError,
                asyncpg.exceptions.InternalClientError,
            ) as exc:
                # The connection can drop during the LISTEN itself (seen when a server
                # terminated it just then): retry as for a failed connect, rather than
                # let the error end the executor.
                conn.terminate()
                logger.warning("LISTEN failed (%s); retrying in %.1fs", exc, delay)
                await anyio.sleep(delay)
                delay = min(delay * 2, 5.0)
                continue
            except BaseException:  # cancelled half-way: the connection is nobody's
                conn.terminate()
                raise
            self.conn = conn
            self.lost = anyio.Event()
            self.generation += 1
            return

    async def keep(self, listener: _Listener) -> None:
        """A listener's keeper: (re)connect when there is no connection, wake the
        listener after each new one; runs until cancelled."""
        seen = 0
        while True:
            async with self.turn:
                if self.conn is None:
                    await self.connect()
            if self.generation != seen:
                seen = self.generation
                listener.on_wake(ALL_KINDS)
            await self.lost.wait()

    async def close(self) -> None:
        conn, self.conn = self.conn, None
        if conn is None:
            return
        try:
            await conn.close(timeout=1)
        except Exception:
            conn.terminate()


_hubs: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, _Hub]] = (
    weakref.WeakKeyDictionary()
)
"""Per event loop (an asyncpg connection belongs to one), the hub of each server."""


@asynccontextmanager
async def listening(dsn: str, on_wake: OnWake, on_cancel: OnCancel) -> AsyncIterator[None]:
    """Deliver the wake-ups and cancels that NOTIFY sends on the server ``dsn`` to
    ``on_wake`` and ``on_cancel`` (through the process's one connection to it,
    reconnected with backoff if it drops), until the block ends."""
    hubs = _hubs.setdefault(asyncio.get_running_loop(), {})
    hub = hubs.get(dsn)
    if hub is None:
        hub = hubs[dsn] = _Hub(dsn)
    listener = _Listener(on_wake, on_cancel)
    hub.listeners.add(listener)
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(hub.keep, listener)
            try:
                yield
            finally:
                tg.cancel_scope.cancel()
    finally:
        hub.listeners.discard(listener)
        if not hub.listeners:  # the last one: nobody joins this hub again
            if hubs.get(dsn) is hub:
                del hubs[dsn]
            with anyio.CancelScope(shield=True):
                await hub.close()
