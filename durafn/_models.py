"""Value types shared by every layer: the typed view of a row and what the operator
calls return (pydantic models); the states, kinds and ids are ``_kinds``'."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict

from ._kinds import FINISHED_STATES, FunctionKind, ScheduledFunctionId, State
from ._public import publish

FROZEN = ConfigDict(frozen=True, defer_build=True)
"""Every model's configuration: immutable, its validator built on first use (building the
dozen at import was 12 ms of a worker's start; most processes use a few of them)."""

__all__ = [
    "FINISHED_STATES",
    "CancelResult",
    "Completion",
    "CronInfo",
    "CronTick",
    "ErrorInfo",
    "FailedAttempt",
    "FunctionKind",
    "Page",
    "QueueInfo",
    "ScheduledFunction",
    "ScheduledFunctionId",
    "State",
    "Stats",
    "WorkerInfo",
]


class ErrorInfo(BaseModel):
    """What a Failed row records of the error: its qualified type name, its message, and
    the traceback of where it was raised (the last frames, when the function raised it;
    None when durafn recorded the failure itself: a lost worker, a time limit)."""

    model_config = FROZEN

    type: str
    message: str
    traceback: str | None = None


class FailedAttempt(BaseModel):
    """One failed run of a row: when, where, what, and what its retry policy made of it."""

    model_config = FROZEN

    attempt: int
    """Which failed attempt it was: 1 for the first (again after ``app.retry``)."""
    failed_at: datetime
    worker_id: str | None
    error: ErrorInfo
    retry_at: datetime | None
    """When it was to be tried again; None: not retried (the row ended Failed)."""


class ScheduledFunction(BaseModel):
    """One row of ``_scheduled_functions``, as returned by ``get`` and ``list``."""

    model_config = FROZEN

    id: ScheduledFunctionId
    name: str
    kind: FunctionKind
    args: dict[str, Any]
    state: State
    scheduled_time: datetime
    """The time the function was asked to run at (kept as asked, even if in the past)."""
    due_time: datetime | None = None
    """When a Pending row is due to run: its scheduled time, or a retry's (after a failed
    run its policy tries again); None once it has started or ended."""
    started_time: datetime | None
    """When an action was moved to InProgress (None for mutations and unstarted rows)."""
    completed_time: datetime | None
    """When the row reached Success, Failed or Canceled."""
    error: ErrorInfo | None
    result: Any
    """The function's return value (JSON form) when Success."""
    parent_id: ScheduledFunctionId | None
    """The scheduled run that scheduled this one, if any."""
    attempts: int
    """How many times the executor started this row (internal retries included)."""
    priority: int = 0
    """Lower runs first, among due rows (then due time, then id)."""
    queue: str | None = None
    """The named queue the row runs in, if any."""
    key: str | None = None
    """The job key it was scheduled with, if any (a debounced row's:
    ``debounce:["<function>","<flow key>"]``)."""
    flow_key: str | None = None
    """Its flow key (``durafn.Flow``), if any: ``app.explain`` says what it waits for."""
    flags: list[str] = []
    """Its flags, sorted."""
    max_attempts: int | None = None
    """How many runs its retry policy allows in all (None: no policy, one run)."""
    failures: int = 0
    """How many of its runs failed (since it was scheduled, or retried by ``app.retry``)."""
    history: list[FailedAttempt] = []
    """Each failed run, oldest first (the row's ``errors``)."""
    on_complete: str | None = None
    """The name of the mutation scheduled when it finishes for good (``on_complete``)."""
    snoozes: int = 0
    """How many of its runs raised ``durafn.Snooze`` (each put it back to Pending)."""
    progress: float | None = None
    """The fraction done its running action last reported (``ctx.progress``), 0 to 1;
    kept after it ends. None: never reported."""
    progress_message: str | None = None
    """The message reported with it."""


class Completion(BaseModel):
    """How a row finished for good: what its ``on_complete`` mutation is given.

    Declare the callback's parameter with this type: ``async def done(ctx, c: Completion)``.
    """

    model_config = FROZEN

    id: ScheduledFunctionId
    """The row that finished."""
    name: str
    """Its function's durable name."""
    state: State
    """Success, Failed (after its last attempt) or Canceled."""
    result: Any = None
    """Its return value (in JSON form, as stored) when Success."""
    error: ErrorInfo | None = None
    """Its last error (type and message) when Failed."""


class Page(BaseModel):
    """One page of a listing; pass ``next_cursor`` back to get the next one."""

    model_config = FROZEN

    items: list[ScheduledFunction]
    next_cursor: str | None
    partial: bool = False
    """The listing's ``scan`` bound was reached before the page filled: rows beyond it
    were not read, and ``next_cursor`` goes on from there (a page may then be short, even
    empty, with more rows to come)."""


class CancelResult(BaseModel):
    """What ``cancel`` did: ``canceled`` is False when the row had already finished."""

    model_config = FROZEN

    id: ScheduledFunctionId
    canceled: bool
    previous_state: State

    def __bool__(self) -> bool:
        return self.canceled


class WorkerInfo(BaseModel):
    """A live (or not yet declared lost) executor, from ``_durafn_workers``."""

    model_config = FROZEN

    id: str
    hostname: str
    pid: int
    concurrency: int
    started_at: datetime
    heartbeat_at: datetime
    running: int
    """Actions InProgress under this worker."""


class Stats(BaseModel):
    """A snapshot of ``_scheduled_functions`` for monitoring (``app.stats()``)."""

    model_config = FROZEN

    at: datetime
    """The clock reading the snapshot was taken at."""
    counts: dict[State, int]
    """Rows in each state; every state is present, zeros included."""
    bound: int | None = None
    """None: exact counts. Else each count stopped at ``bound`` (``app.stats(bound=)``):
    Pending and InProgress counted up to it, the ended states among the ``bound`` rows
    that ended last."""
    capped: list[State] = []
    """The states whose count stopped at ``bound`` (there may be more of them)."""
    oldest_due: datetime | None
    """When the longest-waiting due Pending row became due; None if nothing is due."""
    lag: float
    """Seconds that row has waited (``at - oldest_due``): 0 when nothing is due."""
    next_due: datetime | None
    """When the next Pending row that is not due yet becomes due; None if there is none."""


class AuditEntry(BaseModel):
    """Something an operator did (``app.audit_log()``, ``durafn audit``, the dashboard's
    overview): kept for the retention period."""

    model_config = FROZEN

    id: int
    """Increasing: the newest entry has the highest."""
    at: datetime
    who: str
    """The visitor (``local``, ``token``, the host application's user) or, from the
    command line, ``user@host``."""
    via: str
    """``dashboard`` or ``cli``."""
    action: str
    """What was done: ``cancel``, ``retry``, ``cancel every Pending row``, ``cron remove``..."""
    target: str
    """What it was done to: a row's id, a filter, a cron's or a queue's name."""
    rows: int
    """How many rows it changed."""
    outcome: str
    """What came of it, as the dashboard or the command said it."""


class LostWorker(BaseModel):
    """A worker declared lost (no heartbeat for ``worker_timeout``) and what its rescue
    did (``app.lost_workers()``): kept 7 days."""

    model_config = FROZEN

    id: str
    hostname: str
    pid: int
    started_at: datetime
    heartbeat_at: datetime
    """Its last heartbeat."""
    lost_at: datetime
    """When another worker's rescue declared it lost."""
    rescued_by: str
    """The worker that declared it lost (and rescued its actions)."""
    failed: int
    """Its running actions recorded Failed (``WorkerLostError``) for good: by the rescue
    that declared it lost, and by later ones (an action is rescued a whole timeout after
    its claim: one claimed after the worker's last heartbeat, at a later heartbeat)."""
    retried: int
    """Its running actions put back to Pending by their retry policy (by every rescue,
    as ``failed``)."""


class QueueInfo(BaseModel):
    """A named queue (``app.queues()``, ``durafn queue ls``)."""

    model_config = FROZEN

    name: str
    concurrency: int | None
    """How many of its rows may run at once (1: serial); None: no limit."""
    paused: bool
    due: int
    """Pending rows due now."""
    pending: int
    """Pending rows, due now or later."""
    running: int
    """Actions InProgress."""
    capped: bool = False
    """A count stopped at the bound it was read with (``app.queues(bound=)``)."""
    oldest_due_at: float | None = None
    """When its longest-waiting due row was due (None: none is due): the earliest among
    the first ``bound`` due rows in claim order when counts are bounded, so a lower bound
    of the wait where ``capped``."""


class CronInfo(BaseModel):
    """A cron of the registry (``app.crons()``, ``durafn crons``)."""

    model_config = FROZEN

    name: str
    schedule: str
    timezone: str
    describe: str
    """The schedule in a line of English."""
    function: str
    args: dict[str, Any]
    kind: FunctionKind
    overlap: str
    catch_up: str
    enabled: bool
    """Whether it runs: as declared, unless switched by hand."""
    switched_by_hand: bool
    """``enable_cron``/``disable_cron`` set ``enabled`` against the declaration: it stays so
    across restarts until someone switches it again or the declaration's ``enabled``
    changes."""
    description: str | None
    source: str
    """``code`` (declared with ``app.cron``, reconciled), ``crontab`` or ``api`` (kept)."""
    created_at: datetime
    updated_at: datetime
    last_run_at: datetime | None
    """The last tick written (its scheduled time)."""
    next_run_at: datetime | None
    """None while disabled."""
    run_count: int
    last_row_id: ScheduledFunctionId | None
    last_skip_at: datetime | None
    last_skip_reason: str | None
    """``overlap_skip``, ``missed``, ``dst_skip``, ``paused`` (``pause_after`` reached:
    disabled), ``until`` or ``max_runs`` (its course run: no next run),
    ``skipped_by_operator`` (``skip_next_tick``) or ``error: ...`` (then disabled)."""
    jitter: float | None = None
    """Seconds each tick's row may be due after its tick, at random."""
    max_runs: int | None = None
    until: datetime | None = None
    pause_after: int | None = None
    """Consecutive failed ticks after which it is disabled."""
    failed_ticks: int = 0
    """Its consecutive ticks whose rows ended Failed, as counted for ``pause_after``."""


class CronTick(BaseModel):
    """Which tick a cron's run is for: declare a parameter of this type on the function
    a cron runs (``async def report(ctx, day: str, tick: CronTick | None = None)``: the
    default lets the cron's call leave it out) and each run of the cron gets it (Graphile
    Worker's ``_cron`` payload)."""

    model_config = FROZEN

    ts: datetime
    """The tick's time."""
    backfilled: bool = False
    """A missed tick written later by ``backfill`` (not the latest one)."""
    triggered: bool = False
    """A run started by hand (``trigger_cron``, ``durafn cron trigger``) at ``ts``, not by
    the schedule."""


class Operation(BaseModel):
    """A change of every row a filter matches, tracked (``app.start_operation()``, the
    dashboard's bulk and failure-group actions): run a page at a time by the workers'
    maintenance (or ``app.run_operations()``), resumed where it stopped by any process."""

    model_config = FROZEN

    id: int
    kind: str
    """``cancel`` (Pending rows), ``retry`` (Failed rows) or ``reschedule`` (Pending rows)."""
    filter: dict[str, Any]
    """The rows it selects: ``state``, and any of ``name``, ``queue``, ``key``, ``flag``,
    ``error_type``."""
    change: dict[str, Any]
    """A reschedule's new values (``run_at``, ``priority``); empty for the others."""
    who: str
    created_at: datetime
    updated_at: datetime
    """When its last page ran (its start, before the first)."""
    total: int
    """Rows it matched when it started, counted up to a bound (``total_bounded``)."""
    total_bounded: bool
    """The count stopped at its bound: there were at least ``total`` rows."""
    done: int
    """Rows changed so far."""
    scanned: int
    """Rows read so far (in id order: it reads the table once, a page at a time)."""
    state: str
    """``Running``, ``Done``, ``Failed`` (``error`` says why) or ``Canceled``."""
    finished_at: datetime | None
    error: str | None


class FailureGroup(BaseModel):
    """Failed rows of one function with one error type (``app.failure_groups()``)."""

    model_config = FROZEN

    name: str
    error_type: str
    count: int
    """Among the rows that ended last (``app.failure_groups(scan=)``)."""
    first_seen: datetime
    last_seen: datetime
    sample: str
    """The message of one of them (the greatest: any one is a sample)."""


class LinkedRow(BaseModel):
    """A row as a workflow view draws it (``app.row_links()``)."""

    model_config = FROZEN

    id: ScheduledFunctionId
    name: str
    state: State


class RowLinks(BaseModel):
    """A row's place in a workflow (``app.row_links(id)``), each list bounded by the
    call's ``limit`` (``*_more``: there are more)."""

    model_config = FROZEN

    waits_for: list[LinkedRow]
    """Rows it still waits for (``after=``): an edge is gone once its row finishes."""
    waits_for_more: bool
    waited_by: list[LinkedRow]
    """Rows still waiting for it (a group's completion row among them)."""
    waited_by_more: bool
    group: list[LinkedRow]
    """For a group's completion row (``durafn:group_complete``): the group's rows."""
    group_size: int
    """How many rows the group has (``group`` shows the first of them)."""
    batch_key: str | None
    """A batched action's key ('' : its function batches without one); None otherwise."""
    batch: list[LinkedRow]
    """Rows of its function and batch key still waiting, in the order a batch takes them."""
    batch_more: bool


publish(globals())
