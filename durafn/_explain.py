"""``app.explain(id)``: why a row is where it is, above all why a Pending row waits.

The checks follow the claim's own order (``_store/claim/take.py``): a row must be due, its
queue not paused, a live worker must serve its queue and accept its flags, its queue and
its flow key must have a free slot, and its key a rate budget. The first that fails is
the reason; a row that passes them all is ready, waiting for a claim (the workers busy).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel

from ._clock import to_datetime
from ._flow import Limits, allowance, next_slot
from ._kinds import ScheduledFunctionId, State
from ._models import FROZEN
from ._options import read_flags
from ._public import publish
from ._store import DEBOUNCE_KEY, HELD_SHOWN, Facts, KeyCounts

Reason = Literal[
    "finished",
    "running",
    "awaiting",
    "not_due",
    "batching",
    "debounced",
    "throttled",
    "queue_paused",
    "no_worker",
    "forbidden_flag",
    "queue_full",
    "queue_order",
    "key_full",
    "rate_limited",
    "ready",
]


class Explanation(BaseModel):
    """Why a row is where it is (``app.explain``)."""

    model_config = FROZEN

    id: ScheduledFunctionId
    state: State
    reason: Reason
    message: str
    """One sentence for a person, naming what holds the row and until when."""
    until: datetime | None = None
    """When the reason ends by itself (due time, rate slot, debounce), if it does."""
    held_by: list[ScheduledFunctionId] = []
    """The running rows that fill its queue or key (at most 10 named)."""
    also: list[str] = []
    """What else would hold it once ``reason`` is gone, in the claim's order."""
    queue: str | None = None
    flow_key: str | None = None


@dataclass(frozen=True, slots=True)
class _Held:
    reason: Reason
    message: str
    until: datetime | None = None
    held_by: list[ScheduledFunctionId] = field(default_factory=list)


def explain(facts: Facts, now: float, batch: tuple[int, float] | None = None) -> Explanation:
    """``batch``: the row's function's ``Batch`` (max_size, max_wait), if it is one."""
    row = facts.row
    state = State(row.state)
    base = {"id": ScheduledFunctionId(str(row.id)), "state": state}
    base |= {"queue": row.queue_name, "flow_key": row.flow_key}
    if state.finished:
        return Explanation(**base, reason="finished", message=_ended(row))
    if state is State.IN_PROGRESS:
        since = to_datetime(row.started_time).isoformat() if row.started_time else "?"
        return Explanation(
            **base, reason="running", message=f"it runs on worker {row.worker_id} since {since}"
        )
    found = _holding(facts, now, batch)
    if not found:
        return Explanation(
            **base,
            reason="ready",
            message="due and free to start: waiting for a worker's next claim (they are "
            "busy, or it was just scheduled)",
        )
    first = found[0]
    return Explanation(
        **base,
        reason=first.reason,
        message=first.message,
        until=first.until,
        held_by=first.held_by,
        also=[h.message for h in found[1:]],
    )


def _ended(row: Any) -> str:
    """How a finished row ended, when, and after how many runs."""
    at = to_datetime(row.completed_time).isoformat() if row.completed_time else "?"
    runs = f"{row.attempts} run{'s' if row.attempts != 1 else ''}"
    if row.state == State.CANCELED.value:
        return f"it was cancelled at {at}, after {runs}"
    if row.state == State.FAILED.value:
        return f"it failed at {at}, after {runs}: {row.error_type}: {row.error_message}"
    return f"it succeeded at {at}, after {runs}"


def _holding(facts: Facts, now: float, batch: tuple[int, float] | None) -> list[_Held]:
    """Everything that holds a Pending row back, in the claim's order."""
    return [
        *_held_in_time(facts, now, batch),
        *_held_by_workers(facts),
        *_held_by_limits(facts, now),
    ]


def _held_in_time(facts: Facts, now: float, batch: tuple[int, float] | None) -> list[_Held]:
    """Its batch, the rows it waits for, its due time (a debounce's, a throttle's)."""
    row, found = facts.row, []
    if batch is not None and row.batch_key is not None and row.available_at <= now:
        max_size, max_wait = batch
        oldest = facts.batch_oldest
        if facts.batch_due < max_size and oldest is not None and oldest + max_wait > now:
            at = to_datetime(oldest + max_wait)
            key = f" of its key {row.batch_key!r}" if row.batch_key else ""
            message = (
                f"it waits for its batch: {facts.batch_due} row(s){key} due of "
                f"max_size={max_size}, or until {at.isoformat()}, when the oldest of them "
                f"has waited max_wait={max_wait:g}s"
            )
            found.append(_Held("batching", message, at))
    if facts.awaited:
        shown = ", ".join(facts.awaited[:HELD_SHOWN])
        more = (
            f" and {len(facts.awaited) - HELD_SHOWN} more"
            if len(facts.awaited) > HELD_SHOWN
            else ""
        )
        message = (
            f"it waits for {len(facts.awaited)} row(s) it was scheduled after to finish: "
            f"{shown}{more}"
        )
        found.append(_Held("awaiting", message, None, facts.awaited[:HELD_SHOWN]))
    elif row.available_at > now:
        at = to_datetime(row.available_at)
        if row.flow_until is not None and row.job_key is None:  # Throttle's later run
            message = (
                f"throttled: its key ran less than a period ago; it runs at {at.isoformat()} "
                "and the calls until then join it"
            )
            found.append(_Held("throttled", message, at))
        elif row.flow_until is not None or (row.job_key or "").startswith(DEBOUNCE_KEY):
            message = f"debounced: it runs at {at.isoformat()} unless another call comes first"
            if row.flow_until is not None:  # Debounce(max_wait=...)
                message += f" (and by {to_datetime(row.flow_until).isoformat()} at the latest)"
            found.append(_Held("debounced", message, at))
        else:
            found.append(_Held("not_due", f"not due until {at.isoformat()}", at))
    return found


def _held_by_workers(facts: Facts) -> list[_Held]:
    """Its queue paused; no live worker that serves it, or none that takes its flags."""
    row, found = facts.row, []
    if facts.queue_paused:
        message = f"its queue {row.queue_name!r} is paused (durafn queue resume)"
        found.append(_Held("queue_paused", message))
    serving = [w for w in facts.workers if w.queues is None or row.queue_name in w.queues]
    flags = set(read_flags(row.flags))
    if not serving:
        message = "no live worker serves it: start one (durafn worker)"
        if row.queue_name is not None:
            message = (
                f"no live worker serves its queue {row.queue_name!r}: start one "
                f"(durafn worker --queues {row.queue_name})"
            )
        found.append(_Held("no_worker", message))
    elif flags and all(w.forbidden & flags for w in serving):
        refused = ", ".join(sorted(set().union(*(w.forbidden & flags for w in serving))))
        message = f"every live worker that serves it forbids its flag(s) {refused}"
        found.append(_Held("forbidden_flag", message))
    return found


def _held_by_limits(facts: Facts, now: float) -> list[_Held]:
    """Its queue's concurrency and order; its flow key's concurrency and rate budget."""
    row, found = facts.row, []
    limit = facts.queue_concurrency
    if row.queue_name is not None and row.flow_key is None and limit is not None:
        if facts.queue_running_count >= limit:
            message = (
                f"its queue {row.queue_name!r} runs {facts.queue_running_count} of at most {limit}"
            )
            found.append(_Held("queue_full", message, held_by=facts.queue_running))
        elif facts.queue_ahead:
            message = (
                f"{facts.queue_ahead} due row(s) of its queue {row.queue_name!r} start "
                "before it (a queue starts its rows in order)"
            )
            found.append(_Held("queue_order", message))
    if row.flow_key is not None:
        limits = Limits.parse(row.flow)
        if limits.concurrency is not None and facts.key_running_count >= limits.concurrency:
            message = (
                f"its flow key {row.flow_key!r} runs {facts.key_running_count} of at most "
                f"{limits.concurrency}"
            )
            found.append(_Held("key_full", message, held_by=facts.key_running))
        rate, tat = limits.rate, facts.key_tat
        if rate is not None and tat is not None and allowance(rate, tat, now) == 0:
            at = to_datetime(next_slot(rate, tat))
            message = (
                f"its flow key {row.flow_key!r} has spent its rate budget ({rate.limit} per "
                f"{rate.per:g}s); next start at {at.isoformat()}"
            )
            found.append(_Held("rate_limited", message, at))
    return found


class FlowKeyInfo(BaseModel):
    """A flow key with rows Pending or running (``app.flow_keys()``, ``durafn stats``)."""

    model_config = FROZEN

    key: str
    due: int
    """Pending rows due now: waiting for ``held`` (or for a claim, if None)."""
    pending: int
    running: int
    concurrency: int | None
    rate: str | None
    """``"LIMIT/PERs burst B"``, or None."""
    held: Literal["key_full", "rate_limited"] | None
    """What holds its due rows back, if anything."""
    next_start: datetime | None
    """When its spent rate budget allows a start again (None: it allows one now)."""


def key_info(counts: KeyCounts, now: float) -> FlowKeyInfo:
    limits = Limits.parse(counts.flow)
    rate, held, next_start = limits.rate, None, None
    if rate is not None and counts.tat is not None and allowance(rate, counts.tat, now) == 0:
        held, next_start = "rate_limited", to_datetime(next_slot(rate, counts.tat))
    if limits.concurrency is not None and counts.running >= limits.concurrency:
        held = "key_full"
    return FlowKeyInfo(
        key=counts.key,
        due=counts.due,
        pending=counts.pending,
        running=counts.running,
        concurrency=limits.concurrency,
        rate=None if rate is None else f"{rate.limit}/{rate.per:g}s burst {rate.burst}",
        held=held if counts.due else None,
        next_start=next_start,
    )


publish(globals())
