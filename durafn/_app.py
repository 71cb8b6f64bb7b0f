"""``App``: the registry of functions, the database, the clock, and the ways in."""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, ParamSpec, TypeVar

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession
from typing_extensions import Unpack

from ._activity import ActivityReads
from ._checks import flag, integer, optional, positive_seconds, text
from ._clock import Clock, SystemClock
from ._console import Console
from ._context import SystemTable
from ._cron_declarations import CronDeclarations
from ._cron_registry import CronRegistry
from ._errors import ArgumentError, DatabaseError
from ._executor import Executor, ExecutorOptions, make_config
from ._invoke import Invoker, Timeouts
from ._kinds import FunctionKind, ScheduledFunctionId, State
from ._models import CancelResult, Page, ScheduledFunction
from ._operations import Operations
from ._operator import Operator
from ._options import Queue, check_name
from ._public import publish
from ._registration import Registration
from ._registry import ActionRef, MutationRef, QueryRef, Registry
from ._retries import Retry, check_retry
from ._row_links import RowLinksReads
from ._runtime import Backoff, Health, Limits, Runtime
from ._scheduler import Scheduler
from ._search import Search
from ._store import driver_for_url
from ._workflow.app import Workflows
from ._writers import DirectWriter, JoinedWriter

if TYPE_CHECKING:
    from ._sync_app import SyncApp

P = ParamSpec("P")
R = TypeVar("R")

KINDS = (FunctionKind.MUTATION, FunctionKind.ACTION)

DEFAULT_FILE = "durafn.sqlite3"
DEFAULT_URL = f"sqlite+aiosqlite:///{DEFAULT_FILE}"
"""Used when no URL is given and ``DURAFN_DATABASE_URL`` is unset: a file in the cwd."""


def _blank(url: str, where: str = "the database URL") -> str:
    """``url``, refused where it is empty: an empty URL from a template or an unset
    variable (``App(os.environ.get("DB_URL", ""))``) would otherwise fall back to a file
    in the working directory, where rows are written and no worker looks."""
    if not url.strip():
        raise DatabaseError(
            f"{where} is empty: give one (sqlite+aiosqlite:///path.db, "
            "postgresql+asyncpg://user@host/dbname)"
        )
    return url


def _database_url(url: str | None) -> str:
    """The URL an ``App`` uses: its own, else ``DURAFN_DATABASE_URL``, else ``DEFAULT_URL``."""
    if url is not None:
        return _blank(url)
    from_env = os.environ.get("DURAFN_DATABASE_URL")
    if from_env is None:
        return DEFAULT_URL
    return _blank(from_env, "DURAFN_DATABASE_URL is set, but it")


class App(
    Registration,
    Operator,
    Operations,
    ActivityReads,
    RowLinksReads,
    Search,
    Console,
    CronDeclarations,
    CronRegistry,
    Workflows,
):
    """A durafn application: register functions on it, run them, schedule them.

    ``App()`` uses a SQLite file (``DURAFN_DATABASE_URL`` or ``./durafn.sqlite3``);
    ``App("postgresql+asyncpg://...")`` uses PostgreSQL. Nothing connects until first use.

    ``max_connections``: the most database connections the app's pool opens at once
    (default 10 on PostgreSQL, 16 on SQLite); it keeps half of them open when idle. A
    process running an executor on PostgreSQL holds one more, for LISTEN. Size it to the
    server: of a primary's default ``max_connections = 100``, 97 are for clients (3 are
    reserved for superusers): eight workers at the default (11 each), nineteen at 4
    (executors drain as fast through 2 as through 10). Beyond that, PgBouncer in
    transaction mode: ``?pooler=transaction&listen=HOST:PORT`` in the URL (the deploying
    guide).

    ``inline``: for development and simple tests, run scheduled functions in the caller's
    task as soon as the transaction that scheduled them commits, due or not, instead of
    waiting for an executor (delayed_job's ``delay_jobs = false``); or a predicate,
    ``inline=lambda row: ...`` over each ``ScheduledFunction`` written, for some rows
    only. Rows are written and recorded as ever; rows of named queues wait for executors.
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        clock: Clock | None = None,
        mutation_timeout: float = 5.0,
        action_timeout: float = 600.0,
        query_timeout: float = 30.0,
        max_scheduled_per_run: int = 1000,
        max_scheduled_args_bytes: int = 8 * 1024 * 1024,
        auto_migrate: bool | None = None,
        direct_retries: int = 8,
        queues: Mapping[str, Queue] | None = None,
        retry: Retry | None = None,
        inline: bool | Callable[[ScheduledFunction], bool] = False,
        max_connections: int | None = None,
    ) -> None:
        if url is not None:
            text("url", url)
        if clock is not None and not isinstance(clock, Clock):
            raise ArgumentError(f"clock must have now() and sleep_until(), not {clock!r}")
        timeouts = Timeouts(
            positive_seconds("mutation_timeout", mutation_timeout),
            positive_seconds("action_timeout", action_timeout),
            positive_seconds("query_timeout", query_timeout),
        )
        max_scheduled_per_run = integer("max_scheduled_per_run", max_scheduled_per_run)
        max_scheduled_args_bytes = integer("max_scheduled_args_bytes", max_scheduled_args_bytes)
        direct_retries = integer("direct_retries", direct_retries, low=0, high=1000)
        optional(flag, "auto_migrate", auto_migrate)
        optional(integer, "max_connections", max_connections, high=1000)
        queues = _queue_attributes(queues)
        optional(check_retry, "retry", retry, error=ArgumentError)
        if not (isinstance(inline, bool) or callable(inline)):
            raise ArgumentError(
                f"inline must be True, False or a function of a ScheduledFunction returning "
                f"whether to run it inline, not {inline!r}"
            )
        driver = driver_for_url(_database_url(url))
        self._rt = Runtime(
            registry=Registry(origin=_caller()),
            driver=driver,
            clock=clock or SystemClock(),
            limits=Limits(max_scheduled_per_run, max_scheduled_args_bytes),
            backoff=Backoff(),
            direct_retries=direct_retries,
            # SQLite is embedded: create the tables on first use. PostgreSQL is shared:
            # schema changes are an explicit, deliberate step (`durafn migrate`).
            auto_migrate=driver.auto_migrate if auto_migrate is None else auto_migrate,
            queues=queues,
            retry=retry,
            inline=_every_row if inline is True else inline or None,
            max_connections=max_connections,
        )
        self._invoker = Invoker(self._rt, timeouts)
        if inline is not False:
            # A fresh executor per commit: callers (and the runs they nest) never share one.
            self._rt.inline_runner = lambda calls: self.executor().run_inline(calls)

    def _inspect_only(self) -> None:
        """Create nothing on first use: neither the system tables nor, on SQLite, the
        database file (the CLI's inspection commands, where a mistyped path must be an
        error rather than a new, empty database)."""
        self._rt.auto_migrate = False
        self._rt.driver.require_existing()

    def _use_url(self, url: str) -> None:
        """Point the app at another database (the CLI's ``--url``), before first use."""
        if self._rt._engine is not None:
            raise ArgumentError("the app's database cannot change once it is in use")
        driver = driver_for_url(url)
        if driver.auto_migrate != self._rt.driver.auto_migrate:  # another engine
            self._rt.auto_migrate = driver.auto_migrate
        self._rt.driver = driver
        self._rt.health = Health(driver)

    def _limit_connections(self, most: int) -> None:
        """Set ``max_connections`` (the CLI's ``--max-connections``), before first use."""
        if self._rt._engine is not None:
            raise ArgumentError("the app's connection limit cannot change once it is in use")
        self._rt.max_connections = integer("max_connections", most, high=1000)

    def _share_engine(self, keeper: App) -> None:
        """Use ``keeper``'s engine (and the driver that made it), before first use: the test
        harnesses' apps, one per test on one database, so that SQLAlchemy's compiled
        statements (kept by the engine) outlive a test. ``aclose`` still closes the pool's
        connections, as it does an engine of the app's own; the engine stays usable."""
        if self._rt._engine is not None:
            raise ArgumentError("the app's engine cannot change once it is in use")
        if keeper._rt.driver.url != self._rt.driver.url:
            raise ArgumentError(
                f"cannot share the engine of an app on {keeper._rt.driver.url!r}: this app "
                f"is on {self._rt.driver.url!r}"
            )
        if keeper._rt.connections != self._rt.connections:
            raise ArgumentError(
                f"cannot share the engine of an app with max_connections="
                f"{keeper._rt.connections}: this app has {self._rt.connections}"
            )
        self._rt.driver = keeper._rt.driver
        self._rt.health = Health(keeper._rt.driver)
        self._rt._engine = keeper.engine

    def using(self, url: str | None = None, *, clock: Clock | None = None) -> App:
        """This app on another database, or with another clock: the same functions,
        crons, hooks, queues and settings (shared: what is registered on one is on both),
        with a connection pool, and a clock, of its own. On the same database, each one's
        executors hear the other's wake-ups in this process (``Runtime.wake``). For tests
        of an app defined at module level::

            from myapp.tasks import app, send_email

            test_app = app.using("sqlite+aiosqlite:///test.db", clock=FakeClock())
            await test_app.run_mutation(send_email, "a@example.com")
        """
        if url is not None:
            text("url", url)
        if clock is not None and not isinstance(clock, Clock):
            raise ArgumentError(f"clock must have now() and sleep_until(), not {clock!r}")
        rt = self._rt
        driver = driver_for_url(
            rt.driver.url.render_as_string(hide_password=False) if url is None else _blank(url)
        )
        other = App.__new__(App)
        other._rt = dataclasses.replace(
            rt,
            driver=driver,
            clock=clock or rt.clock,
            _engine=None,
            _ready=False,
            _ready_lock=None,
            auto_migrate=rt.auto_migrate if url is None else driver.auto_migrate,
            inline_runner=None,
            _resolved={},
            _wake_listeners=set(),
            _freed_listeners=set(),
        )
        other._rt.hooks = rt.hooks  # the app's hooks (a new runtime made new ones)
        other._invoker = Invoker(other._rt, self._invoker.timeouts)
        if rt.inline_runner is not None:
            other._rt.inline_runner = lambda calls: other.executor().run_inline(calls)
        return other

    def __repr__(self) -> str:
        return f"<durafn.App {self._rt.driver.url.render_as_string()!r}>"

    # -- running directly --------------------------------------------------------------

    async def run_query(self, fn: QueryRef[P, R], /, *args: P.args, **kwargs: P.kwargs) -> R:
        """Run a query now, in a read-only transaction."""
        return await self._invoker.query(fn, args, kwargs)

    async def run_mutation(self, fn: MutationRef[P, R], /, *args: P.args, **kwargs: P.kwargs) -> R:
        """Run a mutation now, in its own transaction; what it schedules commits with it.

        Transient database faults re-run it (at most one run commits); an exception from
        the mutation rolls it back and is re-raised unchanged.
        """
        return await self._invoker.mutation(fn, args, kwargs)

    async def run_action(self, fn: ActionRef[P, R], /, *args: P.args, **kwargs: P.kwargs) -> R:
        """Run an action now, in this process."""
        return await self._invoker.action(fn, args, kwargs)

    # -- scheduling from outside -------------------------------------------------------

    def scheduler(self, within: AsyncSession | AsyncConnection | None = None) -> Scheduler:
        """A scheduler for code outside durafn.

        With a session or connection, rows are written in *its* transaction and commit
        (or roll back) with your own writes. Without one, each call commits on its own.
        Limits count per scheduler object.
        """
        if within is None:
            # Each call commits alone, so the per-execution limits apply per call.
            return Scheduler(self._rt, DirectWriter(self._rt, check_parent=None), per_call=True)
        if not isinstance(within, AsyncSession | AsyncConnection):
            raise ArgumentError(
                "app.scheduler() takes an AsyncSession or AsyncConnection, not "
                f"{type(within).__name__}"
            )
        return Scheduler(self._rt, JoinedWriter(self._rt, within))

    @property
    def sync(self) -> SyncApp:
        """This app from synchronous code (Django, Flask, sync SQLAlchemy, threads with no
        event loop): ``app.sync.scheduler(session).run_after(...)`` writes in your
        transaction; ``app.sync.run_after(...)``, ``get``, ``list``, ``explain`` as the
        async methods do (``SyncApp``)."""
        found: SyncApp | None = self.__dict__.get("_sync")
        if found is None:
            from ._sync_app import SyncApp

            found = self.__dict__.setdefault("_sync", SyncApp(self._rt))
        return found

    async def cancel(self, id: ScheduledFunctionId | str) -> CancelResult:
        """Cancel a scheduled function (see ``Scheduler.cancel``)."""
        return await self.scheduler().cancel(id)

    # -- reading -----------------------------------------------------------------------

    async def get(self, id: ScheduledFunctionId | str) -> ScheduledFunction | None:
        """The ``_scheduled_functions`` row with this id, or None."""
        return await SystemTable(self._rt, None).get(id)

    async def list(
        self,
        *,
        state: State | Sequence[State] | None = None,
        name: str | None = None,
        scheduled_after: datetime | None = None,
        scheduled_before: datetime | None = None,
        limit: int = 100,
        cursor: str | None = None,
        newest_first: bool = False,
        queue: str | None = None,
        key: str | None = None,
        flag: str | None = None,
        parent: ScheduledFunctionId | str | None = None,
        args: Mapping[str, str | int | float | bool] | None = None,
        args_contain: Mapping[str, str | int | float | bool] | None = None,
        scan: int | None = None,
    ) -> Page:
        """Rows in ``scheduled_time`` order (``newest_first``: latest first), filtered
        (by state, function name, time, queue, job key, flag, the row that scheduled
        them, argument values: ``args={"user_id": 42}``, ``args_contain={"tags": "vip"}``:
        an array holding it, a string holding it as a part) and paginated: pass
        ``next_cursor`` back as ``cursor`` for the next page. ``scan`` bounds the rows
        read for one page (see ``Page.partial``)."""
        return await SystemTable(self._rt, None).list(
            args=args,
            args_contain=args_contain,
            parent=parent,
            state=state,
            name=name,
            scheduled_after=scheduled_after,
            scheduled_before=scheduled_before,
            limit=limit,
            cursor=cursor,
            newest_first=newest_first,
            queue=queue,
            key=key,
            flag=flag,
            scan=scan,
        )

    # -- executor and lifecycle --------------------------------------------------------

    def executor(self, **options: Unpack[ExecutorOptions]) -> Executor:
        """An executor (see ``ExecutorConfig`` for the options); ``async with`` it to run."""
        return Executor(self._rt, self._invoker, make_config(options))

    def run_executor(self, **options: Unpack[ExecutorOptions]) -> Executor:
        """``async with app.run_executor(concurrency=...):`` runs due work in the background."""
        return self.executor(**options)

    async def migrate(self) -> int:
        """Create or upgrade the system tables; returns the schema version."""

        async def _migrate(conn: AsyncConnection) -> int:
            return await self._rt.driver.migrate(conn, self._rt.clock.now())

        version = await self._rt.transaction(_migrate, ready=False, doing="migrating")
        self._rt.mark_ready()
        return version

    @property
    def engine(self) -> AsyncEngine:
        """The app's SQLAlchemy engine: use it for your own sessions and tables."""
        return self._rt.engine

    @property
    def clock(self) -> Clock:
        return self._rt.clock

    @property
    def dialect(self) -> str:
        """ "SQLite" or "PostgreSQL"."""
        return self._rt.driver.name

    async def aclose(self) -> None:
        """Close the connection pool (and ``app.sync``'s, if it was used)."""
        await self._rt.dispose()
        if (sync := self.__dict__.get("_sync")) is not None:
            sync.close()

    async def __aenter__(self) -> App:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


def _queue_attributes(value: object) -> dict[str, Queue]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ArgumentError(f"queues must be a mapping of names to durafn.Queue, not {value!r}")
    out: dict[str, Queue] = {}
    for name, attributes in value.items():
        check_name("a queue's name", name, error=ArgumentError)
        if not isinstance(attributes, Queue):
            raise ArgumentError(
                f"queues[{name!r}] must be a durafn.Queue(concurrency=..., priority=...), "
                f"not {attributes!r}"
            )
        out[name] = attributes
    return out


def _every_row(row: ScheduledFunction) -> bool:
    return True


def _caller() -> str:
    """``file:line`` of the code that made the app (outside durafn)."""
    frame = sys._getframe(2)
    while frame.f_back is not None and frame.f_globals.get("__name__", "").startswith("durafn"):
        frame = frame.f_back
    return f"{frame.f_code.co_filename}:{frame.f_lineno}"


publish(globals())
