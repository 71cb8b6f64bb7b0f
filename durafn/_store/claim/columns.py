"""What every claim shares: the columns a claimed row is read with, and how an action's
start is written (the claims themselves are in ``take``, ``fast``, ``queues``, ``flow``
and ``inline``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Double, Row, bindparam
from sqlalchemy.engine import Dialect
from sqlalchemy.types import TypeDecorator

from ..._clock import Clock
from ..rows import CLAIM_ORDER, Claimed
from ..schema.tables import sf
from ..sql import RUNNING

CLAIM_COLUMNS = tuple(sf.c[name] for name in Claimed._fields)
"""The columns a claim reads, in ``Claimed``'s order (its fields are named for them)."""


def claimed(rows: Sequence[Row[Any]]) -> list[Claimed]:
    """Claimed rows in claim order (an UPDATE ... RETURNING returns them in no order)."""
    make, width = Claimed._make, len(CLAIM_COLUMNS)
    out = [make(row[:width]) for row in rows]
    out.sort(key=CLAIM_ORDER)
    return out


class StartTime:
    """An action's start, as a claim writes it: the clock, read once the claim holds its
    lock, not before.

    A claim reads ``now`` before it has its connection and lock (what is due is decided
    by it); a finish that committed while the claim waited (SQLite's one writer, a
    pooled connection) may have been stamped later than that. Stamped with ``now``, a
    dependent released by that finish started, on record, before its dependency ended
    (the issue's fan-in: 2 of 3 rounds of 200 rows on SQLite). So the start is read when
    the database driver binds it: sqlite3 asks ``__conform__`` as it binds the statement,
    on the connection's thread after ``BEGIN IMMEDIATE`` took the write lock; asyncpg
    asks ``__float__`` as it encodes the statement on the connection the claim waited
    for (after ``take``'s reads, for the full claim's ``START_ACTIONS``). Read once: every
    row and statement of the claim gets the same time. Make one per attempt of a
    transaction (a retry waits for the lock again)."""

    __slots__ = ("_clock", "_value")

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._value: float | None = None

    def value(self) -> float:
        """The time, read now if it has not been."""
        if self._value is None:
            self._value = self._clock.now()
        return self._value

    def __float__(self) -> float:
        return self.value()

    def __conform__(self, protocol: object) -> float:
        return self.value()

    def __repr__(self) -> str:
        return f"StartTime({self._value if self._value is not None else 'unread'})"


class _Start(TypeDecorator[float]):
    """A float bound as it is: SQLAlchemy's own float processor would read a
    ``StartTime`` as the statement is compiled, before the lock."""

    impl = Double
    cache_ok = True

    def bind_processor(self, dialect: Dialect) -> None:
        return None


STARTED: dict[str, Any] = {
    "state": RUNNING,
    "started_time": bindparam("started", type_=_Start()),
    "worker_id": bindparam("worker_id"),
    "attempts": sf.c.attempts + 1,
}
"""What starting an action writes (Pending -> InProgress, under a worker, counted); its
``started`` is a ``StartTime`` (or, in the conformance tests, a plain float)."""
