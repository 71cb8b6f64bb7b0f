"""Cancelling rows in the database: one row (and a running action's descendants), the
completion callbacks of what was cancelled, and telling running actions of it.

A cancelled InProgress action keeps running in its worker until told: ``announce_cancels``
notes the ids for this process (``after_commit``), and PostgreSQL's driver NOTIFYs every
process as well; ``canceled_among`` is the executors' poll of their running rows.
"""

from __future__ import annotations

import builtins
from collections.abc import Sequence
from typing import Any

from sqlalchemy import CursorResult, Double, bindparam, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from ..._errors import DatabaseError
from ..._kinds import ScheduledFunctionId, State
from ..after_commit import note
from ..rows import is_id
from ..schema.tables import sf
from .completions import CompletionStatements, canceled

CANCEL: dict[str, Any] = {
    "state": State.CANCELED.value,
    "completed_time": bindparam("now", type_=Double),
}
"""What cancelling a row writes (its guard is the caller's)."""
CANCELED_COLUMNS = (sf.c.id, sf.c.name, sf.c.on_complete)
"""What a cancelling UPDATE returns: the rows it moved, for their completion callbacks."""

_RUNNABLE = (State.PENDING.value, State.IN_PROGRESS.value)


class CancelStatements(CompletionStatements):
    """The driver's cancels (a part of ``Driver``)."""

    async def cancel(
        self, conn: AsyncConnection, id: ScheduledFunctionId, now: float
    ) -> State | None:
        """Cancel one row (and, if it was running, its unfinished descendants).

        Returns the state the row had, or None if there is no such row.
        """
        if not is_id(id):
            return None
        row = (
            await conn.execute(
                select(sf.c.state, *CANCELED_COLUMNS[1:]).where(sf.c.id == id).with_for_update()
            )
        ).first()
        if row is None:
            return None
        previous = State(row[0])
        if previous.finished:
            return previous
        result = await conn.execute(
            update(sf)
            .where(sf.c.id == id, sf.c.state == previous.value)
            .values(state=State.CANCELED.value, completed_time=now)
        )
        assert isinstance(result, CursorResult)
        if result.rowcount != 1:  # pragma: no cover - the row lock above prevents it
            raise DatabaseError(f"scheduled function {id} changed state while being cancelled")
        await self.write_completions(conn, now, canceled([(id, row[1], row[2])]))
        if previous is State.IN_PROGRESS:
            await self.announce_cancels(conn, [id])
            await self.cancel_descendants(conn, id, now)
        return previous

    async def cancel_descendants(
        self, conn: AsyncConnection, root: ScheduledFunctionId, now: float
    ) -> int:
        # Walks the whole subtree (through finished rows too: a finished child's own
        # children may still be Pending) via ix_scheduled_functions_parent.
        tree = select(sf.c.id).where(sf.c.parent_id == root).cte("tree", recursive=True)
        tree = tree.union_all(select(sf.c.id).join(tree, sf.c.parent_id == tree.c.id))
        stmt = (
            update(sf)
            .where(sf.c.id.in_(select(tree.c.id)), sf.c.state.in_(_RUNNABLE))
            .values(CANCEL)
            .returning(*CANCELED_COLUMNS)
        )
        # Sweep until the set of descendants stops growing. On PostgreSQL one statement
        # sees one snapshot: if the UPDATE waited for a running descendant mutation's lock,
        # the rows that mutation committed meanwhile are invisible to it (so "until a sweep
        # changes nothing" is not enough), but visible to the next SELECT.
        seen: set[str] = set()
        total = 0
        while True:
            found = {str(i) for i in (await conn.execute(select(tree.c.id))).scalars()}
            if found <= seen:
                return total
            seen |= found
            rows = (await conn.execute(stmt, {"now": now})).all()
            await self.write_completions(conn, now, canceled(rows))
            # Some may be running actions (RETURNING cannot tell which were Pending).
            await self.announce_cancels(conn, [str(row[0]) for row in rows])
            total += len(rows)

    async def announce_cancels(self, conn: AsyncConnection, ids: Sequence[str]) -> None:
        """Tell the actions of these rows (cancelled in this transaction) that are running
        in this process, once it commits; PostgreSQL's driver tells every process."""
        note(conn).canceled.update(ids)

    async def canceled_among(
        self, conn: AsyncConnection, ids: Sequence[ScheduledFunctionId]
    ) -> builtins.list[str]:
        """Which of these rows are Canceled (by primary key)."""
        found: list[str] = []
        for start in range(0, len(ids), 500):  # SQLite's limit on bound parameters
            chunk = ids[start : start + 500]
            stmt = select(sf.c.id).where(sf.c.id.in_(chunk), sf.c.state == State.CANCELED.value)
            found += [str(id) for id in (await conn.execute(stmt)).scalars()]
        return found
