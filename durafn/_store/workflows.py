"""The statements of durable workflows (``durafn/_workflow``), one function each, over
``_durafn_workflows``, ``_durafn_workflow_steps`` and ``_durafn_workflow_events``.

Plain SQLAlchemy Core that both engines run as written: ``FOR UPDATE`` is PostgreSQL's
row lock and renders as nothing on SQLite, whose write transactions (``BEGIN
IMMEDIATE``) are serialised already. Every change of state is an UPDATE guarded by the
state it expects (and, for a workflow, by its generation), its row count returned, so a
lost race is a False the caller acts on, never a silent double write.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from sqlalchemy import bindparam, delete, func, insert, select, update
from sqlalchemy.engine import CursorResult
from sqlalchemy.ext.asyncio import AsyncConnection

from .schema.tables import workflow_events as ev
from .schema.tables import workflow_steps as ws
from .schema.tables import workflows as wf

RUNNING = "Running"
STOPPED = "Stopped"
STARTED = "Started"
ENDED = ("Success", "Failed", "Canceled")


@dataclasses.dataclass(slots=True)
class WorkflowRow:
    """A row of ``_durafn_workflows``."""

    id: str
    name: str
    args: str
    state: str
    generation: int
    result: str | None
    error_type: str | None
    error_message: str | None
    waiting: str | None
    waiting_event: str | None
    steps: int
    journal_bytes: int
    parent_id: str | None
    parent_step: int | None
    created_at: float
    updated_at: float
    ended_at: float | None


@dataclasses.dataclass(slots=True)
class StepRow:
    """A row of ``_durafn_workflow_steps``: one entry of a workflow's journal."""

    workflow_id: str
    step_no: int
    kind: str
    name: str
    args: str
    state: str
    result: str | None = None
    error_type: str | None = None
    error_message: str | None = None
    row_id: str | None = None
    wake_at: float | None = None
    started_at: float = 0.0
    ended_at: float | None = None
    delivered: int | None = None
    """The round in which its outcome was first handed to the body (``Turn.deliver``)."""


def _rowcount(result: Any) -> int:
    assert isinstance(result, CursorResult)
    return int(result.rowcount)


def _workflow(row: Any) -> WorkflowRow:
    return WorkflowRow(**{c.name: getattr(row, c.name) for c in wf.columns})


async def insert_workflow(conn: AsyncConnection, row: WorkflowRow) -> None:
    await conn.execute(insert(wf).values(dataclasses.asdict(row)))


# The statements every turn runs, built once (a statement built per call cost more in
# SQLAlchemy's construction and cache key than its round trip: ~1 ms a turn of 2).
_LOCK = select(wf).where(wf.c.id == bindparam("b_id")).with_for_update()  # (pk)
_JOURNAL = select(ws).where(ws.c.workflow_id == bindparam("b_id")).order_by(ws.c.step_no)  # (pk)
_GUARDED = (wf.c.id == bindparam("b_id"), wf.c.generation == bindparam("b_generation"))
_PROGRESS = (
    update(wf)
    .where(*_GUARDED, wf.c.state == RUNNING)
    .values(
        waiting=bindparam("b_waiting"),
        waiting_event=bindparam("b_waiting_event"),
        steps=bindparam("b_steps"),
        journal_bytes=bindparam("b_journal_bytes"),
        updated_at=bindparam("b_now"),
    )
)  # (pk)
_END = (
    update(wf)
    .where(*_GUARDED, wf.c.state == RUNNING)
    .values(
        state=bindparam("b_state"),
        result=bindparam("b_result"),
        error_type=bindparam("b_error_type"),
        error_message=bindparam("b_error_message"),
        waiting=None,
        waiting_event=None,
        steps=bindparam("b_steps"),
        journal_bytes=bindparam("b_journal_bytes"),
        updated_at=bindparam("b_now"),
        ended_at=bindparam("b_ended_at"),
    )
)  # (pk)
_FINISH_STEP = (
    update(ws)
    .where(
        ws.c.workflow_id == bindparam("b_id"),
        ws.c.step_no == bindparam("b_step"),
        ws.c.state == STARTED,
    )
    .values(
        state=bindparam("b_state"),
        result=bindparam("b_result"),
        error_type=bindparam("b_error_type"),
        error_message=bindparam("b_error_message"),
        ended_at=bindparam("b_now"),
    )
)  # (pk)


async def lock_workflow(conn: AsyncConnection, id: str) -> WorkflowRow | None:
    """The workflow, locked until the transaction ends (PostgreSQL; SQLite's write lock
    is held already): two turns of one workflow, or a turn and an event's sender, run
    one after the other, the second seeing what the first committed."""
    row = (await conn.execute(_LOCK, {"b_id": id})).first()
    return None if row is None else _workflow(row)


async def read_workflow(conn: AsyncConnection, id: str) -> WorkflowRow | None:
    row = (await conn.execute(select(wf).where(wf.c.id == id))).first()
    return None if row is None else _workflow(row)


async def journal(conn: AsyncConnection, workflow_id: str) -> list[StepRow]:
    """A workflow's steps in order (the primary key)."""
    rows = await conn.execute(_JOURNAL, {"b_id": workflow_id})
    return [StepRow(**{c.name: getattr(r, c.name) for c in ws.columns}) for r in rows]


async def insert_steps(conn: AsyncConnection, steps: Sequence[StepRow]) -> None:
    """A turn's new journal entries, in one statement (executemany)."""
    if steps:
        await conn.execute(insert(ws), [dataclasses.asdict(s) for s in steps])


async def mark_delivered(
    conn: AsyncConnection, workflow_id: str, rounds: Sequence[tuple[int, int]]
) -> None:
    """Entries written by earlier transactions whose outcomes this turn handed to the body
    first, as (step number, round): one statement (executemany, by the primary key),
    each guarded by the entry's having had no round yet."""
    if rounds:
        await conn.execute(
            update(ws)
            .where(
                ws.c.workflow_id == workflow_id,
                ws.c.step_no == bindparam("b_step"),
                ws.c.delivered.is_(None),
            )
            .values(delivered=bindparam("b_round")),
            [{"b_step": step, "b_round": round} for step, round in rounds],
        )


async def finish_step(
    conn: AsyncConnection,
    step: StepRow,
    *,
    state: str,
    now: float,
    result: str | None = None,
    error: tuple[str, str] | None = None,
) -> bool:
    """Started -> ``state``, once: False if it had finished already (a late or second
    completion, dropped)."""
    done = await conn.execute(
        _FINISH_STEP,
        {
            "b_id": step.workflow_id,
            "b_step": step.step_no,
            "b_state": state,
            "b_result": result,
            "b_error_type": None if error is None else error[0],
            "b_error_message": None if error is None else error[1],
            "b_now": now,
        },
    )
    if _rowcount(done) != 1:
        return False
    step.state, step.result, step.ended_at = state, result, now
    step.error_type, step.error_message = (None, None) if error is None else error
    return True


async def lock_workflow_of_row(
    conn: AsyncConnection, row_id: str
) -> tuple[WorkflowRow, int] | None:
    """The workflow whose step a scheduled row ran (ix_durafn_workflow_steps_row), locked
    as ``lock_workflow`` locks it, and that step's number: one statement."""
    found = (
        await conn.execute(
            select(wf, ws.c.step_no)
            .join(ws, ws.c.workflow_id == wf.c.id)
            .where(ws.c.row_id == row_id)
            .with_for_update(of=wf)
        )
    ).first()
    return None if found is None else (_workflow(found), int(found.step_no))


async def note_progress(
    conn: AsyncConnection,
    row: WorkflowRow,
    *,
    waiting: str | None,
    waiting_event: str | None,
    now: float,
) -> bool:
    """What a Running workflow now waits on, and its journal's size (guarded by the
    generation the turn read)."""
    done = await conn.execute(
        _PROGRESS,
        {
            "b_id": row.id,
            "b_generation": row.generation,
            "b_waiting": waiting,
            "b_waiting_event": waiting_event,
            "b_steps": row.steps,
            "b_journal_bytes": row.journal_bytes,
            "b_now": now,
        },
    )
    return _rowcount(done) == 1


async def end_workflow(
    conn: AsyncConnection,
    row: WorkflowRow,
    *,
    state: str,
    now: float,
    result: str | None = None,
    error: tuple[str, str] | None = None,
) -> bool:
    """Running -> Success/Failed (or Stopped), once, by the generation that read it."""
    done = await conn.execute(
        _END,
        {
            "b_id": row.id,
            "b_generation": row.generation,
            "b_state": state,
            "b_result": result,
            "b_error_type": None if error is None else error[0],
            "b_error_message": None if error is None else error[1],
            "b_steps": row.steps,
            "b_journal_bytes": row.journal_bytes,
            "b_now": now,
            "b_ended_at": now if state in ENDED else None,
        },
    )
    return _rowcount(done) == 1


async def cancel_workflow(conn: AsyncConnection, id: str, now: float) -> bool:
    """Running or Stopped -> Canceled, its generation bumped (its turns and completions
    still in flight find another and are dropped); False if it had ended."""
    done = await conn.execute(
        update(wf)
        .where(wf.c.id == id, wf.c.state.in_((RUNNING, STOPPED)))
        .values(
            state="Canceled",
            generation=wf.c.generation + 1,
            waiting=None,
            waiting_event=None,
            error_type="durafn.WorkflowCanceledError",
            error_message="canceled",
            updated_at=now,
            ended_at=now,
        )
    )
    return _rowcount(done) == 1


async def resume_workflow(conn: AsyncConnection, id: str, now: float) -> int | None:
    """Stopped -> Running under a new generation (returned); None if it was not Stopped."""
    done = await conn.execute(
        update(wf)
        .where(wf.c.id == id, wf.c.state == STOPPED)
        .values(
            state=RUNNING,
            generation=wf.c.generation + 1,
            error_type=None,
            error_message=None,
            updated_at=now,
        )
        .returning(wf.c.generation)
    )
    found = done.first()
    return None if found is None else int(found[0])


async def open_steps(conn: AsyncConnection, workflow_id: str) -> list[StepRow]:
    """The steps of a workflow not finished (a cancel stops their rows and children)."""
    return [s for s in await journal(conn, workflow_id) if s.state == STARTED]


async def insert_event(
    conn: AsyncConnection, workflow_id: str, name: str, payload: str | None, now: float
) -> None:
    await conn.execute(
        insert(ev).values(workflow_id=workflow_id, name=name, payload=payload, sent_at=now)
    )


async def take_event(
    conn: AsyncConnection, workflow_id: str, name: str, step_no: int
) -> tuple[bool, str | None]:
    """The oldest event of ``name`` no wait has taken (ix_durafn_workflow_events_unread),
    taken by step ``step_no``: (found, its payload)."""
    found = (
        await conn.execute(
            select(ev.c.id, ev.c.payload)
            .where(ev.c.workflow_id == workflow_id, ev.c.name == name, ev.c.step_no.is_(None))
            .order_by(ev.c.id)
            .limit(1)
        )
    ).first()
    if found is None:
        return False, None
    taken = await conn.execute(
        update(ev).where(ev.c.id == found[0], ev.c.step_no.is_(None)).values(step_no=step_no)
    )
    return _rowcount(taken) == 1, found[1]


async def list_workflows(
    conn: AsyncConnection,
    *,
    states: Sequence[str] | None,
    name: str | None,
    limit: int,
) -> list[WorkflowRow]:
    """The newest workflows first (ix_durafn_workflows_state when filtered by state)."""
    query = select(wf).order_by(wf.c.created_at.desc(), wf.c.id.desc()).limit(limit)
    if states:
        query = query.where(wf.c.state.in_(list(states)))
    if name is not None:
        query = query.where(wf.c.name == name)
    return [_workflow(r) for r in await conn.execute(query)]


async def count_by_state(conn: AsyncConnection) -> dict[str, int]:
    rows = await conn.execute(select(wf.c.state, func.count()).group_by(wf.c.state))
    return {state: count for state, count in rows}


async def remove_ended(conn: AsyncConnection, before: float, page: int) -> int:
    """One page of the oldest workflows ended before ``before``, with their journals and
    events (ix_durafn_workflows_ended); returns how many workflows went."""
    ids = [
        r[0]
        for r in await conn.execute(
            select(wf.c.id)
            .where(wf.c.ended_at.is_not(None), wf.c.ended_at < before)
            .order_by(wf.c.ended_at)
            .limit(page)
        )
    ]
    if ids:
        await conn.execute(delete(ws).where(ws.c.workflow_id.in_(ids)))
        await conn.execute(delete(ev).where(ev.c.workflow_id.in_(ids)))
        await conn.execute(delete(wf).where(wf.c.id.in_(ids)))
    return len(ids)
