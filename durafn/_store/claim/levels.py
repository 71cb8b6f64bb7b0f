"""The priority levels of Pending rows, and when the next row of a kind is due: what every
claim path reads first (``take``, ``fast``), and the idle wait after a claim that came
back short (``next_due``). The claim indexes hold Pending rows only
(``ix_scheduled_functions_claim``, ``_claim_queued``, ``_keyed_due``, ``_batched``), each
read level by level: a loose index scan, one probe a level (neither engine skips through
an index by itself)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    Boolean,
    Double,
    Integer,
    Text,
    and_,
    bindparam,
    exists,
    func,
    literal,
    or_,
    select,
    union_all,
)
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql.elements import ColumnElement

from ..._kinds import FunctionKind
from ..schema.tables import BATCHED, dependencies, sf
from ..sql import PENDING
from .flow import keyed


def pending(queued: bool) -> tuple[ColumnElement[bool], ...]:
    """Pending rows of ``:kind`` in one of the two claim indexes (their predicates: an
    unqueued one is also unbatched, a batched action's rows being ``batched``'s to
    claim); an unqueued one also ``ready`` (rows ``after=`` others are unqueued,
    unkeyed)."""
    return (
        sf.c.state == PENDING,
        sf.c.kind == bindparam("b_kind", type_=Text),
        sf.c.queue_name.is_not(None) if queued else sf.c.queue_name.is_(None),
        sf.c.flow_key.is_(None),
        *(() if queued else (sf.c.batch_key.is_(None), READY)),
    )


READY = or_(
    sf.c.awaiting == 0,
    ~exists().where(dependencies.c.row_id == sf.c.id),
    and_(sf.c.after_failed > 0, sf.c.after_policy.in_(("cancel", "fail"))),
)
"""A row the claim may take: it waits for nothing (``awaiting = 0``, every row not
scheduled ``after=``: the test stops there), or no edge of it is left
(``ix_durafn_dependencies_row``), or a dependency failed and its policy acts on that
(``schema/dependencies.py``)."""


def levels_cte(queued: bool) -> Any:
    """The priority levels of Pending rows of ``:kind``, ascending: one index probe each
    (a loose index scan; neither engine skips through an index by itself)."""
    # ORDER BY ... LIMIT 1, not min(): with fresh rows and stale statistics PostgreSQL
    # answered min() from ix_scheduled_functions_queued_due, reading all of its entries
    # (20,000 queued mutations: 3.7 ms a claim, the most costly statement of that drain).
    first = select(sf.c.priority).where(*pending(queued)).order_by(sf.c.priority).limit(1)
    levels = select(first.scalar_subquery().label("p")).cte(f"levels_{int(queued)}", recursive=True)
    following = (
        select(sf.c.priority)
        .where(*pending(queued), sf.c.priority > levels.c.p)
        .order_by(sf.c.priority)
        .limit(1)
    )
    return levels.union_all(select(following.scalar_subquery()).where(levels.c.p.is_not(None)))


def _first_due(*where: ColumnElement[bool]) -> Any:
    """The earliest ``available_at`` of these rows, written ``ORDER BY ... LIMIT 1`` rather
    than ``min()``: the planner then reads the first entry of the index in that order
    (``ix_scheduled_functions_keyed_due``, ``_queued_due``). As ``min()``, PostgreSQL with
    fresh rows and stale statistics read every entry of ``ix_scheduled_functions_keys``
    instead: 3.4 ms a claim with 10,000 keyed actions, against 0.05 ms."""
    first = select(sf.c.available_at).where(*where).order_by(sf.c.available_at).limit(1)
    return first.scalar_subquery()


def _levels() -> Any:
    """(queued, level) of both claim indexes, and a row (None, 0) if a keyed row is due
    (ix_scheduled_functions_keyed_due), in one statement: one round trip. The keyed part
    of a claim runs only then: a statement of its own on every full claim cost a queued
    drain (1000 serial queues) about 8% on PostgreSQL."""
    parts = []
    for queued in (False, True):
        levels = levels_cte(queued)
        parts.append(
            select(literal(queued, Boolean).label("queued"), levels.c.p).where(
                levels.c.p.is_not(None)
            )
        )
    keyed_due = _first_due(*keyed())
    parts.append(
        select(literal(None, Boolean), literal(0, Integer)).where(
            keyed_due <= bindparam("now", type_=Double)
        )
    )
    return union_all(*parts)


def _next_due(queued: bool, after: bool) -> Any:
    """The earliest ``available_at`` (later than ``:after``) over every level's range."""
    levels = levels_cte(queued)
    first = (
        select(sf.c.available_at)
        .where(*pending(queued), sf.c.priority == levels.c.p)
        .order_by(sf.c.available_at)
        .limit(1)
    )
    if after:
        first = first.where(sf.c.available_at > bindparam("after", type_=Double))
    return select(func.min(first.scalar_subquery())).where(levels.c.p.is_not(None))


# No queued row of the kind is due: the first entry of ix_scheduled_functions_queued_due,
# so a queued row due next week does not send every claim down the full path.
_FIRST_QUEUED_DUE = _first_due(*pending(True))
# Nor a keyed one (flow control: claimed per key), from ix_scheduled_functions_keyed_due.
_FIRST_KEYED_DUE = _first_due(*keyed())
NO_QUEUED = and_(
    or_(_FIRST_QUEUED_DUE.is_(None), bindparam("now", type_=Double) < _FIRST_QUEUED_DUE),
    or_(_FIRST_KEYED_DUE.is_(None), bindparam("now", type_=Double) < _FIRST_KEYED_DUE),
)
# The highest unqueued level Pending (its last entry in ix_scheduled_functions_claim):
# returned with the fast path's first try, to tell whether a second could find more.
HIGHEST = select(func.max(sf.c.priority)).where(*pending(False)).scalar_subquery()
# The second level (one probe after another): asked when the first try found nothing.
SECOND_LEVEL = select(func.min(sf.c.priority)).where(
    *pending(False),
    sf.c.priority > select(func.min(sf.c.priority)).where(*pending(False)).scalar_subquery(),
)
LEVELS = _levels()


def _next_keyed(after: bool) -> Any:
    later = (sf.c.available_at > bindparam("after", type_=Double),) if after else ()
    return _first_due(*keyed(), *later)


def _next_batched(after: bool) -> Any:
    """A batched action's row (``batched``): its due time, though its batch may wait
    longer (``max_wait``: the claim of batches tells the executor when)."""
    later = (sf.c.available_at > bindparam("after", type_=Double),) if after else ()
    kind = sf.c.kind == bindparam("b_kind", type_=Text)
    return _first_due(BATCHED, kind, *later)  # ix_scheduled_functions_batched


# Every class of Pending rows in one statement (one round trip: the idle wait reads it
# after every claim that came back short).
NEXT_DUE = {
    after: select(
        _next_due(False, after).scalar_subquery(),
        _next_due(True, after).scalar_subquery(),
        _next_keyed(after),
        _next_batched(after),
    )
    for after in (False, True)
}


async def next_due(conn: AsyncConnection, kind: FunctionKind, after: float | None) -> float | None:
    """When the next Pending row of ``kind`` (due later than ``after``) becomes due."""
    params = {"b_kind": kind.value, "after": after}
    found = (await conn.execute(NEXT_DUE[after is not None], params)).one()
    return min((t for t in found if t is not None), default=None)


def due_at_level(queued: bool) -> tuple[ColumnElement[bool], ...]:
    return (
        *pending(queued),
        sf.c.priority == bindparam("level", type_=Integer),
        sf.c.available_at <= bindparam("now", type_=Double),
    )
