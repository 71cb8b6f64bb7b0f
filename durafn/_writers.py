"""The writers: how a scheduler's rows reach the database, by who schedules.

* ``BufferedWriter`` (a mutation) buffers its rows and writes them in one multi-row INSERT
  just before its transaction commits (or earlier, when it cancels, reads the system
  table, or schedules a key): atomic with the mutation, one round trip for a thousand rows;
* ``DirectWriter`` (an action, or code outside durafn) commits each call at once, so the
  row survives the action failing later;
* ``JoinedWriter`` writes through a caller's own session or connection, committing with it.

Every write goes through ``write``: named queues are created with their first row, keyed
rows go through the driver's upsert (``_store/write/keys.py``), and executors are notified.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Iterator
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol

from sqlalchemy import event
from sqlalchemy import exc as sa_exc
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

from ._kinds import FunctionKind, ScheduledFunctionId, State
from ._runtime import Inline, Runtime
from ._store import NewRow, Outcome, take_notes

_PENDING = State.PENDING.value


Enqueued = tuple[ScheduledFunctionId, str, FunctionKind, str | None]


def enqueued(rows: list[NewRow], ids: list[ScheduledFunctionId]) -> list[Enqueued]:
    """(id, name, kind, flow key) of the Pending rows written (for ``enqueue`` hooks)."""
    return [
        (id, row["name"], FunctionKind(row["kind"]), row["flow_key"])
        for row, id in zip(rows, ids, strict=True)
        if row["state"] == _PENDING
    ]


def _pending_kinds(rows: list[NewRow]) -> set[FunctionKind]:
    return {FunctionKind(k) for k in {r["kind"] for r in rows if r["state"] == _PENDING}}


class BufferedWriter:
    """A mutation's rows: held until flushed into the mutation's own transaction."""

    FLUSH_AT = 1000

    def __init__(
        self,
        runtime: Runtime,
        conn: AsyncConnection,
        check_parent: ScheduledFunctionId | None,
        before_cancel: Callable[[], Awaitable[None]] | None = None,
        running: Collection[ScheduledFunctionId] = (),
    ) -> None:
        self._rt = runtime
        self._conn = conn
        self._check_parent = check_parent
        self._before_cancel = before_cancel
        self._running = running
        """The rows of the mutation batch writing through it (debounced calls never join
        a row that is running)."""
        self._rows: list[NewRow] = []
        self.woken: set[FunctionKind] = set()
        """Kinds of Pending rows written: wake executors for them once committed."""
        self.enqueued: list[Enqueued] = []
        """Pending rows written (the id that runs for each): ``enqueue`` hooks, once
        committed."""
        self.inline: list[Inline] = []
        """Rows written that inline mode runs once committed."""

    async def add(self, rows: list[NewRow]) -> list[ScheduledFunctionId]:
        if not all(_plain(row) and not row.get("after") for row in rows):
            # The id of a keyed, debounced or throttled row is the one that runs for it,
            # known only once written; a row's dependencies must exist (this batch's
            # buffered rows among them): write now (after the rows buffered before it,
            # to keep their order).
            await self.flush()
            with self._own_statements("scheduling a function"):
                kinds, ids = await write(
                    self._rt, self._conn, rows, self._check_parent, self.woken, self._running
                )
            self._written(rows, ids, kinds)
            return ids
        self._rows.extend(rows)
        if len(self._rows) >= self.FLUSH_AT:
            await self.flush()
        return [row["id"] for row in rows]

    async def flush(self) -> None:
        if not self._rows:
            return
        rows, self._rows = self._rows, []
        with self._own_statements("scheduling a function"):
            kinds, ids = await write(self._rt, self._conn, rows, self._check_parent, self.woken)
        self._written(rows, ids, kinds)

    @contextlib.contextmanager
    def _own_statements(self, doing: str) -> Iterator[None]:
        """durafn's statements inside a mutation: a driver error they raise reaches the
        mutation's code (and its caller) as a ``DatabaseError``, never raw, as on every
        other route. A transient one stays as it is, so that the transaction around the
        mutation retries it."""
        try:
            yield
        except sa_exc.SQLAlchemyError as exc:
            if self._rt.driver.is_transient(exc):
                raise
            raise self._rt.driver.wrap(exc, doing) from exc

    def _written(
        self, rows: list[NewRow], ids: list[ScheduledFunctionId], kinds: set[FunctionKind]
    ) -> None:
        self.woken |= kinds
        if self._rt.hooks.counting:
            self.enqueued += enqueued(rows, ids)
        if self._rt.inline is not None:
            self.inline += self._rt.inline_calls(rows, ids)

    def transaction_connection(self) -> AbstractAsyncContextManager[AsyncConnection] | None:
        """The mutation's connection, what it buffered written first (durable workflows
        write their rows beside the scheduled ones, ``_workflow/lifecycle.py``)."""
        return self._flushed()

    @contextlib.asynccontextmanager
    async def _flushed(self) -> AsyncIterator[AsyncConnection]:
        await self.flush()
        yield self._conn

    def discard(self) -> None:
        self._rows.clear()
        self.woken.clear()
        self.enqueued.clear()
        self.inline.clear()

    async def cancel(self, id: ScheduledFunctionId, now: float) -> State | None:
        await self.flush()
        if self._before_cancel is not None:
            await self._before_cancel()
        with self._own_statements("cancelling a scheduled function"):
            return await self._rt.driver.cancel(self._conn, id, now)


def _in_claim_order(rows: list[NewRow]) -> list[NewRow]:
    """Rows written together, laid out in the order claims take them: priority, then due
    time (a stable sort, so call order, which is id order, holds within each).

    A claim then rewrites a few pages, not one page per row: with half the rows at random
    priorities (benchmarks/options.py), written in call order, SQLite drained mutations
    0.75x as fast as plain rows (each commit wrote and synced ~250 scattered pages); in
    claim order 0.92x (PostgreSQL 0.85x -> 0.90x). Rows scheduled one per transaction at
    interleaved priorities still pay that locality: no layout at write time can help them.
    """
    if len(rows) < 2:
        return rows
    return sorted(rows, key=lambda row: (row["priority"], row["available_at"]))


async def write(
    rt: Runtime,
    conn: AsyncConnection,
    rows: list[NewRow],
    check_parent: ScheduledFunctionId | None,
    notified: Collection[FunctionKind] = (),
    running: Collection[ScheduledFunctionId] = (),
) -> tuple[set[FunctionKind], list[ScheduledFunctionId]]:
    """Write ``rows`` with a NOTIFY for the kinds of Pending rows among them, and of the
    Pending rows they wait for (``after=``), not in ``notified`` (one per kind per
    transaction is enough); returns those kinds, and the id
    that runs for each row (a keyed row's may be an existing row's). ``running``: rows
    the writing transaction has claimed (a mutation batch's)."""
    driver = rt.driver
    if check_parent is not None:
        # The parent is an action that may be cancelled while it runs: what it schedules
        # after that is written Canceled, never left to run (nor to take a key).
        parent_state = await driver.lock_for_share(conn, check_parent)
        if parent_state is State.CANCELED:
            now = rt.clock.now()
            for row in rows:
                # Nor do they join, start or hold back a debounce or a throttle.
                row["state"], row["completed_time"] = State.CANCELED.value, now
                row["job_key"], row["debounce"] = None, None
            # Finished for good at birth: their completion callbacks are due too.
            born = [
                Outcome(r["id"], State.CANCELED, name=r["name"], on_complete=r["on_complete"])
                for r in rows
            ]
            await driver.write_completions(conn, now, born)
    new = _pending_kinds(rows) - set(notified)
    if all(row["queue_name"] is None and _plain(row) and not row.get("after") for row in rows):
        await driver.insert_rows(conn, _in_claim_order(rows), new)  # the common case
        return new, [row["id"] for row in rows]
    waiting = [row for row in rows if row.get("after") and row["state"] == State.PENDING.value]
    links: list[dict[str, Any]] = []
    if waiting:
        rt.dependencies_in_use = True
        links, locked = await driver.prepare_waiting(conn, waiting)
        # Claims skip the Pending rows it marked until this commits, and their executors
        # sleep (a running executor on the fake clock left a fan-in's rows unclaimed).
        new |= locked - set(notified)
    names = {row["queue_name"] for row in rows if row["queue_name"] is not None}
    if names:
        await driver.ensure_queues(conn, {n: rt.concurrency_of(n) for n in names}, rt.clock.now())
    plain = [row for row in rows if _plain(row)]
    keyed = [row for row in rows if row["job_key"] is not None and row["debounce"] is None]
    debounced = [row for row in rows if row["debounce"] is not None]
    if plain:
        await driver.insert_rows(conn, _in_claim_order(plain), new)
    ids = {row["id"]: row["id"] for row in plain}
    if keyed:
        for row, id in zip(keyed, await driver.insert_keyed(conn, keyed), strict=True):
            ids[row["id"]] = id
    if debounced:
        written = await driver.write_debounced(conn, debounced, running)
        for row, id in zip(debounced, written, strict=True):
            ids[row["id"]] = id
    if links:
        await driver.link_waiting(conn, links)
    if new and not plain:
        await driver.notify(conn, new)
    return new, [ids[row["id"]] for row in rows]


def _plain(row: NewRow) -> bool:
    """Neither keyed nor debounced nor throttled: a plain INSERT."""
    return row["job_key"] is None and row["debounce"] is None


class DirectWriter:
    """An action's rows: each call commits on its own, at once."""

    def __init__(self, runtime: Runtime, check_parent: ScheduledFunctionId | None) -> None:
        self._rt = runtime
        self._check_parent = check_parent

    async def add(self, rows: list[NewRow]) -> list[ScheduledFunctionId]:
        rt = self._rt

        attempts = 0

        async def _body(
            conn: AsyncConnection,
        ) -> tuple[set[FunctionKind], list[ScheduledFunctionId]]:
            nonlocal attempts
            attempts += 1
            try:
                kinds, ids = await write(rt, conn, rows, self._check_parent)
            except sa_exc.IntegrityError:
                # A retry after a fault whose outcome we could not see: the ids were
                # chosen here, so if the first row exists, with our function and time,
                # the earlier attempt did commit. On a first attempt it is never ours.
                # (Keyed rows are upserts: writing them again changes nothing.)
                first = rows[0]
                stored = await rt.driver.get(conn, first["id"]) if attempts > 1 else None
                if (
                    stored is None
                    or stored.name != first["name"]
                    # Stored times come back at microsecond precision.
                    or abs(stored.scheduled_time.timestamp() - first["scheduled_time"]) > 1e-3
                ):
                    raise
                kinds, ids = _pending_kinds(rows), [row["id"] for row in rows]
                if kinds:
                    await rt.driver.notify(conn, kinds)
            return kinds, ids

        # A plain write with no parent to lock is one statement (its NOTIFY included): on
        # PostgreSQL one autocommit round trip instead of four. Retrying it is safe (above).
        # A row after= others is not: its insert and its edges must commit together (in
        # autocommit, a running executor claimed it between the two, before its edges
        # existed, and ran it before the rows it was to wait for).
        single = self._check_parent is None and all(
            _plain(row) and row["queue_name"] is None and not row.get("after") for row in rows
        )
        kinds, ids = await rt.transaction(
            _body, doing="scheduling a function", single_statement=single
        )
        rt.wake(kinds)
        await rt.hooks.enqueued(enqueued(rows, ids) if rt.hooks.counting else ())
        if rt.inline is not None:
            await rt.run_inline(rt.inline_calls(rows, ids))
        return ids

    def transaction_connection(self) -> None:
        """None: each call commits on its own, so there is no transaction to join."""
        return None

    async def cancel(self, id: ScheduledFunctionId, now: float) -> State | None:
        async def _body(conn: AsyncConnection) -> State | None:
            return await self._rt.driver.cancel(conn, id, now)

        return await self._rt.transaction(_body, doing="cancelling a scheduled function")


class Joined(Protocol):
    """A caller's transaction that ``JoinedWriter`` writes in: an ``AsyncSession`` or
    ``AsyncConnection`` (``_AsyncJoined``), or a synchronous one (``_sync_targets.py``)."""

    def connection(self) -> AbstractAsyncContextManager[AsyncConnection]: ...

    def after_commit(self, callback: Callable[[], object]) -> None:
        """Call ``callback`` once the caller's transaction commits (never if it rolls
        back)."""


class _AsyncJoined:
    """An ``AsyncSession`` or ``AsyncConnection`` of the caller's."""

    def __init__(self, target: AsyncSession | AsyncConnection) -> None:
        self._target = target

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[AsyncConnection]:
        if isinstance(self._target, AsyncSession):
            yield await self._target.connection()
        else:
            yield self._target

    def after_commit(self, callback: Callable[[], object]) -> None:
        # In-process executors wake at once; other processes learn by NOTIFY or the poll.
        if isinstance(self._target, AsyncSession):
            event.listen(
                self._target.sync_session, "after_commit", lambda _s: callback(), once=True
            )
        else:
            event.listen(self._target.sync_connection, "commit", lambda _c: callback(), once=True)


class JoinedWriter:
    """Rows written at once through a caller's session or connection; they commit with it."""

    def __init__(self, runtime: Runtime, target: AsyncSession | AsyncConnection | Joined) -> None:
        self._rt = runtime
        self._target = (
            _AsyncJoined(target) if isinstance(target, AsyncSession | AsyncConnection) else target
        )
        self._to_wake: set[FunctionKind] = set()

    @contextlib.asynccontextmanager
    async def _conn(self) -> AsyncIterator[AsyncConnection]:
        async with self._target.connection() as conn:
            if not self._rt.ready:
                # Checked through the caller's own transaction: creating the tables from a
                # second connection could wait on the lock that very transaction holds.
                await self._rt.driver.check_schema(conn)
                self._rt.mark_ready()
            yield conn

    async def add(self, rows: list[NewRow]) -> list[ScheduledFunctionId]:
        async with self._conn() as conn:
            try:
                # The caller may reuse this scheduler across transactions, so notify every
                # time (PostgreSQL folds identical notifications within one transaction).
                kinds, ids = await write(self._rt, conn, rows, None)
            except sa_exc.SQLAlchemyError as exc:
                raise self._rt.driver.wrap(exc, "scheduling through your transaction") from exc
            self._take_notes(conn)
        if not self._to_wake:
            self._target.after_commit(self._wake)
        self._to_wake |= kinds
        return ids

    def transaction_connection(self) -> AbstractAsyncContextManager[AsyncConnection]:
        """The caller's connection, inside its transaction."""
        return self._conn()

    def _wake(self) -> None:
        kinds, self._to_wake = self._to_wake, set()
        self._rt.wake(kinds)

    async def cancel(self, id: ScheduledFunctionId, now: float) -> State | None:
        async with self._conn() as conn:
            try:
                previous = await self._rt.driver.cancel(conn, id, now)
            except sa_exc.SQLAlchemyError as exc:
                raise self._rt.driver.wrap(exc, "cancelling through your transaction") from exc
            self._take_notes(conn)
        return previous

    def _take_notes(self, conn: AsyncConnection) -> None:
        """What the statements just run noted for after the commit (the callbacks of rows
        cancelled, the running actions to tell), done when the caller commits."""
        notes = take_notes(conn)
        if notes is not None:  # (inline mode does not run what it wrote: see the README)
            self._target.after_commit(functools.partial(self._rt.after_commit, notes))
