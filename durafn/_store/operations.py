"""Operations' rows (``_durafn_operations``) and the reads an operation's pages and the
failure groups make of ``_scheduled_functions`` (a part of ``Driver``). What an
operation is and how its pages run: ``durafn/_operations.py``."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    CursorResult,
    and_,
    delete,
    func,
    insert,
    literal,
    literal_column,
    select,
    true,
    update,
)
from sqlalchemy.ext.asyncio import AsyncConnection

from .._clock import to_datetime
from .._models import FailureGroup, Operation
from .filters import RowFilter
from .schema.tables import operations, sf

RUNNING = "Running"


@dataclass(frozen=True)
class WindowRow:
    """A row of an operation's window: its id, and whether the operation's filter matches it."""

    id: str
    hit: bool


class OperationStatements:
    async def insert_operation(
        self,
        conn: AsyncConnection,
        *,
        kind: str,
        filter: dict[str, Any],
        change: dict[str, Any],
        who: str,
        now: float,
        total: int,
    ) -> int:
        """Write a Running operation; its id."""
        found = await conn.execute(
            insert(operations)
            .values(
                kind=kind,
                filter=json.dumps(filter, sort_keys=True),
                change=json.dumps(change, sort_keys=True),
                who=who,
                created_at=now,
                updated_at=now,
                total=total,
                state=RUNNING,
            )
            .returning(operations.c.id)
        )
        return int(found.scalar_one())

    async def get_operation(
        self, conn: AsyncConnection, id: int, bound: int
    ) -> tuple[Operation, str] | None:
        """An operation (primary key) and its cursor; None if there is none. ``bound``:
        where its total was counted up to."""
        row = (await conn.execute(select(operations).where(operations.c.id == id))).first()
        return None if row is None else (_operation(row, bound), row.cursor)

    async def list_operations(
        self, conn: AsyncConnection, *, limit: int, before: int | None, bound: int
    ) -> list[Operation]:
        """The newest ``limit`` operations with an id below ``before`` (the primary key,
        read backwards)."""
        query = select(operations).order_by(operations.c.id.desc()).limit(limit)
        if before is not None:
            query = query.where(operations.c.id < before)
        return [_operation(r, bound) for r in await conn.execute(query)]

    async def running_operations(self, conn: AsyncConnection, limit: int) -> list[int]:
        """The oldest ``limit`` Running operations (ix_durafn_operations_running: as few
        entries as operations running; the workers read it every poll)."""
        query = (
            select(operations.c.id)
            .where(operations.c.state == literal_column("'Running'"))
            .order_by(operations.c.id)
            .limit(limit)
        )
        return [int(i) for i in (await conn.execute(query)).scalars()]

    async def operation_window(
        self, conn: AsyncConnection, where: RowFilter, after: str | None, scan: int
    ) -> list[WindowRow]:
        """The next ``scan`` rows in id order after ``after`` (a range of the primary key,
        whatever the filter), each with whether ``where`` matches it: a page reads at most
        ``scan`` rows however few match."""
        hit = and_(true(), *where.where()).label("hit")
        query = select(sf.c.id, hit).order_by(sf.c.id).limit(scan)
        if after:
            query = query.where(sf.c.id > after)
        return [WindowRow(str(r.id), bool(r.hit)) for r in await conn.execute(query)]

    async def advance_operation(
        self,
        conn: AsyncConnection,
        id: int,
        *,
        expected: str,
        cursor: str,
        scanned: int,
        now: float,
    ) -> bool:
        """Take a page: move the cursor from ``expected`` to ``cursor``, where the
        operation is still Running and still at ``expected`` (a guarded UPDATE: of two
        runners at one cursor, one takes the page, the other's update matches nothing;
        on PostgreSQL it waits for the first's commit and then finds the cursor moved)."""
        result = await conn.execute(
            update(operations)
            .where(
                operations.c.id == id,
                operations.c.state == RUNNING,
                operations.c.cursor == expected,
            )
            .values(cursor=cursor, scanned=operations.c.scanned + scanned, updated_at=now)
        )
        assert isinstance(result, CursorResult)
        return result.rowcount == 1

    async def count_operation(self, conn: AsyncConnection, id: int, changed: int) -> None:
        """Add a taken page's changed rows (the page's transaction holds the row)."""
        await conn.execute(
            update(operations).where(operations.c.id == id).values(done=operations.c.done + changed)
        )

    async def end_operation(
        self, conn: AsyncConnection, id: int, state: str, now: float, error: str | None = None
    ) -> bool:
        """Running -> ``state`` (Done, Failed, Canceled); False if it had ended."""
        result = await conn.execute(
            update(operations)
            .where(operations.c.id == id, operations.c.state == RUNNING)
            .values(state=state, finished_at=now, updated_at=now, error=error)
        )
        assert isinstance(result, CursorResult)
        return result.rowcount == 1

    async def delete_operations(
        self, conn: AsyncConnection, *, older_than: float, limit: int
    ) -> int:
        """Remove up to ``limit`` operations that ended before ``older_than``
        (ix_durafn_operations_finished); how many."""
        oldest = (
            select(operations.c.id)
            .where(operations.c.finished_at < older_than)
            .order_by(operations.c.finished_at)
            .limit(limit)
        )
        result = await conn.execute(delete(operations).where(operations.c.id.in_(oldest)))
        assert isinstance(result, CursorResult)
        return result.rowcount

    async def count_up_to(self, conn: AsyncConnection, where: RowFilter, bound: int) -> int:
        """How many rows match ``where``, counting no further than ``bound``: the rows
        its filter leaves to read, until ``bound`` match (an operation's total when it
        starts; at most the cost of the bulk confirmation's exact count, ``count_rows``)."""
        matching = select(literal(1)).select_from(sf).where(*where.where()).limit(bound)
        stmt = select(func.count()).select_from(matching.subquery())
        return int((await conn.execute(stmt)).scalar_one())

    async def failure_groups(
        self, conn: AsyncConnection, *, scan: int, limit: int
    ) -> list[FailureGroup]:
        """The Failed rows among the ``scan`` rows that ended last (a range of
        ix_scheduled_functions_completed, read backwards), grouped by function and error
        type, the largest groups first."""
        ended = (
            select(sf.c.name, sf.c.state, sf.c.error_type, sf.c.error_message, sf.c.completed_time)
            .where(sf.c.completed_time.is_not(None))
            .order_by(sf.c.completed_time.desc())
            .limit(scan)
            .subquery()
        )
        error_type = func.coalesce(ended.c.error_type, "")
        count = func.count().label("n")
        query = (
            select(
                ended.c.name,
                error_type.label("error_type"),
                count,
                func.min(ended.c.completed_time).label("first"),
                func.max(ended.c.completed_time).label("last"),
                func.max(func.coalesce(ended.c.error_message, "")).label("sample"),
            )
            .where(ended.c.state == "Failed")
            .group_by(ended.c.name, error_type)
            .order_by(count.desc(), ended.c.name, error_type)
            .limit(limit)
        )
        return [
            FailureGroup(
                name=r.name,
                error_type=r.error_type,
                count=r.n,
                first_seen=to_datetime(r.first),
                last_seen=to_datetime(r.last),
                sample=r.sample,
            )
            for r in await conn.execute(query)
        ]


def _operation(row: Any, bound: int) -> Operation:
    return Operation(
        id=row.id,
        kind=row.kind,
        filter=json.loads(row.filter),
        change=json.loads(row.change),
        who=row.who,
        created_at=to_datetime(row.created_at),
        updated_at=to_datetime(row.updated_at),
        total=row.total,
        total_bounded=row.total >= bound,
        done=row.done,
        scanned=row.scanned,
        state=row.state,
        finished_at=None if row.finished_at is None else to_datetime(row.finished_at),
        error=row.error,
    )
