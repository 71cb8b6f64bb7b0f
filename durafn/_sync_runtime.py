"""The app's runtime for synchronous callers (``app.sync``): the same registry, options,
limits, hooks and wake-up listeners as the app's, and transactions of its own, run in
the caller's thread on a synchronous engine.

``SyncRuntime`` is a ``Runtime`` whose ``transaction`` is a coroutine that never
suspends: its connection is a sync one behind ``_sync_bridge.Bridge``, its retries wait
with ``time.sleep``, and the policy of which faults are retried, wrapped or raised is
``Runtime.retry_delay``, the async runtime's own. So the writers and readers of the async
route (``DirectWriter``, ``SystemTable``, ``Operator.explain``) run unchanged on it,
through ``_sync_bridge.run_now``.

What a commit asks of this process (wake the executors, tell running actions of their
cancels) is sent to the event loop the app's executors run on (``Runtime.home_loop``),
never run in the caller's thread: their events are that loop's.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Awaitable, Callable, Collection
from typing import Any, TypeVar

from sqlalchemy.engine import Engine

from ._errors import DurafnError
from ._kinds import FunctionKind
from ._runtime import Inline, Runtime
from ._store import AfterCommit, take_notes
from ._sync_bridge import Bridge

T = TypeVar("T")


class SyncRuntime(Runtime):
    """See the module. Made by ``of``; shares the app runtime's containers (registry,
    hooks, listeners, caches), never its engine."""

    main: Runtime
    _sync_engine: Engine | None
    _engine_lock: threading.Lock

    @classmethod
    def for_(cls, main: Runtime) -> SyncRuntime:
        """The app runtime's one ``SyncRuntime`` (``app.sync``, ``def`` actions)."""
        found = main.__dict__.get("_sync_runtime")
        if found is None:
            found = main.__dict__.setdefault("_sync_runtime", cls.of(main))
        assert isinstance(found, SyncRuntime)
        return found

    @classmethod
    def of(cls, main: Runtime) -> SyncRuntime:
        rt = cls.__new__(cls)
        rt.__dict__.update(main.__dict__)
        rt.main = main
        rt._engine = None
        rt._ready = False
        rt._ready_lock = None
        # Inline mode runs rows on an executor, an event loop's: from sync code they wait
        # for a worker, as rows written through a caller's transaction do.
        rt.inline = None
        rt.inline_runner = None
        rt._sync_engine = None
        rt._engine_lock = threading.Lock()
        return rt

    @property
    def sync_engine(self) -> Engine:
        with self._engine_lock:  # callers of many threads: one engine
            if self._sync_engine is None:
                self._sync_engine = self.driver.create_sync_engine(self.connections)
            return self._sync_engine

    def dispose_sync(self) -> None:
        with self._engine_lock:
            engine, self._sync_engine = self._sync_engine, None
            self._ready = False
        if engine is not None:
            engine.dispose()

    # -- readiness -----------------------------------------------------------------------

    def mark_ready(self) -> None:
        self._ready = True  # (no event loop to bind: see Runtime.mark_ready)

    async def ensure_ready(self) -> None:
        if self._ready:
            return
        await self.transaction(self.prepare_schema, ready=False, **self.first_connection())
        self._ready = True

    # -- transactions --------------------------------------------------------------------

    async def transaction(
        self,
        body: Callable[[Any], Awaitable[T]],
        *,
        read_only: bool = False,
        ready: bool = True,
        doing: str = "running a transaction",
        user_code: bool = False,
        retries: int | None = None,
        single_statement: bool = False,
    ) -> T:
        """``Runtime.transaction``, in the caller's thread (see the module)."""
        if ready:
            await self.ensure_ready()
        options = self.connection_options(read_only=read_only, single_statement=single_statement)
        attempt = 0
        while True:
            committing = False
            try:
                with self.sync_engine.connect() as sync_conn:
                    if options:
                        sync_conn.execution_options(**options)
                    conn = Bridge(sync_conn).as_async()
                    take_notes(conn)  # what a transaction rolled back may have left
                    sync_conn.begin()
                    # The async route's own: a single statement failing part-way acts on
                    # what its committed statements noted.
                    value = await self._run_body(conn, body, read_only, single_statement, user_code)
                    committing = True
                    sync_conn.commit()
                    self.health.ok()
                    self.after_commit(take_notes(conn))
                    return value
            except DurafnError:
                raise
            except Exception as exc:
                delay = self.retry_delay(
                    exc,
                    attempt,
                    retries=retries,
                    read_only=read_only,
                    user_code=user_code,
                    committing=committing,
                    doing=doing,
                )
                attempt += 1
                # The caller's own thread, with no event loop to yield to (see the module).
                time.sleep(delay)  # noqa: ASYNC251

    # -- after a commit, on the executors' loop -------------------------------------------

    def wake(self, kinds: Collection[FunctionKind]) -> None:
        if kinds and self._wake_listeners:
            _on_home_loop(self.main, Runtime.wake, self.main, set(kinds))

    def after_commit(self, notes: AfterCommit | None) -> list[Inline]:
        if notes is not None:
            _on_home_loop(self.main, Runtime.after_commit, self.main, notes)
        return []


def _on_home_loop(main: Runtime, fn: Callable[..., object], *args: Any) -> None:
    """``fn(*args)`` on the loop of the app's executors: at once if that is this thread's
    running loop, else queued to it. No loop (no executor in this process): nothing to
    tell; other processes learn by NOTIFY (PostgreSQL) or their poll."""
    loop = main.home_loop
    if loop is None or loop.is_closed():
        return
    try:
        running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is loop:
        fn(*args)
        return
    with contextlib.suppress(RuntimeError):  # closed meanwhile
        loop.call_soon_threadsafe(fn, *args)
