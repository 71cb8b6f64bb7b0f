"""The hot finish statements, built once, each with the index it uses, and what every
claim shares: the columns a claimed row is read with, how a start is written (the claims
themselves are in ``_claims`` and ``_queue_claims``).

Constructing a Core statement costs ~0.3 ms of Python, as much as running it, so the
statements the executor runs per batch are built at import. Values arrive as bind
parameters, "now" included (the injected clock reaches the SQL). Dialects that need
another form of one (PostgreSQL's array-bound finishes) override the driver hook that
runs it, in their own module.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypedDict

from sqlalchemy import (
    BigInteger,
    Boolean,
    Double,
    Row,
    Text,
    bindparam,
    func,
    literal,
    literal_column,
    update,
)
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.sql.functions import FunctionElement

from .._types import State
from ._rows import Claimed, Outcome
from ._tables import sf

CLAIM_COLUMNS = (
    sf.c.id,
    sf.c.name,
    sf.c.args,
    sf.c.attempts,
    sf.c.parent_id,
    sf.c.available_at,
    sf.c.priority,
    sf.c.queue_name,
    sf.c.on_complete,
    # What a failed run's retry depends on (``RetryState``): read with the claim, not
    # again when a run fails (a SELECT per failing batch cost 6 ms on PostgreSQL).
    sf.c.retry,
    sf.c.max_attempts,
    sf.c.failures,
    sf.c.flow_key,
    sf.c.flow,
    sf.c.seq,
)
# Literals, not bind parameters: a partial index is used only when the query's WHERE
# visibly implies the index's (SQLite does not look into parameters).
PENDING: ColumnElement[str] = literal_column(f"'{State.PENDING.value}'")
RUNNING: ColumnElement[str] = literal_column(f"'{State.IN_PROGRESS.value}'")


class _Within(FunctionElement[bool]):
    """``needle`` occurs in ``haystack``, case-sensitively on both engines: SQLite's LIKE
    ignores ASCII case (a worker forbidding ``bulk`` skipped rows flagged ``Bulk``), and
    its case_sensitive_like pragma would change the users' own queries on the connection.
    """

    type = Boolean()
    name = "within"
    inherit_cache = True


@compiles(_Within)
def _strpos(element: _Within, compiler: SQLCompiler, **kw: Any) -> str:
    needle, haystack = (compiler.process(c, **kw) for c in element.clauses)
    return f"(strpos({haystack}, {needle}) > 0)"


@compiles(_Within, "sqlite")
def _instr(element: _Within, compiler: SQLCompiler, **kw: Any) -> str:
    needle, haystack = (compiler.process(c, **kw) for c in element.clauses)
    return f"(instr({haystack}, {needle}) > 0)"


class _NextSeq(FunctionElement[int]):
    """A new row's ``seq`` (``_tables``), the ``offset``-th of the rows one statement
    writes: PostgreSQL's identity gives it (``DEFAULT``); on SQLite it is the rowid the row
    gets, one more than the largest (a write holds the database's one write lock). SQLite
    reads the subquery of every row of a multi-row VALUES before it writes the first
    (tests/test_driver.py checks that it stays so), hence the offset."""

    type = BigInteger()
    name = "next_seq"
    inherit_cache = True

    def __init__(self, offset: int) -> None:
        super().__init__()
        self.offset = offset


@compiles(_NextSeq)
def _identity(element: _NextSeq, compiler: SQLCompiler, **kw: Any) -> str:
    return "DEFAULT"


@compiles(_NextSeq, "sqlite")
def _rowid(element: _NextSeq, compiler: SQLCompiler, **kw: Any) -> str:
    return f"((SELECT coalesce(max(rowid), 0) FROM _scheduled_functions) + {element.offset:d})"


def next_seq(offset: int = 1) -> ColumnElement[int]:
    """The ``seq`` of the ``offset``-th new row of a statement (``_NextSeq``)."""
    return _NextSeq(offset)


def carries(flag: str) -> ColumnElement[bool]:
    """The row carries ``flag`` (``flags`` is stored ``,a,b,``: one substring test)."""
    return _Within(literal(f",{flag},", Text), sf.c.flags)


def claimed(rows: Sequence[Row[Any]]) -> list[Claimed]:
    """Claimed rows in claim order (an UPDATE ... RETURNING returns them in no order)."""
    out = [Claimed(*row[: len(CLAIM_COLUMNS)]) for row in rows]
    out.sort(key=Claimed.order)
    return out


STARTED: dict[str, Any] = {
    "state": RUNNING,
    "started_time": bindparam("now", type_=Double),
    "worker_id": bindparam("worker_id"),
    "attempts": sf.c.attempts + 1,
}
"""What starting an action writes (Pending -> InProgress, under a worker, counted)."""

CANCEL: dict[str, Any] = {
    "state": State.CANCELED.value,
    "completed_time": bindparam("now", type_=Double),
}
"""What cancelling a row writes (its guard is the caller's)."""
CANCELED_COLUMNS = (sf.c.id, sf.c.name, sf.c.on_complete)
"""What a cancelling UPDATE returns: the rows it moved, for their completion callbacks."""


class FinishParams(TypedDict):
    """The parameters every finish statement shares."""

    now: float
    expected: str
    counted: int
    """1 for a mutation, whose run is counted as it finishes (its start was never
    committed); 0 for an action, counted when it was claimed."""
    started: float | None
    """When a mutation's batch began (its start was never committed either: written with
    its finish); None for an action, whose claim wrote it."""


# A mutation's start, written with its finish; an action's stays as its claim wrote it.
_STARTED = func.coalesce(bindparam("started", type_=Double), sf.c.started_time)
# Both finishes find their rows by primary key; ``expected`` is the state guard.
FINISH_PLAIN = (
    update(sf)
    .where(sf.c.id.in_(bindparam("ids", expanding=True)), sf.c.state == bindparam("expected"))
    .values(
        state=State.SUCCESS.value,
        started_time=_STARTED,
        completed_time=bindparam("now"),
        attempts=sf.c.attempts + bindparam("counted"),
        # A run that succeeded after failed ones: its error is history now.
        error_type=None,
        error_message=None,
        error_traceback=None,
    )
)
FINISH_ONE = (
    update(sf)
    .where(sf.c.id == bindparam("b_id"), sf.c.state == bindparam("expected"))
    .values(
        state=bindparam("b_state"),
        started_time=_STARTED,
        completed_time=bindparam("now"),
        result=bindparam("b_result"),
        error_type=bindparam("b_error_type"),
        error_message=bindparam("b_error_message"),
        error_traceback=bindparam("b_error_traceback"),
        attempts=sf.c.attempts + bindparam("counted"),
        failures=sf.c.failures + bindparam("b_failed"),
    )
)


def finish_params(o: Outcome, common: FinishParams) -> dict[str, Any]:
    """FINISH_ONE's parameters for one outcome."""
    return {
        "b_id": o.id,
        "b_state": o.state.value,
        "b_result": o.result,
        "b_error_type": o.error_type,
        "b_error_message": o.error_message,
        "b_error_traceback": o.error_traceback,
        "b_failed": int(o.state is State.FAILED),
        **common,
    }
