"""``app.explain(id)``: why a row is where it is, above all why a Pending row waits.

The checks follow the claim's own order (``_store/_claims.py``): a row must be due, its
queue not paused, a live worker must serve its queue and accept its flags, its queue and
its flow key must have a free slot, and its key a rate budget. The first that fails is
the reason; a row that passes them all is ready, waiting for a claim (the workers busy).
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict

from ._clock import to_datetime
from ._flow import Limits, allowance, next_slot
from ._options import read_flags
from ._store._explain import Facts
from ._types import ScheduledFunctionId, State

Reason = Literal[
    "finished",
    "running",
    "not_due",
    "debounced",
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

    model_config = ConfigDict(frozen=True)

    id: ScheduledFunctionId
    state: State
    reason: Reason
    message: str
    """One sentence for a person, naming what holds the row and until when."""
    until: datetime | None = None
    """When the reason ends by itself (due time, rate slot, debounce), if it does."""
    held_by: list[ScheduledFunctionId] = []
    """The running rows that fill its queue or key (at most 10 named)."""
    queue: str | None = None
    flow_key: str | None = None


def explain(facts: Facts, now: float) -> Explanation:
    row = facts.row
    state = State(row.state)
    base = {"id": ScheduledFunctionId(str(row.id)), "state": state}
    base |= {"queue": row.queue_name, "flow_key": row.flow_key}
    if state.finished:
        return Explanation(**base, reason="finished", message=f"it is {state.value}")
    if state is State.IN_PROGRESS:
        since = to_datetime(row.started_time).isoformat() if row.started_time else "?"
        return Explanation(
            **base, reason="running", message=f"it runs on worker {row.worker_id} since {since}"
        )
    if row.available_at > now:
        at = to_datetime(row.available_at)
        if row.flow_until is not None:
            message = (
                f"debounced: it runs at {at.isoformat()} unless another call comes first "
                f"(and by {to_datetime(row.flow_until).isoformat()} at the latest)"
            )
            return Explanation(**base, reason="debounced", message=message, until=at)
        return Explanation(
            **base, reason="not_due", message=f"not due until {at.isoformat()}", until=at
        )
    if facts.queue_paused:
        return Explanation(
            **base,
            reason="queue_paused",
            message=f"its queue {row.queue_name!r} is paused (durafn queue resume)",
        )
    flags = set(read_flags(row.flags))
    serving = [w for w in facts.workers if w.queues is None or row.queue_name in w.queues]
    if not serving:
        message = "no live worker serves it: start one (durafn worker)"
        if row.queue_name is not None:
            message = (
                f"no live worker serves its queue {row.queue_name!r}: start one "
                f"(durafn worker --queues {row.queue_name})"
            )
        return Explanation(**base, reason="no_worker", message=message)
    if flags and all(w.forbidden & flags for w in serving):
        refused = sorted(set().union(*(w.forbidden & flags for w in serving)))
        return Explanation(
            **base,
            reason="forbidden_flag",
            message=f"every live worker that serves it forbids its flag(s) {', '.join(refused)}",
        )
    if row.queue_name is not None and row.flow_key is None:
        limit = facts.queue_concurrency
        if limit is not None and facts.queue_running_count >= limit:
            return Explanation(
                **base,
                reason="queue_full",
                message=f"its queue {row.queue_name!r} runs {facts.queue_running_count} of "
                f"at most {limit}",
                held_by=facts.queue_running,
            )
        if limit is not None and facts.queue_ahead:
            return Explanation(
                **base,
                reason="queue_order",
                message=f"{facts.queue_ahead} due row(s) of its queue {row.queue_name!r} "
                "start before it (a queue starts its rows in order)",
            )
    if row.flow_key is not None:
        limits = Limits.parse(row.flow)
        if limits.concurrency is not None and facts.key_running_count >= limits.concurrency:
            return Explanation(
                **base,
                reason="key_full",
                message=f"its flow key {row.flow_key!r} runs {facts.key_running_count} of at "
                f"most {limits.concurrency}",
                held_by=facts.key_running,
            )
        rate, tat = limits.rate, facts.key_tat
        if rate is not None and tat is not None and allowance(rate, tat, now) == 0:
            at = to_datetime(next_slot(rate, tat))
            return Explanation(
                **base,
                reason="rate_limited",
                message=f"its flow key {row.flow_key!r} has spent its rate budget "
                f"({rate.limit} per {rate.per:g}s); next start at {at.isoformat()}",
                until=at,
            )
    return Explanation(
        **base,
        reason="ready",
        message="due and free to start: waiting for a worker's next claim (they are busy, "
        "or it was just scheduled)",
    )
