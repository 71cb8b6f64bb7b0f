"""The hot statements, built once, each with the index it uses.

Constructing a Core statement costs ~0.3 ms of Python, as much as running it, so the
statements the executor runs per batch are built at import. Values arrive as bind
parameters, "now" included (the injected clock reaches the SQL). Dialects that need
another form of one (PostgreSQL's array-bound finishes) override the driver hook that
runs it, in their own module.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, TypedDict

from sqlalchemy import Row, bindparam, select, update

from .._types import FunctionKind, State
from ._rows import Claimed
from ._tables import sf

CLAIM_COLUMNS = (sf.c.id, sf.c.name, sf.c.args, sf.c.attempts, sf.c.parent_id, sf.c.available_at)


def claimed(rows: Iterable[Row[Any]]) -> list[Claimed]:
    """Claimed rows in due order (an UPDATE ... RETURNING returns them in no order)."""
    out = [Claimed(*row) for row in rows]
    out.sort(key=lambda c: (c.available_at, c.id))
    return out


def _due(kind: FunctionKind) -> Any:
    # ix_scheduled_functions_due: (kind, available_at, id) WHERE state = 'Pending'.
    return (
        select(*CLAIM_COLUMNS)
        .where(
            sf.c.state == State.PENDING.value,
            sf.c.kind == kind.value,
            sf.c.available_at <= bindparam("now"),
        )
        .order_by(sf.c.available_at, sf.c.id)
        .limit(bindparam("limit"))
    )


# FOR UPDATE SKIP LOCKED on PostgreSQL: concurrent lanes and executors take disjoint rows.
# SQLite ignores the clause; its BEGIN IMMEDIATE already makes the batch the only writer.
CLAIM_MUTATIONS = _due(FunctionKind.MUTATION).with_for_update(skip_locked=True)

# A MATERIALIZED CTE, not ``id IN (SELECT ... LIMIT n)``: PostgreSQL may re-run an
# IN-subquery per row and so claim more than ``limit`` rows (caught by
# test_actions_run_concurrently_up_to_the_limit).
DUE_ACTIONS = (
    _due(FunctionKind.ACTION)
    .with_only_columns(sf.c.id)
    .with_for_update(skip_locked=True)
    .cte("due")
    .prefix_with("MATERIALIZED")
)
# The due rows through DUE_ACTIONS (ix_scheduled_functions_due), each updated by its
# primary key.
CLAIM_ACTIONS = (
    update(sf)
    .where(sf.c.id == DUE_ACTIONS.c.id, sf.c.state == State.PENDING.value)
    .values(
        state=State.IN_PROGRESS.value,
        started_time=bindparam("now"),
        worker_id=bindparam("worker_id"),
        attempts=sf.c.attempts + 1,
    )
    .returning(*CLAIM_COLUMNS)
)


class FinishParams(TypedDict):
    """The parameters every finish statement shares."""

    now: float
    expected: str
    counted: int
    """1 for a mutation, whose run is counted as it finishes (its start was never
    committed); 0 for an action, counted when it was claimed."""


# Both finishes find their rows by primary key; ``expected`` is the state guard.
FINISH_PLAIN = (
    update(sf)
    .where(sf.c.id.in_(bindparam("ids", expanding=True)), sf.c.state == bindparam("expected"))
    .values(
        state=State.SUCCESS.value,
        completed_time=bindparam("now"),
        attempts=sf.c.attempts + bindparam("counted"),
    )
)
FINISH_ONE = (
    update(sf)
    .where(sf.c.id == bindparam("b_id"), sf.c.state == bindparam("expected"))
    .values(
        state=bindparam("b_state"),
        completed_time=bindparam("now"),
        result=bindparam("b_result"),
        error_type=bindparam("b_error_type"),
        error_message=bindparam("b_error_message"),
        error_traceback=bindparam("b_error_traceback"),
        attempts=sf.c.attempts + bindparam("counted"),
    )
)
