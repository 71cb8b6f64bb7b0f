"""The claims the executor makes (a part of ``Driver``): due mutations, chosen inside
their batch's transaction; due actions, moved Pending -> InProgress under a worker; what
a worker claimed and never started, released; and when the next row becomes due.

Which rows a claim takes, and in what order, is ``take`` (the full claim) and ``fast``
(its fast path); ``hints`` carries what one claim tells the next.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import CursorResult, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from ..._kinds import FunctionKind, ScheduledFunctionId, State
from ..engine import EngineDriver
from ..rows import Claimed
from ..schema.tables import sf
from .batched import BatchClaim, BatchSpec, claim_batches
from .columns import CLAIM_COLUMNS, StartTime, claimed
from .fast import start_fast, take_fast
from .handoff import hand_off
from .hints import FastPathHint, LevelFloor
from .levels import next_due
from .take import SERVE_ALL, ClaimFilter, start_actions, take


class ClaimStatements(EngineDriver):
    """The driver's claims."""

    async def claim_mutations(
        self,
        conn: AsyncConnection,
        now: float,
        limit: int,
        serve: ClaimFilter = SERVE_ALL,
        hint: FastPathHint | None = None,
        floor: LevelFloor | None = None,
    ) -> list[Claimed]:
        """Choose due mutations inside the batch transaction (``take``), locked, with
        their queues, until it ends."""
        kind = FunctionKind.MUTATION
        rows: list[Claimed] = []
        if hint is None or hint.use:
            rows = await take_fast(conn, kind, now, limit, serve, self.lateral_claims, floor)
        if not rows:
            # Rows from the fast path mean its guard held (no queued row due) and it read
            # every level: the full claim could add nothing. (It ran the full claim for
            # every short claim at first: a 1-row claim cost 15 ms against a backlog at
            # seven levels.)
            rows = await take(
                conn, kind, now, limit, serve, self.dialect_insert, hint, self.lateral_claims
            )
        return rows

    async def claim_actions(
        self,
        conn: AsyncConnection,
        now: float,
        limit: int,
        worker_id: str,
        serve: ClaimFilter = SERVE_ALL,
        hint: FastPathHint | None = None,
        started: StartTime | float | None = None,
    ) -> list[Claimed]:
        """Pending -> InProgress for up to ``limit`` due actions (``take``, after
        ``claim_actions_fast``), at ``started`` (default ``now``; ``StartTime``: read once
        this claim holds its lock); commit before running them."""
        rows = await take(
            conn,
            FunctionKind.ACTION,
            now,
            limit,
            serve,
            self.dialect_insert,
            hint,
            self.lateral_claims,
        )
        return await start_actions(conn, rows, now if started is None else started, worker_id)

    async def claim_actions_fast(
        self,
        conn: AsyncConnection,
        now: float,
        limit: int,
        worker_id: str,
        serve: ClaimFilter = SERVE_ALL,
        started: StartTime | float | None = None,
    ) -> list[Claimed]:
        """Pending -> InProgress at ``started`` (default ``now``) for up to ``limit`` due
        unqueued actions, by level, when no queued action is due (``fast.start_fast``);
        commit before running them. None found: ``claim_actions`` (the full claim) may
        find queued ones."""
        return await start_fast(conn, now, limit, worker_id, serve, self.lateral_claims, started)

    async def claim_batches(
        self,
        conn: AsyncConnection,
        now: float,
        worker_id: str,
        functions: Sequence[BatchSpec],
        room: int,
        serve: ClaimFilter = SERVE_ALL,
        started: StartTime | float | None = None,
    ) -> BatchClaim:
        """Pending -> InProgress at ``started`` (default ``now``) for up to ``room`` ready
        batches of these batched actions (``batched``); commit before running them."""
        return await claim_batches(
            conn, now, worker_id, functions, room, serve, self.try_lock, started
        )

    async def hand_off(
        self,
        conn: AsyncConnection,
        now: float,
        queues: Sequence[str],
        room: int,
        worker_id: str,
        serve: ClaimFilter = SERVE_ALL,
        started: StartTime | float | None = None,
    ) -> list[Claimed]:
        """In the transaction that has just finished actions of ``queues``: start each
        queue's next row under ``worker_id`` where the claim would have (``handoff``), at
        most ``room``, at ``started`` (default ``now``); commit before running them."""
        return await hand_off(conn, now, queues, room, worker_id, serve, started)

    async def release_unstarted(
        self, conn: AsyncConnection, ids: Sequence[ScheduledFunctionId], worker_id: str
    ) -> int:
        """InProgress -> Pending for actions this worker claimed and never started (a stop
        ended before a worker was free): none of them ran, so at most once still holds.
        Guarded by state and worker, so running it again changes nothing twice."""
        released = 0
        for start in range(0, len(ids), 500):  # SQLite's limit on bound parameters
            result = await conn.execute(
                update(sf)
                .where(
                    sf.c.id.in_(ids[start : start + 500]),
                    sf.c.state == State.IN_PROGRESS.value,
                    sf.c.worker_id == worker_id,
                )
                .values(
                    state=State.PENDING.value,
                    started_time=None,
                    worker_id=None,
                    attempts=sf.c.attempts - 1,
                )
            )
            assert isinstance(result, CursorResult)
            released += result.rowcount
        return released

    async def claimed_by(self, conn: AsyncConnection, worker_id: str) -> list[Claimed]:
        """The actions InProgress under ``worker_id`` (ix_scheduled_functions_running)."""
        rows = await conn.execute(
            select(*CLAIM_COLUMNS).where(
                sf.c.state == State.IN_PROGRESS.value, sf.c.worker_id == worker_id
            )
        )
        return claimed(list(rows))

    async def next_due(
        self, conn: AsyncConnection, kind: FunctionKind, after: float | None = None
    ) -> float | None:
        """When the next Pending row of ``kind`` (due later than ``after``) becomes due.

        ``after`` lets an idle executor skip rows that are due but locked by another lane
        or executor: waiting for those would be a busy loop.
        """
        # The first entry of each priority level's range of the two claim indexes: one
        # probe per level, whatever the backlog (take.next_due).
        return await next_due(conn, kind, after)
