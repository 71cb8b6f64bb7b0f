"""Starting each kind of step, in a turn's transaction (``Turn.run`` calls ``advance``).

The guarantee of each kind comes from where its outcome is journaled:

* **mutation**: run in a savepoint of the turn's transaction, its journal entry written
  in the same transaction: its effects and its entry commit together or not at all,
  exactly once. A mutation that raises is rolled back to the savepoint (what it
  scheduled dropped) and journaled Failed.
* **query**: run in the turn's transaction, its result journaled with it.
* **action**: a row of ``_scheduled_functions`` written with the entry (Started), whose
  completion callback (``durafn:workflow_step_done``) journals its outcome once and runs
  the next turn: at most once, or at least once under a retry policy.
* **sleep**, **event**: a turn scheduled for the end (a Pending row, no process held);
  an event sent before the wait is found in ``_durafn_workflow_events`` when it starts.
* **workflow** (a child): its row and first turn written with the entry; its end
  journals this step and schedules a turn of the parent.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from .._context import MutationCtx, MutationParts, QueryCtx, SystemTable, read_only_session
from .._errors import WorkflowLimitError
from .._registry import ActionRef, MutationRef, QueryRef
from .._retries import type_name
from .._store import StepRow
from .._store import workflow_sql as store
from . import seams
from .api import INLINE_STEPS_PER_TURN, step_row_id
from .begin import begin_workflow
from .names import step_done_ref, turn_ref
from .replay import Request

if TYPE_CHECKING:
    from .replay import Turn


async def advance(turn: Turn, req: Request) -> bool:
    """Start or finish ``req``'s step; True if it finished in this turn (its outcome is
    handed to the body in the turn's next round: ``Turn.deliver``)."""
    if req.entry is not None:  # Started by an earlier turn: a sleep or a wait may end
        return await _finish_started(turn, req)
    if req.kind in ("mutation", "query"):
        if turn.inline_steps >= INLINE_STEPS_PER_TURN or time.monotonic() > turn.inline_until:
            turn.more = True  # a new turn goes on: this one's locks and time stay short
            return False
        turn.inline_steps += 1
        return await (_mutation(turn, req) if req.kind == "mutation" else _query(turn, req))
    if req.kind == "action":
        return await _action(turn, req)
    if req.kind == "sleep":
        wake_at = req.until if req.until is not None else turn.now + (req.wait or 0.0)
        return await _begin_wait(turn, req, wake_at)
    if req.kind == "event":
        if await _take_event(turn, req, started=False):
            return True
        return await _begin_wait(turn, req, None if req.wait is None else turn.now + req.wait)
    if req.kind == "workflow":
        return await _child(turn, req)
    raise AssertionError(req.kind)  # pragma: no cover - the api makes no other kind


def _entry(turn: Turn, req: Request, **values: Any) -> StepRow:
    return StepRow(
        workflow_id=turn.row.id,
        step_no=req.step_no,
        kind=req.kind,
        name=req.name,
        args=req.args,
        started_at=turn.now,
        **values,
    )


async def _record(turn: Turn, req: Request, entry: StepRow) -> None:
    """Journal a step (its outcome, or that it started). Written with the turn's other
    new entries, at its end (``ending.conclude``): one statement a turn, not one a step;
    nothing in the turn reads them back."""
    turn.new_entries.append(entry)
    turn.row.steps += 1
    turn.journal[req.step_no] = entry
    req.entry = entry


def _done(turn: Turn, req: Request, result: Any) -> StepRow:
    """A finished entry from a result (or its bound's failure)."""
    assert req.ref is not None
    try:
        text = req.ref.encode_result(result)
    except Exception as exc:  # an ArgumentError: a result JSON cannot hold
        return _failed(turn, req, type(exc), str(exc))
    problem = turn.count_result(text)
    if problem is not None:
        return _failed(turn, req, WorkflowLimitError, f"step {req.step_no}: {problem}")
    return _entry(turn, req, state="Success", result=text, ended_at=turn.now)


def _failed(turn: Turn, req: Request, cls: type[BaseException], message: str) -> StepRow:
    return _entry(
        turn,
        req,
        state="Failed",
        error_type=type_name(cls),
        error_message=message,
        ended_at=turn.now,
    )


async def _mutation(turn: Turn, req: Request) -> bool:
    ref = req.ref
    assert isinstance(ref, MutationRef) and req.values is not None
    parts = seams.parts(turn.ctx)
    turn.ctx.scheduler  # noqa: B018 - the turn's writer, which the step's rows join
    own = MutationParts(
        turn.rt, parts._conn, parts.db, parts._new_writer, parent_id=turn.ctx.run_id
    )
    session = parts.db
    try:
        async with session.begin_nested():
            result = await ref.fn(MutationCtx(turn.rt, own, turn.ctx.run_id), **req.values)
            await session.flush()
            if own.limit_error is not None:
                raise own.limit_error
            if own.writer is not None:
                await own.writer.flush()
    except Exception as exc:
        if own.writer is not None:
            own.writer.discard()
        entry = _failed(turn, req, type(exc), str(exc))
    else:
        if own.writer is not None and parts.writer is not None:
            parts.writer.woken |= own.writer.woken
            parts.writer.enqueued += own.writer.enqueued
            parts.writer.inline += own.writer.inline
        entry = _done(turn, req, result)
    await _record(turn, req, entry)
    return True


async def _query(turn: Turn, req: Request) -> bool:
    ref = req.ref
    assert isinstance(ref, QueryRef) and req.values is not None
    conn = turn.conn
    await seams.parts(turn.ctx).db.flush()  # the turn's own writes, visible to the query
    session = read_only_session(conn)
    try:
        result = await ref.fn(QueryCtx(turn.rt, session, SystemTable(turn.rt, conn)), **req.values)
    except Exception as exc:
        entry = _failed(turn, req, type(exc), str(exc))
    else:
        entry = _done(turn, req, result)
    finally:
        await session.close()
    await _record(turn, req, entry)
    return True


async def _action(turn: Turn, req: Request) -> bool:
    assert req.ref is not None and req.values is not None
    scheduler = turn.ctx.scheduler
    assert isinstance(req.ref, ActionRef)
    ref = req.ref.options(on_complete=step_done_ref(turn.rt))
    row_id = step_row_id(turn.row.id, req.step_no)
    await seams.schedule_as(scheduler, row_id, ref, req.values)
    await _record(turn, req, _entry(turn, req, state=store.STARTED, row_id=row_id))
    return False


async def _begin_wait(turn: Turn, req: Request, wake_at: float | None) -> bool:
    """A sleep, or an event's wait: over already, or a turn scheduled at its end."""
    if wake_at is not None and wake_at <= turn.now and req.kind == "sleep":
        await _record(
            turn, req, _entry(turn, req, state="Success", wake_at=wake_at, ended_at=turn.now)
        )
        return True
    await _record(turn, req, _entry(turn, req, state=store.STARTED, wake_at=wake_at))
    if req.kind == "event":
        turn.waiting_events.add(req.name)
    if wake_at is not None:
        await wake_turn(turn, wake_at)
    return False


async def _finish_started(turn: Turn, req: Request) -> bool:
    entry = req.entry
    assert entry is not None
    if entry.kind == "event" and await _take_event(turn, req, started=True):
        return True
    due = entry.wake_at is not None and entry.wake_at <= turn.now
    if entry.kind == "sleep" and due:
        await store.finish_step(turn.conn, entry, state="Success", now=turn.now)
        return True
    if entry.kind == "event" and due:
        error = ("durafn.WorkflowTimeoutError", f"no event {entry.name!r} came in time")
        await store.finish_step(turn.conn, entry, state="Failed", now=turn.now, error=error)
        return True
    if entry.kind == "event":
        turn.waiting_events.add(entry.name)
    return False


async def _take_event(turn: Turn, req: Request, *, started: bool) -> bool:
    found, payload = await store.take_event(turn.conn, turn.row.id, req.name, req.step_no)
    if not found:
        return False
    if started:
        assert req.entry is not None
        await store.finish_step(turn.conn, req.entry, state="Success", now=turn.now, result=payload)
        turn.row.journal_bytes += 0 if payload is None else len(payload.encode())
    else:
        problem = turn.count_result(payload)
        if problem is not None:
            entry = _failed(turn, req, WorkflowLimitError, f"the event's payload: {problem}")
        else:
            entry = _entry(turn, req, state="Success", result=payload, ended_at=turn.now)
        await _record(turn, req, entry)
    return True


async def _child(turn: Turn, req: Request) -> bool:
    child = turn.rt.registry.workflows[req.name]
    child_id = step_row_id(turn.row.id, -req.step_no)
    await begin_workflow(
        turn.rt,
        turn.conn,
        turn.ctx.scheduler,
        child,
        req.args,
        child_id,
        parent=(turn.row.id, req.step_no),
    )
    await _record(turn, req, _entry(turn, req, state=store.STARTED, row_id=child_id))
    return False


async def wake_turn(turn: Turn, at: float) -> None:
    """A turn of this workflow at ``at`` (its generation: a cancel drops it)."""
    await turn.ctx.scheduler.run_at(
        max(at, 0.0), turn_ref(turn.rt), workflow_id=turn.row.id, generation=turn.row.generation
    )
