"""The store on one page: every operation the runtime asks of the database (``Store``;
the operators' tools' rooms on ``operator_interface.py``), grouped by room, one line
each on what it does and the index it reads; then what an engine's dialect must or may
provide (``Dialect``).

The runtime and the executor type against ``Store`` (``Runtime.driver``); ``Driver``
(``driver.py``: the statements both engines share, in the rooms named below) with
``SQLiteDriver`` or ``PostgresDriver`` is what implements it, and ``tests/test_driver.py``
runs it on both engines. A method's name is the same from the caller through this page
to its statement: ``rt.driver.claim_actions`` is ``ClaimStatements.claim_actions`` in
``claim/statements.py``. Every state change is an UPDATE guarded by the state it expects;
callers check the counts returned.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable, Collection, Mapping, Sequence
from collections.abc import Set as AbstractSet
from contextlib import AbstractAsyncContextManager
from typing import Any, ClassVar, Protocol

from sqlalchemy.engine import URL, Connection, Engine
from sqlalchemy.ext.asyncio import AsyncConnection as Conn
from sqlalchemy.ext.asyncio import AsyncEngine
from typing_extensions import Unpack

from .._errors import DatabaseError
from .._kinds import FunctionKind, ScheduledFunctionId, State
from .._models import (
    LostWorker,
    Page,
    QueueInfo,
    ScheduledFunction,
    WorkerInfo,
)
from .claim.batched import BatchClaim, BatchSpec
from .claim.columns import StartTime
from .claim.hints import FastPathHint, LevelFloor
from .claim.take import ClaimFilter
from .crons import CronChange, CronMove, NewCron, StoredCron
from .filters import RowFilter
from .operator_interface import OperatorStore
from .read.explain import Facts, KeyCounts
from .rows import Claimed, LostAction, NewRow, NewRowColumns, Outcome, RetryState

Ids = Sequence[ScheduledFunctionId]
IdList = builtins.list[ScheduledFunctionId]


class Store(OperatorStore, Protocol):
    """What the runtime asks of the database. ``conn`` is the caller's transaction. The
    operators' tools' rooms (the audit trail, operations, a row's links, search, the
    rollups) are on a page of their own (``operator_interface.OperatorStore``)."""

    url: URL
    name: ClassVar[str]
    """For messages: ``SQLite``, ``PostgreSQL``."""

    # -- the engine (engine.py; each dialect's driver overrides what differs) -------------
    max_mutation_lanes: ClassVar[int]
    default_poll_interval: ClassVar[float]
    auto_migrate: ClassVar[bool]
    default_max_connections: ClassVar[int]
    lateral_claims: ClassVar[bool]
    read_only_options: ClassVar[dict[str, Any]]
    single_statement_options: ClassVar[dict[str, Any]]

    def create_engine(self, max_connections: int) -> AsyncEngine: ...  # the app's pool
    def create_sync_engine(self, max_connections: int) -> Engine: ...  # app.sync's
    async def dispose(self, engine: AsyncEngine) -> None: ...
    def require_existing(self) -> None: ...  # SchemaError: would create, not open
    def read_only(self, conn: Conn) -> AbstractAsyncContextManager[None]: ...
    def is_transient(self, exc: BaseException, *, raised_by_user: bool = ...) -> bool: ...
    def is_driver_error(self, exc: BaseException) -> bool: ...  # raised unwrapped
    def is_disconnect(self, exc: BaseException) -> bool: ...  # unreachable, not busy
    def commit_outcome_unknown(self, exc: BaseException) -> bool: ...  # COMMIT may have held
    def translate(self, exc: BaseException) -> BaseException | None: ...  # user-made errors
    def wrap(self, exc: BaseException, doing: str) -> DatabaseError: ...
    async def statement_handle(self, conn: Conn) -> Any: ...  # for ``abandon``
    async def abandon(self, conn: Conn, handle: Any) -> None: ...  # a timed-out mutation
    async def notify(self, conn: Conn, kinds: Collection[FunctionKind]) -> None: ...  # at commit
    async def wake_freed(self, conn: Conn, ids: Collection[str]) -> int: ...  # rows now free
    def listen(
        self,
        engine: AsyncEngine,
        on_wake: Callable[[Collection[FunctionKind]], None],
        on_cancel: Callable[[builtins.list[str]], None],
    ) -> AbstractAsyncContextManager[bool]: ...  # other processes' wake-ups and cancels

    # -- the schema (engine.py, schema/) --------------------------------------------------
    async def migrate(self, conn: Conn, now: float) -> int: ...  # create or upgrade
    async def check_schema(self, conn: Conn) -> None: ...  # SchemaError unless current

    # -- scheduling: new rows (driver.py, write/keys.py, write/debounce.py, ...) ----------
    async def insert_rows(
        self, conn: Conn, rows: Sequence[NewRowColumns], notify: Collection[FunctionKind] = ...
    ) -> None: ...  # one multi-row INSERT; NOTIFY at commit
    # Rows with job keys (ix_scheduled_functions_key): the id that runs for each.
    async def insert_keyed(self, conn: Conn, rows: Sequence[NewRow]) -> IdList: ...
    async def write_debounced(
        self,
        conn: Conn,
        rows: Sequence[NewRow],
        running: Collection[ScheduledFunctionId] = ...,
    ) -> IdList: ...  # debounced and throttled calls (ix_scheduled_functions_key_head)
    async def prepare_waiting(
        self, conn: Conn, rows: Sequence[NewRow]
    ) -> tuple[builtins.list[dict[str, Any]], set[FunctionKind]]: ...  # before ``after=`` rows
    async def link_waiting(self, conn: Conn, links: Sequence[dict[str, Any]]) -> None: ...
    async def ensure_queues(
        self, conn: Conn, concurrency: Mapping[str, int | None], now: float
    ) -> None: ...  # a queue's first row creates it (primary key)
    async def write_completions(
        self, conn: Conn, now: float, finished: Sequence[Outcome]
    ) -> None: ...  # the completion callbacks of rows finished for good

    # -- claim (claim/): Pending -> InProgress, or locked for a mutation batch -----------
    async def claim_mutations(
        self,
        conn: Conn,
        now: float,
        limit: int,
        serve: ClaimFilter = ...,
        hint: FastPathHint | None = ...,
        floor: LevelFloor | None = ...,
    ) -> builtins.list[Claimed]: ...  # locked till commit (ix_scheduled_functions_claim[_queued])
    async def claim_actions_fast(
        self,
        conn: Conn,
        now: float,
        limit: int,
        worker_id: str,
        serve: ClaimFilter = ...,
        started: StartTime | float | None = ...,
    ) -> builtins.list[Claimed]: ...  # unqueued, by level (ix_scheduled_functions_claim)
    async def claim_actions(
        self,
        conn: Conn,
        now: float,
        limit: int,
        worker_id: str,
        serve: ClaimFilter = ...,
        hint: FastPathHint | None = ...,
        started: StartTime | float | None = ...,
    ) -> builtins.list[Claimed]: ...  # queues, flow keys, levels (claim/take.py)
    async def claim_batches(
        self,
        conn: Conn,
        now: float,
        worker_id: str,
        functions: Sequence[BatchSpec],
        room: int,
        serve: ClaimFilter = ...,
        started: StartTime | float | None = ...,
    ) -> BatchClaim: ...  # ready batches of batched actions (ix_scheduled_functions_batched)
    async def hand_off(
        self,
        conn: Conn,
        now: float,
        queues: Sequence[str],
        room: int,
        worker_id: str,
        serve: ClaimFilter = ...,
        started: StartTime | float | None = ...,
    ) -> builtins.list[Claimed]: ...  # each queue's next row, in its finish's transaction
    async def claim_ids(
        self,
        conn: Conn,
        kind: FunctionKind,
        ids: Ids,
        now: float,
        worker_id: str | None = ...,
        started: StartTime | float | None = ...,
    ) -> builtins.list[Claimed]: ...  # rows run inline by their scheduler (primary key)
    # Claimed actions never started back to Pending (primary key, guarded by worker).
    async def release_unstarted(self, conn: Conn, ids: Ids, worker_id: str) -> int: ...
    async def claimed_by(self, conn: Conn, worker_id: str) -> builtins.list[Claimed]: ...
    # A worker's InProgress actions (ix_scheduled_functions_running).
    async def next_due(
        self, conn: Conn, kind: FunctionKind, after: float | None = ...
    ) -> float | None: ...  # the next Pending row's time (ix_scheduled_functions_claim)

    # -- finish (write/finish.py, write/failures.py, postgres|sqlite/multirow.py) ---------
    async def finish_pending(
        self,
        conn: Conn,
        now: float,
        outcomes: Sequence[Outcome],
        worker_id: str | None = ...,
        started: float | None = ...,
    ) -> int: ...  # a mutation batch's rows: Pending -> Success/Failed/retried (primary key)
    async def finish_in_progress(
        self, conn: Conn, now: float, outcomes: Sequence[Outcome], worker_id: str | None = ...
    ) -> int: ...  # actions: InProgress -> Success/Failed/retried (primary key)
    def finishes_in_one_statement(
        self, outcomes: Sequence[Outcome], retrying: AbstractSet[ScheduledFunctionId]
    ) -> bool: ...  # whether ``finish_in_progress`` needs no transaction of its own
    async def retry_rows(
        self,
        conn: Conn,
        now: float,
        outcomes: Sequence[Outcome],
        expected: State,
        worker_id: str | None,
        counted: int = ...,
        failed: int = ...,
    ) -> set[str]: ...  # back to Pending at retry_at, the run in the history
    async def snooze_rows(
        self,
        conn: Conn,
        outcomes: Sequence[Outcome],
        expected: State,
        counted: int,
        limits: Sequence[int],
    ) -> tuple[set[str], set[str]]: ...  # back to Pending, a snooze counted
    # What each failed row's retry depends on (primary key).
    async def retry_states(self, conn: Conn, ids: Ids) -> dict[ScheduledFunctionId, RetryState]: ...
    async def record_failures(
        self, conn: Conn, now: float, outcomes: Sequence[Outcome], worker_id: str | None
    ) -> None: ...  # final failures into their rows' histories
    async def count_retry(self, conn: Conn, ids: Ids) -> None: ...  # a rolled-back batch's run
    async def set_progress(
        self, conn: Conn, id: ScheduledFunctionId, fraction: float, message: str | None
    ) -> bool: ...  # while InProgress (primary key)

    # -- cancel, retry, reschedule, delete (write/cancels.py, driver.py) -----------------
    async def cancel(self, conn: Conn, id: ScheduledFunctionId, now: float) -> State | None: ...
    async def canceled_among(self, conn: Conn, ids: Ids) -> builtins.list[str]: ...  # (pk)
    async def lock_for_share(self, conn: Conn, id: ScheduledFunctionId) -> State | None: ...
    async def state(self, conn: Conn, id: ScheduledFunctionId) -> State | None: ...  # (pk)
    async def matching_batch(
        self, conn: Conn, where: RowFilter, after: str | None, limit: int
    ) -> IdList: ...  # a keyset page of a bulk change's rows, by id
    async def change_pending(
        self, conn: Conn, ids: Ids, values: dict[str, Any] | None, now: float
    ) -> int: ...  # set values, or cancel (None), where still Pending
    # Failed -> Pending for a fresh set of attempts (primary key).
    async def retry_failed(self, conn: Conn, ids: Ids, run_at: float) -> IdList: ...
    async def delete_finished(
        self,
        conn: Conn,
        cutoff: float,
        limit: int,
        states: Collection[State] = ...,
        *,
        names: Collection[str] | None = ...,
        excluded: Collection[str] = ...,
    ) -> int: ...  # retention, oldest first (ix_scheduled_functions_completed)
    async def count_finished(
        self, conn: Conn, cutoff: float, states: Collection[State] = ...
    ) -> int: ...  # what ``delete_finished`` would delete (ix_scheduled_functions_completed)

    # -- read (read/listing.py, read/explain.py) -----------------------------------------
    async def get(self, conn: Conn, id: str) -> ScheduledFunction | None: ...  # (pk)
    async def list(
        self,
        conn: Conn,
        *,
        where: RowFilter,
        limit: int,
        cursor: str | None,
        newest_first: bool = ...,
        scan: int | None = ...,
    ) -> Page: ...  # cursor pages (ix_scheduled_functions_scheduled; _parent for a parent)
    async def count_rows(self, conn: Conn, where: RowFilter) -> int: ...  # a bulk change's
    async def finished_since(
        self, conn: Conn, since: float, limit: int
    ) -> builtins.list[ScheduledFunction]: ...  # (ix_scheduled_functions_completed)
    async def count_by_state(self, conn: Conn) -> dict[State, int]: ...  # a full scan
    async def count_by_state_bounded(
        self, conn: Conn, bound: int
    ) -> tuple[dict[State, int], set[State]]: ...  # partial indexes and _completed, bounded
    # Pending rows due, up to ``bound``: the four Pending partial indexes.
    async def count_due_bounded(self, conn: Conn, now: float, bound: int) -> tuple[int, bool]: ...
    async def backlog(self, conn: Conn, now: float) -> tuple[float | None, float | None]: ...
    # The oldest due row's time and the next one's (the claim indexes).
    async def explain_facts(
        self, conn: Conn, id: ScheduledFunctionId, now: float
    ) -> Facts | None: ...  # why a row waits (primary key, _queue, _batch, dependencies_row)
    async def flow_key_counts(
        self, conn: Conn, now: float, limit: int
    ) -> builtins.list[KeyCounts]: ...  # (ix_scheduled_functions_keys, _running)

    # -- queues (queues.py) ---------------------------------------------------------------
    async def declare_queues(
        self, conn: Conn, concurrency: Mapping[str, int | None], now: float
    ) -> None: ...  # an app's ``Queue``s, at its executor's start
    async def set_paused(
        self, conn: Conn, concurrency: Mapping[str, int | None], paused: bool, now: float
    ) -> int: ...
    async def list_queues(
        self,
        conn: Conn,
        now: float,
        bound: int | None = ...,
        *,
        names: Collection[str] | None = ...,
        limit: int | None = ...,
    ) -> builtins.list[QueueInfo]: ...  # (primary key; ix_scheduled_functions_queue, _running)

    # -- crons (crons.py; the rules they follow: _cron_rules.py) -------------------------
    async def stored_crons(self, conn: Conn) -> builtins.list[StoredCron]: ...  # by name
    async def stored_cron(
        self, conn: Conn, name: str, *, lock: bool = ...
    ) -> StoredCron | None: ...  # (primary key)
    async def add_crons(self, conn: Conn, added: Sequence[NewCron], *, now: float) -> None: ...
    async def set_cron(self, conn: Conn, name: str, **values: Unpack[CronChange]) -> None: ...
    async def remove_crons(self, conn: Conn, names: Sequence[str]) -> int: ...
    # Enabled crons due by ``now``, earliest first (ix_durafn_crons_next).
    async def due_crons(self, conn: Conn, now: float, limit: int) -> builtins.list[StoredCron]: ...
    async def next_cron(self, conn: Conn) -> float | None: ...  # (ix_durafn_crons_next)
    # Each cron on from the next run it was read with, if still that (primary key).
    async def advance_crons(self, conn: Conn, moves: Sequence[CronMove]) -> int: ...
    async def count_cron_run(self, conn: Conn, name: str, row_id: str) -> int: ...
    async def row_states(self, conn: Conn, ids: Sequence[str]) -> dict[str, State]: ...  # (pk)
    async def pending_in_queue(self, conn: Conn, queue: str) -> int: ...  # (_claim_queued)
    async def take_lease(
        self, conn: Conn, name: str, *, holder: str, now: float, until: float
    ) -> bool: ...  # the cron leader's lease (primary key)

    # -- workers (workers.py) -------------------------------------------------------------
    async def register_worker(
        self,
        conn: Conn,
        id: str,
        hostname: str,
        pid: int,
        concurrency: int,
        now: float,
        serve: ClaimFilter = ...,
    ) -> None: ...
    async def heartbeat(self, conn: Conn, id: str, now: float) -> bool: ...  # False: lost
    async def unregister_worker(self, conn: Conn, id: str) -> None: ...
    async def list_workers(self, conn: Conn) -> builtins.list[WorkerInfo]: ...
    async def find_lost(
        self, conn: Conn, cutoff: float, message: str
    ) -> builtins.list[LostAction]: ...  # silent workers' actions (ix_scheduled_functions_running)
    async def fail_lost(
        self, conn: Conn, now: float, lost: Sequence[LostAction]
    ) -> None: ...  # those not retried, InProgress -> Failed (primary key)
    async def remove_lost_workers(
        self,
        conn: Conn,
        now: float,
        cutoff: float,
        by: str,
        rescued: Mapping[str | None, tuple[int, int]],
    ) -> int: ...  # declared lost, recorded (ix_durafn_lost_workers_lost_at)
    async def list_lost_workers(self, conn: Conn, limit: int) -> builtins.list[LostWorker]: ...


class Dialect(Protocol):
    """What an engine's driver (a subclass of ``Driver``) provides beyond the statements
    both engines share. ``EngineDriver.lacks`` refuses, when the driver is made, one that
    does not provide the first block (``engine.MUST_PROVIDE``), or SQL for each element
    of ``sql.py``; an engine's driver must also support RETURNING, and INSERT ... ON
    CONFLICT through its ``dialect_insert`` (SQLite 3.35 and PostgreSQL both do)."""

    # -- must provide ----------------------------------------------------------------------
    name: ClassVar[str]
    max_mutation_lanes: ClassVar[int]  # SQLite 1: one writer
    default_poll_interval: ClassVar[float]
    auto_migrate: ClassVar[bool]  # an embedded database creates its tables itself
    default_max_connections: ClassVar[int]
    dialect_insert: ClassVar[Callable[..., Any]]  # an insert with ON CONFLICT

    def create_engine(self, max_connections: int) -> AsyncEngine: ...
    async def insert_rows(
        self, conn: Conn, rows: Sequence[NewRowColumns], notify: Collection[FunctionKind] = ...
    ) -> None: ...  # its one-statement form of a multi-row INSERT
    def install_release_trigger(self, conn: Connection) -> None: ...  # schema/dependencies.py
    def add_seq_column(self, conn: Connection) -> None: ...  # migration step 11

    # and SQL for Within, NextSeq, ArgEquals, ArgContains, MinuteStart (sql.py; sqlite/sql.py)

    # -- may provide (engine.py has the neutral form) --------------------------------------
    lateral_claims: ClassVar[bool]  # LATERAL joins: the fast claim reads every level
    read_only_options: ClassVar[dict[str, Any]]
    single_statement_options: ClassVar[dict[str, Any]]  # autocommit for one statement

    async def try_lock(self, conn: Conn, name: str) -> bool: ...  # an advisory lock
    def create_sync_engine(self, max_connections: int) -> Engine: ...  # app.sync's
    def require_existing(self) -> None: ...
    def _transient_dbapi(self, exc: Any) -> bool: ...  # serialization failures, busy
    def is_driver_error(self, exc: BaseException) -> bool: ...
    def is_disconnect(self, exc: BaseException) -> bool: ...
    def commit_outcome_unknown(self, exc: BaseException) -> bool: ...
    def translate(self, exc: BaseException) -> BaseException | None: ...
    def read_only(self, conn: Conn) -> AbstractAsyncContextManager[None]: ...
    async def statement_handle(self, conn: Conn) -> Any: ...
    async def abandon(self, conn: Conn, handle: Any) -> None: ...
    async def dispose(self, engine: AsyncEngine) -> None: ...
    async def notify(self, conn: Conn, kinds: Collection[FunctionKind]) -> None: ...
    async def wake_freed(self, conn: Conn, ids: Collection[str]) -> int: ...
    def listen(
        self,
        engine: AsyncEngine,
        on_wake: Callable[[Collection[FunctionKind]], None],
        on_cancel: Callable[[builtins.list[str]], None],
    ) -> AbstractAsyncContextManager[bool]: ...
    async def _lock_schema(self, conn: Conn) -> None: ...  # serialise concurrent migrations
    def install_release_functions(self, conn: Connection) -> None: ...  # the hot finish's
    def install_schedule_function(self, conn: Connection) -> None: ...  # durafn.schedule
    def set_storage(self, conn: Connection) -> None: ...  # the hot table's fillfactor
    def set_autovacuum(self, conn: Connection) -> None: ...  # and its autovacuum thresholds

    # and, for speed, any statement of ``Store``: the multi-row finishes, retries and
    # failures (``postgres/multirow.py``, ``sqlite/multirow.py``), a cancel's NOTIFY
    # (``announce_cancels``), ``lock_for_share``, ``advance_crons``
