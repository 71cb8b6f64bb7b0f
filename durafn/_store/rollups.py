"""The per-minute and per-hour rollups (``_durafn_rollups``, a part of ``Driver``): how
they are written from the rows that ended, read for a chart, and pruned.

Writes are ``INSERT ... SELECT ... GROUP BY ... ON CONFLICT DO NOTHING``: a minute (or
hour) rolled up twice, by two workers' passes at once, keeps the first rows written and
the second adds nothing (the primary key is the guard). Only closed minutes are rolled
up (``_executor/rollups.py`` says which): a finished row does not change its end time,
so a second pass over the same minutes computes the same rows. With them, in the same
transaction, the span's mark (``_durafn_rollup_marks``) moves forward to the end of what
was written, never back: a reader knows which minutes are in, the empty ones too."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from sqlalchemy import CursorResult, and_, case, delete, func, literal, select, update
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql.elements import ColumnElement

from .._kinds import State
from .._latency import EDGES
from .schema.tables import DURATION_COLUMNS, LAG_COLUMNS, rollup_marks, rollups, sf
from .sql import MinuteStart

MINUTE, HOUR = 60, 3600
ENDED = (State.SUCCESS.value, State.FAILED.value, State.CANCELED.value)
_MEASURES = (*LAG_COLUMNS, *DURATION_COLUMNS)


@dataclass(frozen=True)
class RollupRow:
    """One group of a read: rows of ``state`` that ended in the span starting at
    ``start`` (of one function and queue, or summed over them)."""

    start: int
    state: str
    count: int
    lag: tuple[int, ...]
    duration: tuple[int, ...]
    function_name: str = ""
    queue: str = ""


def _histogram(value: ColumnElement[float]) -> list[ColumnElement[int]]:
    """A SUM per bucket of ``_latency.EDGES`` over the rows that started."""
    out: list[ColumnElement[int]] = []
    for i in range(len(EDGES) + 1):
        within: list[ColumnElement[bool]] = [sf.c.started_time.is_not(None)]
        if i > 0:
            within.append(value >= literal(EDGES[i - 1]))
        if i < len(EDGES):
            within.append(value < literal(EDGES[i]))
        out.append(func.sum(case((and_(*within), 1), else_=0)))
    return out


_MINUTE = MinuteStart(sf.c.completed_time)
_QUEUE = func.coalesce(sf.c.queue_name, "")
_PER_MINUTE = select(
    literal(MINUTE),
    _MINUTE,
    sf.c.name,
    _QUEUE,
    sf.c.state,
    func.count(),
    *_histogram(sf.c.started_time - sf.c.scheduled_time),
    *_histogram(sf.c.completed_time - sf.c.started_time),
).group_by(_MINUTE, sf.c.name, _QUEUE, sf.c.state)
_HOUR = (rollups.c.start // HOUR) * HOUR
_PER_HOUR = select(
    literal(HOUR),
    _HOUR,
    rollups.c.function_name,
    rollups.c.queue,
    rollups.c.state,
    func.sum(rollups.c.count),
    *(func.sum(rollups.c[name]) for name in _MEASURES),
).group_by(_HOUR, rollups.c.function_name, rollups.c.queue, rollups.c.state)
_COLUMNS = ["span", "start", "function_name", "queue", "state", "count", *_MEASURES]
EVERY = ""
"""``function_name`` (and ``queue``) of the rows that sum every function's: a chart of
all of them reads a row per minute or hour and state, however many functions ran (a
durable name is never empty)."""
_TOTALS = select(
    literal(MINUTE),
    rollups.c.start,
    literal(EVERY),
    literal(EVERY),
    rollups.c.state,
    func.sum(rollups.c.count),
    *(func.sum(rollups.c[name]) for name in _MEASURES),
).group_by(rollups.c.start, rollups.c.state)


class RollupStatements:
    dialect_insert: ClassVar[Callable[..., Any]]

    async def roll_up_minutes(self, conn: AsyncConnection, start: int, end: int) -> int:
        """Roll up the rows that ended in the minutes from ``start`` to ``end`` (epoch
        seconds, multiples of 60): a range of ix_scheduled_functions_completed; then
        each minute's sum over every function (``EVERY``), from the rows just written
        (the primary key's range). The groups written (a minute already rolled up adds
        none)."""
        source = _PER_MINUTE.where(
            sf.c.completed_time >= float(start),
            sf.c.completed_time < float(end),
            sf.c.state.in_(ENDED),
        )
        totals = _TOTALS.where(
            rollups.c.span == MINUTE,
            rollups.c.start >= start,
            rollups.c.start < end,
            rollups.c.function_name != EVERY,
        )
        written = 0
        for select_ in (source, totals):
            stmt = self.dialect_insert(rollups).from_select(_COLUMNS, select_)
            result = await conn.execute(stmt.on_conflict_do_nothing())
            assert isinstance(result, CursorResult)
            written += max(result.rowcount, 0)
        return written

    async def roll_up_hours(self, conn: AsyncConnection, start: int, end: int) -> int:
        """Sum the minutes of the hours from ``start`` to ``end`` (multiples of 3600)
        into a row per hour (the primary key's range); the groups written."""
        source = _PER_HOUR.where(
            rollups.c.span == MINUTE, rollups.c.start >= start, rollups.c.start < end
        )
        stmt = self.dialect_insert(rollups).from_select(_COLUMNS, source).on_conflict_do_nothing()
        result = await conn.execute(stmt)
        assert isinstance(result, CursorResult)
        return max(result.rowcount, 0)

    async def rollup_marks(self, conn: AsyncConnection) -> tuple[int | None, int | None]:
        """Up to when the minutes and the hours are rolled up (epoch seconds; None: not
        yet), from ``_durafn_rollup_marks`` (two rows)."""
        marks = await conn.execute(select(rollup_marks.c.span, rollup_marks.c.until))
        found = {int(span): int(until) for span, until in marks}
        minutes, hours = found.get(MINUTE), found.get(HOUR)
        return minutes, hours

    async def advance_rollup_mark(self, conn: AsyncConnection, span: int, until: int) -> bool:
        """Move the mark of ``span`` forward to ``until`` (made at first); False if it is
        there or beyond already (another pass's): a guarded UPDATE, never backwards."""
        made = self.dialect_insert(rollup_marks).values(span=span, until=until)
        result = await conn.execute(made.on_conflict_do_nothing())
        assert isinstance(result, CursorResult)
        if result.rowcount == 1:
            return True
        moved = await conn.execute(
            update(rollup_marks)
            .where(rollup_marks.c.span == span, rollup_marks.c.until < until)
            .values(until=until)
        )
        assert isinstance(moved, CursorResult)
        return moved.rowcount == 1

    async def oldest_rollup(
        self, conn: AsyncConnection, span: int, since: int | None = None
    ) -> int | None:
        """The earliest start of ``span`` kept (at or after ``since``): one probe of the
        primary key."""
        first = select(func.min(rollups.c.start)).where(rollups.c.span == span)
        if since is not None:
            first = first.where(rollups.c.start >= since)
        value = (await conn.execute(first)).scalar()
        return None if value is None else int(value)

    async def oldest_finished(
        self, conn: AsyncConnection, since: float | None = None
    ) -> float | None:
        """When the earliest kept row ended (at or after ``since``): one probe of
        ix_scheduled_functions_completed."""
        first = select(func.min(sf.c.completed_time)).where(sf.c.completed_time.is_not(None))
        if since is not None:
            first = first.where(sf.c.completed_time >= since)
        value = (await conn.execute(first)).scalar()
        return None if value is None else float(value)

    async def delete_rollups(self, conn: AsyncConnection, span: int, start: int, end: int) -> int:
        """Remove the rollups of ``span`` starting from ``start`` to ``end`` (a range of
        the primary key: the pruning's page); how many."""
        result = await conn.execute(
            delete(rollups).where(
                rollups.c.span == span, rollups.c.start >= start, rollups.c.start < end
            )
        )
        assert isinstance(result, CursorResult)
        return result.rowcount

    async def read_rollups(
        self,
        conn: AsyncConnection,
        span: int,
        start: int,
        end: int,
        *,
        name: str | None,
        queue: str | None,
    ) -> list[RollupRow]:
        """The rollups of ``span`` from ``start`` to ``end`` (the primary key's range),
        of one function or queue if given, else the sums of every function (``EVERY``),
        per start and state."""
        keys = [rollups.c.start, rollups.c.state]
        query = (
            select(*keys, func.sum(rollups.c.count), *(func.sum(rollups.c[m]) for m in _MEASURES))
            .where(rollups.c.span == span, rollups.c.start >= start, rollups.c.start < end)
            .group_by(*keys)
        )
        if name is not None:
            query = query.where(rollups.c.function_name == name)
        elif queue is not None:
            query = query.where(rollups.c.function_name != EVERY)
        else:
            query = query.where(rollups.c.function_name == EVERY)
        if queue is not None:
            query = query.where(rollups.c.queue == queue)
        width = len(LAG_COLUMNS)
        out = []
        for r in await conn.execute(query):
            values = [int(v or 0) for v in r[2:]]
            lag, duration = values[1 : 1 + width], values[1 + width :]
            out.append(RollupRow(int(r[0]), r[1], values[0], tuple(lag), tuple(duration)))
        return out

    async def rollup_functions(
        self, conn: AsyncConnection, span: int, start: int, end: int
    ) -> list[RollupRow]:
        """Every function and queue with rows ended from ``start`` to ``end``, counted by
        state (the primary key's range; counts only: a week's hours are summed in a few
        milliseconds, where their histograms would take ten times that)."""
        keys = [rollups.c.function_name, rollups.c.queue, rollups.c.state]
        query = (
            select(*keys, func.sum(rollups.c.count))
            .where(rollups.c.span == span, rollups.c.start >= start, rollups.c.start < end)
            .where(rollups.c.function_name != EVERY)
            .group_by(*keys)
        )
        return [
            RollupRow(0, r[2], int(r[3] or 0), (), (), r[0], r[1])
            for r in await conn.execute(query)
        ]
