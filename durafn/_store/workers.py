"""The workers' rows (``_durafn_workers``): registering, heartbeats, and the rescue of the
actions of workers that stopped beating (a part of ``Driver``)."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

from sqlalchemy import (
    CursorResult,
    bindparam,
    delete,
    func,
    insert,
    literal,
    or_,
    select,
    update,
)
from sqlalchemy.ext.asyncio import AsyncConnection

from .._clock import to_datetime
from .._kinds import ScheduledFunctionId, State
from .._models import LostWorker
from .claim.take import SERVE_ALL, ClaimFilter
from .rows import LostAction, RetryState
from .schema.tables import lost_workers, sf, workers
from .write.failures import RETRY_COLUMNS

LOST_KEPT = 7 * 86400.0
"""Seconds a lost worker's record is kept (as long as finished rows are, by default)."""


class WorkerStatements:
    dialect_insert: ClassVar[Callable[..., Any]]

    async def register_worker(
        self,
        conn: AsyncConnection,
        id: str,
        hostname: str,
        pid: int,
        concurrency: int,
        now: float,
        serve: ClaimFilter = SERVE_ALL,
    ) -> None:
        await conn.execute(
            insert(workers).values(
                id=id,
                hostname=hostname,
                pid=pid,
                concurrency=concurrency,
                started_at=now,
                heartbeat_at=now,
                serves=None if serve.queues is None else json.dumps(sorted(serve.queues)),
                forbidden=json.dumps(sorted(serve.forbidden_flags))
                if serve.forbidden_flags
                else None,
            )
        )

    async def heartbeat(self, conn: AsyncConnection, id: str, now: float) -> bool:
        """Renew a worker's heartbeat; False if its row is gone (it was declared lost)."""
        result = await conn.execute(
            update(workers).where(workers.c.id == id).values(heartbeat_at=now)
        )
        assert isinstance(result, CursorResult)
        return result.rowcount == 1

    async def unregister_worker(self, conn: AsyncConnection, id: str) -> None:
        await conn.execute(delete(workers).where(workers.c.id == id))

    async def find_lost(
        self, conn: AsyncConnection, cutoff: float, message: str
    ) -> list[LostAction]:
        """The InProgress actions whose worker has not heartbeaten since ``cutoff`` (or
        has no row at all), locked until the transaction ends (``FOR UPDATE`` on
        PostgreSQL; SQLite's transaction holds the file), not yet changed: the caller
        decides which its retry policy runs again (``retry_rows`` from InProgress) and
        records the others Failed (``fail_lost``). A retried row goes straight back to
        Pending: through Failed, a final state, the release trigger would free the rows
        waiting for it (``after=``) before it had run again.

        ``started_time < cutoff`` as well: a row is never rescued sooner after its claim
        than a worker is allowed to go without a heartbeat. The lock and the state guard
        of the writes that follow make two workers rescuing at once harmless: the second
        finds nothing left to move.
        """
        before, _, after = message.partition("{worker}")
        alive = select(workers.c.id).where(workers.c.heartbeat_at >= cutoff)
        result = await conn.execute(
            select(
                sf.c.id,
                sf.c.name,
                sf.c.worker_id,
                # The message names the lost worker: "{worker}" in it becomes its id.
                literal(before).concat(func.coalesce(sf.c.worker_id, "unknown")).concat(after),
                sf.c.queue_name,
                *RETRY_COLUMNS[1:],
                sf.c.on_complete,
                sf.c.flow_key,
                sf.c.trace_context,
                sf.c.attempts,
            )
            .where(
                sf.c.state == State.IN_PROGRESS.value,  # ix_scheduled_functions_running
                sf.c.started_time < cutoff,
                or_(sf.c.worker_id.is_(None), sf.c.worker_id.not_in(alive)),
            )
            .with_for_update()
        )
        return [
            LostAction(
                ScheduledFunctionId(str(i)),
                n,
                w,
                m,
                q,
                RetryState(n, retry, most, failures),
                callback,
                key,
                trace,
                attempts,
            )
            for i, n, w, m, q, retry, most, failures, callback, key, trace, attempts in result
        ]

    async def fail_lost(
        self, conn: AsyncConnection, now: float, lost: Sequence[LostAction]
    ) -> None:
        """InProgress -> Failed for lost actions that are not retried (``find_lost``)."""
        for row in lost:  # few: the actions one worker was running
            await conn.execute(
                update(sf)
                .where(sf.c.id == row.id, sf.c.state == State.IN_PROGRESS.value)  # (pk)
                .values(
                    state=State.FAILED.value,
                    completed_time=now,
                    error_type="durafn.WorkerLostError",
                    error_message=row.error_message,
                    failures=sf.c.failures + 1,
                )
            )

    async def remove_lost_workers(
        self,
        conn: AsyncConnection,
        now: float,
        cutoff: float,
        by: str,
        rescued: Mapping[str | None, tuple[int, int]],
    ) -> int:
        """Remove the rows of the workers that sent no heartbeat since ``cutoff`` and
        record each in ``_durafn_lost_workers`` with what the rescue ``by`` did to its
        actions (``rescued``: worker id -> (recorded Failed, retried)); add to the record
        of a worker declared lost before what this rescue did to its actions; forget the
        lost workers of more than ``LOST_KEPT`` seconds ago. Returns how many were removed.
        """
        gone = await conn.execute(
            delete(workers)
            .where(workers.c.heartbeat_at < cutoff)
            .returning(
                workers.c.id,
                workers.c.hostname,
                workers.c.pid,
                workers.c.started_at,
                workers.c.heartbeat_at,
            )
        )
        found = [
            {
                "id": id,
                "hostname": host,
                "pid": pid,
                "started_at": started,
                "heartbeat_at": beat,
                "lost_at": now,
                "rescued_by": by,
                "failed": rescued.get(id, (0, 0))[0],
                "retried": rescued.get(id, (0, 0))[1],
            }
            for id, host, pid, started, beat in gone
        ]
        if found:
            # A worker lost, back (it registers again under its id) and lost again: the
            # latest loss is the one kept.
            stmt = self.dialect_insert(lost_workers).values(found)
            await conn.execute(
                stmt.on_conflict_do_update(
                    index_elements=[lost_workers.c.id],
                    set_={c.name: stmt.excluded[c.name] for c in lost_workers.c if c.name != "id"},
                )
            )
        # A row is rescued a whole timeout after its claim, and a worker once silent for
        # one: the actions a worker claimed after its last heartbeat are rescued after
        # the rescue that declared it lost, and are counted on that record here. (A
        # worker with no record, one that unregistered with actions unrecorded, has none
        # to count on.)
        declared = {row["id"] for row in found}
        later = [
            {"lost_id": id, "more_failed": failed, "more_retried": retried}
            for id, (failed, retried) in rescued.items()
            if id is not None and id not in declared and (failed or retried)
        ]
        if later:
            await conn.execute(
                update(lost_workers)
                .where(lost_workers.c.id == bindparam("lost_id"))  # its primary key
                .values(
                    failed=lost_workers.c.failed + bindparam("more_failed"),
                    retried=lost_workers.c.retried + bindparam("more_retried"),
                ),
                later,
            )
        # ix_durafn_lost_workers_lost_at
        await conn.execute(delete(lost_workers).where(lost_workers.c.lost_at < now - LOST_KEPT))
        return len(found)

    async def list_lost_workers(self, conn: AsyncConnection, limit: int) -> list[LostWorker]:
        """The workers declared lost lately, the latest first (ix_durafn_lost_workers_lost_at)."""
        rows = await conn.execute(
            select(lost_workers).order_by(lost_workers.c.lost_at.desc()).limit(limit)
        )
        return [
            LostWorker(
                id=r.id,
                hostname=r.hostname,
                pid=r.pid,
                started_at=to_datetime(r.started_at),
                heartbeat_at=to_datetime(r.heartbeat_at),
                lost_at=to_datetime(r.lost_at),
                rescued_by=r.rescued_by,
                failed=r.failed,
                retried=r.retried,
            )
            for r in rows
        ]
