"""``Harness``: one app on a fake clock, with the steps and assertions tests of scheduled
work are made of (Oban.Testing's ``assert_enqueued`` and ``perform_job``, River's
``rivertest``), as the pytest plugin's ``durafn`` fixture hands it to a test."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, ParamSpec, TypeVar

from .._app import App
from .._cron_rules import schedule_of
from .._executor import Executor
from .._kinds import State
from .._models import ScheduledFunction
from .._registry import ActionRef, FunctionRef, MutationRef, QueryRef
from .._workflow.api import WorkflowRef
from .._workflow.models import Workflow
from .clock import FakeClock
from .running import advance, all_rows, finish_all

P = ParamSpec("P")
R = TypeVar("R")


class Harness:
    """``app`` (on a throwaway database) and the ``clock`` it reads."""

    def __init__(self, app: App, clock: FakeClock) -> None:
        self.app = app
        self.clock = clock
        self._executor: Executor | None = None

    @property
    def executor(self) -> Executor:
        """The app's executor the steps below run (made on first use, with defaults)."""
        if self._executor is None:
            self._executor = self.app.executor()
        return self._executor

    # -- steps -------------------------------------------------------------------------

    async def run_until_idle(self) -> int:
        """Run what is due now, and what that schedules due now, until nothing is; the
        count of runs. The clock does not move."""
        return await self.executor.run_until_idle()

    async def finish_all(self, *, max_steps: int = 100) -> int:
        """Run everything scheduled, moving the clock to each row's due time until nothing
        is Pending; the cron ticks the clock passes run at their own times, and never move
        it (``RunawayError`` after ``max_steps`` moves, naming what keeps scheduling work
        ahead: a function rescheduling itself, a cron; use ``advance`` for those)."""
        return await finish_all(self.executor, self.clock, max_steps=max_steps)

    async def advance(self, by: float | timedelta) -> int:
        """Move the clock on by ``by``, stopping at every due time on the way (rows and
        cron ticks) to run what is due there; the count of runs."""
        return await advance(self.executor, self.clock, by)

    async def perform(self, fn: FunctionRef[P, R], /, *args: P.args, **kwargs: P.kwargs) -> R:
        """Run ``fn`` now, once, as its kind runs (a mutation in its transaction, an action
        with its context, a query read-only), without scheduling it; its result. What it
        schedules is written, as in production: assert on it, or run it."""
        if isinstance(fn, MutationRef):
            return await self.app.run_mutation(fn, *args, **kwargs)
        if isinstance(fn, ActionRef):
            return await self.app.run_action(fn, *args, **kwargs)
        if isinstance(fn, QueryRef):
            return await self.app.run_query(fn, *args, **kwargs)
        raise TypeError(f"perform() takes a durafn function, not {fn!r}")

    async def run_workflow(
        self, workflow: WorkflowRef[P, Any], /, *args: P.args, **kwargs: P.kwargs
    ) -> Workflow:
        """Start a durable workflow and run it as far as it goes on the fake clock
        (``finish_all``: its sleeps and event timeouts pass at their times); the
        workflow, with its journal. One that waits for an event without a timeout is
        returned Running: send it (``send_event``) and ``finish_workflow``."""
        id = await self.app.start_workflow(workflow, *args, **kwargs)
        return await self.finish_workflow(id)

    async def send_event(self, workflow_id: str, name: str, payload: Any = None) -> bool:
        """Send an event to a workflow (``app.send_event``) and run what it wakes."""
        sent = await self.app.send_event(workflow_id, name, payload)
        await self.run_until_idle()
        return sent

    async def finish_workflow(self, workflow_id: str, *, max_steps: int = 100) -> Workflow:
        """Run everything scheduled (``finish_all``); the workflow, with its journal."""
        await self.finish_all(max_steps=max_steps)
        found = await self.app.get_workflow(workflow_id)
        if found is None:
            raise AssertionError(f"no workflow {workflow_id}")
        return found

    # -- reading and asserting ------------------------------------------------------------

    async def scheduled(
        self,
        fn: FunctionRef[Any, Any] | None = None,
        *,
        state: State | Sequence[State] | None = None,
        args: Mapping[str, Any] | None = None,
    ) -> list[ScheduledFunction]:
        """Rows of ``fn`` (every function's, if None) in ``state`` (any: None) whose
        arguments include ``args``, in the order they were scheduled for."""
        rows = await all_rows(self.app)
        states = {state} if isinstance(state, State) else set(state or State)
        found = [
            r
            for r in rows
            if (fn is None or r.name == fn.name)
            and r.state in states
            and _includes(r.args, args or {})
        ]
        return sorted(found, key=lambda r: r.scheduled_time)

    async def assert_scheduled(
        self,
        fn: FunctionRef[Any, Any],
        *,
        args: Mapping[str, Any] | None = None,
        within: float | timedelta | None = None,
        state: State = State.PENDING,
    ) -> ScheduledFunction:
        """The first row of ``fn`` in ``state`` whose arguments include ``args`` (and, with
        ``within``, due no later than that from now: its ``due_time``, a retry's included);
        an ``AssertionError`` listing what is scheduled if there is none."""
        rows = await self.scheduled(fn, state=state, args=args)
        if within is not None:
            seconds = within.total_seconds() if isinstance(within, timedelta) else within
            latest = self.clock.now() + seconds
            due = (r.due_time or r.scheduled_time for r in rows)
            rows = [r for r, at in zip(rows, due, strict=True) if at.timestamp() <= latest]
        if rows:
            return rows[0]
        wanted = f"{fn.name} {state.value}"
        if args:
            wanted += f" with args including {dict(args)}"
        if within is not None:
            wanted += f", due within {within if isinstance(within, timedelta) else f'{within}s'}"
        raise AssertionError(f"nothing scheduled as {wanted}; {await self._listing()}")

    async def assert_not_scheduled(
        self,
        fn: FunctionRef[Any, Any],
        *,
        args: Mapping[str, Any] | None = None,
        state: State | Sequence[State] | None = State.PENDING,
    ) -> None:
        """No row of ``fn`` in ``state`` (any state: None) has arguments including
        ``args``; else an ``AssertionError`` naming the rows found."""
        rows = await self.scheduled(fn, state=state, args=args)
        if rows:
            found = ", ".join(f"{r.id} {r.state.value} {r.args}" for r in rows)
            raise AssertionError(f"{fn.name} is scheduled: {found}")

    async def assert_cron_fires(self, name: str, at: Sequence[datetime]) -> None:
        """The cron ``name``'s next fire times from the clock's now are ``at`` (aware
        datetimes, compared as instants); an ``AssertionError`` with the times it has."""
        # Stored (switched by hand, or registered through the API), else as declared:
        # the app's crons reach the database when an executor starts.
        stored = await self.app.get_cron(name)
        declared = self.app._rt.crons.get(name)
        if stored is not None:
            expression, timezone, source = stored.schedule, stored.timezone, stored.source
            enabled = stored.enabled
        elif declared is not None:
            expression, timezone, source = declared.schedule, declared.timezone, declared.source
            enabled = declared.enabled
        else:
            names = sorted({c.name for c in await self.app.crons()} | set(self.app._rt.crons))
            raise AssertionError(f"no cron {name!r}; the crons: {names}")
        if not enabled:
            raise AssertionError(f"cron {name!r} is disabled: it fires at no time")
        schedule = schedule_of(expression, timezone, source)
        times: list[datetime] = []
        t = self.clock.now_datetime()
        for _ in at:
            following = schedule.next_after(t)
            if following is None:
                break
            times.append(following)
            t = following
        if [x.timestamp() for x in times] != [x.timestamp() for x in at]:
            shown = ", ".join(x.isoformat() for x in times)
            raise AssertionError(f"cron {name!r} ({expression}) fires at {shown}")

    async def _listing(self) -> str:
        rows = await self.scheduled()
        if not rows:
            return "no rows at all"
        shown = "; ".join(
            f"{r.name} {r.state.value} {r.args} at {r.scheduled_time.isoformat()}"
            for r in rows[:20]
        )
        more = f" (and {len(rows) - 20} more)" if len(rows) > 20 else ""
        return f"what there is: {shown}{more}"


def _includes(args: Mapping[str, Any], wanted: Mapping[str, Any]) -> bool:
    return all(k in args and args[k] == v for k, v in wanted.items())
