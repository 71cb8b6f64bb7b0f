"""The store seam: every SQL statement the runtime issues, dialect-neutral where it can be.

``Driver`` holds the statements both engines share (SQLAlchemy Core, so they stay readable
and reviewable; the hot ones are built once, at import); ``SQLiteDriver`` and
``PostgresDriver`` override only what differs: how an engine is built, how rows are
locked, how other processes are woken, and which errors are transient (``EngineDriver``).
The executor and the contexts never ask which database they are on. The conformance
suite (``tests/test_driver.py``) runs this interface on both engines.

Every state change is an UPDATE guarded by the state it expects, and its row count is
checked by the caller: a lost race is explicit, never a row moved backwards.
"""

from __future__ import annotations

import builtins
from collections.abc import Collection, Sequence
from typing import Any

from sqlalchemy import CursorResult, and_, delete, func, select, update
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql.elements import ColumnElement

from .._errors import ArgumentError
from .._kinds import FINISHED_STATES, ScheduledFunctionId, State
from .audit import AuditStatements
from .claim.inline import InlineStatements
from .claim.statements import ClaimStatements
from .crons import CronStatements
from .engine import EngineDriver
from .filters import RowFilter
from .operations import OperationStatements
from .queues import QueueStatements
from .read.explain import ExplainStatements, FlowKeyStatements
from .read.listing import ReadStatements
from .read.row_links import RowLinksStatements
from .read.search import SearchStatements
from .rollups import RollupStatements
from .rows import NewRow
from .schema.tables import sf
from .workers import WorkerStatements
from .write.cancels import CANCEL, CANCELED_COLUMNS, CancelStatements
from .write.completions import canceled
from .write.debounce import write_debounced
from .write.dependencies import DependencyStatements
from .write.failures import FailureStatements
from .write.finish import FinishStatements
from .write.keys import insert_keyed
from .write.progress import ProgressStatements


class Driver(
    ClaimStatements,
    FinishStatements,
    ReadStatements,
    QueueStatements,
    FailureStatements,
    ProgressStatements,
    DependencyStatements,
    CancelStatements,
    InlineStatements,
    CronStatements,
    ExplainStatements,
    FlowKeyStatements,
    WorkerStatements,
    AuditStatements,
    OperationStatements,
    RollupStatements,
    RowLinksStatements,
    SearchStatements,
    EngineDriver,
):
    """Dialect-neutral statements on the system tables."""

    # -- one row ---------------------------------------------------------------------------

    async def lock_for_share(self, conn: AsyncConnection, id: ScheduledFunctionId) -> State | None:
        """Read a row's state, holding it against a concurrent cancel until commit."""
        return await self.state(conn, id)

    async def state(self, conn: AsyncConnection, id: ScheduledFunctionId) -> State | None:
        value = (await conn.execute(select(sf.c.state).where(sf.c.id == id))).scalar()
        return State(value) if value is not None else None

    # -- scheduling ----------------------------------------------------------------------

    async def insert_keyed(
        self, conn: AsyncConnection, rows: Sequence[NewRow]
    ) -> builtins.list[ScheduledFunctionId]:
        """Write rows that carry job keys (``write/keys.py``); returns the id that runs for each."""
        return await insert_keyed(conn, self.dialect_insert, rows)

    async def write_debounced(
        self,
        conn: AsyncConnection,
        rows: Sequence[NewRow],
        running: Collection[ScheduledFunctionId] = (),
    ) -> builtins.list[ScheduledFunctionId]:
        """Write debounced and throttled calls (``write/debounce.py``); returns the id that runs for
        each. ``running``: rows this transaction has claimed and is running."""
        return await write_debounced(conn, self.dialect_insert, rows, running)

    async def matching_batch(
        self, conn: AsyncConnection, where: RowFilter, after: str | None, limit: int
    ) -> builtins.list[ScheduledFunctionId]:
        """Up to ``limit`` ids of rows matching ``where`` (Pending ones for a cancel or a
        reschedule, Failed ones for a retry), in id order after ``after`` (keyset: a
        rescheduled row still matches and must not be seen twice)."""
        stmt = select(sf.c.id).where(*where.where()).order_by(sf.c.id).limit(limit)
        if after is not None:
            stmt = stmt.where(sf.c.id > after)
        return [ScheduledFunctionId(str(i)) for i in (await conn.execute(stmt)).scalars()]

    async def change_pending(
        self,
        conn: AsyncConnection,
        ids: Sequence[ScheduledFunctionId],
        values: dict[str, Any] | None,
        now: float,
    ) -> int:
        """Set ``values`` on these rows, or cancel them (None), where still Pending."""
        stmt = update(sf).where(sf.c.id.in_(ids), sf.c.state == State.PENDING.value)
        if values is not None:
            result = await conn.execute(stmt.values(**values))
            assert isinstance(result, CursorResult)
            return result.rowcount
        rows = (
            await conn.execute(stmt.values(CANCEL).returning(*CANCELED_COLUMNS), {"now": now})
        ).all()
        await self.write_completions(conn, now, canceled(rows))
        return len(rows)

    # -- retention -----------------------------------------------------------------------

    async def delete_finished(
        self,
        conn: AsyncConnection,
        cutoff: float,
        limit: int,
        states: Collection[State] = FINISHED_STATES,
        *,
        names: Collection[str] | None = None,
        excluded: Collection[str] = (),
    ) -> int:
        """Delete up to ``limit`` rows in ``states`` completed before ``cutoff``, oldest
        first: rows of the functions ``names`` only (None: any), and none of ``excluded``."""
        # Bounded so that one call never holds locks for long.
        doomed = (
            select(sf.c.id)
            .where(_finished_before(cutoff, states))
            .order_by(sf.c.completed_time)
            .limit(limit)
        )
        if names is not None:
            doomed = doomed.where(sf.c.name.in_(sorted(names)))
        if excluded:
            doomed = doomed.where(sf.c.name.not_in(sorted(excluded)))
        result = await conn.execute(
            delete(sf).where(sf.c.id.in_(doomed.scalar_subquery())).returning(sf.c.id)
        )
        return len(result.all())  # their histories with them

    async def count_rows(self, conn: AsyncConnection, where: RowFilter) -> int:
        """How many rows match ``where`` (a scan of what its filters leave)."""
        stmt = select(func.count()).select_from(sf).where(*where.where())
        return int((await conn.execute(stmt)).scalar_one())

    async def count_finished(
        self, conn: AsyncConnection, cutoff: float, states: Collection[State] = FINISHED_STATES
    ) -> int:
        """How many rows ``delete_finished`` would delete, all batches together."""
        stmt = select(func.count()).select_from(sf).where(_finished_before(cutoff, states))
        return int((await conn.execute(stmt)).scalar_one())


def _finished_before(cutoff: float, states: Collection[State]) -> ColumnElement[bool]:
    # ix_scheduled_functions_completed: "completed_time < x" implies the index's
    # "completed_time IS NOT NULL", so both engines can use the partial index.
    unfinished = sorted(State(s).value for s in states if not State(s).finished)
    if unfinished:
        raise ArgumentError(
            f"only finished rows (Success, Failed, Canceled) can be deleted, not {unfinished}"
        )
    return and_(
        sf.c.completed_time < cutoff, sf.c.state.in_(sorted(State(s).value for s in states))
    )
