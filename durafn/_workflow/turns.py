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
as blocked: a task woken by a resolved step, or started by ``gather``, runs within a
round or two of it (asyncio runs ready callbacks in order, one round at a time)."""


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
    body = asyncio.get_running_loop().create_task(ref.fn(WorkflowCtx(turn, row.id), **values))
    try:
        while True:
            await _settle(turn, body)
            if turn.mismatch is not None or body.done():
                break
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


async def _settle(turn: Turn, body: asyncio.Task[Any]) -> None:
    """Let the body's tasks run until they are all blocked: at once when its own task
    awaits a step not resolved (one event-loop round after a step resolves, in a body
    that takes its steps one at a time); else (``gather``: tasks the turn does not see)
    once none of them has moved for ``_IDLE_ROUNDS`` rounds."""
    idle = 0
    while idle < _IDLE_ROUNDS and not body.done():
        before = turn.touched
        await asyncio.sleep(0)
        waits = turn.blocked.get(body)
        if waits is not None and not waits.done():
            return
        idle = idle + 1 if turn.touched == before else 0
