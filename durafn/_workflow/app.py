"""Durable workflows on ``App`` (a base class of it): ``@app.workflow``, and starting,
signalling, cancelling, resuming and reading workflows."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar, overload

from sqlalchemy.ext.asyncio import AsyncConnection

from .._checks import integer, optional, text
from .._errors import NotFoundError, RegistrationError
from .._runtime import Runtime
from .._scheduler import Scheduler
from .._store import workflow_sql as store
from . import lifecycle
from .api import WorkflowCtx, WorkflowRef
from .models import Workflow, WorkflowState, workflow_model

if TYPE_CHECKING:
    from .._explain import Explanation

P = ParamSpec("P")
R = TypeVar("R")


class Workflows:
    """The durable-workflow half of ``App``."""

    _rt: Runtime

    if TYPE_CHECKING:  # App's (Operator's explain)

        def scheduler(self, within: Any = None) -> Scheduler: ...

        async def explain(self, id: str) -> Explanation: ...

    @overload
    def workflow(
        self, fn: Callable[Concatenate[WorkflowCtx, P], Awaitable[R]]
    ) -> WorkflowRef[P, R]: ...

    @overload
    def workflow(
        self, *, name: str | None = None
    ) -> Callable[[Callable[Concatenate[WorkflowCtx, P], Awaitable[R]]], WorkflowRef[P, R]]: ...

    def workflow(self, fn: Any = None, *, name: str | None = None) -> Any:
        """Register a durable workflow: ``async def f(step: durafn.WorkflowCtx, ...)``,
        whose ``await step.run_mutation(...)``, ``run_action``, ``sleep``,
        ``wait_for_event`` ... are journaled and never run again once finished; after
        any crash it resumes by replaying its journal. ``name``: its durable name (stored
        in its rows: renaming it strands the workflows in flight)."""

        def decorate(f: Callable[..., Awaitable[Any]]) -> WorkflowRef[Any, Any]:
            ref: WorkflowRef[Any, Any] = WorkflowRef(
                f, name=name, timeout=None, ctx_types=(WorkflowCtx,)
            )
            registry = self._rt.registry
            if ref.name in registry.workflows:
                raise RegistrationError(
                    f"the workflow name {ref.name!r} is already registered; pass name=... "
                    "to give one of them another name"
                )
            lifecycle.register_internals(registry)
            registry.workflow_ops = lifecycle
            ref.origin = registry.origin
            registry.workflows[ref.name] = ref
            return ref

        return decorate if fn is None else decorate(fn)

    async def start_workflow(
        self, workflow: WorkflowRef[P, Any], /, *args: P.args, **kwargs: P.kwargs
    ) -> str:
        """Start a workflow, committed at once; returns its id. To start it atomically
        with your writes: ``ctx.scheduler.start_workflow`` in a mutation, or
        ``app.scheduler(session).start_workflow``."""
        return await self.scheduler().start_workflow(workflow, *args, **kwargs)

    async def send_event(self, workflow_id: str, name: str, payload: Any = None) -> bool:
        """Send an event to a workflow, committed at once (see ``Scheduler.send_event``;
        from a transaction of yours: ``app.scheduler(session).send_event``)."""
        return await self.scheduler().send_event(workflow_id, name, payload)

    async def cancel_workflow(self, workflow_id: str) -> bool:
        """Cancel a Running (or Stopped) workflow: its action steps' rows are cancelled,
        its children too, its turns in flight dropped (its generation moves on); a parent
        waiting for it sees its step fail. False if it had ended already."""
        return await lifecycle.cancel(self.scheduler(), workflow_id)

    async def resume_workflow(self, workflow_id: str) -> bool:
        """Run a Stopped workflow again from its journal (under a new generation), once
        its code matches its journal again. False if it was not Stopped."""
        return await lifecycle.resume(self.scheduler(), workflow_id)

    async def get_workflow(self, workflow_id: str) -> Workflow | None:
        """A workflow with its journal, or None (what is not a workflow's id finds none)."""
        try:
            workflow_id = lifecycle.canonical_id(workflow_id)
        except lifecycle.WorkflowNotFoundError:
            return None

        async def _read(conn: AsyncConnection) -> Workflow | None:
            row = await store.read_workflow(conn, workflow_id)
            if row is None:
                return None
            return workflow_model(row, await store.journal(conn, workflow_id))

        return await self._rt.transaction(_read, read_only=True, doing="reading a workflow")

    async def explain_workflow(self, workflow_id: str) -> str:
        """Why a workflow is where it is, in a sentence: how it ended, why it is Stopped,
        or what it waits for; for an action step, what holds that step's row
        (``app.explain``); for an event, how many of that name wait unread."""
        found = await self.get_workflow(workflow_id)
        if found is None:
            raise lifecycle.WorkflowNotFoundError(workflow_id)
        if found.state is not WorkflowState.RUNNING:
            error = f": {found.error.type}: {found.error.message}" if found.error else ""
            return f"{found.state.value}{error}"
        open_ = [s for s in found.steps if s.state == "Started"]
        if not open_:
            return "Running: its next turn is due (a new step, or the end)"
        said = []
        for step in open_:
            what = f"step {step.step_no} ({step.kind} {step.name!r})"
            if step.kind == "action" and step.row_id is not None:
                try:
                    why = (await self.explain(step.row_id)).message
                except NotFoundError:
                    why = "its row is gone"
                said.append(f"{what}: its row {step.row_id}: {why}")
            elif step.wake_at is not None:
                said.append(f"{what} until {step.wake_at.isoformat()}")
            else:
                said.append(f"{what}")
        return "Running: waits for " + "; ".join(said)

    async def list_workflows(
        self,
        *,
        state: WorkflowState | Sequence[WorkflowState] | None = None,
        name: str | None = None,
        limit: int = 100,
    ) -> list[Workflow]:
        """Workflows, newest first (without their journals: ``get_workflow``)."""
        states = None
        if state is not None:
            chosen = [state] if isinstance(state, str) else list(state)
            states = [WorkflowState(s).value for s in chosen]
        optional(text, "name", name)
        limit = integer("limit", limit, high=10_000)

        async def _read(conn: AsyncConnection) -> list[Workflow]:
            rows = await store.list_workflows(conn, states=states, name=name, limit=limit)
            return [workflow_model(r) for r in rows]

        return await self._rt.transaction(_read, read_only=True, doing="listing workflows")

    async def remove_ended_workflows(self, older_than: float, *, page: int = 500) -> int:
        """Remove the workflows ended more than ``older_than`` seconds ago, with their
        journals and events, a page per transaction; returns how many."""
        removed = 0
        before = self._rt.clock.now() - older_than

        async def _page(conn: AsyncConnection) -> int:
            return await store.remove_ended(conn, before, page)

        while (done := await self._rt.transaction(_page, doing="removing workflows")) > 0:
            removed += done
            if done < page:
                break
        return removed
