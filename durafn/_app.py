"""``App``: the registry of functions, the database, the clock, and the ways in."""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import datetime
from typing import Any, Concatenate, ParamSpec, TypeVar, overload

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession
from typing_extensions import Unpack

from ._admin import Operations
from ._cancels import CANCEL_MODES, CancelMode
from ._checks import flag, integer, optional, positive_seconds, text
from ._clock import Clock, SystemClock
from ._context import ActionCtx, MutationCtx, QueryCtx, SystemTable
from ._cron_registry import CronRegistry
from ._crons import CronDeclarations
from ._errors import ArgumentError, RegistrationError
from ._executor import Executor, ExecutorOptions, make_config
from ._hooks import HookName, HookT, check_hook
from ._invoke import Invoker, Timeouts
from ._kinds import FunctionKind, ScheduledFunctionId, State
from ._options import JobOptions, Queue, check_name
from ._public import publish
from ._registry import ActionRef, FunctionRef, JobOptionArgs, MutationRef, QueryRef, Registry
from ._retention import Retention, check_retention
from ._retries import MAX_SNOOZES, SNOOZE_LIMIT, Retry, check_retry
from ._runtime import Backoff, Health, Limits, Runtime
from ._scheduler import Scheduler
from ._store import driver_for_url
from ._types import CancelResult, Page, ScheduledFunction
from ._writers import DirectWriter, JoinedWriter

P = ParamSpec("P")
R = TypeVar("R")

KINDS = (FunctionKind.MUTATION, FunctionKind.ACTION)

DEFAULT_FILE = "durafn.sqlite3"
DEFAULT_URL = f"sqlite+aiosqlite:///{DEFAULT_FILE}"
"""Used when no URL is given and ``DURAFN_DATABASE_URL`` is unset: a file in the cwd."""


class App(Operations, CronDeclarations, CronRegistry):
    """A durafn application: register functions on it, run them, schedule them.

    ``App()`` uses a SQLite file (``DURAFN_DATABASE_URL`` or ``./durafn.sqlite3``);
    ``App("postgresql+asyncpg://...")`` uses PostgreSQL. Nothing connects until first use.

    ``max_connections``: the most database connections the app's pool opens at once
    (default 10 on PostgreSQL, 16 on SQLite); it keeps half of them open when idle. An
    executor on PostgreSQL holds one more, for LISTEN. Size it to the server: of a
    primary's default ``max_connections = 100``, 97 are for clients (3 are reserved for
    superusers): eight workers at the default (11 each), nineteen at 4 (executors drain as
    fast through 2 as through 10).

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
        driver = driver_for_url(url or os.environ.get("DURAFN_DATABASE_URL") or DEFAULT_URL)
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
        if type(driver) is not type(self._rt.driver):
            self._rt.auto_migrate = driver.auto_migrate
        self._rt.driver = driver
        self._rt.health = Health(driver)

    def _limit_connections(self, most: int) -> None:
        """Set ``max_connections`` (the CLI's ``--max-connections``), before first use."""
        if self._rt._engine is not None:
            raise ArgumentError("the app's connection limit cannot change once it is in use")
        self._rt.max_connections = integer("max_connections", most, high=1000)

    def using(self, url: str | None = None, *, clock: Clock | None = None) -> App:
        """This app on another database, or with another clock: the same functions,
        crons, hooks, queues and settings (shared: what is registered on one is on both),
        with a connection pool, and a clock, of its own. For tests of an app defined at
        module level::

            from myapp.tasks import app, send_email

            test_app = app.using("sqlite+aiosqlite:///test.db", clock=FakeClock())
            await test_app.run_mutation(send_email, "a@example.com")
        """
        if url is not None:
            text("url", url)
        if clock is not None and not isinstance(clock, Clock):
            raise ArgumentError(f"clock must have now() and sleep_until(), not {clock!r}")
        rt = self._rt
        driver = driver_for_url(url or rt.driver.url.render_as_string(hide_password=False))
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
        )
        other._rt.hooks = rt.hooks  # the app's hooks (a new runtime made new ones)
        other._invoker = Invoker(other._rt, self._invoker.timeouts)
        if rt.inline_runner is not None:
            other._rt.inline_runner = lambda calls: other.executor().run_inline(calls)
        return other

    def __repr__(self) -> str:
        return f"<durafn.App {self._rt.driver.url.render_as_string()!r}>"

    # -- registration ------------------------------------------------------------------

    @overload
    def query(self, fn: Callable[Concatenate[QueryCtx, P], Awaitable[R]]) -> QueryRef[P, R]: ...

    @overload
    def query(
        self, *, name: str | None = None, timeout: float | None = None
    ) -> Callable[[Callable[Concatenate[QueryCtx, P], Awaitable[R]]], QueryRef[P, R]]: ...

    def query(
        self, fn: Any = None, *, name: str | None = None, timeout: float | None = None
    ) -> Any:
        """Register a read-only function: ``async def f(ctx: QueryCtx, ...)``."""
        return self._register(QueryRef, (QueryCtx,), fn, name, timeout)

    @overload
    def mutation(
        self, fn: Callable[Concatenate[MutationCtx, P], Awaitable[R]]
    ) -> MutationRef[P, R]: ...

    @overload
    def mutation(
        self,
        *,
        name: str | None = None,
        timeout: float | None = None,
        retention: Retention | None = None,
        snooze_limit: int = SNOOZE_LIMIT,
        **options: Unpack[JobOptionArgs],
    ) -> Callable[[Callable[Concatenate[MutationCtx, P], Awaitable[R]]], MutationRef[P, R]]: ...

    def mutation(
        self,
        fn: Any = None,
        *,
        name: str | None = None,
        timeout: float | None = None,
        retention: Retention | None = None,
        snooze_limit: int = SNOOZE_LIMIT,
        **options: Unpack[JobOptionArgs],
    ) -> Any:
        """Register a transactional function: ``async def f(ctx: MutationCtx, ...)``.

        Scheduled, it runs exactly once; ``timeout`` (seconds) overrides the app default.
        Job options (``priority``, ``queue``, ``key``, ``key_mode``, ``flags``,
        ``retry``) are the defaults of its scheduled calls; ``ref.options(...)`` overrides
        them per call. With ``retry``, a run that raises is rolled back and tried again
        later, its effects committed once, by the run that succeeds. ``retention``: how
        long its finished rows are kept, per state (``durafn.Retention``).
        ``snooze_limit``: how many times one row may ``raise durafn.Snooze(...)``.
        """
        return self._register(
            MutationRef, (MutationCtx,), fn, name, timeout, options, retention, snooze_limit
        )

    @overload
    def action(self, fn: Callable[Concatenate[ActionCtx, P], Awaitable[R]]) -> ActionRef[P, R]: ...

    @overload
    def action(
        self,
        *,
        name: str | None = None,
        timeout: float | None = None,
        retention: Retention | None = None,
        cancel: CancelMode = "cooperative",
        snooze_limit: int = SNOOZE_LIMIT,
        **options: Unpack[JobOptionArgs],
    ) -> Callable[[Callable[Concatenate[ActionCtx, P], Awaitable[R]]], ActionRef[P, R]]: ...

    def action(
        self,
        fn: Any = None,
        *,
        name: str | None = None,
        timeout: float | None = None,
        retention: Retention | None = None,
        cancel: CancelMode = "cooperative",
        snooze_limit: int = SNOOZE_LIMIT,
        **options: Unpack[JobOptionArgs],
    ) -> Any:
        """Register a side-effecting function: ``async def f(ctx: ActionCtx, ...)``.

        Scheduled, it runs at most once and is never retried by durafn, unless it has a
        ``retry`` policy: then it runs at least once until it succeeds or runs out of
        attempts (a failure, its time limit, its worker lost, a stop's grace period).
        ``cancel``: how a run learns of its row's cancel: ``"cooperative"`` sets
        ``ctx.cancel_requested`` (and ends ``ctx.wait_for_cancel()``), ``"interrupt"`` also
        cancels it at its next ``await``. Job options, ``snooze_limit``: as ``mutation``.
        """
        if cancel not in CANCEL_MODES:
            raise RegistrationError(
                f"cancel must be one of {', '.join(CANCEL_MODES)}, not {cancel!r}"
            )
        return self._register(
            ActionRef, (ActionCtx,), fn, name, timeout, options, retention, snooze_limit, cancel
        )

    def on(self, hook: HookName) -> Callable[[HookT], HookT]:
        """Register a lifecycle hook for every function: ``@app.on("failure")`` over
        ``def alert(event: durafn.HookEvent)`` (or ``async def``). Hooks: ``enqueue``,
        ``before``, ``after``, ``success``, ``error``, ``failure`` (see the README); they
        run in-process, outside the guarantees, and one that raises changes nothing."""
        name = check_hook(hook)

        def _add(fn: HookT) -> HookT:
            self._rt.hooks.add(name, fn)
            return fn

        return _add

    def _register(
        self,
        cls: type[FunctionRef[Any, Any]],
        ctx_types: tuple[type, ...],
        fn: Any,
        name: str | None,
        timeout: float | None,
        options: JobOptionArgs | None = None,
        retention: Retention | None = None,
        snooze_limit: int = SNOOZE_LIMIT,
        cancel: CancelMode | None = None,
    ) -> Any:
        # Checked before decorating, so a bad option names the decorator's line.
        defaults = JobOptions.checked(error=RegistrationError, **(options or {}))
        if defaults.after is not None:
            raise RegistrationError(
                "after= names rows, so it is given per call: ref.options(after=[id, ...])"
            )
        optional(check_retention, "retention", retention, error=RegistrationError)
        integer("snooze_limit", snooze_limit, low=0, high=MAX_SNOOZES, error=RegistrationError)

        def decorate(f: Callable[..., Awaitable[Any]]) -> FunctionRef[Any, Any]:
            ref = cls(f, name=name, timeout=timeout, ctx_types=ctx_types)
            ref.job_options = defaults
            ref.retention = retention
            ref.snooze_limit = snooze_limit
            if isinstance(ref, ActionRef) and cancel is not None:
                ref.cancel = cancel
            self._rt.registry.add(ref)
            return ref

        return decorate if fn is None else decorate(fn)

    def functions(self) -> list[str]:
        """The durable names registered on this app."""
        return self._rt.registry.names()

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
        """Close the connection pool."""
        await self._rt.dispose()

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
