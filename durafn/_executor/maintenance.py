"""Maintenance: the periodic work that keeps ``_scheduled_functions`` in shape.

Retention: finished rows older than their period (the executor's
``retention``, a number or a ``Retention`` per state, or their function's own) are
deleted in bounded batches (``ix_scheduled_functions_completed``), so no pass holds locks
for long; so are the audit trail's entries older than the longest of the executor's
periods (``ix_durafn_audit_at``), the operations that ended before it, and the durable
workflows that did, with their journals (``ix_durafn_workflows_ended``). Then the
rollups: what ended in each closed minute and hour, for the dashboard's charts, kept as
long as the longest period (``rollups.py``). And operations (``durafn/_operations.py``):
a loop of their own runs them a page at a time. Every worker runs them all; the batches
make concurrent passes harmless. Recurring (cron) ticks have a loop of their own, which
one leader runs (``crons.py``).
"""

from __future__ import annotations

import functools
import logging

import anyio
import anyio.lowlevel
from sqlalchemy.ext.asyncio import AsyncConnection

from .._errors import DatabaseError
from .._kinds import State
from .._operations import OPERATIONS_POLL, run_operations
from .._retention import FINISHED, periods
from .._runtime import Runtime
from .._store import workflow_sql
from .config import ExecutorConfig
from .rollups import RollUps
from .tasks import first_of

logger = logging.getLogger("durafn.executor")


class Maintenance:
    def __init__(self, runtime: Runtime, config: ExecutorConfig) -> None:
        self._rt = runtime
        self._config = config
        self._rollups = RollUps(runtime)

    async def run_once(self) -> int:
        """Delete finished rows older than their retention periods; returns how many."""
        await self._rt.ensure_ready()
        now = self._rt.clock.now()
        default = periods(self._config.retention)
        own = self._rt.registry.retentions()
        # Per state, the executor's period for every function without one of its own for
        # that state; then each function's own periods. One pass each, in batches.
        passes: list[tuple[State, float, list[str] | None, list[str]]] = []
        for state in FINISHED:
            others = sorted(n for n, r in own.items() if r.of(state) is not None)
            passes.append((state, default[state], None, others))
            for name in others:
                passes.append((state, own[name].over(default)[state], [name], []))
        deleted = 0
        for state, period, names, excluded in passes:
            deleted += await self._delete(now - period, [state], names, excluded)
        if deleted:
            logger.debug("retention deleted %d finished rows", deleted)
        # The audit trail is kept as long as the longest of the executor's periods: an
        # operator's action outlives none of the rows it changed.
        await self._prune(now - max(default.values()))
        await self._rollups.run_once(now, max(default.values()))
        return deleted

    async def _prune(self, cutoff: float) -> None:
        """The audit trail's entries, and the operations and durable workflows (with their
        journals and events) that ended, before ``cutoff``."""
        limit = self._config.retention_batch
        driver = self._rt.driver

        async def _audit(conn: AsyncConnection) -> int:
            return await driver.delete_audit(conn, older_than=cutoff, limit=limit)

        async def _operations(conn: AsyncConnection) -> int:
            return await driver.delete_operations(conn, older_than=cutoff, limit=limit)

        async def _workflows(conn: AsyncConnection) -> int:
            return await workflow_sql.remove_ended(conn, cutoff, limit)

        for batch, doing in (
            (_audit, "audit entries"),
            (_operations, "operations"),
            (_workflows, "ended workflows"),
        ):
            while await self._rt.transaction(batch, doing=f"deleting old {doing}") == limit:
                await anyio.lowlevel.checkpoint()

    async def _delete(
        self, cutoff: float, states: list[State], names: list[str] | None, excluded: list[str]
    ) -> int:
        limit = self._config.retention_batch
        deleted = 0

        async def _batch(conn: AsyncConnection) -> int:
            return await self._rt.driver.delete_finished(
                conn, cutoff, limit, states, names=names, excluded=excluded
            )

        while True:
            n = await self._rt.transaction(_batch, doing="deleting expired rows")
            deleted += n
            if n < limit:
                return deleted
            await anyio.lowlevel.checkpoint()  # let the executor's other tasks in between batches

    async def loop(self, stopping: anyio.Event) -> None:
        """A pass every ``retention_interval`` on the clock, until ``stopping``."""
        while not stopping.is_set():
            # The interval runs from the start of a pass, so time that passes during it
            # (a real backlog, or a fake clock advanced meanwhile) is not lost.
            deadline = self._rt.clock.now() + self._config.retention_interval
            try:
                await self.run_once()
            except DatabaseError as exc:
                logger.warning("retention pass failed (%s); trying again next interval", exc)
            await first_of(stopping.wait, functools.partial(self._rt.clock.sleep_until, deadline))

    async def operations_loop(self, stopping: anyio.Event) -> None:
        """Run the Running operations (``durafn/_operations.py``) a page at a time, looking
        for new ones every ``OPERATIONS_POLL`` seconds on the clock, until ``stopping``.
        Every worker runs it: each page is taken by one of them."""
        while not stopping.is_set():
            deadline = self._rt.clock.now() + OPERATIONS_POLL
            try:
                await run_operations(self._rt, stopping=stopping)
            except DatabaseError as exc:
                logger.warning("an operation's page failed (%s); trying again", exc)
            await first_of(stopping.wait, functools.partial(self._rt.clock.sleep_until, deadline))
