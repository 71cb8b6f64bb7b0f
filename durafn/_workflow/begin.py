"""A workflow's birth: its row and its first turn, in the caller's transaction (a start,
or a parent's turn starting a child)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sqlalchemy.ext.asyncio import AsyncConnection

from .._registry import FunctionRef
from .._store import WorkflowRow
from .._store import workflow_sql as store
from .names import turn_ref

if TYPE_CHECKING:
    from .._runtime import Runtime
    from .._scheduler import Scheduler


async def begin_workflow(
    rt: Runtime,
    conn: AsyncConnection,
    scheduler: Scheduler,
    ref: FunctionRef[Any, Any],
    args_json: str,
    id: str,
    *,
    parent: tuple[str, int] | None = None,
) -> None:
    """Write a workflow's row and its first turn, in ``conn``'s transaction."""
    now = rt.clock.now()
    await store.insert_workflow(
        conn,
        WorkflowRow(
            id=id,
            name=ref.name,
            args=args_json,
            state=store.RUNNING,
            generation=0,
            result=None,
            error_type=None,
            error_message=None,
            waiting=None,
            waiting_event=None,
            steps=0,
            journal_bytes=0,
            parent_id=None if parent is None else parent[0],
            parent_step=None if parent is None else parent[1],
            created_at=now,
            updated_at=now,
            ended_at=None,
        ),
    )
    await scheduler.run_after(0, turn_ref(rt), workflow_id=id, generation=0)
