"""What every layer above the store shares: registry, driver, engine, clock, settings.

``Runtime`` also owns the one transaction helper, so that retry-on-transient-fault and the
translation of driver errors happen in one place.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import random
import time
import weakref
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass, field
from typing import Any, TypeVar

import anyio
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from ._cancels import Cancels
from ._clock import Clock
from ._errors import DatabaseError, DurafnError
from ._hooks import Hooks
from ._kinds import FunctionKind, ScheduledFunctionId, State
from ._models import ScheduledFunction
from ._options import JobOptions, Queue, RowOptions, resolve
from ._registry import Registry
from ._retries import Retry
from ._store import AfterCommit, CronRow, NewRow, Store, new_row_model, take_notes
from ._telemetry import Telemetry
from ._telemetry.reading import read_gauges

T = TypeVar("T")

Inline = tuple[ScheduledFunctionId, FunctionKind]
"""A row that inline mode runs as soon as it is committed: its id and kind."""
logger = logging.getLogger("durafn")

_RUNTIMES: weakref.WeakSet[Runtime] = weakref.WeakSet()
"""Every runtime of this process: ``Runtime.wake`` tells those on the same database."""


@dataclass(frozen=True, slots=True)
class Limits:
    """Per function execution (one mutation, one action, one outside scheduler)."""

    max_scheduled: int = 1000
    max_args_bytes: int = 8 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class Backoff:
    """Capped exponential backoff with full jitter, for internal (transient) faults."""

    base: float = 0.05
    cap: float = 5.0

    def delay(self, attempt: int) -> float:
        return random.uniform(0, min(self.cap, self.base * 2 ** min(attempt, 16)))


class Health:
    """Says once that the database went away and once that it came back, however many
    loops (claims, heartbeats, outcome writes) hit the outage in between: one log line
    per event, not one per retry. Other transient faults (a deadlock, a busy SQLite file)
    are logged at INFO each time; they are rare and each is its own event."""

    def __init__(self, driver: Store) -> None:
        self._driver = driver
        self._down_since: float | None = None

    @property
    def down(self) -> bool:
        return self._down_since is not None

    def fault(self, exc: BaseException, doing: str, retry_in: float | None = None) -> None:
        cause = exc.__cause__ if isinstance(exc, DatabaseError) and exc.__cause__ else exc
        retry = f"; retrying in {retry_in:.2f}s" if retry_in is not None else ""
        if isinstance(exc, DatabaseError) and not exc.transient:
            logger.warning("database error while %s: %s%s", doing, one_line(exc), retry)
        elif not self._driver.is_disconnect(cause):
            logger.info("transient database fault while %s (%s)%s", doing, one_line(exc), retry)
        elif self._down_since is None:
            self._down_since = time.monotonic()
            logger.warning(
                "lost the connection to %s while %s (%s); reconnecting with backoff",
                self._driver.name,
                doing,
                one_line(exc),
            )
        else:
            logger.debug("still no connection to %s while %s%s", self._driver.name, doing, retry)

    def ok(self) -> None:
        if self._down_since is not None:
            down_for = time.monotonic() - self._down_since
            logger.warning("reconnected to %s after %.1fs", self._driver.name, down_for)
            self._down_since = None


@dataclass(eq=False)
class Runtime:
    registry: Registry
    driver: Store
    clock: Clock
    limits: Limits
    backoff: Backoff
    direct_retries: int
    """How often ``app.run_*`` retries a transient fault before raising DatabaseError."""
    _engine: AsyncEngine | None = None
    _ready: bool = False
    _ready_lock: anyio.Lock | None = None
    auto_migrate: bool = True
    max_connections: int | None = None
    """``App(max_connections=)``; None: the driver's default."""
    queues: dict[str, Queue] = field(default_factory=dict)
    """The app's queue attributes (``App(queues=...)``)."""
    retry: Retry | None = None
    """The app's retry policy, for functions without one (``App(retry=...)``)."""
    inline: Callable[[ScheduledFunction], bool] | None = None
    """Inline mode (``App(inline=...)``): which rows run as their scheduling commits."""
    crons: dict[str, CronRow] = field(default_factory=dict)
    """The crons the app declares (``app.cron``), reconciled when an executor starts."""
    inline_runner: Callable[[list[Inline]], Awaitable[None]] | None = None
    """Runs them (an executor of the app's, made when inline mode is on)."""
    _resolved: dict[JobOptions, RowOptions] = field(default_factory=dict)
    _wake_listeners: set[Callable[[Collection[FunctionKind]], None]] = field(default_factory=set)
    _freed_listeners: set[Callable[[], None]] = field(default_factory=set)
    health: Health = field(init=False)
    hooks: Hooks = field(init=False)
    telemetry: Telemetry = field(init=False)
    """Traces and metrics of its runs (``durafn[otel]``; off without it)."""
    cancels: Cancels = field(init=False)
    """The actions running in this process, to tell of their rows' cancels."""

    def __post_init__(self) -> None:
        self.health = Health(self.driver)
        self.telemetry = Telemetry(functools.partial(read_gauges, self))
        self.hooks = Hooks(self.registry.hooks_of, self.telemetry)
        self.cancels = Cancels()
        self.dependencies_in_use = False
        """Rows scheduled ``after=`` others were written or claimed in this process: its
        finishes may release some (see ``wake_on_finish``)."""
        self.maybe_freed: set[str] = set()
        """Rows waiting for others that finishes here may have freed (PostgreSQL's hot
        finish notes them), not yet looked at (``_executor/releases.py``)."""
        self.home_loop: asyncio.AbstractEventLoop | None = None
        """The event loop the app's pool (and so its executors) runs on: where a wake-up
        from another thread is sent (``_sync_runtime.py``)."""
        self.listening = 0
        """Executors of this app whose LISTEN is in effect: PostgreSQL then tells them of
        every release (a NOTIFY), so a finish need not wake them on the chance of one."""
        _RUNTIMES.add(self)

    @property
    def wake_on_finish(self) -> bool:
        """Whether a finish here wakes this process's loops on the chance that it
        released rows waiting for it: rows ``after=`` others are in use here, and no
        executor's LISTEN hears of releases. With one, PostgreSQL's NOTIFY tells every
        executor of each release that may have freed a row (the trigger's, and
        ``_executor/releases.py``'s), and a wake-up after every finish only sent the
        loops to claim for nothing: a fan-in of 10,000 drained at 0.883-0.939x of the
        plain drain without it, against 0.764-0.892x with it (six alternating pairs of
        15-round runs on PostgreSQL, 2026-11-28; better in all six, ``docs/performance``).
        SQLite has no NOTIFY (other processes poll), and ``run_until_idle`` listens to
        none. (Its first try was taken back: a long-lived executor then left new
        mutations unclaimed, from a lost wake-up this one had masked, since fixed in
        ``_writers.write``: a transaction scheduling ``after=`` locks the rows awaited.)
        """
        return self.dependencies_in_use and not self.listening

    def row_options(self, options: JobOptions) -> RowOptions:
        """The options a row is written with (``_options.resolve``), cached: most calls
        share a handful of option sets, and resolving cost ~2 us per scheduled row."""
        if options.after is not None:  # ids per call: never a key of the cache
            options = dataclasses.replace(options, after=None)
        found = self._resolved.get(options)
        if found is None:
            found = self._resolved[options] = resolve(options, self.queues, self.retry)
        return found

    def concurrency_of(self, queue: str) -> int | None:
        """A queue's concurrency as this app declares it (1, serial, if it does not)."""
        attributes = self.queues.get(queue)
        return 1 if attributes is None else attributes.concurrency

    @property
    def ready(self) -> bool:
        """Whether this process has created or checked the system tables."""
        return self._ready

    def mark_ready(self) -> None:
        """The system tables were found at this version (checked by the caller)."""
        self._ready = True
        self._bind_loop()

    def _bind_loop(self) -> None:
        self.telemetry.bind_loop()
        self.home_loop = asyncio.get_running_loop()

    @property
    def connections(self) -> int:
        """The most connections the app's pool opens at once."""
        return self.max_connections or self.driver.default_max_connections

    @property
    def engine(self) -> AsyncEngine:
        if self._engine is None:
            self._engine = self.driver.create_engine(self.connections)
        return self._engine

    async def ensure_ready(self) -> None:
        """Create (SQLite) or check (PostgreSQL) the system tables, once per process."""
        if self._ready:
            return
        if self._ready_lock is None:
            self._ready_lock = anyio.Lock()
        async with self._ready_lock:
            if self._ready:
                return

            await self.transaction(self.prepare_schema, ready=False, **self.first_connection())
            self._ready = True
            self._bind_loop()

    async def prepare_schema(self, conn: AsyncConnection) -> None:
        """Create or migrate (SQLite: ``auto_migrate``), else check, durafn's tables."""
        if self.auto_migrate:
            await self.driver.migrate(conn, self.clock.now())
        else:
            await self.driver.check_schema(conn)

    def first_connection(self) -> dict[str, Any]:
        """How ``prepare_schema`` runs: checking reads only (inspection works on a
        database it may not write); and, the process's first connection, its failure
        names where it went (a server that is down read "lost the connection ... while
        running a transaction")."""
        where = self.driver.url.render_as_string(hide_password=True)
        return {
            "read_only": not self.auto_migrate,
            "doing": f"first connecting to {where} (to check durafn's tables)",
        }

    async def dispose(self) -> None:
        if self._engine is not None:
            await self.driver.dispose(self._engine)
            self._engine = None
        self._ready = False

    # -- wake-ups ------------------------------------------------------------------------

    def wake(self, kinds: Collection[FunctionKind]) -> None:
        """Tell this process's executors that rows of ``kinds`` were committed: this
        runtime's, and those of its other runtimes on the same database (``app.using()``)
        that no LISTEN tells. A NOTIFY tells the rest (PostgreSQL's executors, whose
        LISTEN hears this process too); on SQLite, which has none, another runtime's
        executor otherwise learnt of the rows one of them wrote, finished or gave back
        only by its poll (``make stress``: 26 rounds in 1,000 waited for it)."""
        if not kinds:
            return
        for listener in list(self._wake_listeners):
            listener(kinds)
        if len(_RUNTIMES) > 1:
            url = self.driver.url
            for peer in list(_RUNTIMES):
                if (
                    peer is not self
                    and peer._wake_listeners
                    and not peer.listening
                    and peer.driver.url == url
                ):
                    for listener in list(peer._wake_listeners):
                        listener(kinds)

    def inline_calls(self, rows: list[NewRow], ids: list[ScheduledFunctionId]) -> list[Inline]:
        """The Pending rows written (``ids``: the one that runs for each) that inline mode
        runs at once: those its predicate accepts, in no named queue, with no flow key
        (their limits are the claim's to keep) and no dependencies (``after=``: a worker
        runs them once those have finished)."""
        accepts = self.inline
        if accepts is None:
            return []
        return [
            (id, FunctionKind(row["kind"]))
            for row, id in zip(rows, ids, strict=True)
            if row["state"] == State.PENDING.value
            and row["queue_name"] is None
            and row["flow_key"] is None
            and not row.get("after")
            and accepts(new_row_model(row, id))
        ]

    async def run_inline(self, calls: list[Inline]) -> None:
        """Run rows at once, in the caller's task (inline mode; ``calls``: ``inline_calls``)."""
        if calls and self.inline_runner is not None:
            await self.inline_runner(calls)

    def after_commit(self, notes: AfterCommit | None) -> list[Inline]:
        """Act on what a committed transaction noted (``_store/after_commit.py``); returns
        the rows it wrote that inline mode runs (the caller runs them: ``run_inline``)."""
        if notes is None:
            return []
        self.wake(notes.wake)
        self.cancels.request(notes.canceled)
        if notes.maybe_freed:
            self.maybe_freed |= notes.maybe_freed
            for listener in list(self._freed_listeners):
                listener()
        return self.inline_calls(notes.written, [row["id"] for row in notes.written])

    # -- transactions --------------------------------------------------------------------

    def connection_options(self, *, read_only: bool, single_statement: bool) -> dict[str, Any]:
        """Execution options for a connection running a transaction of that sort (see
        ``transaction``): on SQLite a reader begins DEFERRED; on PostgreSQL one statement
        runs in autocommit."""
        options: dict[str, Any] = dict(self.driver.read_only_options) if read_only else {}
        if single_statement:
            options.update(self.driver.single_statement_options)
        return options

    async def transaction(
        self,
        body: Callable[[AsyncConnection], Awaitable[T]],
        *,
        read_only: bool = False,
        ready: bool = True,
        doing: str = "running a transaction",
        user_code: bool = False,
        retries: int | None = None,
        single_statement: bool = False,
    ) -> T:
        """Run ``body`` in one transaction, retrying it whole on transient faults.

        ``body`` may run more than once, but (unless ``single_statement``, below) at most
        one run commits. A commit whose
        outcome is unknown (the connection died during COMMIT) is not retried: it raises
        DatabaseError, because re-running could apply the body twice. ``retries``
        overrides ``direct_retries`` for callers with a retry loop of their own.

        ``single_statement``: ``body`` runs one statement, atomic by itself, so the driver
        may run it without BEGIN and COMMIT (autocommit). Its execution is then its commit,
        and a fault is retried like any other: the body must be safe to run again after an
        outcome it could not see (a guarded UPDATE, an INSERT of an id chosen here), or be
        called with ``retries=0`` by a caller that handles the uncertainty itself.

        ``read_only`` and ``single_statement`` together: one of durafn's own reads. It
        needs no guard against writes, so on PostgreSQL it is one autocommit round trip
        instead of four (BEGIN, SET TRANSACTION READ ONLY, SELECT, COMMIT).
        """
        if ready:
            await self.ensure_ready()
        options = self.connection_options(read_only=read_only, single_statement=single_statement)
        attempt = 0
        while True:
            committing = False
            try:
                # durafn's own statements are never cancelled half-way (that costs the
                # connection, and on SQLite could strand the write lock); a cancellation
                # lands between attempts instead. User code stays cancellable.
                with anyio.CancelScope(shield=not user_code):
                    async with self.engine.connect() as conn:
                        take_notes(conn)  # what a transaction rolled back may have left
                        if options:
                            await conn.execution_options(**options)
                        await conn.begin()
                        value = await self._run_body(
                            conn, body, read_only, single_statement, user_code
                        )
                        committing = True
                        await conn.commit()
                        self.health.ok()
                        inline = self.after_commit(take_notes(conn))
                        break
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
                await anyio.sleep(delay)
        # After the commit, outside the shield: the completion callbacks it wrote, when
        # inline mode runs them.
        await self.run_inline(inline)
        return value

    def retry_delay(
        self,
        exc: Exception,
        attempt: int,
        *,
        retries: int | None,
        read_only: bool,
        user_code: bool,
        committing: bool,
        doing: str,
    ) -> float:
        """How long to wait before running again a transaction that raised ``exc`` on
        its ``attempt`` (0 the first); or raise what the caller is to see instead: the
        policy of ``transaction``, and of ``_sync_runtime.SyncRuntime``'s."""
        translated = self.driver.translate(exc) if read_only else None
        if translated is not None:
            raise translated from exc
        if not self.driver.is_transient(exc, raised_by_user=user_code):
            # A user's function may raise its own driver errors (an IntegrityError it
            # expects to catch); durafn's own statements never leak them raw.
            if user_code or not (
                isinstance(exc, SQLAlchemyError) or self.driver.is_driver_error(exc)
            ):
                raise exc
            raise self.driver.wrap(exc, doing) from exc
        if committing and self.driver.commit_outcome_unknown(exc):
            raise DatabaseError(
                f"the connection to {self.driver.name} failed while committing, so "
                f"whether it took effect is unknown: {exc}",
                transient=True,
            ) from exc
        if attempt >= (self.direct_retries if retries is None else retries):
            raise self.driver.wrap(exc, doing) from exc
        delay = self.backoff.delay(attempt)
        self.health.fault(exc, doing, delay)
        return delay

    async def _run_body(
        self,
        conn: AsyncConnection,
        body: Callable[[AsyncConnection], Awaitable[T]],
        read_only: bool,
        single_statement: bool,
        user_code: bool,
    ) -> T:
        """Run ``body`` in the transaction begun on ``conn``.

        A single-statement body's statements each commit as they run (PostgreSQL's
        autocommit; on SQLite, after its first call, which commits whole): when one fails,
        those before it stand, and so must what they noted, acted on before the failure
        goes on. Dropped with the failure, an action finish whose successes' statement had
        freed a join, and whose next statement (a result to store) failed, left the join
        unannounced until the poll. (Such a body writes no rows for inline mode to run:
        ``finishes_in_one_statement``.)
        """
        try:
            if user_code:
                return await self._user_body(conn, body, read_only)
            if read_only and not single_statement:
                async with self.driver.read_only(conn):
                    return await body(conn)
            return await body(conn)
        except BaseException:
            if single_statement:
                try:
                    notes = take_notes(conn)
                except Exception:  # the connection is gone, and its notes: the poll
                    notes = None
                self.after_commit(notes)
            raise

    async def _user_body(
        self,
        conn: AsyncConnection,
        body: Callable[[AsyncConnection], Awaitable[T]],
        read_only: bool,
    ) -> T:
        """Run a body with user code; if its time limit or its caller cancels it in the
        middle of a statement, stop that statement too. (Cancelling the await alone leaves
        the statement running on the server, or in SQLite's thread, with its locks.)"""
        handle = await self.driver.statement_handle(conn)
        try:
            if not read_only:
                return await body(conn)
            async with self.driver.read_only(conn):
                return await body(conn)
        except BaseException:
            if conn.invalidated:
                with anyio.CancelScope(shield=True):
                    await self.driver.abandon(conn, handle)
            raise


def one_line(exc: BaseException) -> str:
    text = str(getattr(exc, "orig", None) or exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
