"""Plain ``def`` functions, registered with ``@app.action`` and ``@app.mutation``.

An action declared ``def`` runs in a worker thread of a bounded pool (``THREADS`` per
process), never on the event loop. Its time limit and its row's cancel end the run as
for an async action (the row is recorded at once: Failed with ``FunctionTimeoutError``,
or Canceled) and set ``ctx.stop_requested``, which the function checks between units of
work. A thread cannot be interrupted: the function runs on until it returns (its result
then discarded), holding its thread of the pool meanwhile, and a process's exit waits
for it.

A mutation declared ``def`` runs inside the batch's transaction, as an async one does:
SQLAlchemy's ``AsyncSession.run_sync`` calls it in a greenlet with ``ctx.db``, the
``Session`` under the run's ``AsyncSession``, on the batch's connection. Its writes and
what it schedules (``ctx.scheduler``, whose calls wait for their statements in the same
greenlet) commit with the row's state or not at all: exactly once, as before. It runs
on the event loop's thread, so it must wait on nothing but the database (no sleeps, no
HTTP: that is an action's work); its time limit stops it at its next statement.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import functools
from collections.abc import Callable
from datetime import datetime
from typing import Any, ParamSpec, TypeVar

from sqlalchemy.orm import Session
from sqlalchemy.util import await_only

from ._clock import to_datetime
from ._context import ActionCtx, MutationCtx
from ._kinds import ScheduledFunctionId
from ._public import publish
from ._sync_scheduler import SyncScheduler

P = ParamSpec("P")
R = TypeVar("R")

THREADS = 32
"""The most ``def`` actions that run at once in one process: the threads of its pool."""

_pool: concurrent.futures.ThreadPoolExecutor | None = None


def _threads() -> concurrent.futures.ThreadPoolExecutor:
    global _pool
    if _pool is None:
        _pool = concurrent.futures.ThreadPoolExecutor(THREADS, thread_name_prefix="durafn-def")
    return _pool


def threaded_action(fn: Callable[..., R]) -> Callable[..., Any]:
    """The coroutine function the executor awaits for the ``def`` action ``fn``."""

    @functools.wraps(fn)
    async def run(ctx: ActionCtx, /, **values: Any) -> R:
        call = functools.partial(fn, ctx, **values)
        # Its context too: the run's span (telemetry) and whatever the caller set.
        future = _threads().submit(contextvars.copy_context().run, call)
        try:
            return await asyncio.wrap_future(future)
        except BaseException:
            # Its time limit, its row's cancel, a stop: the run ends here, the thread
            # goes on until the function returns (see the module).
            ctx._stopped = True
            raise

    return run


def greenlet_mutation(fn: Callable[..., R]) -> Callable[..., Any]:
    """The coroutine function a batch awaits for the ``def`` mutation ``fn``."""

    @functools.wraps(fn)
    async def run(ctx: MutationCtx, /, **values: Any) -> R:
        sync_ctx = SyncMutationCtx(ctx)
        return await ctx.db.run_sync(lambda _session: fn(sync_ctx, **values))

    return run


class SyncMutationCtx:
    """What a ``def`` mutation receives: its transaction as a SQLAlchemy ``Session``."""

    def __init__(self, ctx: MutationCtx) -> None:
        self._ctx = ctx
        self.run_id: ScheduledFunctionId | None = ctx.run_id
        """The scheduled run this code belongs to; None when called directly."""

    @property
    def db(self) -> Session:
        """A ``Session`` inside the mutation's transaction (the one under its
        ``AsyncSession``); do not commit it yourself."""
        return self._ctx.db.sync_session

    @functools.cached_property
    def scheduler(self) -> SyncScheduler:
        """Schedules rows that commit with the mutation, or not at all
        (``MutationCtx.scheduler``, not awaited)."""
        return SyncScheduler(self._ctx.scheduler, run=await_only)

    def now(self) -> datetime:
        """The runtime clock's current time (the fake clock in tests)."""
        return to_datetime(self._ctx._rt.clock.now())


publish(globals())
