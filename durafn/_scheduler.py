"""``ctx.scheduler``: run_after, run_at and cancel, validated when called.

Where the rows go depends on who schedules, so the scheduler writes through one of three
writers:

* a mutation buffers its rows and writes them in one multi-row INSERT just before its
  transaction commits (or earlier, when it cancels or reads the system table): atomic with
  the mutation, and one round trip for a thousand rows;
* an action commits each call at once, so the row survives the action failing later;
* code outside durafn writes through its own session or connection, committing with it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection
from datetime import datetime, timedelta
from typing import Any, ParamSpec, Protocol, overload

from sqlalchemy import event
from sqlalchemy import exc as sa_exc
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

from ._checks import aware_time, finite_seconds, is_number, scheduled_id
from ._errors import (
    CancelOwnRunError,
    NotFoundError,
    SchedulingError,
    SchedulingLimitError,
)
from ._registry import SchedulableRef
from ._runtime import Runtime
from ._store import new_id
from ._types import CancelResult, FunctionKind, ScheduledFunctionId, State

P = ParamSpec("P")

MAX_HORIZON = 5 * 365.25 * 86400.0
"""How far ahead a function may be scheduled: 5 years."""


class _Writer(Protocol):
    async def add(self, row: dict[str, Any]) -> None: ...

    async def cancel(self, id: ScheduledFunctionId, now: float) -> State | None: ...


class Scheduler:
    """Schedules and cancels functions. Reach it as ``ctx.scheduler`` or ``app.scheduler(...)``."""

    def __init__(
        self,
        runtime: Runtime,
        writer: _Writer,
        *,
        parent_id: ScheduledFunctionId | None = None,
        own_run_id: ScheduledFunctionId | None = None,
        per_call: bool = False,
    ) -> None:
        self._rt = runtime
        self._per_call = per_call
        self._writer = writer
        self._parent_id = parent_id
        self._own_run_id = own_run_id
        self._count = 0
        self._bytes = 0
        self.limit_error: SchedulingLimitError | None = None
        """Set once a limit was exceeded: the enclosing mutation must then fail."""

    @overload
    async def run_after(
        self,
        delay: float | timedelta,
        fn: SchedulableRef[P, Any],
        /,
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> ScheduledFunctionId: ...

    @overload
    async def run_after(
        self, delay: float | timedelta, fn: str, /, *args: Any, **kwargs: Any
    ) -> ScheduledFunctionId: ...

    async def run_after(
        self,
        delay: float | timedelta,
        fn: SchedulableRef[Any, Any] | str,
        /,
        *args: Any,
        **kwargs: Any,
    ) -> ScheduledFunctionId:
        """Schedule ``fn(*args, **kwargs)`` to run ``delay`` seconds (or a timedelta) from now.

        A delay of 0 queues it to run as soon as the current transaction commits.
        """
        now = self._rt.clock.now()
        return await self._schedule(now + _delay_seconds(delay), now, fn, args, kwargs)

    @overload
    async def run_at(
        self,
        when: datetime | float,
        fn: SchedulableRef[P, Any],
        /,
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> ScheduledFunctionId: ...

    @overload
    async def run_at(
        self, when: datetime | float, fn: str, /, *args: Any, **kwargs: Any
    ) -> ScheduledFunctionId: ...

    async def run_at(
        self,
        when: datetime | float,
        fn: SchedulableRef[Any, Any] | str,
        /,
        *args: Any,
        **kwargs: Any,
    ) -> ScheduledFunctionId:
        """Schedule ``fn`` at an aware ``datetime`` or epoch seconds.

        A time in the past runs as soon as possible; the row keeps the time asked for.
        """
        now = self._rt.clock.now()
        return await self._schedule(_when_seconds(when, now), now, fn, args, kwargs)

    async def cancel(self, id: ScheduledFunctionId | str) -> CancelResult:
        """Cancel a scheduled function.

        Pending: it never runs. InProgress (an action): it keeps running, but its result is
        not recorded over Canceled, and what it scheduled and has not started is cancelled
        too, transitively. Already finished: nothing changes and ``canceled`` is False.
        """
        target = scheduled_id(id)
        if target is None:
            raise NotFoundError(str(id), malformed=True)
        if self._own_run_id is not None and target == self._own_run_id:
            raise CancelOwnRunError(
                f"a mutation cannot cancel its own run ({target}); raise an exception to "
                "abort it instead"
            )
        previous = await self._writer.cancel(target, self._rt.clock.now())
        if previous is None:
            raise NotFoundError(target)
        return CancelResult(id=target, canceled=not previous.finished, previous_state=previous)

    async def _schedule(
        self,
        due: float,
        now: float,
        fn: SchedulableRef[Any, Any] | str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> ScheduledFunctionId:
        if due - now > MAX_HORIZON:
            raise SchedulingError(
                f"cannot schedule more than 5 years ahead ({(due - now) / 86400:.0f} days asked)"
            )
        ref = self._rt.registry.resolve(fn)
        if not isinstance(ref, SchedulableRef):
            raise SchedulingError(
                f"{ref.name!r} is a {ref.kind}; only mutations and actions can be scheduled"
            )
        args_json = ref.encode_args(args, kwargs)
        size = len(args_json) if args_json.isascii() else len(args_json.encode())
        limits = self._rt.limits
        if self._per_call:
            self._count = self._bytes = 0
        if self._count + 1 > limits.max_scheduled:
            self._limit(
                f"one function execution may schedule at most {limits.max_scheduled} functions"
            )
        if self._bytes + size > limits.max_args_bytes:
            self._limit(
                f"one function execution may schedule at most {limits.max_args_bytes} bytes of "
                f"arguments; this call would bring it to {self._bytes + size}"
            )
        self._count += 1
        self._bytes += size
        id = new_id(now)
        await self._writer.add(
            {
                "id": id,
                "name": ref.name,
                "kind": ref.kind.value,
                "args": args_json,
                "state": _PENDING,
                "scheduled_time": due,
                "available_at": due,
                "completed_time": None,
                "parent_id": self._parent_id,
            }
        )
        return id

    def _limit(self, message: str) -> None:
        self.limit_error = SchedulingLimitError(
            f"{message}; split the work across several runs (the limit is set by "
            "App(max_scheduled_per_run=..., max_scheduled_args_bytes=...))"
        )
        raise self.limit_error


_PENDING = State.PENDING.value


def _delay_seconds(delay: object) -> float:
    if isinstance(delay, timedelta):
        seconds = delay.total_seconds()
    elif is_number(delay):
        seconds = finite_seconds("delay", delay, error=SchedulingError)
    else:
        raise SchedulingError(f"delay must be seconds (a number) or a timedelta, not {delay!r}")
    if seconds < 0:
        raise SchedulingError(
            f"delay must not be negative ({seconds}s); use run_at for a past time"
        )
    return seconds


def _when_seconds(when: object, now: float) -> float:
    if isinstance(when, datetime):
        if when.tzinfo is None or when.utcoffset() is None:
            raise SchedulingError(
                f"run_at needs an aware datetime, got naive {when.isoformat()}; "
                "use datetime.now(UTC) or attach a tzinfo"
            )
        seconds = aware_time("run_at time", when, error=SchedulingError)
    elif is_number(when):
        seconds = finite_seconds("run_at time", when, error=SchedulingError)
    else:
        raise SchedulingError(f"run_at takes an aware datetime or epoch seconds, not {when!r}")
    if seconds < 0:
        raise SchedulingError(
            f"run_at time {when!r} is before 1970; pass an aware datetime or epoch seconds "
            "(a past time runs as soon as possible)"
        )
    return seconds


def _pending_kinds(rows: list[dict[str, Any]]) -> set[FunctionKind]:
    return {FunctionKind(k) for k in {r["kind"] for r in rows if r["state"] == _PENDING}}


class BufferedWriter:
    """A mutation's rows: held until flushed into the mutation's own transaction."""

    FLUSH_AT = 1000

    def __init__(
        self,
        runtime: Runtime,
        conn: AsyncConnection,
        check_parent: ScheduledFunctionId | None,
        before_cancel: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self._rt = runtime
        self._conn = conn
        self._check_parent = check_parent
        self._before_cancel = before_cancel
        self._rows: list[dict[str, Any]] = []
        self.woken: set[FunctionKind] = set()
        """Kinds of Pending rows written: wake executors for them once committed."""

    async def add(self, row: dict[str, Any]) -> None:
        self._rows.append(row)
        if len(self._rows) >= self.FLUSH_AT:
            await self.flush()

    async def flush(self) -> None:
        if not self._rows:
            return
        rows, self._rows = self._rows, []
        new = await _write(self._rt, self._conn, rows, self._check_parent, self.woken)
        self.woken |= new

    def discard(self) -> None:
        self._rows.clear()
        self.woken.clear()

    async def cancel(self, id: ScheduledFunctionId, now: float) -> State | None:
        await self.flush()
        if self._before_cancel is not None:
            await self._before_cancel()
        return await self._rt.driver.cancel(self._conn, id, now)


async def _write(
    rt: Runtime,
    conn: AsyncConnection,
    rows: list[dict[str, Any]],
    check_parent: ScheduledFunctionId | None,
    notified: Collection[FunctionKind] = (),
) -> set[FunctionKind]:
    """Insert ``rows`` with a NOTIFY for the kinds of Pending rows among them not in
    ``notified`` (one per kind per transaction is enough); returns those kinds."""
    if check_parent is not None:
        # The parent is an action that may be cancelled while it runs: what it schedules
        # after that is written Canceled, never left to run.
        parent_state = await rt.driver.lock_for_share(conn, check_parent)
        if parent_state is State.CANCELED:
            now = rt.clock.now()
            for row in rows:
                row["state"] = State.CANCELED.value
                row["completed_time"] = now
    new = _pending_kinds(rows) - set(notified)
    await rt.driver.insert_rows(conn, rows, new)
    return new


class DirectWriter:
    """An action's rows: each call commits on its own, at once."""

    def __init__(self, runtime: Runtime, check_parent: ScheduledFunctionId | None) -> None:
        self._rt = runtime
        self._check_parent = check_parent

    async def add(self, row: dict[str, Any]) -> None:
        rt = self._rt

        attempts = 0

        async def _body(conn: AsyncConnection) -> set[FunctionKind]:
            nonlocal attempts
            attempts += 1
            try:
                return await _write(rt, conn, [row], self._check_parent)
            except sa_exc.IntegrityError:
                # A retry after a fault whose outcome we could not see: the id was chosen
                # here, so if that row exists, with our function and time, the earlier
                # attempt did commit. On a first attempt it is never ours.
                stored = await rt.driver.get(conn, row["id"]) if attempts > 1 else None
                if (
                    stored is None
                    or stored.name != row["name"]
                    # Stored times come back at microsecond precision.
                    or abs(stored.scheduled_time.timestamp() - row["scheduled_time"]) > 1e-3
                ):
                    raise
            kinds = _pending_kinds([row])
            if kinds:
                await rt.driver.notify(conn, kinds)
            return kinds

        # Without a parent to lock, the write is one statement (its NOTIFY included): on
        # PostgreSQL one autocommit round trip instead of four. Retrying it is safe (above).
        single = self._check_parent is None
        rt.wake(await rt.transaction(_body, doing="scheduling a function", single_statement=single))

    async def cancel(self, id: ScheduledFunctionId, now: float) -> State | None:
        async def _body(conn: AsyncConnection) -> State | None:
            return await self._rt.driver.cancel(conn, id, now)

        return await self._rt.transaction(_body, doing="cancelling a scheduled function")


class JoinedWriter:
    """Rows written at once through a caller's session or connection; they commit with it."""

    def __init__(self, runtime: Runtime, target: AsyncSession | AsyncConnection) -> None:
        self._rt = runtime
        self._target = target
        self._to_wake: set[FunctionKind] = set()

    async def _conn(self) -> AsyncConnection:
        if isinstance(self._target, AsyncSession):
            conn = await self._target.connection()
        else:
            conn = self._target
        if not self._rt.ready:
            # Checked through the caller's own transaction: creating the tables from a
            # second connection could wait on the lock that very transaction holds.
            await self._rt.driver.check_schema(conn)
            self._rt.mark_ready()
        return conn

    async def add(self, row: dict[str, Any]) -> None:
        conn = await self._conn()
        try:
            # The caller may reuse this scheduler across transactions, so notify every
            # time (PostgreSQL folds identical notifications within one transaction).
            kinds = await _write(self._rt, conn, [row], None)
        except sa_exc.SQLAlchemyError as exc:
            raise self._rt.driver.wrap(exc, "scheduling through your transaction") from exc
        if not self._to_wake:
            self._after_commit(self._wake)
        self._to_wake |= kinds

    def _wake(self) -> None:
        kinds, self._to_wake = self._to_wake, set()
        self._rt.wake(kinds)

    def _after_commit(self, callback: Callable[[], None]) -> None:
        # In-process executors wake at once; other processes learn by NOTIFY or the poll.
        if isinstance(self._target, AsyncSession):
            event.listen(
                self._target.sync_session, "after_commit", lambda _s: callback(), once=True
            )
        else:
            event.listen(self._target.sync_connection, "commit", lambda _c: callback(), once=True)

    async def cancel(self, id: ScheduledFunctionId, now: float) -> State | None:
        conn = await self._conn()
        try:
            return await self._rt.driver.cancel(conn, id, now)
        except sa_exc.SQLAlchemyError as exc:
            raise self._rt.driver.wrap(exc, "cancelling through your transaction") from exc
