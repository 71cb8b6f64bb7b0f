"""The store seam: every SQL statement the runtime issues, dialect-neutral where it can be.

``Driver`` holds the statements both engines share (SQLAlchemy Core, so they stay readable
and reviewable); ``SQLiteDriver`` and ``PostgresDriver`` override only what differs: how
an engine is built, how rows are locked, how other processes are woken, and which errors
are transient. The executor and the contexts never ask which database they are on.

Every state change is an UPDATE guarded by the state it expects, and its row count is
checked by the caller: a lost race is explicit, never a row moved backwards.
"""

from __future__ import annotations

import base64
import builtins
import json
import os
import random
import uuid
from collections.abc import AsyncIterator, Callable, Collection, Iterable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple, TypedDict

from sqlalchemy import (
    CursorResult,
    Row,
    and_,
    bindparam,
    delete,
    func,
    insert,
    literal,
    or_,
    select,
    update,
)
from sqlalchemy import exc as sa_exc
from sqlalchemy import inspect as sa_inspect
from sqlalchemy.engine import URL, Connection
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.sql.elements import ColumnElement

from .._clock import to_datetime
from .._errors import ArgumentError, DatabaseError, SchemaError
from .._types import (
    FINISHED_STATES,
    ErrorInfo,
    FunctionKind,
    Page,
    ScheduledFunction,
    ScheduledFunctionId,
    State,
    WorkerInfo,
)
from ._tables import MIGRATIONS, SCHEMA_VERSION, metadata, schema_version, sf, workers

_RUNNABLE = (State.PENDING.value, State.IN_PROGRESS.value)


NEW_ROW_COLUMNS = (
    "id",
    "name",
    "kind",
    "args",
    "state",
    "scheduled_time",
    "available_at",
    "completed_time",
    "parent_id",
)
"""The keys of a row passed to ``Driver.insert_rows``; the other columns take defaults."""

_last_ms = -1
_seq = 0
_random = random.Random(os.urandom(16))
if hasattr(os, "register_at_fork"):  # not on Windows, which has no fork
    os.register_at_fork(after_in_child=lambda: _random.seed(os.urandom(16)))


def new_id(now: float) -> ScheduledFunctionId:
    """A UUIDv7 (RFC 9562, with a 30-bit counter after the milliseconds).

    Generated here rather than by the database so that ``run_after`` inside a mutation can
    return the id at once and the rows be written in one multi-row INSERT at commit. The
    counter keeps ids from one process strictly increasing even within one millisecond (or
    under a fake clock that stands still), so ``ORDER BY scheduled_time, id`` is the order
    of scheduling; 44 random bits keep processes apart.
    """
    global _last_ms, _seq
    ms = int(now * 1000)
    if ms <= _last_ms:
        ms = _last_ms
        _seq += 1
        if _seq >= 1 << 30:
            ms, _seq = ms + 1, 0
    else:
        _seq = 0
    _last_ms = ms
    # A private generator seeded from os.urandom (and again in a forked child), not a
    # system call per id, and the string built directly rather than via uuid.UUID:
    # measured, 1.5 us per id instead of 3.3 us, of about 19 us of CPU per scheduled row.
    # Private, so that a user's random.seed() can neither repeat our ids nor be disturbed.
    rand = _random.getrandbits(44)
    value = (
        ((ms & ((1 << 48) - 1)) << 80)
        | (0x7 << 76)
        | ((_seq >> 18) << 64)
        | (0x2 << 62)
        | ((_seq & ((1 << 18) - 1)) << 44)
        | rand
    )
    h = f"{value:032x}"  # uuid.UUID's str(), without building the object
    return ScheduledFunctionId(f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}")


@dataclass(slots=True)
class Claimed:
    """A row the executor is about to run."""

    id: ScheduledFunctionId
    name: str
    args: str
    attempts: int
    parent_id: ScheduledFunctionId | None
    available_at: float


@dataclass(slots=True)
class Outcome:
    """How a run ended, ready to be written back."""

    id: ScheduledFunctionId
    state: State
    result: str | None = None
    error_type: str | None = None
    error_message: str | None = None
    name: str = ""
    """The function's durable name, for logs."""


class LostAction(NamedTuple):
    """An action recorded Failed because its worker was lost."""

    id: ScheduledFunctionId
    name: str
    worker_id: str | None


_CLAIM_COLUMNS = (sf.c.id, sf.c.name, sf.c.args, sf.c.attempts, sf.c.parent_id, sf.c.available_at)


def _claimed(rows: Iterable[Row[Any]]) -> list[Claimed]:
    out = [Claimed(*row) for row in rows]
    out.sort(key=lambda c: (c.available_at, c.id))
    return out


# The hot statements, built once: constructing a Core statement costs ~0.3 ms of Python,
# as much as running it. Values arrive as bind parameters, "now" included (the clock).


def _due(kind: FunctionKind) -> Any:
    # ix_scheduled_functions_due: (kind, available_at, id) WHERE state = 'Pending'.
    return (
        select(*_CLAIM_COLUMNS)
        .where(
            sf.c.state == State.PENDING.value,
            sf.c.kind == kind.value,
            sf.c.available_at <= bindparam("now"),
        )
        .order_by(sf.c.available_at, sf.c.id)
        .limit(bindparam("limit"))
    )


# FOR UPDATE SKIP LOCKED on PostgreSQL: concurrent lanes and executors take disjoint rows.
# SQLite ignores the clause; its BEGIN IMMEDIATE already makes the batch the only writer.
_CLAIM_MUTATIONS = _due(FunctionKind.MUTATION).with_for_update(skip_locked=True)

# A MATERIALIZED CTE, not ``id IN (SELECT ... LIMIT n)``: PostgreSQL may re-run an
# IN-subquery per row and so claim more than ``limit`` rows (caught by
# test_actions_run_concurrently_up_to_the_limit).
_DUE_ACTIONS = (
    _due(FunctionKind.ACTION)
    .with_only_columns(sf.c.id)
    .with_for_update(skip_locked=True)
    .cte("due")
    .prefix_with("MATERIALIZED")
)
_CLAIM_ACTIONS = (
    update(sf)
    .where(sf.c.id == _DUE_ACTIONS.c.id, sf.c.state == State.PENDING.value)
    .values(
        state=State.IN_PROGRESS.value,
        started_time=bindparam("now"),
        worker_id=bindparam("worker_id"),
        attempts=sf.c.attempts + 1,
    )
    .returning(*_CLAIM_COLUMNS)
)


class _FinishParams(TypedDict):
    """The parameters every finish statement shares."""

    now: float
    expected: str
    counted: int
    """1 for a mutation, whose run is counted as it finishes (its start was never
    committed); 0 for an action, counted when it was claimed."""


_FINISH_PLAIN = (
    update(sf)
    .where(sf.c.id.in_(bindparam("ids", expanding=True)), sf.c.state == bindparam("expected"))
    .values(
        state=State.SUCCESS.value,
        completed_time=bindparam("now"),
        attempts=sf.c.attempts + bindparam("counted"),
    )
)
_FINISH_ONE = (
    update(sf)
    .where(sf.c.id == bindparam("b_id"), sf.c.state == bindparam("expected"))
    .values(
        state=bindparam("b_state"),
        completed_time=bindparam("now"),
        result=bindparam("b_result"),
        error_type=bindparam("b_error_type"),
        error_message=bindparam("b_error_message"),
        attempts=sf.c.attempts + bindparam("counted"),
    )
)


class Driver:
    """Dialect-neutral statements. Subclasses set the class attributes and override hooks."""

    name: ClassVar[str]
    max_mutation_lanes: ClassVar[int]
    """How many mutation batches may usefully run at once (SQLite has one writer)."""
    default_poll_interval: ClassVar[float]
    """Fallback poll for work scheduled by other processes that no signal announced."""
    auto_migrate: ClassVar[bool]
    """Create the system tables on first use (an embedded database), or require
    ``durafn migrate`` (a shared server, whose schema changes deliberately)."""

    single_statement_options: ClassVar[dict[str, Any]] = {}
    """Execution options for a transaction that is one statement: on PostgreSQL,
    autocommit, which saves the BEGIN and COMMIT round trips."""

    def __init__(self, url: URL) -> None:
        self.url = url

    # -- engine and errors ---------------------------------------------------------------

    def create_engine(self) -> AsyncEngine:
        raise NotImplementedError

    def require_existing(self) -> None:
        """Raise SchemaError if connecting would create the database rather than open it."""

    def is_transient(self, exc: BaseException, *, raised_by_user: bool = False) -> bool:
        """True for faults that retrying the whole transaction can cure.

        ``raised_by_user``: the exception came out of a user's function, where a bare
        OSError is the user's own (a missing file), not a database fault.
        """
        if isinstance(exc, sa_exc.DBAPIError):
            return bool(exc.connection_invalidated) or self._transient_dbapi(exc)
        return not raised_by_user and isinstance(exc, OSError)

    def _transient_dbapi(self, exc: sa_exc.DBAPIError) -> bool:
        return False

    def is_driver_error(self, exc: BaseException) -> bool:
        """An error the database driver raised without SQLAlchemy wrapping it (some
        connect-time failures), so that it reaches users as a DatabaseError."""
        return False

    def is_disconnect(self, exc: BaseException) -> bool:
        """True if the fault means the database is unreachable (not merely busy)."""
        if isinstance(exc, sa_exc.DBAPIError):
            return bool(exc.connection_invalidated)
        return isinstance(exc, OSError)

    def commit_outcome_unknown(self, exc: BaseException) -> bool:
        """True if a COMMIT that raised ``exc`` may nonetheless have taken effect."""
        return False

    async def abandon(self, conn: AsyncConnection) -> None:
        """Drop a connection whose statement was cut off (a mutation's time limit)."""
        await conn.invalidate()

    def translate(self, exc: BaseException) -> BaseException | None:
        """A durafn error for a driver error users could cause (writing in a query)."""
        return None

    def wrap(self, exc: BaseException, doing: str) -> DatabaseError:
        transient = self.is_transient(exc)
        detail = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0]
        return DatabaseError(
            f"database error while {doing} on {self.name}: {detail}", transient=transient
        )

    # -- transactions --------------------------------------------------------------------

    @asynccontextmanager
    async def read_only(self, conn: AsyncConnection) -> AsyncIterator[None]:
        """Make the transaction just begun on ``conn`` refuse writes."""
        yield

    async def lock_for_share(self, conn: AsyncConnection, id: ScheduledFunctionId) -> State | None:
        """Read a row's state, holding it against a concurrent cancel until commit."""
        return await self.state(conn, id)

    async def state(self, conn: AsyncConnection, id: ScheduledFunctionId) -> State | None:
        value = (await conn.execute(select(sf.c.state).where(sf.c.id == id))).scalar()
        return State(value) if value is not None else None

    async def notify(self, conn: AsyncConnection, kinds: Collection[FunctionKind]) -> None:
        """Tell executors in other processes, on commit, that rows of ``kinds`` were added."""

    @asynccontextmanager
    async def listen(
        self, engine: AsyncEngine, on_wake: Callable[[Collection[FunctionKind]], None]
    ) -> AsyncIterator[bool]:
        """Deliver other processes' wake-ups to ``on_wake``; yields whether it can."""
        yield False

    # -- schema --------------------------------------------------------------------------

    async def _lock_schema(self, conn: AsyncConnection) -> None:
        """Serialise concurrent migrations."""

    async def migrate(self, conn: AsyncConnection, now: float) -> int:
        """Create or upgrade the system tables; returns the version now in place."""
        await self._lock_schema(conn)
        await conn.run_sync(lambda c: schema_version.create(c, checkfirst=True))
        current = await self._current_version(conn)
        if current is not None and current > SCHEMA_VERSION:
            raise _too_new(current)
        if current is None:
            await conn.run_sync(_create_all)
            await conn.execute(
                insert(schema_version).values(version=SCHEMA_VERSION, applied_at=now)
            )
            return SCHEMA_VERSION
        for version in range(current + 1, SCHEMA_VERSION + 1):
            await conn.run_sync(MIGRATIONS[version])
            await conn.execute(insert(schema_version).values(version=version, applied_at=now))
        return SCHEMA_VERSION

    async def check_schema(self, conn: AsyncConnection) -> None:
        missing = SchemaError(
            "the durafn system tables do not exist in this database; run "
            "`durafn migrate --url ...` or `await app.migrate()` first"
        )
        try:
            current = await self._current_version(conn)
        except sa_exc.DBAPIError as exc:
            if self.is_transient(exc):
                raise
            raise missing from None
        if current is None:
            existing = await conn.run_sync(lambda c: set(sa_inspect(c).get_table_names()))
            if sf.name not in existing:
                raise missing
            # Created from durafn.metadata by the user's own migrations (Alembic): the
            # version table is there but empty; the schema is theirs to manage, but it
            # must be the whole of this version's (say, after upgrading durafn).
            if absent := sorted(set(metadata.tables) - existing):
                raise SchemaError(
                    f"the durafn system tables are incomplete for this durafn (missing "
                    f"{', '.join(absent)}): regenerate your migration from durafn.metadata, "
                    "or run `durafn migrate` to adopt and complete them"
                )
            return
        if current > SCHEMA_VERSION:
            raise _too_new(current)
        if current < SCHEMA_VERSION:
            raise SchemaError(
                f"the durafn system tables are at version {current}, this durafn needs "
                f"{SCHEMA_VERSION}; run `durafn migrate`"
            )

    async def _current_version(self, conn: AsyncConnection) -> int | None:
        version = (await conn.execute(select(func.max(schema_version.c.version)))).scalar()
        return None if version is None else int(version)

    # -- scheduling ----------------------------------------------------------------------

    async def insert_rows(
        self,
        conn: AsyncConnection,
        rows: Sequence[dict[str, Any]],
        notify: Collection[FunctionKind] = (),
    ) -> None:
        """Insert rows (their keys are ``NEW_ROW_COLUMNS``), and ``notify`` executors of
        these kinds when this commits. Each driver has its own one-statement form."""
        raise NotImplementedError

    async def cancel(
        self, conn: AsyncConnection, id: ScheduledFunctionId, now: float
    ) -> State | None:
        """Cancel one row (and, if it was running, its unfinished descendants).

        Returns the state the row had, or None if there is no such row.
        """
        if not _is_id(id):
            return None
        row = (
            await conn.execute(select(sf.c.state).where(sf.c.id == id).with_for_update())
        ).first()
        if row is None:
            return None
        previous = State(row[0])
        if previous.finished:
            return previous
        result = await conn.execute(
            update(sf)
            .where(sf.c.id == id, sf.c.state == previous.value)
            .values(state=State.CANCELED.value, completed_time=now)
        )
        assert isinstance(result, CursorResult)
        if result.rowcount != 1:  # pragma: no cover - the row lock above prevents it
            raise DatabaseError(f"scheduled function {id} changed state while being cancelled")
        if previous is State.IN_PROGRESS:
            await self.cancel_descendants(conn, id, now)
        return previous

    async def cancel_descendants(
        self, conn: AsyncConnection, root: ScheduledFunctionId, now: float
    ) -> int:
        # Walks the whole subtree (through finished rows too: a finished child's own
        # children may still be Pending) via ix_scheduled_functions_parent.
        tree = select(sf.c.id).where(sf.c.parent_id == root).cte("tree", recursive=True)
        tree = tree.union_all(select(sf.c.id).join(tree, sf.c.parent_id == tree.c.id))
        stmt = (
            update(sf)
            .where(sf.c.id.in_(select(tree.c.id)), sf.c.state.in_(_RUNNABLE))
            .values(state=State.CANCELED.value, completed_time=now)
        )
        # Sweep until the set of descendants stops growing. On PostgreSQL one statement
        # sees one snapshot: if the UPDATE waited for a running descendant mutation's lock,
        # the rows that mutation committed meanwhile are invisible to it (so "until a sweep
        # changes nothing" is not enough), but visible to the next SELECT.
        seen: set[str] = set()
        total = 0
        while True:
            found = {str(i) for i in (await conn.execute(select(tree.c.id))).scalars()}
            if found <= seen:
                return total
            seen |= found
            result = await conn.execute(stmt)
            assert isinstance(result, CursorResult)
            total += result.rowcount

    # -- executor: mutations -------------------------------------------------------------

    async def claim_mutations(self, conn: AsyncConnection, now: float, limit: int) -> list[Claimed]:
        """Select due mutations inside the batch transaction, locked until it ends."""
        rows = await conn.execute(_CLAIM_MUTATIONS, {"now": now, "limit": limit})
        return _claimed(rows)

    async def finish_pending(
        self, conn: AsyncConnection, now: float, outcomes: Sequence[Outcome]
    ) -> int:
        """Pending -> Success/Failed for mutations run in this transaction; returns the count."""
        return await self._finish(conn, now, outcomes, State.PENDING)

    async def _finish(
        self, conn: AsyncConnection, now: float, outcomes: Sequence[Outcome], expected: State
    ) -> int:
        # The common outcome (Success, nothing returned) goes out as one statement for the
        # whole batch; only the others need a row each. On SQLite this took a 64-row
        # batch's completion from ~3 ms (executemany) to well under 1 ms.
        plain = [o.id for o in outcomes if o.state is State.SUCCESS and o.result is None]
        other = [o for o in outcomes if not (o.state is State.SUCCESS and o.result is None)]
        common = _FinishParams(
            now=now, expected=expected.value, counted=1 if expected is State.PENDING else 0
        )
        written = 0
        if plain:
            written += await self._finish_plain(conn, plain, common)
        if other:
            written += await self._finish_others(conn, other, common)
        return written

    async def _finish_plain(
        self, conn: AsyncConnection, ids: list[ScheduledFunctionId], common: _FinishParams
    ) -> int:
        """Success, with no result, for every row of ``ids`` still in ``expected``."""
        written = 0
        for start in range(0, len(ids), 500):  # SQLite's limit on bound parameters
            result = await conn.execute(_FINISH_PLAIN, {**common, "ids": ids[start : start + 500]})
            assert isinstance(result, CursorResult)
            written += result.rowcount
        return written

    async def _finish_others(
        self, conn: AsyncConnection, outcomes: list[Outcome], common: _FinishParams
    ) -> int:
        """Each outcome's state, result and error, for its row if still in ``expected``."""
        result = await conn.execute(
            _FINISH_ONE,
            [
                {
                    "b_id": o.id,
                    "b_state": o.state.value,
                    "b_result": o.result,
                    "b_error_type": o.error_type,
                    "b_error_message": o.error_message,
                    **common,
                }
                for o in outcomes
            ],
        )
        assert isinstance(result, CursorResult)
        return result.rowcount

    async def count_retry(self, conn: AsyncConnection, ids: Sequence[ScheduledFunctionId]) -> None:
        """Count an internal retry on rows whose batch was rolled back by a fault."""
        await conn.execute(
            update(sf)
            .where(sf.c.id.in_(ids), sf.c.state == State.PENDING.value)
            .values(attempts=sf.c.attempts + 1)
        )

    # -- executor: actions ---------------------------------------------------------------

    async def claim_actions(
        self, conn: AsyncConnection, now: float, limit: int, worker_id: str
    ) -> list[Claimed]:
        """Pending -> InProgress for up to ``limit`` due actions; commit before running them."""
        rows = await conn.execute(
            _CLAIM_ACTIONS, {"now": now, "limit": limit, "worker_id": worker_id}
        )
        return _claimed(rows)

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
            select(*_CLAIM_COLUMNS).where(
                sf.c.state == State.IN_PROGRESS.value, sf.c.worker_id == worker_id
            )
        )
        return _claimed(rows)

    async def finish_in_progress(
        self, conn: AsyncConnection, now: float, outcomes: Sequence[Outcome]
    ) -> int:
        """InProgress -> Success/Failed. A row cancelled meanwhile stays Canceled.

        Guarded by the state, so running it again (a retry after an unseen outcome) writes
        nothing twice."""
        return await self._finish(conn, now, outcomes, State.IN_PROGRESS)

    async def next_due(
        self, conn: AsyncConnection, kind: FunctionKind, after: float | None = None
    ) -> float | None:
        """When the next Pending row of ``kind`` (due later than ``after``) becomes due.

        ``after`` lets an idle executor skip rows that are due but locked by another lane
        or executor: waiting for those would be a busy loop.
        """
        # The first entry of ix_scheduled_functions_due for this kind: O(log n).
        stmt = (
            select(sf.c.available_at)
            .where(sf.c.state == State.PENDING.value, sf.c.kind == kind.value)
            .order_by(sf.c.available_at)
            .limit(1)
        )
        if after is not None:
            stmt = stmt.where(sf.c.available_at > after)
        return (await conn.execute(stmt)).scalar()

    # -- workers -------------------------------------------------------------------------

    async def register_worker(
        self, conn: AsyncConnection, id: str, hostname: str, pid: int, concurrency: int, now: float
    ) -> None:
        await conn.execute(
            insert(workers).values(
                id=id,
                hostname=hostname,
                pid=pid,
                concurrency=concurrency,
                started_at=now,
                heartbeat_at=now,
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

    async def rescue_lost(
        self, conn: AsyncConnection, now: float, cutoff: float, message: str
    ) -> list[LostAction]:
        """InProgress -> Failed for actions whose worker has not heartbeaten since
        ``cutoff`` (or has no row at all); returns (id, name, worker_id) of each.

        ``started_time < cutoff`` as well: a row is never rescued sooner after its claim
        than a worker is allowed to go without a heartbeat. The state guard makes two
        workers rescuing at once harmless: the second finds nothing left to move.
        """
        before, _, after = message.partition("{worker}")
        alive = select(workers.c.id).where(workers.c.heartbeat_at >= cutoff)
        result = await conn.execute(
            update(sf)
            .where(
                sf.c.state == State.IN_PROGRESS.value,  # ix_scheduled_functions_running
                sf.c.started_time < cutoff,
                or_(sf.c.worker_id.is_(None), sf.c.worker_id.not_in(alive)),
            )
            .values(
                state=State.FAILED.value,
                completed_time=now,
                error_type="durafn.WorkerLostError",
                # The message names the lost worker: "{worker}" in it becomes its id.
                error_message=literal(before)
                .concat(func.coalesce(sf.c.worker_id, "unknown"))
                .concat(after),
            )
            .returning(sf.c.id, sf.c.name, sf.c.worker_id)
        )
        lost = [LostAction(ScheduledFunctionId(str(i)), n, w) for i, n, w in result]
        await conn.execute(delete(workers).where(workers.c.heartbeat_at < cutoff))
        return lost

    # -- retention -----------------------------------------------------------------------

    async def delete_finished(
        self,
        conn: AsyncConnection,
        cutoff: float,
        limit: int,
        states: Collection[State] = FINISHED_STATES,
    ) -> int:
        """Delete up to ``limit`` rows in ``states`` completed before ``cutoff``, oldest first."""
        # Bounded so that one call never holds locks for long.
        doomed = (
            select(sf.c.id)
            .where(_finished_before(cutoff, states))
            .order_by(sf.c.completed_time)
            .limit(limit)
        )
        result = await conn.execute(delete(sf).where(sf.c.id.in_(doomed.scalar_subquery())))
        assert isinstance(result, CursorResult)
        return result.rowcount

    async def count_finished(
        self, conn: AsyncConnection, cutoff: float, states: Collection[State] = FINISHED_STATES
    ) -> int:
        """How many rows ``delete_finished`` would delete, all batches together."""
        stmt = select(func.count()).select_from(sf).where(_finished_before(cutoff, states))
        return int((await conn.execute(stmt)).scalar_one())

    # -- reading -------------------------------------------------------------------------

    async def get(self, conn: AsyncConnection, id: str) -> ScheduledFunction | None:
        if not _is_id(id):
            return None
        row = (await conn.execute(select(sf).where(sf.c.id == id))).first()
        return _to_model(row) if row is not None else None

    async def list(
        self,
        conn: AsyncConnection,
        *,
        states: Sequence[State] | None,
        name: str | None,
        after: float | None,
        before: float | None,
        limit: int,
        cursor: str | None,
    ) -> Page:
        stmt = select(sf).order_by(sf.c.scheduled_time, sf.c.id).limit(limit + 1)
        if states:
            stmt = stmt.where(sf.c.state.in_([State(s).value for s in states]))
        if name is not None:
            stmt = stmt.where(sf.c.name == name)
        if after is not None:
            stmt = stmt.where(sf.c.scheduled_time >= after)
        if before is not None:
            stmt = stmt.where(sf.c.scheduled_time < before)
        if cursor is not None:
            at, last_id = _decode_cursor(cursor)
            stmt = stmt.where(
                or_(sf.c.scheduled_time > at, and_(sf.c.scheduled_time == at, sf.c.id > last_id))
            )
        rows = list(await conn.execute(stmt))
        items = [_to_model(r) for r in rows[:limit]]
        next_cursor = None
        if len(rows) > limit:
            last = rows[limit - 1]
            next_cursor = _encode_cursor(last.scheduled_time, last.id)
        return Page(items=items, next_cursor=next_cursor)

    async def list_workers(self, conn: AsyncConnection) -> builtins.list[WorkerInfo]:
        """Registered workers, with how many actions each has InProgress."""
        running = (
            select(sf.c.worker_id, func.count().label("running"))
            .where(sf.c.state == State.IN_PROGRESS.value)
            .group_by(sf.c.worker_id)
            .subquery()
        )
        rows = await conn.execute(
            select(workers, func.coalesce(running.c.running, 0))
            .outerjoin(running, running.c.worker_id == workers.c.id)
            .order_by(workers.c.started_at, workers.c.id)
        )
        return [
            WorkerInfo(
                id=r.id,
                hostname=r.hostname,
                pid=r.pid,
                concurrency=r.concurrency,
                started_at=to_datetime(r.started_at),
                heartbeat_at=to_datetime(r.heartbeat_at),
                running=r[-1],
            )
            for r in rows
        ]

    async def count_by_state(self, conn: AsyncConnection) -> dict[State, int]:
        """Rows in each state, every state present. A full scan (no index helps a GROUP BY
        over every row): fine for an operator's occasional look, not for a hot path."""
        rows = await conn.execute(select(sf.c.state, func.count()).group_by(sf.c.state))
        counts = dict.fromkeys(State, 0)
        counts.update({State(s): n for s, n in rows})
        return counts

    async def backlog(self, conn: AsyncConnection, now: float) -> tuple[float | None, float | None]:
        """(``available_at`` of the longest-waiting due Pending row, the earliest
        ``available_at`` after ``now``): each None when there is no such row.

        Up to four ``next_due`` reads, each the first entry of a range of
        ix_scheduled_functions_due, rather than a MIN over the Pending rows.
        """
        oldest: list[float] = []
        upcoming: list[float] = []
        for kind in (FunctionKind.MUTATION, FunctionKind.ACTION):
            first = await self.next_due(conn, kind)
            if first is not None and first <= now:
                oldest.append(first)
                first = await self.next_due(conn, kind, after=now)
            if first is not None:
                upcoming.append(first)
        return min(oldest, default=None), min(upcoming, default=None)


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


def _is_id(id: object) -> bool:
    """Ids are UUIDs; anything else matches no row (and must not reach a uuid column)."""
    try:
        uuid.UUID(str(id))
    except ValueError:
        return False
    return isinstance(id, str)


def _create_all(conn: Connection) -> None:
    # Indexes too: tables a user created from an older durafn.metadata (Alembic) and that
    # ``migrate`` now adopts may lack this version's, and create_all skips existing tables.
    metadata.create_all(conn, checkfirst=True)
    for table in metadata.tables.values():
        for index in table.indexes:
            index.create(conn, checkfirst=True)


def _too_new(version: int) -> SchemaError:
    return SchemaError(
        f"the durafn system tables are at version {version}, newer than this durafn "
        f"understands ({SCHEMA_VERSION}); upgrade durafn before running it on this database"
    )


def _to_model(row: Row[Any]) -> ScheduledFunction:
    m = row._mapping
    error = None
    if m["error_type"] is not None:
        error = ErrorInfo(type=m["error_type"], message=m["error_message"] or "")
    return ScheduledFunction(
        id=ScheduledFunctionId(str(m["id"])),
        name=m["name"],
        kind=FunctionKind(m["kind"]),
        args=json.loads(m["args"]),
        state=State(m["state"]),
        scheduled_time=to_datetime(m["scheduled_time"]),
        started_time=to_datetime(m["started_time"]) if m["started_time"] is not None else None,
        completed_time=to_datetime(m["completed_time"])
        if m["completed_time"] is not None
        else None,
        error=error,
        result=json.loads(m["result"]) if m["result"] is not None else None,
        parent_id=ScheduledFunctionId(str(m["parent_id"])) if m["parent_id"] else None,
        attempts=m["attempts"],
    )


def _encode_cursor(at: float, id: object) -> str:
    raw = json.dumps([at, str(id)]).encode()
    return base64.urlsafe_b64encode(raw).decode()


def _decode_cursor(cursor: str) -> tuple[float, str]:
    try:
        at, last_id = json.loads(base64.urlsafe_b64decode(cursor.encode()))
        return float(at), str(uuid.UUID(last_id))
    except Exception:
        raise ArgumentError(f"{cursor!r} is not a cursor returned by list()") from None
