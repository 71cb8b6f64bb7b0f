"""The fast path of a claim (``take``'s module docstring): due unqueued, unkeyed rows by
priority level, one statement a level, while no queued or keyed row of the kind is due.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection

from ..._kinds import FunctionKind
from ..._options import PRIORITY_RANGE
from ..rows import CLAIM_ORDER, Claimed
from .columns import CLAIM_COLUMNS, StartTime, claimed
from .hints import LevelFloor
from .levels import SECOND_LEVEL
from .take import ClaimFilter, statements


async def take_fast(
    conn: AsyncConnection,
    kind: FunctionKind,
    now: float,
    limit: int,
    serve: ClaimFilter,
    lateral: bool = False,
    floor: LevelFloor | None = None,
) -> list[Claimed]:
    """The fast path: due unqueued rows by level, ascending, locked, while no queued row of
    ``kind`` is due (else nothing); from ``floor`` up, if given."""
    st = statements(serve, lateral)
    if st.first is None or st.fast is None:
        return []
    params = {"b_kind": kind.value, "now": now}
    return await _by_level(conn, st.first, st.fast, params, limit, floor)


async def start_fast(
    conn: AsyncConnection,
    now: float,
    limit: int,
    worker_id: str,
    serve: ClaimFilter,
    lateral: bool = False,
    started: StartTime | float | None = None,
) -> list[Claimed]:
    """The fast path for actions, started (at ``started``, default ``now``) in the same
    statements."""
    st = statements(serve, lateral)
    if st.first_actions is None or st.fast_actions is None:
        return []
    params = {
        "b_kind": FunctionKind.ACTION.value,
        "now": now,
        "worker_id": worker_id,
        "started": now if started is None else started,
    }
    return await _by_level(conn, st.first_actions, st.fast_actions, params, limit)


# A claimed row's priority (HIGHEST follows the columns).
_PRIORITY = [column.name for column in CLAIM_COLUMNS].index("priority")


async def _by_level(
    conn: AsyncConnection,
    first: Any,
    fast: Any,
    params: dict[str, Any],
    limit: int,
    floor: LevelFloor | None = None,
) -> list[Claimed]:
    """``first`` from the lowest level; while it falls short and a higher level is Pending
    (its rows carry the highest level), ``first`` again from the next level, and when the
    lowest level had nothing due (its rows in the future, or locked by another claim: a
    concurrent mutation batch holds its rows until it commits), from the second level.

    A drain then changes level with one more run of a statement this connection has run
    already. The one-statement reach over every level (``fast``) in its place cost 5-15
    ms per run in a 20,000-row drain on PostgreSQL (a statement of its own, prepared and
    planned on each of the pool's connections): 9% of the drain with half the rows at
    random priorities. ``fast`` is left for a second level with nothing due either: it
    reads past any number of such levels in one statement."""
    rows: list[Claimed] = []
    from_level = PRIORITY_RANGE[0] if floor is None else floor.level()
    while True:
        more = {**params, "from_level": from_level, "limit": limit - len(rows)}
        found = list(await conn.execute(first, more))
        rows += claimed(found)
        if len(rows) >= limit:
            return rows
        if found:
            level, highest = found[0][_PRIORITY], found[0][-1]
            if floor is not None and level < PRIORITY_RANGE[1]:
                # (At the top of the range, 2**31 - 1, there is no level after it to bind:
                # a claim that bound it failed, out of 32 bits, and stopped the executor.)
                floor.taken_below(level + 1)
            if level == highest:
                return rows
            from_level = level + 1
        elif from_level == PRIORITY_RANGE[0]:
            # Nothing due at the lowest level: an idle claim ends with this one probe.
            second = (await conn.execute(SECOND_LEVEL, params)).scalar()
            if second is None:
                return rows
            from_level = second
        else:
            # Our own locks do not hide rows from us: ``fast`` may find them again.
            return merged(rows, claimed(list(await conn.execute(fast, more))), limit)


def merged(first: list[Claimed], more: list[Claimed], limit: int) -> list[Claimed]:
    """``first`` and the rows of ``more`` not in it, in claim order, at most ``limit``."""
    seen = {r.id for r in first}
    rows = first + [r for r in more if r.id not in seen]
    rows.sort(key=CLAIM_ORDER)
    return rows[:limit]
