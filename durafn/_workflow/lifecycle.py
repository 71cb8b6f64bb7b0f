"""A workflow's life outside its turns: started, sent events, cancelled, resumed; and
durafn's two mutations that run its turns (``durafn:workflow_turn``) and journal an
action step's outcome (``durafn:workflow_step_done``, the step's completion callback).

Each entry point writes through a ``Scheduler``'s transaction (``_on_connection``): a
mutation's own (``ctx.scheduler``), a caller's session (``app.scheduler(session)``), or,
from outside, one of its own; the rows it writes commit with whatever else that
transaction writes, or not at all.
"""

from __future__ import annotations

import contextlib
import functools
import json
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

from sqlalchemy.ext.asyncio import AsyncConnection

from .._checks import scheduled_id
from .._context import MutationCtx
from .._errors import ArgumentError, NotFoundError
from .._kinds import State
from .._models import Completion
from .._options import JobOptions
from .._public import publish
from .._registry import FunctionRef, MutationRef, Registry
from .._retries import Exponential, Retry
from .._store import StepRow, WorkflowRow, new_id
from .._store import workflow_sql as store
from . import seams
from .api import MAX_RESULT_BYTES
from .begin import begin_workflow
from .names import STEP_DONE, TURN, turn_ref

if TYPE_CHECKING:
    from .._runtime import Runtime
    from .._scheduler import Scheduler

T = TypeVar("T")


class WorkflowNotFoundError(NotFoundError):
    """No workflow has the given id (it may have been removed by retention)."""

    def __init__(self, id: str) -> None:
        LookupError.__init__(
            self, f"no workflow has id {id!r}; finished workflows are removed after retention"
        )
        self.id = id


TURN_RETRY = Retry(8, backoff=Exponential(base=1.0))
"""A failed turn's (or completion's) runs: 8 in all, 1 s, 2 s, ... apart."""


def canonical_id(value: object) -> str:
    """A workflow id's canonical form (any form ``uuid.UUID`` reads, as rows' ids are);
    ``WorkflowNotFoundError`` for what is not an id."""
    found = scheduled_id(value)
    if found is None:
        raise WorkflowNotFoundError(str(value))
    return str(found)


def register_internals(registry: Registry) -> None:
    """durafn's workflow mutations, on an app that declares a workflow (so every worker
    importing it runs them)."""
    if registry.find(TURN) is None:
        for fn, name in ((workflow_turn, TURN), (workflow_step_done, STEP_DONE)):
            ref: MutationRef[Any, Any] = MutationRef(
                fn, name=name, timeout=None, ctx_types=(MutationCtx,)
            )
            # A turn that fails (past its time limit, a mutation step slower than it; a
            # database fault that outlived the batch's own retries) is rolled back and
            # tried again later, so a passing fault never leaves a workflow without one.
            ref.job_options = JobOptions(retry=TURN_RETRY)
            registry.add(ref)


# -- the turns ---------------------------------------------------------------------------


async def workflow_turn(ctx: MutationCtx, workflow_id: str, generation: int) -> None:
    """``durafn:workflow_turn``: replay the workflow, start what it asks next. A turn of
    another generation (before a cancel or a resume), or of an ended workflow, does
    nothing."""
    conn = seams.connection(ctx)
    row = await store.lock_workflow(conn, workflow_id)
    if row is None or row.state != store.RUNNING or row.generation != generation:
        return
    await run_turn(ctx, row)


async def workflow_step_done(ctx: MutationCtx, completion: Completion) -> None:
    """``durafn:workflow_step_done``: an action step's row finished for good. Journal its
    outcome, once (a second or late completion finds the step finished, or the workflow
    ended, and is dropped), then run the workflow's turn in this same transaction."""
    conn = seams.connection(ctx)
    found = await store.lock_workflow_of_row(conn, completion.id)
    if found is None or found[0].state != store.RUNNING:
        return
    row = found[0]
    journal = await store.journal(conn, row.id)
    step = next(s for s in journal if s.step_no == found[1])
    now = seams.runtime_of(ctx).clock.now()
    if completion.state is State.SUCCESS:
        text = None if completion.result is None else json.dumps(completion.result)
        size = 0 if text is None else len(text.encode())
        if size > MAX_RESULT_BYTES:
            error = (
                "durafn.WorkflowLimitError",
                f"step {step.step_no}: its result is {size} bytes as JSON; a step's bound "
                f"is {MAX_RESULT_BYTES}",
            )
            recorded = await store.finish_step(conn, step, state="Failed", now=now, error=error)
        else:
            recorded = await store.finish_step(conn, step, state="Success", now=now, result=text)
            row.journal_bytes += size
    else:
        info = completion.error
        error = (
            (info.type, info.message) if info is not None else ("durafn.WorkflowError", "Canceled")
        )
        recorded = await store.finish_step(conn, step, state="Failed", now=now, error=error)
    if recorded:
        await run_turn(ctx, row, journal)  # the journal read above, this step's outcome in it


async def run_turn(
    ctx: MutationCtx, row: WorkflowRow, journal: list[StepRow] | None = None
) -> None:
    from .turns import play

    rt = seams.runtime_of(ctx)
    ref = rt.registry.workflows.get(row.name)
    if ref is None:
        # Deployed code without it: stop for an operator rather than fail the run.
        error = (
            "durafn.WorkflowError",
            f"no workflow is registered as {row.name!r} on the worker that ran its turn; "
            "deploy code that has it and resume it (app.resume_workflow)",
        )
        await store.end_workflow(
            seams.connection(ctx), row, state=store.STOPPED, now=rt.clock.now(), error=error
        )
        return
    # A workflow's first turn has no journal to read (one statement fewer per start).
    if journal is None:
        journal = await store.journal(seams.connection(ctx), row.id) if row.steps else []
    await play(rt, ctx, row, journal, ref)


# -- entry points ------------------------------------------------------------------------


async def _on_connection(
    scheduler: Scheduler, body: Callable[[AsyncConnection, Scheduler], Awaitable[T]]
) -> T:
    """Run ``body`` in the scheduler's transaction, or (a scheduler that commits each
    call on its own) in one transaction of its own, flushed and woken as a mutation's."""
    from .._scheduler import Scheduler as _Scheduler
    from .._writers import BufferedWriter

    joined = seams.joined(scheduler)
    if joined is not None:
        async with joined as conn:
            return await body(conn, scheduler)
    rt = seams.runtime_of(scheduler)
    woken: set[Any] = set()

    async def _body(conn: AsyncConnection) -> T:
        writer = BufferedWriter(rt, conn, check_parent=None)
        result = await body(conn, _Scheduler(rt, writer))
        await writer.flush()
        woken.clear()
        woken.update(writer.woken)
        return result

    result = await rt.transaction(_body, doing="writing a workflow")
    rt.wake(woken)
    return result


async def start(
    scheduler: Scheduler, ref: FunctionRef[Any, Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> str:
    rt = seams.runtime_of(scheduler)
    registered: FunctionRef[Any, Any] | None = rt.registry.workflows.get(getattr(ref, "name", ""))
    if registered is None or registered is not getattr(ref, "registered", None):
        raise ArgumentError(f"start_workflow takes a workflow (@app.workflow), not {ref!r}")
    assert registered is not None  # (mypy: an ``is not`` of Any widened it again)
    args_json = registered.encode_args(args, kwargs)
    id = str(new_id(rt.clock.now()))
    await _on_connection(
        scheduler, functools.partial(_begin, rt=rt, ref=registered, args_json=args_json, id=id)
    )
    return id


async def _begin(
    conn: AsyncConnection,
    scheduler: Scheduler,
    *,
    rt: Runtime,
    ref: FunctionRef[Any, Any],
    args_json: str,
    id: str,
) -> None:
    await begin_workflow(rt, conn, scheduler, ref, args_json, id)


async def send_event(scheduler: Scheduler, workflow_id: str, name: str, payload: Any) -> bool:
    """Record an event for a workflow, in the scheduler's transaction; its turn too if it
    waits for that name. False (and nothing written) if the workflow has ended."""
    if not isinstance(name, str) or not name:
        raise ArgumentError(f"an event's name is a non-empty string, not {name!r}")
    try:
        text = None if payload is None else json.dumps(payload, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ArgumentError(f"an event's payload must be JSON: {exc}") from None
    workflow_id = canonical_id(workflow_id)
    rt = seams.runtime_of(scheduler)

    async def _body(conn: AsyncConnection, scheduler: Scheduler) -> bool:
        # Locked: a turn deciding to wait and this send are ordered, the later one seeing
        # the other (the event found by the wait, or the wait found by the send).
        row = await store.lock_workflow(conn, workflow_id)
        if row is None:
            raise WorkflowNotFoundError(workflow_id)
        if row.state not in (store.RUNNING, store.STOPPED):
            return False
        await store.insert_event(conn, workflow_id, name, text, rt.clock.now())
        if row.state == store.RUNNING and name in (row.waiting_event or "").split(","):
            await scheduler.run_after(
                0, turn_ref(rt), workflow_id=row.id, generation=row.generation
            )
        return True

    return await _on_connection(scheduler, _body)


async def cancel(scheduler: Scheduler, workflow_id: str) -> bool:
    """Cancel a workflow, its action steps' rows and its children; its parent's step
    fails. False if it had ended."""
    workflow_id = canonical_id(workflow_id)
    rt = seams.runtime_of(scheduler)

    async def _body(conn: AsyncConnection, scheduler: Scheduler) -> bool:
        return await _cancel_in(rt, conn, scheduler, workflow_id)

    return await _on_connection(scheduler, _body)


async def _cancel_in(rt: Runtime, conn: AsyncConnection, scheduler: Scheduler, id: str) -> bool:
    row = await store.lock_workflow(conn, id)
    if row is None:
        raise WorkflowNotFoundError(id)
    now = rt.clock.now()
    if not await store.cancel_workflow(conn, id, now):
        return False
    for step in await store.open_steps(conn, id):
        if step.kind == "action" and step.row_id is not None:
            # Its completion (Canceled) then finds the workflow ended: dropped. A row
            # removed by retention is not found.
            with contextlib.suppress(NotFoundError):
                await scheduler.cancel(step.row_id)
        elif step.kind == "workflow" and step.row_id is not None:
            await _cancel_in(rt, conn, scheduler, step.row_id)
    from .ending import _tell_parent

    await _tell_parent(rt, conn, scheduler, row, now)
    return True


async def resume(scheduler: Scheduler, workflow_id: str) -> bool:
    """A Stopped workflow runs again (a new generation), from its journal."""
    workflow_id = canonical_id(workflow_id)
    rt = seams.runtime_of(scheduler)

    async def _body(conn: AsyncConnection, scheduler: Scheduler) -> bool:
        generation = await store.resume_workflow(conn, workflow_id, rt.clock.now())
        if generation is None:
            if await store.read_workflow(conn, workflow_id) is None:
                raise WorkflowNotFoundError(workflow_id)
            return False
        await scheduler.run_after(0, turn_ref(rt), workflow_id=workflow_id, generation=generation)
        return True

    return await _on_connection(scheduler, _body)


publish(globals())
