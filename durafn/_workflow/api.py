"""What a workflow's author writes against: ``WorkflowRef`` (what ``@app.workflow``
returns) and ``WorkflowCtx`` (what its body receives, conventionally named ``step``).

Each ``step.run_*``, ``sleep``, ``wait_for_event`` and ``run_workflow`` call takes the
next step number at once, in call order, and returns a future: resolved already when the
journal holds that step's outcome (a replay), else left for the turn to start the step
(``replay.Turn``). Calling them in the same order on every replay is all that
determinism asks; ``asyncio.gather`` of several calls starts them in one turn.
"""

from __future__ import annotations

import asyncio
import json
import random
import uuid
from collections.abc import Awaitable, Callable, Generator
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, ParamSpec, Protocol, TypeVar

from .._checks import aware_time, finite_seconds, is_number
from .._clock import to_datetime
from .._errors import CallError, SchedulingError
from .._kinds import FunctionKind
from .._public import publish
from .._registry import ActionRef, FunctionRef, MutationRef, QueryRef, StartableRef

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")

MAX_STEPS = 10_000
"""The most steps one workflow may take; the step past it fails (``WorkflowLimitError``)."""
MAX_RESULT_BYTES = 1024 * 1024
"""The largest result (or event payload) one step may journal, as JSON: 1 MiB."""
MAX_JOURNAL_BYTES = 16 * 1024 * 1024
"""The most bytes of results one workflow's journal may hold: 16 MiB."""
INLINE_STEPS_PER_TURN = 100
"""Mutation and query steps run in one turn's transaction before it hands over to a new
turn: a bound on the turn's time and locks, not on the workflow."""
INLINE_SECONDS = 1.0
"""Nor is a mutation or query step begun in a turn that has run this long (real time:
it bounds how long the turn holds its locks, within its time limit)."""

_NAMESPACE = uuid.UUID("5f0c9a52-1d6e-4c3b-9a57-2f1f3d0b7e11")


def step_row_id(workflow_id: str, step_no: int) -> str:
    """The id of the row that runs an action step (and of a child workflow): made from
    the workflow's id and the step's number, so it is the same on every retry of the
    step and is the step's idempotency key (``ctx.run_id`` in the action)."""
    return str(uuid.uuid5(_NAMESPACE, f"{workflow_id}/{step_no}"))


class Turn(Protocol):
    """What the body's calls reach: the turn replaying it (``replay.Turn``)."""

    workflow_time: float
    blocked: dict[object, StepFuture[Any]]

    def observed(self, ended_at: float | None) -> None: ...

    def resolve(self, fn: FunctionRef[Any, Any]) -> FunctionRef[Any, Any]: ...

    def workflow_ref(self, fn: WorkflowRef[Any, Any]) -> WorkflowRef[Any, Any]: ...

    def request(
        self,
        kind: str,
        name: str,
        args: str,
        *,
        ref: FunctionRef[Any, Any] | None = None,
        values: dict[str, Any] | None = None,
        wait: float | None = None,
        until: float | None = None,
    ) -> StepFuture[Any]: ...


class WorkflowRef(StartableRef[P, R]):
    """A registered durable workflow: ``@app.workflow`` over ``async def f(step:
    WorkflowCtx, ...)``. Start it with ``app.start_workflow(f, ...)`` or, atomically with
    a mutation's writes, ``ctx.scheduler.start_workflow(f, ...)``."""

    kind = "workflow"  # type: ignore[assignment]  # not a FunctionKind: never a row's

    if not TYPE_CHECKING:

        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            raise CallError(
                f"{self.name!r} is a durafn workflow, not a plain function: start it with "
                f"await app.start_workflow({self.__wrapped__.__name__}, ...)"
            )


class StepFuture(asyncio.Future[T]):
    """A step's outcome. Reading it (awaiting it, or ``gather`` doing so) moves the
    workflow's clock (``WorkflowCtx.now``) to when the step ended, the same on every
    replay."""

    def __init__(self, turn: Turn, step_no: int) -> None:
        super().__init__()
        self.step_no = step_no
        self.ended_at: float | None = None
        self._turn = turn

    def result(self) -> T:
        self._turn.observed(self.ended_at)
        return super().result()

    def exception(self) -> BaseException | None:
        self._turn.observed(self.ended_at)
        return super().exception()

    def __await__(self) -> Generator[Any, None, T]:
        if not self.done():
            # Which task waits on which step: a turn sees at once that its body's own
            # task is blocked on a step not yet resolved (``turns._settle``).
            task = asyncio.current_task()
            self._turn.blocked[task] = self
            self._asyncio_future_blocking = True
            try:
                yield self
            finally:
                self._turn.blocked.pop(task, None)
        return self.result()

    __iter__ = __await__


class WorkflowCtx:
    """What a workflow's body receives: its steps, and a clock and ids that are the same
    on every replay. Await only steps (one at a time, or several with
    ``asyncio.gather``): the body is re-run from the start at every turn, the journal
    answering the steps it has taken."""

    def __init__(self, turn: Turn, workflow_id: str) -> None:
        self._turn = turn
        self.workflow_id = workflow_id
        """This workflow run's id."""
        self.random = random.Random(workflow_id)
        """Random numbers the same on every replay (seeded with the workflow's id): draw
        them in the same order."""
        self._ids = 0

    def now(self) -> datetime:
        """The workflow's time: when it started, moved to the end of each step whose
        outcome it has read; the same at the same point of every replay (never the
        wall clock, which would differ)."""
        return to_datetime(self._turn.workflow_time)

    def uuid(self) -> uuid.UUID:
        """A new id, the same at the same point of every replay."""
        self._ids += 1
        return uuid.uuid5(_NAMESPACE, f"{self.workflow_id}#{self._ids}")

    def run_query(self, fn: QueryRef[P, R], /, *args: P.args, **kwargs: P.kwargs) -> Awaitable[R]:
        """A query step: run in the turn's transaction, its result journaled."""
        return self._call(FunctionKind.QUERY, QueryRef, fn, args, kwargs)

    def run_mutation(
        self, fn: MutationRef[P, R], /, *args: P.args, **kwargs: P.kwargs
    ) -> Awaitable[R]:
        """A mutation step: run in the turn's transaction (a savepoint of it), its effects
        and its journal entry committed together: exactly once."""
        return self._call(FunctionKind.MUTATION, MutationRef, fn, args, kwargs)

    def run_action(self, fn: ActionRef[P, R], /, *args: P.args, **kwargs: P.kwargs) -> Awaitable[R]:
        """An action step: scheduled as a row, at most once, or at least once under a
        retry policy (``fn.options(retry=durafn.Retry(...))``, or its decorator's). Its
        row's id (``ctx.run_id`` in the action) is its idempotency key."""
        return self._call(FunctionKind.ACTION, ActionRef, fn, args, kwargs)

    def run_workflow(
        self, fn: WorkflowRef[P, R], /, *args: P.args, **kwargs: P.kwargs
    ) -> Awaitable[R]:
        """A child workflow: started in this turn, its result (or failure) this step's."""
        ref = self._turn.workflow_ref(fn)
        values, args_json = ref.encode_call(args, kwargs)
        return self._turn.request("workflow", ref.name, args_json, ref=ref, values=values)

    def sleep(self, delay: timedelta | float) -> Awaitable[None]:
        """Sleep durably: the workflow is a Pending row until then, holding no process."""
        if isinstance(delay, timedelta):
            seconds = delay.total_seconds()
        elif is_number(delay):
            seconds = finite_seconds("delay", delay, error=SchedulingError)
        else:
            raise SchedulingError(f"sleep takes a timedelta or seconds, not {delay!r}")
        if seconds < 0:
            raise SchedulingError(f"sleep takes a delay of 0 or more, not {seconds}")
        return self._turn.request("sleep", "sleep", json.dumps({"seconds": seconds}), wait=seconds)

    def sleep_until(self, when: datetime | float) -> Awaitable[None]:
        """Sleep durably until an aware datetime (or epoch seconds)."""
        at = (
            aware_time("when", when, error=SchedulingError)
            if isinstance(when, datetime)
            else finite_seconds("when", when, error=SchedulingError)
        )
        return self._turn.request("sleep", "sleep", json.dumps({"until": at}), until=at)

    def wait_for_event(
        self, name: str, *, timeout: timedelta | float | None = None
    ) -> Awaitable[Any]:
        """The payload of the next event ``name`` sent to this workflow
        (``app.send_event``), one sent before the wait began included; raises
        ``WorkflowTimeoutError`` after ``timeout`` without one."""
        if not isinstance(name, str) or not name:
            raise SchedulingError(f"an event's name is a non-empty string, not {name!r}")
        seconds = None
        if timeout is not None:
            seconds = timeout.total_seconds() if isinstance(timeout, timedelta) else timeout
            seconds = finite_seconds("timeout", seconds, error=SchedulingError)
        return self._turn.request("event", name, json.dumps({"timeout": seconds}), wait=seconds)

    def _call(
        self,
        kind: FunctionKind,
        cls: type[FunctionRef[Any, Any]],
        fn: FunctionRef[Any, Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Awaitable[Any]:
        ref = self._turn.resolve(fn)
        if not isinstance(ref, cls):
            raise SchedulingError(
                f"step.run_{kind.value} takes {kind.with_article}; {ref.name!r} is "
                f"{ref.kind.with_article}"
            )
        if kind is FunctionKind.ACTION:
            _refuse_step_options(fn)
        values, args_json = ref.encode_call(args, kwargs)
        # A per-call option set (fn.options(retry=...)) rides with the reference.
        return self._turn.request(kind.value, ref.name, args_json, ref=fn, values=values)


def _refuse_step_options(fn: FunctionRef[Any, Any]) -> None:
    """An action step's row must be the one it writes, and its completion the step's:
    options that may make another row run for it, or take its completion, are refused
    where the step is asked for (priority, queue, flags, retry and flow limits are fine)."""
    options = fn.job_options
    flow = options.flow
    taken = [
        name
        for name, used in (
            ("a job key", options.key is not None),
            ("after=", options.after is not None),
            ("on_complete", options.on_complete is not None),
            ("a debounce", flow is not None and flow.debounce is not None),
            ("a throttle", flow is not None and flow.throttle is not None),
        )
        if used
    ]
    if taken:
        raise SchedulingError(
            f"an action step cannot take {' or '.join(taken)} ({fn.name!r}): its row must "
            "run for this step alone, and its outcome come back to the workflow; schedule "
            "such a call from a mutation step instead"
        )


WorkflowBody = Callable[..., Awaitable[Any]]

publish(globals())
