"""The ``ctx`` each kind of function receives.

* ``QueryCtx``: a read-only session and the system table.
* ``MutationCtx``: a session inside the mutation's one transaction, and a scheduler whose
  rows commit with it.
* ``ActionCtx``: no transaction; ``run_query`` / ``run_mutation`` / ``run_action`` and a
  scheduler, each call committing on its own.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import datetime
from functools import cached_property
from typing import TYPE_CHECKING, Any, NoReturn, ParamSpec, Protocol, TypedDict, TypeVar

import anyio
from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

from ._checks import aware_time, integer, one_id, optional, scheduled_id, state_list, text
from ._checks import flag as boolean
from ._clock import to_datetime
from ._errors import ArgumentError, ReadOnlyError
from ._kinds import ScheduledFunctionId, State
from ._models import Page, ScheduledFunction
from ._options import check_flag
from ._progress import Progress, checked
from ._public import publish
from ._registry import ActionRef, MutationRef, QueryRef
from ._runtime import Runtime
from ._scheduler import Scheduler
from ._store import RowFilter
from ._writers import BufferedWriter, DirectWriter

if TYPE_CHECKING:
    from ._sync_scheduler import SyncScheduler

P = ParamSpec("P")
R = TypeVar("R")


class ListFilters(TypedDict, total=False):
    """``SystemTable.list``'s keywords, for the routes that hand them on unchanged
    (``app.sync.list``): mypy checks each route against the one signature."""

    state: State | Sequence[State] | None
    name: str | None
    scheduled_after: datetime | None
    scheduled_before: datetime | None
    limit: int
    cursor: str | None
    newest_first: bool
    queue: str | None
    key: str | None
    flag: str | None
    parent: ScheduledFunctionId | str | None
    args: Mapping[str, str | int | float | bool] | None
    args_contain: Mapping[str, str | int | float | bool] | None
    scan: int | None


class SystemTable:
    """Reads ``_scheduled_functions`` (``ctx.system``, and ``app.get`` / ``app.list``)."""

    def __init__(
        self,
        runtime: Runtime,
        conn: AsyncConnection | None,
        before_read: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self._rt = runtime
        self._conn = conn
        self._before_read = before_read

    async def get(self, id: ScheduledFunctionId | str) -> ScheduledFunction | None:
        """The row with this id, or None if there is none (or it was removed by retention).

        Any form of the id that ``uuid.UUID`` reads finds the row; one that is not an id
        finds none."""
        canonical = one_id(id, "get", ", or list(...) to read by filters")
        if canonical is None:
            return None

        async def _read(conn: AsyncConnection) -> ScheduledFunction | None:
            return await self._rt.driver.get(conn, canonical)

        return await self._run(_read)

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
        (``parent``: the rows that row scheduled; ``args``: whose arguments hold these
        values, ``{"user_id": 42}``); follow ``next_cursor`` for more. ``scan``: read at
        most this many rows of the order for the page (a filter that matches little
        then costs ``scan`` rows, not the table); a page the bound cut short says so
        (``Page.partial``) and its ``next_cursor`` goes on from where it stopped."""
        where = row_filter(
            args=args,
            args_contain=args_contain,
            parent=parent,
            state=state,
            name=name,
            scheduled_after=scheduled_after,
            scheduled_before=scheduled_before,
            queue=queue,
            key=key,
            flag=flag,
        )
        limit = integer("limit", limit, high=10_000)
        if scan is not None:
            scan = integer("scan", scan, low=1, high=10_000_000)
        optional(text, "cursor", cursor)
        boolean("newest_first", newest_first)

        async def _read(conn: AsyncConnection) -> Page:
            return await self._rt.driver.list(
                conn,
                where=where,
                limit=limit,
                cursor=cursor,
                newest_first=newest_first,
                scan=scan,
            )

        # Two reads with a scan bound (its end, then the page): not one-statement.
        return await self._run(_read, single_statement=scan is None)

    async def _run(
        self, read: Callable[[AsyncConnection], Awaitable[R]], *, single_statement: bool = True
    ) -> R:
        if self._conn is None:
            return await self._rt.transaction(
                read,
                read_only=True,
                single_statement=single_statement,
                doing="reading _scheduled_functions",
            )
        if self._before_read is not None:
            await self._before_read()
        return await read(self._conn)


class _BaseCtx:
    def __init__(self, runtime: Runtime, run_id: ScheduledFunctionId | None) -> None:
        self._rt = runtime
        self.run_id = run_id
        """The scheduled run this code belongs to; None when called directly from outside."""

    def now(self) -> datetime:
        """The runtime clock's current time (the fake clock in tests)."""
        return to_datetime(self._rt.clock.now())


class QueryCtx(_BaseCtx):
    """What a query receives: read-only access to user tables and the system table."""

    def __init__(self, runtime: Runtime, db: AsyncSession, system: SystemTable) -> None:
        super().__init__(runtime, None)
        self.db = db
        """A read-only ``AsyncSession``: a write raises ReadOnlyError."""
        self.system = system

    @property
    def scheduler(self) -> NoReturn:
        raise ReadOnlyError("queries are read-only and cannot schedule; schedule from a mutation")


class MutationParts:
    """What a mutation's ``ctx`` builds on first use, and what it was used for: its
    scheduler (and the buffered writer under it) and its system table. Most mutations
    use neither: building both, with a writer, for every run was 5% of a no-op mutation's
    CPU in a PostgreSQL drain (py-spy). ``used_db``: whether the run reached for its
    session at all (only then can it have left writes, or the transaction, to check)."""

    __slots__ = (
        "_conn",
        "_new_writer",
        "_own_run_id",
        "_parent_id",
        "_rt",
        "_scheduler",
        "_system",
        "db",
        "used_db",
        "writer",
    )

    def __init__(
        self,
        runtime: Runtime,
        conn: AsyncConnection,
        db: AsyncSession,
        new_writer: Callable[[], BufferedWriter],
        *,
        parent_id: ScheduledFunctionId | None,
        own_run_id: ScheduledFunctionId | None = None,
    ) -> None:
        self._rt = runtime
        self._conn = conn
        self._new_writer = new_writer
        self._parent_id = parent_id
        self._own_run_id = own_run_id
        self._scheduler: Scheduler | None = None
        self._system: SystemTable | None = None
        self.db = db
        self.used_db = False
        self.writer: BufferedWriter | None = None
        """The writer of what the run scheduled, once it scheduled (or cancelled)."""

    def scheduler(self) -> Scheduler:
        if self._scheduler is None:
            self.writer = self._new_writer()
            self._scheduler = Scheduler(
                self._rt, self.writer, parent_id=self._parent_id, own_run_id=self._own_run_id
            )
        return self._scheduler

    def system(self) -> SystemTable:
        if self._system is None:
            self._system = SystemTable(self._rt, self._conn, self._flush)
        return self._system

    async def _flush(self) -> None:
        """Before the system table is read: what the run scheduled, written first."""
        if self.writer is not None:
            await self.writer.flush()

    @property
    def limit_error(self) -> Exception | None:
        """The scheduling limit the run hit (and may have caught), if any."""
        return self._scheduler.limit_error if self._scheduler is not None else None


class MutationCtx(_BaseCtx):
    """What a mutation receives: one transaction for its writes and what it schedules."""

    def __init__(
        self, runtime: Runtime, parts: MutationParts, run_id: ScheduledFunctionId | None
    ) -> None:
        super().__init__(runtime, run_id)
        self._parts = parts

    @property
    def db(self) -> AsyncSession:
        """An ``AsyncSession`` inside the mutation's transaction; do not commit it yourself."""
        self._parts.used_db = True
        return self._parts.db

    @property
    def scheduler(self) -> Scheduler:
        """Schedules rows that commit with the mutation, or not at all."""
        return self._parts.scheduler()

    @property
    def system(self) -> SystemTable:
        """Reads ``_scheduled_functions`` in the mutation's transaction (what it has
        scheduled included)."""
        return self._parts.system()


class Runner(Protocol):
    """What runs a function directly for ``ActionCtx.run_*`` (``_invoke.Invoker``)."""

    async def query(
        self, ref: QueryRef[Any, R], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> R: ...

    async def mutation(
        self,
        ref: MutationRef[Any, R],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        *,
        parent_id: ScheduledFunctionId | None = None,
    ) -> R: ...

    async def action(
        self,
        ref: ActionRef[Any, R],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        *,
        run_id: ScheduledFunctionId | None = None,
    ) -> R: ...


class ActionCtx(_BaseCtx):
    """What an action receives: no transaction; each call below commits on its own."""

    def __init__(
        self, runtime: Runtime, runner: Runner, run_id: ScheduledFunctionId | None
    ) -> None:
        super().__init__(runtime, run_id)
        self._runner = runner
        self._progress: Progress | None = None
        self._stopped = False

    # Built on first use: most actions never schedule, and building both for every run
    # was a fifth of a no-op action's time in the worker (py-spy, PostgreSQL drain).
    @cached_property
    def scheduler(self) -> Scheduler:
        """Schedules rows that commit at once, each call on its own."""
        return Scheduler(
            self._rt, DirectWriter(self._rt, check_parent=self.run_id), parent_id=self.run_id
        )

    @cached_property
    def system(self) -> SystemTable:
        """Reads ``_scheduled_functions``, each call in its own read."""
        return SystemTable(self._rt, None)

    @property
    def cancel_requested(self) -> bool:
        """Whether this run's row has been cancelled while it runs (``cancel(id)``, here or
        in any process): stop early, the row is Canceled whatever this returns. Always
        False when the action was called directly (``app.run_action``)."""
        cancellation = self._rt.cancels.get(self.run_id)
        return cancellation is not None and cancellation.requested

    @property
    def stop_requested(self) -> bool:
        """Whether this run should stop: its row was cancelled (``cancel_requested``), or,
        for a ``def`` action, its run has ended without it (its time limit, a stop of
        the worker) while its thread runs on (``_sync_functions``). Check it between
        units of work."""
        return self._stopped or self.cancel_requested

    @cached_property
    def sync_scheduler(self) -> SyncScheduler:
        """``scheduler`` for a ``def`` action: the same calls, not awaited (rows commit at
        once, each call on its own, this run their parent)."""
        from ._sync_runtime import SyncRuntime
        from ._sync_scheduler import SyncScheduler

        srt = SyncRuntime.for_(self._rt)
        writer = DirectWriter(srt, check_parent=self.run_id)
        return SyncScheduler(Scheduler(srt, writer, parent_id=self.run_id))

    async def progress(self, fraction: float, message: str | None = None) -> None:
        """Report how far this run has got: ``fraction`` from 0 to 1 and a short message
        (at most 1,000 characters), stored on its row (``get``, ``durafn show``, ``ls``)
        at most once a second (``_progress``: a report within a second of the last one
        written is skipped). A bad value raises ``ArgumentError``. Nothing is stored for
        a direct call (``app.run_action``), which has no row."""
        fraction, message = checked(fraction, message)
        if self.run_id is None:
            return
        if self._progress is None:
            self._progress = Progress(self._rt, self.run_id)
        await self._progress.report(fraction, message)

    async def wait_for_cancel(self) -> None:
        """Return once this run's row is cancelled (never, for a direct call): race it
        against your work, e.g. in a task group whose scope you cancel."""
        cancellation = self._rt.cancels.get(self.run_id)
        if cancellation is None:
            await anyio.sleep_forever()
        else:
            await cancellation.wait()

    async def run_query(self, fn: QueryRef[P, R], /, *args: P.args, **kwargs: P.kwargs) -> R:
        """Run a query in its own read-only transaction."""
        return await self._runner.query(fn, args, kwargs)

    async def run_mutation(self, fn: MutationRef[P, R], /, *args: P.args, **kwargs: P.kwargs) -> R:
        """Run a mutation in its own transaction, committed before this returns."""
        return await self._runner.mutation(fn, args, kwargs, parent_id=self.run_id)

    async def run_action(self, fn: ActionRef[P, R], /, *args: P.args, **kwargs: P.kwargs) -> R:
        """Run another action inline, in this process."""
        return await self._runner.action(fn, args, kwargs, run_id=self.run_id)


def read_only_session(conn: AsyncConnection) -> AsyncSession:
    """A session that refuses to flush, over a connection whose transaction refuses writes."""
    session = AsyncSession(bind=conn)

    def _refuse(*_: Any) -> None:
        raise ReadOnlyError("a query cannot write to the database; do the write in a mutation")

    event.listen(session.sync_session, "before_flush", _refuse)
    return session


def row_filter(
    *,
    state: State | Sequence[State] | None = None,
    name: str | None = None,
    scheduled_after: datetime | None = None,
    scheduled_before: datetime | None = None,
    queue: str | None = None,
    key: str | None = None,
    flag: str | None = None,
    parent: ScheduledFunctionId | str | None = None,
    args: Mapping[str, str | int | float | bool] | None = None,
    args_contain: Mapping[str, str | int | float | bool] | None = None,
) -> RowFilter:
    """A ``RowFilter`` from the public keyword arguments, each checked."""
    parent_id = None
    if parent is not None:
        parent_id = scheduled_id(parent)
        if parent_id is None:
            raise ArgumentError(f"parent must be a scheduled function's id, not {parent!r}")
    return RowFilter(
        args=_argument_terms(args, "args"),
        contains=_argument_terms(args_contain, "args_contain"),
        parent=parent_id,
        states=None if state is None else state_list("state", state),
        name=optional(text, "name", name),
        queue=optional(text, "queue", queue),
        key=optional(text, "key", key),
        flag=optional(check_flag, "flag", flag, error=ArgumentError),
        after=optional(aware_time, "scheduled_after", scheduled_after),
        before=optional(aware_time, "scheduled_before", scheduled_before),
    )


_PATH = re.compile(r"[A-Za-z0-9_]+(\.[A-Za-z0-9_]+)*")


def _argument_terms(
    args: Mapping[str, str | int | float | bool] | None, what: str
) -> tuple[tuple[str, str | int | float | bool], ...]:
    """``args={"user_id": 42, "address.city": "Oslo"}``: paths of letters, digits and
    underscores joined by dots, each with a JSON scalar (``what``: the parameter)."""
    if args is None:
        return ()
    if not isinstance(args, Mapping):
        raise ArgumentError(f"{what} must map argument paths to values, not {args!r}")
    terms = []
    for path, value in sorted(args.items()):
        if not isinstance(path, str) or not _PATH.fullmatch(path):
            raise ArgumentError(
                f"{what}: {path!r} is not an argument path (names of letters, digits and "
                "underscores, joined by dots: 'user_id', 'address.city')"
            )
        if not isinstance(value, str | int | float | bool):
            raise ArgumentError(
                f"{what}: {path!r} must be given a string, number or boolean, not {value!r}"
            )
        terms.append((path, value))
    return tuple(terms)


publish(globals())
