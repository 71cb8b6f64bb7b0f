"""``ctx.scheduler``: run_after, run_at, run_many and cancel, validated when called.

Every route builds rows the same way (``_row``): arguments validated against the
function's signature, options taken from the reference (``ref.options(...)`` over the
decorator's, over the queue's attributes), limits counted. Where the rows go depends on
who schedules: the writers of ``_writers.py``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any, ParamSpec, Protocol, overload

from ._batching import BatchActionRef, refuse_options
from ._checks import aware_time, finite_seconds, is_number, one_id
from ._errors import (
    CancelOwnRunError,
    NotFoundError,
    OptionError,
    SchedulingError,
    SchedulingLimitError,
)
from ._groups import GROUP_COMPLETE, GroupCompletion, check_group_callback, group_ids
from ._kinds import ScheduledFunctionId, State
from ._models import CancelResult
from ._public import publish
from ._registry import Call, MutationRef, SchedulableRef, StartableRef
from ._runtime import Limits, Runtime
from ._store import NewRow, new_id, new_row

P = ParamSpec("P")

MAX_HORIZON = 5 * 365.25 * 86400.0
"""How far ahead a function may be scheduled: 5 years."""


OUTSIDE_BATCH = Limits(max_scheduled=10_000, max_args_bytes=64 * 1024 * 1024)
"""What one ``run_many`` from outside durafn may write (a function execution has its own
limits, for all it schedules)."""


class _Writer(Protocol):
    async def add(self, rows: list[NewRow]) -> list[ScheduledFunctionId]: ...

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
        self._limits = runtime.limits
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

    async def group(
        self,
        ids: Iterable[ScheduledFunctionId | str],
        /,
        *,
        on_complete: MutationRef[[GroupCompletion], Any],
    ) -> ScheduledFunctionId:
        """Call ``on_complete`` once, with a ``GroupCompletion`` (the counts by final
        state), when every row of ``ids`` (written already, in this transaction or
        earlier; 0 to 10,000) has finished for good: Success, Failed after its last
        attempt, or Canceled. Never lost, never twice (``_groups``). Returns the id of the
        row that completes the group (``durafn:group_complete``)."""
        check_group_callback("on_complete", on_complete, error=SchedulingError)
        rows = group_ids(ids)
        ref = self._rt.registry.get(GROUP_COMPLETE)
        assert isinstance(ref, SchedulableRef)
        if rows:
            ref = ref.options(after=rows)
        return await self.run_after(0, ref, callback=on_complete.name, ids=rows)

    async def start_workflow(
        self, workflow: StartableRef[P, Any], /, *args: P.args, **kwargs: P.kwargs
    ) -> str:
        """Start a durable workflow (``@app.workflow``) in this scheduler's transaction:
        its row and its first turn commit with the caller's writes, or not at all.
        Returns the workflow's id (``app.get_workflow``)."""
        return str(await self._workflows().start(self, workflow, args, kwargs))

    async def send_event(self, workflow_id: str, name: str, payload: Any = None) -> bool:
        """Send ``payload`` (JSON) as event ``name`` to a workflow, in this scheduler's
        transaction (a rollback unsends it). A ``wait_for_event(name)`` takes it, now or
        when it starts waiting, each event once. False if the workflow has ended (nothing
        is kept); ``WorkflowNotFoundError`` if there is no such workflow."""
        return bool(await self._workflows().send_event(self, workflow_id, name, payload))

    def _workflows(self) -> Any:
        """``_workflow.lifecycle``, once a workflow is registered on the app."""
        found = self._rt.registry.workflow_ops
        if found is None:
            raise SchedulingError(
                "no durable workflow is registered on this app: declare one with @app.workflow"
            )
        return found

    async def cancel(self, id: ScheduledFunctionId | str) -> CancelResult:
        """Cancel a scheduled function.

        Pending: it never runs. InProgress (an action): it keeps running, but its result is
        not recorded over Canceled, and what it scheduled and has not started is cancelled
        too, transitively. Already finished: nothing changes and ``canceled`` is False.
        """
        target = one_id(id, "cancel", ", or cancel_where(...) to cancel by filters")
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

    async def run_many(self, calls: Iterable[Call], /) -> list[ScheduledFunctionId]:
        """Schedule many calls at once: ``[send.call(user=1), send.options(priority=5)
        .call(user=2).after(60), ...]``, each with its own function, arguments, options
        and time (``Call.after``/``Call.at``; default: now). Returns the id that runs for
        each, in order.

        One statement writes the rows without keys, one per key mode those with keys.
        Inside a function the calls count against its limits (1000 functions, 8 MB);
        from outside one call takes at most 10,000. All or nothing: a bad call (or
        option) raises before anything is written. Keys follow Graphile's batch rules:
        ``unsafe_dedupe`` is refused, and a key may appear once per batch.
        """
        if isinstance(calls, Call) or not isinstance(calls, Iterable):
            raise SchedulingError(
                f"run_many takes a list of calls (fn.call(...)), not {type(calls).__name__}"
            )
        batch = list(calls)
        if not batch:
            return []
        now = self._rt.clock.now()
        rows: list[NewRow] = []
        keys: set[str] = set()
        with self._counting(OUTSIDE_BATCH if self._per_call else None):
            for i, call in enumerate(batch):
                if not isinstance(call, Call):
                    raise SchedulingError(
                        f"run_many: item {i} is {call!r}, not a call; build one with "
                        "fn.call(*args, **kwargs)"
                    )
                due = _call_time(call, now)
                row = self._row(due, now, call.fn, call.args, call.kwargs)
                # Debounced calls of one key may share a batch: each joins the waiting row.
                if (key := row["job_key"]) is not None and row["debounce"] is None:
                    if row["key_mode"] == "unsafe_dedupe":
                        raise OptionError(
                            f"run_many: item {i} uses key_mode='unsafe_dedupe', which a "
                            "batch refuses (Graphile's rule); schedule it on its own"
                        )
                    if key in keys:
                        raise OptionError(f"run_many: the key {key!r} appears twice in one batch")
                    keys.add(key)
                rows.append(row)
        return await self._writer.add(rows)

    async def _schedule(
        self,
        due: float,
        now: float,
        fn: SchedulableRef[Any, Any] | str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> ScheduledFunctionId:
        if self._per_call:
            self._count = self._bytes = 0
        self._limits = self._rt.limits
        # _row counts the row last, once every check has passed: a bad call counts nothing.
        [id] = await self._writer.add([self._row(due, now, fn, args, kwargs)])
        return id

    @contextmanager
    def _counting(self, limits: Limits | None) -> Iterator[None]:
        """Count a batch's rows against ``limits`` (default the app's per-run limits); a
        batch that raises counts nothing (nothing of it is written)."""
        if self._per_call:
            self._count = self._bytes = 0
        saved = self._count, self._bytes
        self._limits = limits or self._rt.limits
        try:
            yield
        except BaseException:
            self._count, self._bytes = saved
            raise

    def _row(
        self,
        due: float,
        now: float,
        fn: SchedulableRef[Any, Any] | str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> NewRow:
        if due - now > MAX_HORIZON:
            raise SchedulingError(
                f"cannot schedule more than 5 years ahead ({(due - now) / 86400:.0f} days asked)"
            )
        ref = self._rt.registry.resolve(fn)
        if not isinstance(ref, SchedulableRef):
            raise SchedulingError(
                f"{ref.name!r} is {ref.kind.with_article}; only mutations and actions can be "
                "scheduled"
            )
        values, args_json = ref.encode_call(args, kwargs)
        options = self._rt.row_options(ref.job_options)
        size = len(args_json) if args_json.isascii() else len(args_json.encode())
        limits = self._limits
        who = "one call from outside" if limits is OUTSIDE_BATCH else "one function execution"
        if self._count + 1 > limits.max_scheduled:
            self._limit(f"{who} may schedule at most {limits.max_scheduled} functions")
        if self._bytes + size > limits.max_args_bytes:
            self._limit(
                f"{who} may schedule at most {limits.max_args_bytes} bytes of "
                f"arguments; this call would bring it to {self._bytes + size}"
            )
        flow_key = options.flow.key_of(ref.name, values) if options.flow is not None else None
        after = ref.job_options.after
        if after is not None and (
            options.key is not None or options.flow is not None or options.queue is not None
        ):
            raise OptionError(
                "after= cannot be combined with a job key, flow control or a named queue: a "
                "keyed or debounced call may join a row that exists already, and a row "
                "waiting at the head of a queue would hold back the rows behind it"
            )
        batch_key = None
        if isinstance(ref, BatchActionRef):
            batch_key = ref.key_of(values)
            refuse_options(ref.name, options.queue, options.flow, after, error=OptionError)
        self._count += 1
        self._bytes += size
        return new_row(
            id=new_id(now),
            name=ref.name,
            kind=ref.kind.value,
            args=args_json,
            due=due,
            parent_id=self._parent_id,
            options=options,
            flow_key=flow_key,
            trace_context=self._rt.telemetry.capture(),
            after=after,
            batch_key=batch_key,
        )

    def _limit(self, message: str) -> None:
        self.limit_error = SchedulingLimitError(
            f"{message}; split the work across several runs (the limit is set by "
            "App(max_scheduled_per_run=..., max_scheduled_args_bytes=...))"
        )
        raise self.limit_error


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


def _call_time(call: Call, now: float) -> float:
    """A ``Call``'s time: now, after its delay, or at its time."""
    if call.when is not None:
        return _when_seconds(call.when, now)
    return now if call.delay is None else now + _delay_seconds(call.delay)


publish(globals())
