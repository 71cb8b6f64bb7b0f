"""The end of a turn: the workflow ended (Success, Failed), stopped for an operator (its
replay did not match its journal), or waits (for steps, a time, an event); and a child's
end told to its parent, in the same transaction."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from .._errors import WorkflowDeterminismError, WorkflowError
from .._retries import type_name
from .._store import WorkflowRow
from .._store import workflow_sql as store
from .names import turn_ref
from .steps import wake_turn

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection

    from .._scheduler import Scheduler
    from .replay import Turn


async def conclude(turn: Turn, body: asyncio.Task[Any]) -> None:
    conn = turn.conn
    row, now = turn.row, turn.now
    await store.insert_steps(conn, turn.new_entries)
    await store.mark_delivered(conn, row.id, turn.delivered_now)
    if turn.mismatch is not None:
        error = (type_name(type(turn.mismatch)), str(turn.mismatch))
        await store.end_workflow(conn, row, state=store.STOPPED, now=now, error=error)
        return
    if body.done() and (left := [n for n in turn.journal if n > len(turn.requests)]):
        entry = turn.journal[min(left)]
        turn.mismatch = WorkflowDeterminismError(
            f"workflow {row.id} ({row.name!r}) ended its replay after step "
            f"{len(turn.requests)}, but its journal holds step {entry.step_no} "
            f"({entry.kind} {entry.name!r}): its code changed under it. It is Stopped: deploy "
            "code that matches and resume it (app.resume_workflow), or cancel it"
        )
        error = (type_name(WorkflowDeterminismError), str(turn.mismatch))
        await store.end_workflow(conn, row, state=store.STOPPED, now=now, error=error)
        return
    if body.done():
        await _ended(turn, body)
        return
    if turn.more:
        await wake_turn(turn, now)  # the inline budget ran out: go on in a new turn
    open_ = [r for r in turn.requests if not r.future.done()]
    if not open_ and not turn.more:
        error = (
            "durafn.WorkflowError",
            "the workflow's body awaits something other than its steps (only step.* calls, "
            "and asyncio.gather of them, may be awaited: the body is re-run at every turn)",
        )
        await store.end_workflow(conn, row, state="Failed", now=now, error=error)
        await _tell_parent(turn.rt, conn, turn.ctx.scheduler, row, now)
        return
    await store.note_progress(
        conn,
        row,
        waiting=_waiting(open_),
        waiting_event=",".join(sorted(turn.waiting_events)) or None,
        now=now,
    )


async def _ended(turn: Turn, body: asyncio.Task[Any]) -> None:
    conn = turn.conn
    row, now = turn.row, turn.now
    if body.cancelled():  # pragma: no cover - only the turn cancels the body
        return
    exc = body.exception()
    if exc is None:
        try:
            text = turn.ref.encode_result(body.result())
        except Exception as bad:
            exc = bad
        else:
            problem = turn.count_result(text)
            if problem is None:
                await store.end_workflow(conn, row, state="Success", now=now, result=text)
                await _tell_parent(turn.rt, conn, turn.ctx.scheduler, row, now)
                return
            exc = WorkflowError(f"the workflow's result: {problem}")
    error = (type_name(type(exc)), str(exc))
    await store.end_workflow(conn, row, state="Failed", now=now, error=error)
    await _tell_parent(turn.rt, conn, turn.ctx.scheduler, row, now)


def _waiting(open_: list[Any]) -> str:
    parts = []
    for req in open_:
        entry = req.entry
        if req.kind == "sleep" and entry is not None and entry.wake_at is not None:
            parts.append(f"step {req.step_no}: sleep")
        elif req.kind == "event":
            parts.append(f"step {req.step_no}: event {req.name!r}")
        else:
            parts.append(f"step {req.step_no}: {req.kind} {req.name!r}")
    return "; ".join(parts)[:1000]


async def _tell_parent(
    rt: Any, conn: AsyncConnection, scheduler: Scheduler, child: WorkflowRow, now: float
) -> None:
    """A child ended (its row written already): journal its parent's step, once, and
    schedule the parent's turn."""
    if child.parent_id is None or child.parent_step is None:
        return
    ended = await store.read_workflow(conn, child.id)
    parent = await store.lock_workflow(conn, child.parent_id)
    if ended is None or parent is None or parent.state != store.RUNNING:
        return
    entries = [s for s in await store.journal(conn, parent.id) if s.step_no == child.parent_step]
    if not entries:
        return
    if ended.state == "Success":
        done = await store.finish_step(
            conn, entries[0], state="Success", now=now, result=ended.result
        )
    else:
        error = (ended.error_type or "durafn.WorkflowError", ended.error_message or ended.state)
        done = await store.finish_step(conn, entries[0], state="Failed", now=now, error=error)
    if done:
        await scheduler.run_after(
            0, turn_ref(rt), workflow_id=parent.id, generation=parent.generation
        )
