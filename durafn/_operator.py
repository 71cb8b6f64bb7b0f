"""Operator utilities on ``App``: named queues (list, pause, resume), and changes to many
rows at once (reschedule, retry of Failed rows, cancel by filter, delete finished rows),
each in batches so that a million rows never hold one transaction (or, on SQLite, the
write lock) for long.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Sequence
from contextlib import AbstractAsyncContextManager
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection

from ._checks import aware_time, integer, one_id, positive_seconds, scheduled_id, state_list
from ._clock import to_datetime
from ._context import row_filter
from ._errors import ArgumentError, NotFoundError
from ._explain import Explanation, FlowKeyInfo, explain, key_info
from ._kinds import FINISHED_STATES, FunctionKind, ScheduledFunctionId, State
from ._models import LostWorker, QueueInfo, ScheduledFunction, Stats, WorkerInfo
from ._options import check_name, check_priority
from ._retries import MAX_ATTEMPTS
from ._runtime import Runtime
from ._store import RowFilter
from ._telemetry.endpoint import metrics_asgi
from ._watch import Watch, watch

KINDS = (FunctionKind.MUTATION, FunctionKind.ACTION)


Change = Callable[[AsyncConnection, list[ScheduledFunctionId], float], Awaitable[int]]
"""A bulk change of a batch of rows (their ids, now): how many it changed."""


def _require_filter(where: RowFilter, state: State, call: str, would: str) -> None:
    if where == RowFilter(states=[state]):
        raise ArgumentError(
            f"{call} needs a filter (name, queue, key, flag or a time window); it would {would}"
        )


class Operator:
    """The operator half of ``App`` (a base class of it)."""

    _rt: Runtime

    # -- why a row waits ---------------------------------------------------------------

    async def explain(self, id: ScheduledFunctionId | str) -> Explanation:
        """Why this row is where it is: for a Pending row, what holds it back (not due yet,
        its queue paused, no worker serving it, a forbidden flag, its queue or flow key
        at its concurrency, its key's rate budget spent, debounced) or that it is ready.
        Raises NotFoundError for an unknown id."""
        checked = one_id(id, "explain")
        if checked is None:
            raise NotFoundError(str(id), malformed=True)
        now = self._rt.clock.now()

        async def _read(conn: AsyncConnection) -> Explanation | None:
            facts = await self._rt.driver.explain_facts(conn, checked, now)
            if facts is None:
                return None
            ref = self._rt.registry.find(facts.row.name)
            batch = getattr(ref, "batch", None)  # a batched action's (durafn.Batch)
            return explain(facts, now, batch and (batch.max_size, batch.max_wait))

        found = await self._rt.transaction(_read, read_only=True, doing="explaining a row")
        if found is None:
            raise NotFoundError(checked)
        return found

    async def flow_keys(self, *, limit: int = 100) -> list[FlowKeyInfo]:
        """The flow keys with rows Pending or running, most due rows first: per key its
        due, waiting and running rows, its limits, what holds its due rows back (its
        concurrency, its spent rate budget) and when its budget allows the next start."""
        integer("limit", limit, high=10_000)
        now = self._rt.clock.now()

        async def _read(conn: AsyncConnection) -> list[FlowKeyInfo]:
            found = await self._rt.driver.flow_key_counts(conn, now, limit)
            return [key_info(c, now) for c in found]

        return await self._rt.transaction(_read, read_only=True, doing="listing flow keys")

    def metrics_app(self) -> Any:
        """This process's metrics as Prometheus text, an ASGI app to mount
        (``durafn[otel]``): its runs' counters and histograms (kept from this call on, or
        from the start where the process uses OpenTelemetry's metrics API), and the
        database's gauges (read when scraped, at most every 5 s, each a bounded read)."""
        return metrics_asgi(self._rt.telemetry.measure())

    # -- workers and statistics ----------------------------------------------------------

    def watch(
        self, *, poll: float = 2.0, settle: float = 0.5
    ) -> AbstractAsyncContextManager[Watch]:
        """``async with app.watch() as w: ... await w.changed()``: wait for a reason to
        read again (a live page, a monitor): on PostgreSQL a NOTIFY from any process (new
        rows, freed slots, cancels); this process's own writes on both engines; else
        ``poll`` seconds (real time). Never sooner than ``settle`` seconds after the last
        wake. On PostgreSQL it holds one connection of its own while open."""
        return watch(self._rt, poll, settle)

    async def workers(self) -> list[WorkerInfo]:
        """The executors registered on this database (each renews a heartbeat row)."""

        async def _read(conn: AsyncConnection) -> list[WorkerInfo]:
            return await self._rt.driver.list_workers(conn)

        return await self._rt.transaction(_read, read_only=True, doing="listing workers")

    async def lost_workers(self, *, limit: int = 20) -> list[LostWorker]:
        """The workers declared lost in the last 7 days (no heartbeat for
        ``worker_timeout``), the latest first, each with what its rescue did."""
        limit = integer("limit", limit, high=10_000)

        async def _read(conn: AsyncConnection) -> list[LostWorker]:
            return await self._rt.driver.list_lost_workers(conn, limit)

        return await self._rt.transaction(_read, read_only=True, doing="listing lost workers")

    async def stats(self, *, bound: int | None = None) -> Stats:
        """Rows by state, how long the oldest due row has waited, when the next is due.

        ``bound``: stop each count there, at a cost of at most ``bound`` index entries
        per state however large the table (the dashboard's overview; without it, the
        counts read the whole table): Pending and InProgress are counted up to
        ``bound``, the ended states among the ``bound`` rows that ended last, and
        ``Stats.capped`` names the states whose count stopped at the bound."""
        now = self._rt.clock.now()
        if bound is not None:
            bound = integer("bound", bound, high=10_000_000)

        async def _read(conn: AsyncConnection) -> Stats:
            capped: set[State] = set()
            if bound is None:
                counts = await self._rt.driver.count_by_state(conn)
            else:
                counts, capped = await self._rt.driver.count_by_state_bounded(conn, bound)
            oldest, upcoming = await self._rt.driver.backlog(conn, now)
            return Stats(
                at=to_datetime(now),
                counts=counts,
                bound=bound,
                capped=sorted(capped, key=list(State).index),
                oldest_due=None if oldest is None else to_datetime(oldest),
                lag=0.0 if oldest is None else now - oldest,
                next_due=None if upcoming is None else to_datetime(upcoming),
            )

        return await self._rt.transaction(_read, read_only=True, doing="reading statistics")

    # -- recent activity ---------------------------------------------------------------

    async def finished(
        self, *, within: float | timedelta = 3600.0, limit: int = 5000
    ) -> list[ScheduledFunction]:
        """The rows that ended in the last ``within`` (seconds or a ``timedelta``), the
        latest first, at most ``limit`` of them: what ran lately, its failures and its
        start lag, at a cost bounded by ``limit`` however large the table (the dashboard's
        overview reads it)."""
        seconds = within.total_seconds() if isinstance(within, timedelta) else within
        seconds = positive_seconds("within", seconds)
        limit = integer("limit", limit, high=100_000)
        since = self._rt.clock.now() - seconds

        async def _read(conn: AsyncConnection) -> list[ScheduledFunction]:
            return await self._rt.driver.finished_since(conn, since, limit)

        return await self._rt.transaction(_read, read_only=True, doing="reading recent runs")

    # -- queues ------------------------------------------------------------------------

    async def queues(self, *, bound: int | None = None) -> list[QueueInfo]:
        """The named queues, with their rows waiting and running, and whether paused;
        ``bound``: each count stops there (``QueueInfo.capped``), at a cost of at most
        ``bound`` index entries per count however long a queue's backlog."""
        now = self._rt.clock.now()
        if bound is not None:
            bound = integer("bound", bound, high=10_000_000)

        async def _read(conn: AsyncConnection) -> list[QueueInfo]:
            return await self._rt.driver.list_queues(conn, now, bound)

        return await self._rt.transaction(_read, read_only=True, doing="listing queues")

    async def pause_queue(self, *names: str) -> int:
        """Stop these queues' rows from starting (they stay Pending; running ones finish),
        on every worker; returns how many queues were not paused already. A queue can be
        paused before its first row."""
        return await self._set_paused(names, True)

    async def resume_queue(self, *names: str) -> int:
        """Let paused queues' rows start again; returns how many were paused."""
        return await self._set_paused(names, False)

    async def _set_paused(self, names: tuple[str, ...], paused: bool) -> int:
        if not names:
            raise ArgumentError("name at least one queue")
        checked = {check_name("queue", n, error=ArgumentError) for n in names}
        now = self._rt.clock.now()

        async def _write(conn: AsyncConnection) -> int:
            declared = {name: self._rt.concurrency_of(name) for name in checked}
            changed = await self._rt.driver.set_paused(conn, declared, paused, now)
            if not paused:
                await self._rt.driver.notify(conn, KINDS)
            return changed

        changed = await self._rt.transaction(_write, doing="pausing or resuming queues")
        if not paused:
            self._rt.wake(KINDS)
        return changed

    # -- many rows at once -------------------------------------------------------------

    async def reschedule(
        self,
        ids: Sequence[ScheduledFunctionId | str] | None = None,
        *,
        run_at: datetime | None = None,
        priority: int | None = None,
        max_attempts: int | None = None,
        name: str | None = None,
        queue: str | None = None,
        key: str | None = None,
        flag: str | None = None,
        scheduled_after: datetime | None = None,
        scheduled_before: datetime | None = None,
        batch_size: int = 1000,
    ) -> int:
        """Change the time, priority and/or attempts limit (``max_attempts``, runs in all:
        the retry policy's for these rows) of Pending rows (Graphile's ``rescheduleJobs``):
        those of ``ids``, or every one matching the filters. Returns how many changed.
        Rows that started meanwhile are left alone."""
        values: dict[str, Any] = {}
        if run_at is not None:
            when = aware_time("run_at", run_at)
            values.update(scheduled_time=when, available_at=when)
        if priority is not None:
            values["priority"] = check_priority(priority, "priority", error=ArgumentError)
        if max_attempts is not None:
            values["max_attempts"] = integer("max_attempts", max_attempts, high=MAX_ATTEMPTS)
        if not values:
            raise ArgumentError(
                "reschedule needs run_at, priority and/or max_attempts: what to change"
            )
        where = self._selection(ids, name, queue, key, flag, scheduled_after, scheduled_before)
        rt = self._rt

        async def _change(conn: AsyncConnection, ids: list[ScheduledFunctionId], now: float) -> int:
            return await rt.driver.change_pending(conn, ids, values, now)

        return await self._in_batches(where, batch_size, _change, "rescheduling rows")

    async def retry(
        self,
        ids: Sequence[ScheduledFunctionId | str],
        *,
        run_at: datetime | None = None,
        batch_size: int = 1000,
    ) -> list[ScheduledFunctionId]:
        """Put Failed rows back to Pending, due at ``run_at`` (default now), for a fresh set
        of attempts (their ``failures`` back to 0; their history and last error kept):
        delayed_job's retry, Graphile's reschedule with attempts reset. Returns the ids
        moved; rows that are not Failed are left alone."""
        _check_ids(ids)
        batch_size = integer("batch_size", batch_size, high=100_000)
        rt = self._rt
        when = None if run_at is None else aware_time("run_at", run_at)
        wanted = [c for c in (scheduled_id(i) for i in ids) if c is not None]
        moved: list[ScheduledFunctionId] = []
        for start in range(0, len(wanted), batch_size):

            async def _batch(
                conn: AsyncConnection,
                chunk: list[ScheduledFunctionId] = wanted[start : start + batch_size],
            ) -> list[ScheduledFunctionId]:
                found = await rt.driver.retry_failed(conn, chunk, when or rt.clock.now())
                if found:
                    await rt.driver.notify(conn, KINDS)
                return found

            moved += await rt.transaction(_batch, doing="retrying failed rows")
        if moved:
            rt.wake(KINDS)
        return moved

    async def retry_where(
        self,
        *,
        name: str | None = None,
        queue: str | None = None,
        key: str | None = None,
        flag: str | None = None,
        scheduled_after: datetime | None = None,
        scheduled_before: datetime | None = None,
        run_at: datetime | None = None,
        batch_size: int = 1000,
    ) -> int:
        """``retry`` every Failed row matching the filters (at least one), in batches of
        ``batch_size``, each its own transaction; returns how many went back to Pending."""
        when = None if run_at is None else aware_time("run_at", run_at)
        where = self._selection(
            None, name, queue, key, flag, scheduled_after, scheduled_before, State.FAILED
        )
        _require_filter(where, State.FAILED, "retry_where", "retry every Failed row")
        rt = self._rt

        async def _retry(conn: AsyncConnection, ids: list[ScheduledFunctionId], now: float) -> int:
            return len(await rt.driver.retry_failed(conn, ids, when or now))

        return await self._in_batches(where, batch_size, _retry, "retrying failed rows")

    async def cancel_where(
        self,
        *,
        name: str | None = None,
        queue: str | None = None,
        key: str | None = None,
        flag: str | None = None,
        scheduled_after: datetime | None = None,
        scheduled_before: datetime | None = None,
        batch_size: int = 1000,
    ) -> int:
        """Cancel every Pending row matching the filters (at least one); returns how many.
        Running actions are left to ``cancel(id)``, which also cancels what they spawned."""
        where = self._selection(None, name, queue, key, flag, scheduled_after, scheduled_before)
        _require_filter(where, State.PENDING, "cancel_where", "cancel every Pending row")
        rt = self._rt

        async def _cancel(conn: AsyncConnection, ids: list[ScheduledFunctionId], now: float) -> int:
            return await rt.driver.change_pending(conn, ids, None, now)

        return await self._in_batches(where, batch_size, _cancel, "cancelling rows", wakes=False)

    async def count(
        self,
        *,
        state: State | Sequence[State] | None = None,
        name: str | None = None,
        queue: str | None = None,
        key: str | None = None,
        flag: str | None = None,
        scheduled_after: datetime | None = None,
        scheduled_before: datetime | None = None,
    ) -> int:
        """How many rows match the filters (those of ``list``): what ``cancel_where`` or
        ``reschedule`` would change, with ``state=Pending``, before it changes them."""
        where = row_filter(
            state=state,
            name=name,
            queue=queue,
            key=key,
            flag=flag,
            scheduled_after=scheduled_after,
            scheduled_before=scheduled_before,
        )

        async def _read(conn: AsyncConnection) -> int:
            return await self._rt.driver.count_rows(conn, where)

        return await self._rt.transaction(_read, read_only=True, doing="counting rows")

    def _selection(
        self,
        ids: Sequence[ScheduledFunctionId | str] | None,
        name: str | None,
        queue: str | None,
        key: str | None,
        flag: str | None,
        after: datetime | None,
        before: datetime | None,
        state: State = State.PENDING,
    ) -> RowFilter:
        where = row_filter(
            state=state,
            name=name,
            queue=queue,
            key=key,
            flag=flag,
            scheduled_after=after,
            scheduled_before=before,
        )
        if ids is not None:
            _check_ids(ids)
            where = RowFilter(**{**_fields(where), "ids": [str(i) for i in ids]})
        return where

    async def _in_batches(
        self, where: RowFilter, batch_size: int, change: Change, doing: str, wakes: bool = True
    ) -> int:
        """``change`` the matching rows ``batch_size`` at a time in id order, one
        transaction each (a million rows never hold one); ``wakes``: rows it changed may
        be due now, so the executors are told (a cancel's need not be)."""
        batch_size = integer("batch_size", batch_size, high=100_000)
        rt = self._rt
        after: str | None = None
        total = 0
        while True:

            async def _batch(
                conn: AsyncConnection, start: str | None = after
            ) -> tuple[int, str | None]:
                ids = await rt.driver.matching_batch(conn, where, start, batch_size)
                if not ids:
                    return 0, None
                changed = await change(conn, ids, rt.clock.now())
                if wakes and changed:
                    await rt.driver.notify(conn, KINDS)
                return changed, ids[-1] if len(ids) == batch_size else None

            # Counted once committed: a batch run again after a fault counts once.
            changed, after = await rt.transaction(_batch, doing=doing)
            total += changed
            if wakes and changed:
                rt.wake(KINDS)
            if after is None:
                return total

    # -- deleting finished rows --------------------------------------------------------

    async def count_finished(
        self, *, completed_before: datetime, states: Collection[State] = FINISHED_STATES
    ) -> int:
        """How many rows ``delete_finished`` with the same arguments would delete."""
        cutoff = aware_time("completed_before", completed_before)
        states = _finished_states(states)

        async def _count(conn: AsyncConnection) -> int:
            return await self._rt.driver.count_finished(conn, cutoff, states)

        return await self._rt.transaction(_count, read_only=True, doing="counting finished rows")

    async def delete_finished(
        self,
        *,
        completed_before: datetime,
        states: Collection[State] = FINISHED_STATES,
        batch_size: int = 1000,
    ) -> int:
        """Delete the rows in ``states`` (finished ones only: Success, Failed, Canceled)
        completed before ``completed_before``; returns how many.

        One transaction per ``batch_size`` rows, so that no lock is held for long.
        """
        cutoff = aware_time("completed_before", completed_before)
        states = _finished_states(states)
        batch_size = integer("batch_size", batch_size, high=1_000_000)

        async def _delete(conn: AsyncConnection) -> int:
            return await self._rt.driver.delete_finished(conn, cutoff, batch_size, states)

        deleted = 0
        while True:
            n = await self._rt.transaction(_delete, doing="deleting finished rows")
            deleted += n
            if n < batch_size:
                return deleted


def _check_ids(ids: object) -> None:
    if not isinstance(ids, list | tuple) or not all(isinstance(i, str) for i in ids):
        raise ArgumentError(f"ids must be a list of row ids, not {ids!r}")


def _fields(where: RowFilter) -> dict[str, Any]:
    return {name: getattr(where, name) for name in RowFilter.__slots__}


def _finished_states(value: object) -> list[State]:
    # Unfinished states are refused by the driver, with the reason.
    return state_list("states", value)
