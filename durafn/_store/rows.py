"""The values that cross the store seam, and how rows are named and read back.

``new_id`` makes the ids (UUIDv7, chosen here so that a schedule inside a mutation can
return its id at once); ``Claimed`` is a row the executor is about to run, ``Outcome`` how a
run ended, ``LostAction`` an action recorded lost; ``to_model`` turns a row into the public
``ScheduledFunction``; list cursors are encoded here.
"""

from __future__ import annotations

import base64
import json
import operator
import os
import random
import uuid
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, TypedDict, cast

from sqlalchemy import Row

from .._clock import to_datetime
from .._errors import ArgumentError
from .._flow import Debounce, Throttle
from .._kinds import FunctionKind, ScheduledFunctionId, State
from .._models import ErrorInfo, FailedAttempt, ScheduledFunction
from .._options import RowOptions, read_flags


class NewRowColumns(TypedDict):
    """The columns a new row is written with (``Driver.insert_rows``; the others take
    their defaults): declared once, here. ``NEW_ROW_COLUMNS``, both engines' INSERTs,
    the key-mode upsert and the debounce's write are made from it."""

    id: ScheduledFunctionId
    name: str
    kind: str
    args: str
    state: str
    scheduled_time: float
    available_at: float
    completed_time: float | None
    parent_id: ScheduledFunctionId | None
    priority: int
    queue_name: str | None
    job_key: str | None
    flags: str | None
    retry: str | None
    max_attempts: int | None
    on_complete: str | None
    flow_key: str | None
    flow: str | None
    trace_context: str | None
    batch_key: str | None


class NewRow(NewRowColumns):
    """A Pending row to write (``new_row``): its columns, and what the writers need to
    choose how (a ``TypedDict``, not a class: a row is made per scheduled call, and a
    dict literal cost 1.1 us less than a slots dataclass's 24-field construction, of
    about 19 us a row)."""

    key_mode: str
    debounce: Debounce | Throttle | None
    after: Sequence[str] | None
    after_policy: str


NEW_ROW_COLUMNS: tuple[str, ...] = tuple(NewRowColumns.__annotations__)
"""The keys of a row passed to ``Driver.insert_rows``, in the order of their declaration."""


def column_values(row: NewRow) -> dict[str, Any]:
    """A new row's columns, by name (for a statement's VALUES)."""
    values = cast(Mapping[str, Any], row)
    return {c: values[c] for c in NEW_ROW_COLUMNS}


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


class RetryState(NamedTuple):
    """What a failed row's retry depends on, besides its error."""

    name: str
    retry: str | None
    """Its policy as data (``Retry.to_json``), or None (its function's, or the app's)."""
    max_attempts: int | None
    failures: int
    """Its failed runs so far, this one not counted."""


class Claimed(NamedTuple):
    """A row the executor is about to run: the claim's columns, each field named for its
    column and the claim reading them in this order (``claim.columns.CLAIM_COLUMNS``). A
    tuple, made from each row read as it is: the slots dataclass it replaces took 1.7 us
    a row to build, a tenth of a no-op mutation's CPU in a PostgreSQL drain."""

    id: ScheduledFunctionId
    name: str
    args: str
    attempts: int
    parent_id: ScheduledFunctionId | None
    available_at: float
    priority: int = 0
    queue_name: str | None = None
    on_complete: str | None = None
    """Its completion callback, as data (``_store/write/completions.py``), or None."""
    # What a failed run's retry depends on (``RetryState``): read with the claim, not
    # again when a run fails (a SELECT per failing batch cost 6 ms on PostgreSQL).
    retry: str | None = None
    max_attempts: int | None = None
    failures: int = 0
    flow_key: str | None = None
    flow: str | None = None
    """Its flow key's knobs, as stored (``durafn._flow.Flow.spec``)."""
    seq: int = 0
    """Where it was written among the rows (``schema/tables.py``' ``seq``)."""
    trace_context: str | None = None
    """The trace context it was scheduled in (``_telemetry``), as stored."""
    job_key: str | None = None
    after_failed: int = 0
    """How many rows it waited for (``after=``) ended Failed or Canceled."""
    after_policy: str | None = None
    """What it does then (``run``, ``cancel``, ``fail``), or None: it waited for none."""
    dependents: int = 0
    """1 when rows wait for it (``after=``), as the claim read it."""

    @property
    def slot(self) -> str | None:
        """The queue, or the flow key with a concurrency limit, whose slot it holds while
        it runs: its end wakes the claimers that skipped it. (A rate-only key frees no
        slot: a NOTIFY per finish sent every worker claiming at a 1000/s key, 0.90x.)"""
        if self.queue_name is not None:
            return self.queue_name
        return self.flow_key if self.flow is not None and '"c":' in self.flow else None

    def order(self) -> tuple[int, float, int]:
        """Claim order: priority (lower first), then due time, then the order written
        (``CLAIM_ORDER``, the same as a key function)."""
        return (self.priority, self.available_at, self.seq)

    def retry_state(self) -> RetryState:
        """What a failure of this run is retried by."""
        return RetryState(self.name, self.retry, self.max_attempts, self.failures)


CLAIM_ORDER = operator.itemgetter(
    Claimed._fields.index("priority"),
    Claimed._fields.index("available_at"),
    Claimed._fields.index("seq"),
)
"""A claimed row's place in claim order, as a sort key (a C function: ``Claimed.order``
per row cost as much again as the sort)."""


@dataclass(slots=True)
class Outcome:
    """How a run ended, ready to be written back."""

    id: ScheduledFunctionId
    state: State
    result: str | None = None
    error_type: str | None = None
    error_message: str | None = None
    error_traceback: str | None = None
    name: str = ""
    """The function's durable name, for logs."""
    queue: str | None = None
    """The row's named queue: its end frees the queue for the next row (wake claimers)."""
    flow_key: str | None = None
    """The row's flow key (for hooks)."""
    error: BaseException | None = None
    """What the run raised, in this process, for its retry policy; None: not retryable
    (a result that could not be stored: the function itself succeeded)."""
    retry_at: float | None = None
    """Set (with state Pending) when its retry policy tries it again: due then."""
    on_complete: str | None = None
    """The row's completion callback (``Claimed.on_complete``): scheduled, in the same
    transaction, if this outcome finishes the row for good."""
    retry_state: RetryState | None = None
    """Its row's retry policy and failures so far, when known (read with the claim)."""
    snoozed: bool = False
    """Set (with state Pending, due ``retry_at``) when its run raised ``durafn.Snooze``
    and the row went back to Pending: not a failure (``_executor/retrying.py``)."""
    unwritten: bool = False
    """Set by the finish when its guard found the row moved on (cancelled, or recorded
    lost, meanwhile): nothing was written for this run (known for failed runs and rows
    with a callback; a plain success is written in bulk)."""
    awaited: bool = False
    """Rows waited for it when it was claimed (``Claimed.dependents``)."""


def mark_moved(outcomes: Iterable[Outcome], moved: Collection[str]) -> int:
    """Set each outcome's ``unwritten`` from the ids its finish ``moved``; returns how
    many moved."""
    for o in outcomes:
        o.unwritten = o.id not in moved
    return len(moved)


class LostAction(NamedTuple):
    """An action whose worker was lost, as ``find_lost`` found it (still InProgress)."""

    id: ScheduledFunctionId
    name: str
    worker_id: str | None
    error_message: str
    queue_name: str | None
    retry: RetryState
    on_complete: str | None
    flow_key: str | None
    trace_context: str | None = None
    attempts: int = 0
    """The lost run's attempt (the row's ``attempts``: a claim counts it)."""


def is_id(id: object) -> bool:
    """Ids are UUIDs; anything else matches no row (and must not reach a uuid column)."""
    try:
        uuid.UUID(str(id))
    except ValueError:
        return False
    return isinstance(id, str)


def history(errors: Any) -> list[FailedAttempt]:
    """A row's ``errors`` (as stored, or decoded) as its failed runs, oldest first."""
    if errors is None:
        return []
    entries = json.loads(errors) if isinstance(errors, str | bytes) else errors
    return [
        FailedAttempt(
            attempt=e["attempt"],
            failed_at=to_datetime(e["at"]),
            worker_id=e["worker"],
            error=ErrorInfo(type=e["type"], message=e["message"] or "", traceback=e["traceback"]),
            retry_at=to_datetime(e["retry_at"]) if e["retry_at"] is not None else None,
        )
        for e in entries
    ]


def to_model(row: Row[Any]) -> ScheduledFunction:
    m = row._mapping
    error = None
    if m["error_type"] is not None:
        error = ErrorInfo(
            type=m["error_type"],
            message=m["error_message"] or "",
            traceback=m["error_traceback"],
        )
    return ScheduledFunction(
        id=ScheduledFunctionId(str(m["id"])),
        name=m["name"],
        kind=FunctionKind(m["kind"]),
        args=json.loads(m["args"]),
        state=State(m["state"]),
        scheduled_time=to_datetime(m["scheduled_time"]),
        due_time=to_datetime(m["available_at"]) if m["state"] == State.PENDING.value else None,
        started_time=to_datetime(m["started_time"]) if m["started_time"] is not None else None,
        completed_time=to_datetime(m["completed_time"])
        if m["completed_time"] is not None
        else None,
        error=error,
        result=json.loads(m["result"]) if m["result"] is not None else None,
        parent_id=ScheduledFunctionId(str(m["parent_id"])) if m["parent_id"] else None,
        attempts=m["attempts"],
        priority=m["priority"],
        queue=m["queue_name"],
        key=m["job_key"],
        flags=read_flags(m["flags"]),
        max_attempts=m["max_attempts"],
        failures=m["failures"],
        on_complete=json.loads(m["on_complete"])["name"] if m["on_complete"] else None,
        history=history(m["errors"]),
        flow_key=m["flow_key"],
        snoozes=m["snoozes"],
        progress=m["progress"],
        progress_message=m["progress_message"],
    )


DEBOUNCE_KEY = "debounce:"
"""How the job key of a row debounced on the trailing edge begins (``new_row``)."""


def new_row(
    *,
    id: ScheduledFunctionId,
    name: str,
    kind: str,
    args: str,
    due: float,
    options: RowOptions,
    parent_id: ScheduledFunctionId | None = None,
    flow_key: str | None = None,
    trace_context: str | None = None,
    after: Sequence[str] | None = None,
    batch_key: str | None = None,
) -> NewRow:
    """A Pending row to write (its keys ``NEW_ROW_COLUMNS``, the key mode, and its
    debounce or throttle: a row debounced on the trailing edge holds the job key
    ``debounce:["<function>","<flow key>"]``: the calls of one function coalesce, never
    those of two functions that share a flow key, whose arguments differ)."""
    debounce = options.flow.coalesce if options.flow is not None and flow_key else None
    job_key = options.key
    if isinstance(debounce, Debounce) and debounce.edge == "trailing":
        job_key = DEBOUNCE_KEY + json.dumps([name, flow_key], separators=(",", ":"))
    return {
        "id": id,
        "name": name,
        "kind": kind,
        "args": args,
        "state": State.PENDING.value,
        "scheduled_time": due,
        "available_at": due,
        "completed_time": None,
        "parent_id": parent_id,
        "priority": options.priority,
        "queue_name": options.queue,
        "job_key": job_key,
        "key_mode": options.key_mode,
        "flags": options.flags,
        "retry": options.retry,
        "max_attempts": options.max_attempts,
        "on_complete": options.on_complete,
        "flow_key": flow_key,
        "flow": options.flow_spec if flow_key is not None else None,
        "trace_context": trace_context,
        "debounce": debounce,
        "after": after,
        "after_policy": options.after_policy,
        "batch_key": batch_key,
    }


def new_row_model(row: NewRow, id: ScheduledFunctionId) -> ScheduledFunction:
    """A row about to be written (``NEW_ROW_COLUMNS``) as the public model (for inline
    mode's predicate); ``id`` is the one that runs for it (a keyed row's may differ)."""
    return ScheduledFunction(
        id=id,
        name=row["name"],
        kind=FunctionKind(row["kind"]),
        args=json.loads(row["args"]),
        state=State(row["state"]),
        scheduled_time=to_datetime(row["scheduled_time"]),
        due_time=to_datetime(row["available_at"]),
        started_time=None,
        completed_time=None,
        error=None,
        result=None,
        parent_id=row["parent_id"],
        attempts=0,
        priority=row["priority"],
        queue=row["queue_name"],
        key=row["job_key"],
        flags=read_flags(row["flags"]),
        flow_key=row["flow_key"],
        max_attempts=row["max_attempts"],
    )


def encode_cursor(at: float, id: object, newest_first: bool = False, filters: str = "") -> str:
    """A listing's position, its order and its filters (``RowFilter.digest``)."""
    raw = json.dumps([at, str(id), "newest" if newest_first else "oldest", filters]).encode()
    return base64.urlsafe_b64encode(raw).decode()


def decode_cursor(
    cursor: str, newest_first: bool = False, filters: str | None = None
) -> tuple[float, str]:
    """The position a cursor marks, for a listing in the same order, and with the same
    filters (``filters``; None: not checked), as the one that made it."""
    try:
        at, last_id, *rest = json.loads(base64.urlsafe_b64decode(cursor.encode()))
        position = float(at), str(uuid.UUID(last_id))
        order, made_with = [*rest, "oldest", ""][:2] if rest else ("oldest", "")
    except Exception:
        raise ArgumentError(
            f"{cursor!r} is not a cursor printed by a listing (next_cursor)"
        ) from None
    if (order == "newest") != newest_first:
        raise ArgumentError(
            "this cursor continues a listing in the other order; keep newest_first "
            "(--newest) as it was"
        )
    if filters is not None and made_with and made_with != filters:
        raise ArgumentError(
            "this cursor continues a listing with other filters: keep the filters as they "
            "were, or leave the cursor out to start from the first page"
        )
    return position
