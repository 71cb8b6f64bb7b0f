"""Operations on ``App``: a change of every row a filter matches (cancel the Pending ones,
retry the Failed ones, reschedule the Pending ones), tracked in ``_durafn_operations``
and run a page at a time, and the failure groups an operator starts them from.

``start_operation`` writes the operation and counts its rows up to ``TOTAL_BOUND``; any
process then runs it (``run_operations``: every worker's maintenance does, every
``OPERATIONS_POLL`` seconds). A page is one transaction: it reads the next ``SCAN_PAGE``
rows in id order after the operation's cursor (a range of the primary key, whatever the
filter: no page reads more, however few rows match), changes at most ``PAGE`` of those
that match (each an UPDATE guarded by the state it expects, as the other bulk changes),
and moves the cursor past them by an UPDATE of the operation guarded by the cursor it
read: of two workers at one cursor, one takes the page and the other's update matches
nothing, so no page is done twice. A process killed mid-page leaves its page's
transaction rolled back and the cursor where it was: the next runner does that page.
The whole operation reads the table once, in ``rows / SCAN_PAGE`` short transactions;
rows written after it started (ids are time-ordered) are changed too.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import replace
from datetime import datetime
from typing import Any

import anyio
import anyio.lowlevel
from sqlalchemy.ext.asyncio import AsyncConnection

from ._checks import aware_time, integer, optional, text
from ._context import row_filter
from ._errors import ArgumentError, UnknownOperationError
from ._kinds import FunctionKind, ScheduledFunctionId, State
from ._models import FailureGroup, Operation
from ._options import check_priority
from ._runtime import Runtime
from ._store import RowFilter

logger = logging.getLogger("durafn.operations")

KINDS = (FunctionKind.MUTATION, FunctionKind.ACTION)
OPERATION_KINDS: dict[str, State] = {
    "cancel": State.PENDING,
    "retry": State.FAILED,
    "reschedule": State.PENDING,
}
"""What an operation does, and the state of the rows it changes."""
FILTERS = ("name", "queue", "key", "flag", "error_type")
PAGE = 500
"""Rows a page changes at most: one transaction each."""
SCAN_PAGE = 5000
"""Rows a page reads at most (the primary key from the cursor on)."""
TOTAL_BOUND = 100_000
"""Where an operation's count of its rows stops (shown as "100,000+")."""
OPERATIONS_POLL = 1.0
"""Seconds between a worker's looks for Running operations (a read of a partial index
holding only the Running ones)."""
MAX_ID = 2**63 - 1
"""The largest id an operation can have (both engines' 64-bit integer)."""
GROUP_SCAN = 10_000
"""Rows that ended last among which ``failure_groups`` groups the Failed ones."""


class Operations:
    """Tracked bulk changes on ``App`` (a base class of it)."""

    _rt: Runtime

    async def start_operation(
        self,
        kind: str,
        *,
        who: str,
        name: str | None = None,
        queue: str | None = None,
        key: str | None = None,
        flag: str | None = None,
        error_type: str | None = None,
        run_at: datetime | None = None,
        priority: int | None = None,
    ) -> Operation:
        """Start ``kind`` (``cancel``: every Pending row; ``retry``: every Failed row;
        ``reschedule``: every Pending row to ``run_at`` and/or ``priority``) on the rows
        matching the filters (at least one), as a tracked operation: it returns at once,
        Running, with its rows counted (up to ``TOTAL_BOUND``); the workers' maintenance
        (or ``run_operations``) changes them a page at a time."""
        if kind not in OPERATION_KINDS:
            raise ArgumentError(f"no operation {kind!r}: one of {', '.join(OPERATION_KINDS)}")
        chosen = {"name": name, "queue": queue, "key": key, "flag": flag, "error_type": error_type}
        filters = {k: text(k, v) for k, v in chosen.items() if v is not None}
        if not filters:
            raise ArgumentError(
                f"an operation needs a filter ({', '.join(FILTERS)}): it would {kind} every row"
            )
        change = _change(kind, run_at, priority)
        stored = {"state": OPERATION_KINDS[kind].value, **filters}
        where = _where(stored)
        who = text("who", who)
        now = self._rt.clock.now()
        rt = self._rt

        async def _count(conn: AsyncConnection) -> int:
            return await rt.driver.count_up_to(conn, where, TOTAL_BOUND)

        # Counted in a read of its own: on SQLite, a write transaction would hold the one
        # writer's lock for as long as the count takes.
        total = await rt.transaction(_count, read_only=True, doing="counting an operation's rows")

        async def _write(conn: AsyncConnection) -> int:
            return await rt.driver.insert_operation(
                conn, kind=kind, filter=stored, change=change, who=who, now=now, total=total
            )

        id = await rt.transaction(_write, doing="starting an operation")
        return await self.operation(id)

    async def operation(self, id: int) -> Operation:
        """An operation, as it stands; UnknownOperationError if there is none (or
        retention removed it)."""
        id = integer("id", id, low=1, high=MAX_ID)

        async def _read(conn: AsyncConnection) -> tuple[Operation, str] | None:
            return await self._rt.driver.get_operation(conn, id, TOTAL_BOUND)

        found = await self._rt.transaction(_read, read_only=True, doing="reading an operation")
        if found is None:
            raise UnknownOperationError(
                f"no operation has id {id}; ended ones are removed after the retention period"
            )
        return found[0]

    async def operations(self, *, limit: int = 50, before: int | None = None) -> list[Operation]:
        """Operations newest first: ``limit`` of them, older than ``before`` (an id)."""
        limit = integer("limit", limit, high=10_000)
        before = optional(integer, "before", before)

        async def _read(conn: AsyncConnection) -> list[Operation]:
            return await self._rt.driver.list_operations(
                conn, limit=limit, before=before, bound=TOTAL_BOUND
            )

        return await self._rt.transaction(_read, read_only=True, doing="listing operations")

    async def cancel_operation(self, id: int) -> bool:
        """Stop a Running operation: no page starts after this (one under way finishes);
        the rows it changed stay changed. False if it had ended."""
        id = (await self.operation(id)).id  # checked; UnknownOperationError if unknown
        now = self._rt.clock.now()

        async def _end(conn: AsyncConnection) -> bool:
            return await self._rt.driver.end_operation(conn, id, State.CANCELED.value, now)

        return await self._rt.transaction(_end, doing="canceling an operation")

    async def run_operations(self, *, pages: int | None = None) -> int:
        """Run the Running operations, oldest first, a page at a time, until each has
        ended (or ``pages`` pages in all); returns how many pages this call took. Safe
        alongside other processes doing the same (each page is taken by one)."""
        return await run_operations(self._rt, optional(integer, "pages", pages, low=1))

    async def run_operation(self, id: int, *, pages: int | None = None) -> Operation:
        """Run operation ``id`` a page at a time until it ends (or after ``pages``
        pages); returns it as it then stands. Safe alongside the workers running it."""
        limit = optional(integer, "pages", pages, low=1)
        id = (await self.operation(id)).id  # checked; UnknownOperationError if unknown
        tried = 0
        while limit is None or tried < limit:
            op = await self.operation(id)
            if op.state != "Running":
                return op
            await run_page(self._rt, op.id)
            tried += 1
        return await self.operation(id)

    async def failure_groups(
        self, *, scan: int = GROUP_SCAN, limit: int = 100
    ) -> list[FailureGroup]:
        """The Failed rows among the ``scan`` rows that ended last, grouped by function
        and error type, largest first (a bounded read of the completion index)."""
        scan = integer("scan", scan, low=1, high=1_000_000)
        limit = integer("limit", limit, low=1, high=10_000)

        async def _read(conn: AsyncConnection) -> list[FailureGroup]:
            return await self._rt.driver.failure_groups(conn, scan=scan, limit=limit)

        return await self._rt.transaction(_read, read_only=True, doing="grouping failures")


async def run_operations(
    rt: Runtime, pages: int | None = None, stopping: anyio.Event | None = None
) -> int:
    """``App.run_operations``, and the workers' maintenance (until ``stopping``)."""
    taken = 0
    while pages is None or taken < pages:
        if stopping is not None and stopping.is_set():
            return taken

        async def _running(conn: AsyncConnection) -> list[int]:
            return await rt.driver.running_operations(conn, 1)

        running = await rt.transaction(_running, read_only=True, doing="looking for operations")
        if not running:
            return taken
        taken += await run_page(rt, running[0])
        await anyio.lowlevel.checkpoint()  # the process's other tasks, between pages
    return taken


async def run_page(rt: Runtime, id: int) -> int:
    """One page of operation ``id``; 1 if this call took it, 0 if another runner did (or
    it had ended). Ends it (Done) when the page reaches the last row, or (Failed) when
    its stored filter cannot be read."""
    now = rt.clock.now()

    async def _page(conn: AsyncConnection) -> tuple[int, int]:
        found = await rt.driver.get_operation(conn, id, TOTAL_BOUND)
        if found is None or found[0].state != "Running":
            return 0, 0
        op, cursor = found
        try:
            where = _where(op.filter)
            values = _values(op.change)
        except (ArgumentError, ValueError, TypeError) as exc:
            await rt.driver.end_operation(conn, id, "Failed", now, f"unreadable: {exc}")
            return 0, 0
        window = await rt.driver.operation_window(conn, where, cursor or None, SCAN_PAGE)
        hits = [r.id for r in window if r.hit][:PAGE]
        read = len(window)
        if len(hits) == PAGE:  # the page stops at its last change; the rest is the next's
            read = next(n for n, r in enumerate(window, 1) if r.id == hits[-1])
        ahead = window[read - 1].id if read else cursor
        if not await rt.driver.advance_operation(
            conn, id, expected=cursor, cursor=ahead, scanned=read, now=now
        ):
            return 0, 0  # another runner took this page
        changed = await _apply(rt, conn, op.kind, hits, values, now)
        await rt.driver.count_operation(conn, id, changed)
        if read == len(window) < SCAN_PAGE:  # no row after these: it is done
            await rt.driver.end_operation(conn, id, "Done", now)
        if changed and op.kind != "cancel":
            await rt.driver.notify(conn, KINDS)
        return 1, changed

    took, changed = await rt.transaction(_page, doing="running a page of an operation")
    if changed and took:
        rt.wake(KINDS)
    return took


async def _apply(
    rt: Runtime,
    conn: AsyncConnection,
    kind: str,
    ids: list[str],
    values: dict[str, Any],
    now: float,
) -> int:
    if not ids:
        return 0
    chosen = [ScheduledFunctionId(i) for i in ids]
    if kind == "retry":
        return len(await rt.driver.retry_failed(conn, chosen, values.get("available_at", now)))
    return await rt.driver.change_pending(
        conn, chosen, values if kind == "reschedule" else None, now
    )


def _change(kind: str, run_at: datetime | None, priority: int | None) -> dict[str, Any]:
    change: dict[str, Any] = {}
    if run_at is not None:
        change["run_at"] = aware_time("run_at", run_at)
    if priority is not None:
        change["priority"] = check_priority(priority, "priority", error=ArgumentError)
    if kind == "reschedule" and not change:
        raise ArgumentError("a reschedule needs run_at and/or priority: what to change")
    if kind == "cancel" and change:
        raise ArgumentError("a cancel takes no run_at or priority")
    return change


def _values(change: Mapping[str, Any]) -> dict[str, Any]:
    """A stored change as the columns it sets."""
    values: dict[str, Any] = {}
    if "run_at" in change:
        values.update(scheduled_time=float(change["run_at"]), available_at=float(change["run_at"]))
    if "priority" in change:
        values["priority"] = int(change["priority"])
    return values


def _where(stored: Mapping[str, Any]) -> RowFilter:
    """A stored filter as the rows it selects (checked again: it was read back)."""
    unknown = set(stored) - {"state", *FILTERS}
    if unknown:
        raise ArgumentError(f"unknown filter fields {sorted(unknown)}")
    base = row_filter(
        state=State(stored["state"]),
        **{k: stored.get(k) for k in ("name", "queue", "key", "flag")},
    )
    return replace(base, error_type=optional(text, "error_type", stored.get("error_type")))
