"""Driving a turn: the workflow's body run as a task until it ends or blocks, the steps
it asked for started between its runs (``steps.advance``), the outcome recorded
(``ending.conclude``); see ``replay`` for the journal's side."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from .._store import StepRow, WorkflowRow
from . import ending, steps
from .api import WorkflowCtx, WorkflowRef
from .replay import Turn

if TYPE_CHECKING:
    from .._context import MutationCtx
    from .._runtime import Runtime

_IDLE_ROUNDS = 4
"""Event-loop rounds in which no task of the body touched a step before the body counts
as blocked, where its tasks' waits cannot be told apart from the executor's (``_settle``):
a task woken by a resolved step, or started by ``gather``, runs within a round or two of
it (asyncio runs ready callbacks in order, one round at a time)."""


async def play(
    rt: Runtime,
    ctx: MutationCtx,
    row: WorkflowRow,
    journal: list[StepRow],
    ref: WorkflowRef[Any, Any],
) -> None:
    """Run the body until it ends or blocks; record which."""
    turn = Turn(rt, ctx, row, journal, ref)
    values = ref.decode_args(row.args)
    before = asyncio.all_tasks()
    body = asyncio.get_running_loop().create_task(ref.fn(WorkflowCtx(turn, row.id), **values))
    try:
        await _settle(turn, body, before)
        # The outcomes earlier turns handed over, in their rounds: the body goes where it
        # went then, asking for the same steps in the same order.
        for round in sorted(turn.rounds):
            if turn.mismatch is not None or body.done() or not turn.redeliver(round):
                break
            await _settle(turn, body, before)
        # Then what is new: outcomes journaled since (an action's, a sleep's end) or in
        # this turn (its mutation steps), each batch a round; and the steps to start.
        while turn.mismatch is None and not body.done():
            fresh = turn.undelivered()
            if fresh:
                turn.deliver(fresh)
                await _settle(turn, body, before)
                continue
            todo, turn.todo = turn.todo, []
            moved = False
            for req in todo:
                moved |= await steps.advance(turn, req)
            if not moved or turn.mismatch is not None:
                break
        await ending.conclude(turn, body)
    finally:
        if not body.done():
            body.cancel()
            await asyncio.wait([body])
        for req in turn.requests:  # a failed step the dropped body never read: no warning
            if req.future.done() and not req.future.cancelled():
                req.future.exception()


async def _settle(turn: Turn, body: asyncio.Task[Any], before: set[asyncio.Task[Any]]) -> None:
    """Let the body's tasks run until none of them can. At once when the body's own task
    waits on a step not resolved and no other task made since the body began is alive
    (a body that takes its steps one at a time: one event-loop round after a step
    resolves); else (``gather``, a ``TaskGroup``: callbacks and tasks the turn does not
    see) once no step has been touched for ``_IDLE_ROUNDS`` rounds."""
    idle = 0
    while not body.done():
        touched = turn.touched
        await asyncio.sleep(0)
        waits = turn.blocked.get(body)
        if waits is not None and not waits.done() and _alone(body, before):
            return
        idle = idle + 1 if turn.touched == touched else 0
        if idle >= _IDLE_ROUNDS:
            return


def _alone(body: asyncio.Task[Any], before: set[asyncio.Task[Any]]) -> bool:
    """No task made since the body began (by it, or by the executor meanwhile) is alive
    but the body's own and this one."""
    mine = asyncio.current_task()
    return all(t.done() or t is body or t is mine for t in asyncio.all_tasks() - before)
