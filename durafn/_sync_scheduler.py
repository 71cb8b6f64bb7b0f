"""``SyncScheduler``: the ``Scheduler``'s methods for synchronous code.

Each method runs the async ``Scheduler``'s own (``_scheduler.py``: the validation of the
arguments against the function's signature, the options, the limits, the errors) over a
writer whose statements run in the caller's thread (``_sync_bridge``), and returns its
value: one implementation of scheduling, two faces.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Iterable
from datetime import datetime, timedelta
from typing import Any, ParamSpec, overload

from ._groups import GroupCompletion
from ._kinds import ScheduledFunctionId
from ._models import CancelResult
from ._public import publish
from ._registry import Call, MutationRef, SchedulableRef, StartableRef
from ._scheduler import Scheduler
from ._sync_bridge import run_now

P = ParamSpec("P")


class SyncScheduler:
    """Schedules and cancels functions from synchronous code: ``app.sync.scheduler(...)``
    (in your transaction), or ``app.sync`` itself (each call commits on its own).

    The same methods as ``Scheduler``, with the same arguments, checks and errors, not
    awaited."""

    def __init__(
        self, scheduler: Scheduler, *, run: Callable[[Coroutine[Any, Any, Any]], Any] = run_now
    ) -> None:
        self._scheduler = scheduler
        self._run = run
        """How a step of the async scheduler is run: at once (``run_now``), or, in a
        ``def`` mutation's greenlet, waited for on its connection (``await_only``)."""

    @overload
    def run_after(
        self,
        delay: float | timedelta,
        fn: SchedulableRef[P, Any],
        /,
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> ScheduledFunctionId: ...

    @overload
    def run_after(
        self, delay: float | timedelta, fn: str, /, *args: Any, **kwargs: Any
    ) -> ScheduledFunctionId: ...

    def run_after(
        self,
        delay: float | timedelta,
        fn: SchedulableRef[Any, Any] | str,
        /,
        *args: Any,
        **kwargs: Any,
    ) -> ScheduledFunctionId:
        """Schedule ``fn(*args, **kwargs)`` to run ``delay`` seconds (or a timedelta) from
        now (``Scheduler.run_after``)."""
        return self._run(self._scheduler.run_after(delay, fn, *args, **kwargs))  # type: ignore[no-any-return]

    @overload
    def run_at(
        self,
        when: datetime | float,
        fn: SchedulableRef[P, Any],
        /,
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> ScheduledFunctionId: ...

    @overload
    def run_at(
        self, when: datetime | float, fn: str, /, *args: Any, **kwargs: Any
    ) -> ScheduledFunctionId: ...

    def run_at(
        self,
        when: datetime | float,
        fn: SchedulableRef[Any, Any] | str,
        /,
        *args: Any,
        **kwargs: Any,
    ) -> ScheduledFunctionId:
        """Schedule ``fn`` at an aware ``datetime`` or epoch seconds (``Scheduler.run_at``)."""
        return self._run(self._scheduler.run_at(when, fn, *args, **kwargs))  # type: ignore[no-any-return]

    def run_many(self, calls: Iterable[Call], /) -> list[ScheduledFunctionId]:
        """Schedule many calls at once, all or nothing (``Scheduler.run_many``)."""
        return self._run(self._scheduler.run_many(calls))  # type: ignore[no-any-return]

    def group(
        self,
        ids: Iterable[ScheduledFunctionId | str],
        /,
        *,
        on_complete: MutationRef[[GroupCompletion], Any],
    ) -> ScheduledFunctionId:
        """Call ``on_complete`` once every row of ``ids`` has finished for good
        (``Scheduler.group``)."""
        return self._run(self._scheduler.group(ids, on_complete=on_complete))  # type: ignore[no-any-return]

    def start_workflow(
        self, workflow: StartableRef[P, Any], /, *args: P.args, **kwargs: P.kwargs
    ) -> str:
        """Start a durable workflow in this scheduler's transaction; its id
        (``Scheduler.start_workflow``)."""
        return self._run(self._scheduler.start_workflow(workflow, *args, **kwargs))  # type: ignore[no-any-return]

    def send_event(self, workflow_id: str, name: str, payload: Any = None) -> bool:
        """Send an event to a workflow in this scheduler's transaction
        (``Scheduler.send_event``)."""
        return self._run(self._scheduler.send_event(workflow_id, name, payload))  # type: ignore[no-any-return]

    def cancel(self, id: ScheduledFunctionId | str) -> CancelResult:
        """Cancel a scheduled function (``Scheduler.cancel``)."""
        return self._run(self._scheduler.cancel(id))  # type: ignore[no-any-return]


publish(globals())
