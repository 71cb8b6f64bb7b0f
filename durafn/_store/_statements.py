"""The hot finish statements, built once, each with the index it uses (the claims are in
``_claims``).

Constructing a Core statement costs ~0.3 ms of Python, as much as running it, so the
statements the executor runs per batch are built at import. Values arrive as bind
parameters, "now" included (the injected clock reaches the SQL). Dialects that need
another form of one (PostgreSQL's array-bound finishes) override the driver hook that
runs it, in their own module.
"""

from __future__ import annotations

from typing import TypedDict

from sqlalchemy import bindparam, update

from .._types import State
from ._tables import sf


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
