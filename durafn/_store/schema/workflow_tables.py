"""The tables of durable workflows (``durafn/_workflow``): a workflow run, its journal
of steps, and the events sent to it."""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    Column,
    Double,
    Index,
    Integer,
    String,
    Table,
    Text,
)

from .base import ID_TYPE, metadata, partial

# Version 27, durable workflows (``durafn/_workflow``): one row per workflow run, its
# journal of steps, and the events sent to it. A workflow's state changes only through
# UPDATEs guarded by its state and its ``generation`` (bumped by a cancel or a resume, so
# that a turn or a completion of the run before is dropped: ``_store/workflows.py``).
workflows = Table(
    "_durafn_workflows",
    metadata,
    Column("id", ID_TYPE, primary_key=True),
    Column("name", Text, nullable=False),
    Column("args", Text, nullable=False),
    # Running (which includes sleeping and waiting: ``waiting`` says on what), Success,
    # Failed, Canceled, or Stopped: a replay met a journal its code no longer matches,
    # and the workflow waits for an operator (``resume_workflow`` or ``cancel_workflow``).
    Column("state", String(16), nullable=False),
    Column("generation", Integer, nullable=False, server_default="0"),
    Column("result", Text),
    Column("error_type", Text),
    Column("error_message", Text),
    Column("waiting", Text),  # "steps 3, 4", "sleep until ...", "event 'paid'": for people
    Column("waiting_event", Text),  # the event name a wait_for_event blocks on, or None
    Column("steps", Integer, nullable=False, server_default="0"),
    Column("journal_bytes", BigInteger, nullable=False, server_default="0"),
    Column("parent_id", ID_TYPE),  # a child workflow's parent, and its step there
    Column("parent_step", Integer),
    Column("created_at", Double, nullable=False),
    Column("updated_at", Double, nullable=False),
    Column("ended_at", Double),
    CheckConstraint(
        "state IN ('Running', 'Success', 'Failed', 'Canceled', 'Stopped')",
        name="ck_durafn_workflows_state",
    ),
)
# Listing, newest first, per state (``durafn workflows ls``, the dashboard).
Index("ix_durafn_workflows_state", workflows.c.state, workflows.c.created_at)
# Retention removes the oldest finished workflows first, a page at a time.
Index(
    "ix_durafn_workflows_ended",
    workflows.c.ended_at,
    **partial(workflows.c.ended_at.is_not(None)),
)
# A cancel walks a workflow's children.
Index(
    "ix_durafn_workflows_parent",
    workflows.c.parent_id,
    **partial(workflows.c.parent_id.is_not(None)),
)

workflow_steps = Table(
    "_durafn_workflow_steps",
    metadata,
    Column("workflow_id", ID_TYPE, primary_key=True),
    Column("step_no", Integer, primary_key=True),
    # mutation, query, action, sleep, event, workflow (a child), and what it names:
    # the function's durable name, the event's name, the child workflow's name.
    Column("kind", String(16), nullable=False),
    Column("name", Text, nullable=False),
    Column("args", Text, nullable=False),  # compared on replay, with kind and name
    Column("state", String(16), nullable=False),  # Started, Success, Failed
    Column("result", Text),
    Column("error_type", Text),
    Column("error_message", Text),
    # The row that runs it (an action's) or the child workflow's id.
    Column("row_id", ID_TYPE),
    Column("wake_at", Double),  # a sleep's end, an event wait's timeout
    Column("started_at", Double, nullable=False),
    Column("ended_at", Double),
    # The round in which its outcome was first handed to the body: a replay hands the
    # outcomes over in the same rounds, so concurrent branches (gather) go on in the same
    # order and ask for their steps in the same order (``_workflow/turns.py``).
    Column("delivered", Integer),
)
# An action step's completion finds its step by the row that ran it.
Index(
    "ix_durafn_workflow_steps_row",
    workflow_steps.c.row_id,
    **partial(workflow_steps.c.row_id.is_not(None)),
)

workflow_events = Table(
    "_durafn_workflow_events",
    metadata,
    Column("id", BigInteger().with_variant(Integer(), "sqlite"), primary_key=True),
    Column("workflow_id", ID_TYPE, nullable=False),
    Column("name", Text, nullable=False),
    Column("payload", Text),
    Column("sent_at", Double, nullable=False),
    Column("step_no", Integer),  # the wait that took it; None until one does
)
# A wait takes the oldest event of its name not yet taken.
Index(
    "ix_durafn_workflow_events_unread",
    workflow_events.c.workflow_id,
    workflow_events.c.name,
    workflow_events.c.id,
    **partial(workflow_events.c.step_no.is_(None)),
)
Index("ix_durafn_workflow_events_workflow", workflow_events.c.workflow_id)
