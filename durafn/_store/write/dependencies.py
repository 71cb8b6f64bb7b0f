"""Rows scheduled ``after=`` others (``schema/dependencies.py`` releases them).

Scheduling, in the writing transaction, before the rows are inserted: the rows named are
marked ``dependents = 1`` by an UPDATE that returns their states (PostgreSQL locks them,
so a finish running at the same moment either commits first, and its state is read here,
or waits, and its trigger then finds this transaction's edges); an id not found is an
error and nothing is written. A row waits for those not finished for good: ``awaiting``
counts them and its edges go into ``_durafn_dependencies`` (the claim takes it once none
is left: ``claim/take.py``'s ``READY``). One that ended other than Success is counted in
``after_failed``.

A claim skips a row so locked (``SKIP LOCKED``) and its executor, taking it for a row
another claim holds, sleeps until a wake-up: the writing transaction wakes the kinds of
the Pending rows it marked when it commits (``_writers.write``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import bindparam, insert, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from ..._errors import SchedulingError
from ..._kinds import FINISHED_STATES, FunctionKind, ScheduledFunctionId, State
from ..rows import NewRow
from ..schema.tables import dependencies, sf

_LINK = (
    update(sf)
    .where(sf.c.id == bindparam("b_id"))
    .values(
        awaiting=bindparam("b_awaiting"),
        after_failed=bindparam("b_failed"),
        after_policy=bindparam("b_policy"),
    )
)


class DependencyStatements:
    """The driver's statements on dependencies (a part of ``Driver``)."""

    async def mark_dependencies(
        self, conn: AsyncConnection, ids: Sequence[str]
    ) -> tuple[dict[str, State], set[FunctionKind]]:
        """Mark these rows as awaited; return their states, and the kinds of those
        Pending (locked until the caller's transaction ends). A missing id is a
        ``SchedulingError`` (the caller's transaction then writes nothing)."""
        states: dict[str, State] = {}
        pending: set[FunctionKind] = set()
        for start in range(0, len(ids), 500):  # SQLite's limit on bound parameters
            chunk = ids[start : start + 500]
            result = await conn.execute(
                update(sf)
                .where(sf.c.id.in_(chunk))
                .values(dependents=1)
                .returning(sf.c.id, sf.c.state, sf.c.kind)
            )
            for id, value, kind in result:
                state = states[str(id)] = State(value)
                if state is State.PENDING:
                    pending.add(FunctionKind(kind))
        missing = [id for id in ids if id not in states]
        if missing:
            more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
            raise SchedulingError(
                f"after= names a row that does not exist: {missing[0]}{more} (ids of rows "
                "already written, in this transaction or earlier; removed rows are gone)"
            )
        return states, pending

    async def prepare_waiting(
        self, conn: AsyncConnection, rows: Sequence[NewRow]
    ) -> tuple[list[dict[str, Any]], set[FunctionKind]]:
        """Before ``rows`` (each with ``after``) are inserted: mark what they wait for,
        park those that must wait; returns what ``link_waiting`` writes after the insert,
        and the kinds to wake when the transaction commits (``mark_dependencies``)."""
        wanted = list(dict.fromkeys(id for row in rows for id in row["after"] or ()))
        states, locked = await self.mark_dependencies(conn, wanted)
        links: list[dict[str, Any]] = []
        for row in rows:
            after = row["after"] or ()
            live = [id for id in after if states[id] not in FINISHED_STATES]
            failed = sum(states[id] in (State.FAILED, State.CANCELED) for id in after)
            policy = row["after_policy"]
            links.append(
                {
                    "b_id": row["id"],
                    "b_awaiting": len(live),
                    "b_failed": failed,
                    "b_policy": policy,
                    "live": live,
                }
            )
        return links, locked

    async def link_waiting(self, conn: AsyncConnection, links: Sequence[dict[str, Any]]) -> None:
        """After the insert: each row's counts and policy, and its edges."""
        await conn.execute(
            _LINK, [{k: v for k, v in link.items() if k != "live"} for link in links]
        )
        edges = [{"dep_id": dep, "row_id": link["b_id"]} for link in links for dep in link["live"]]
        for start in range(0, len(edges), 500):
            await conn.execute(insert(dependencies), edges[start : start + 500])


async def awaited(conn: AsyncConnection, id: ScheduledFunctionId) -> list[ScheduledFunctionId]:
    """The rows ``id`` still waits for (by ``ix_durafn_dependencies_row``)."""
    rows = await conn.execute(
        select(dependencies.c.dep_id)
        .where(dependencies.c.row_id == id)
        .order_by(dependencies.c.dep_id)
    )
    return [ScheduledFunctionId(str(dep)) for (dep,) in rows]
