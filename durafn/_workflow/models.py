"""What ``app.get_workflow`` and ``app.list_workflows`` return: a workflow's state and
its journal, as pydantic models."""

from __future__ import annotations

import enum
import json
from datetime import datetime
from typing import Any

from pydantic import BaseModel

from .._clock import to_datetime
from .._models import FROZEN, ErrorInfo
from .._public import publish
from .._store import StepRow, WorkflowRow


class WorkflowState(enum.StrEnum):
    """A workflow's state: Running (sleeping and waiting included: see ``waiting``),
    then Success, Failed or Canceled; Stopped: a replay met a journal its code no longer
    matches, and it waits for an operator."""

    RUNNING = "Running"
    SUCCESS = "Success"
    FAILED = "Failed"
    CANCELED = "Canceled"
    STOPPED = "Stopped"

    @property
    def finished(self) -> bool:
        return self in (WorkflowState.SUCCESS, WorkflowState.FAILED, WorkflowState.CANCELED)


class WorkflowStep(BaseModel):
    """One entry of a workflow's journal."""

    model_config = FROZEN

    step_no: int
    kind: str
    """mutation, query, action, sleep, event or workflow (a child)."""
    name: str
    """The function's durable name, the event's name, the child workflow's name."""
    args: Any
    state: str
    """Started, Success or Failed."""
    result: Any = None
    error: ErrorInfo | None = None
    row_id: str | None = None
    """The row running an action step, or a child workflow's id."""
    wake_at: datetime | None = None
    started_at: datetime
    ended_at: datetime | None = None


class Workflow(BaseModel):
    """A workflow run, with its journal (``steps``; empty from ``list_workflows``)."""

    model_config = FROZEN

    id: str
    name: str
    args: dict[str, Any]
    state: WorkflowState
    generation: int
    result: Any = None
    error: ErrorInfo | None = None
    waiting: str | None = None
    """What a Running workflow waits for: steps, a sleep's end, an event."""
    step_count: int
    journal_bytes: int
    parent_id: str | None = None
    created_at: datetime
    updated_at: datetime
    ended_at: datetime | None = None
    steps: list[WorkflowStep] = []


def _json(text: str | None) -> Any:
    return None if text is None else json.loads(text)


def _error(type_: str | None, message: str | None) -> ErrorInfo | None:
    return None if type_ is None else ErrorInfo(type=type_, message=message or "")


def step_model(step: StepRow) -> WorkflowStep:
    return WorkflowStep(
        step_no=step.step_no,
        kind=step.kind,
        name=step.name,
        args=_json(step.args),
        state=step.state,
        result=_json(step.result),
        error=_error(step.error_type, step.error_message),
        row_id=step.row_id,
        wake_at=None if step.wake_at is None else to_datetime(step.wake_at),
        started_at=to_datetime(step.started_at),
        ended_at=None if step.ended_at is None else to_datetime(step.ended_at),
    )


def workflow_model(row: WorkflowRow, steps: list[StepRow] | None = None) -> Workflow:
    return Workflow(
        id=row.id,
        name=row.name,
        args=json.loads(row.args),
        state=WorkflowState(row.state),
        generation=row.generation,
        result=_json(row.result),
        error=_error(row.error_type, row.error_message),
        waiting=row.waiting,
        step_count=row.steps,
        journal_bytes=row.journal_bytes,
        parent_id=row.parent_id,
        created_at=to_datetime(row.created_at),
        updated_at=to_datetime(row.updated_at),
        ended_at=None if row.ended_at is None else to_datetime(row.ended_at),
        steps=[step_model(s) for s in steps or ()],
    )


publish(globals())
