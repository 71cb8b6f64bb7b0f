"""What every claim shares: the columns a claimed row is read with, and how an action's
start is written (the claims themselves are in ``take``, ``fast``, ``queues``, ``flow``
and ``inline``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Double, Row, bindparam

from ..rows import CLAIM_ORDER, Claimed
from ..schema.tables import sf
from ..sql import RUNNING

CLAIM_COLUMNS = (
    sf.c.id,
    sf.c.name,
    sf.c.args,
    sf.c.attempts,
    sf.c.parent_id,
    sf.c.available_at,
    sf.c.priority,
    sf.c.queue_name,
    sf.c.on_complete,
    # What a failed run's retry depends on (``RetryState``): read with the claim, not
    # again when a run fails (a SELECT per failing batch cost 6 ms on PostgreSQL).
    sf.c.retry,
    sf.c.max_attempts,
    sf.c.failures,
    sf.c.flow_key,
    sf.c.flow,
    sf.c.seq,
    sf.c.trace_context,
    sf.c.job_key,
    # Whether a row it waited for ended other than Success, and what it does then.
    sf.c.after_failed,
    sf.c.after_policy,
    # Whether rows wait for it: a mutation's finish on SQLite releases them itself.
    sf.c.dependents,
)


def claimed(rows: Sequence[Row[Any]]) -> list[Claimed]:
    """Claimed rows in claim order (an UPDATE ... RETURNING returns them in no order)."""
    make, width = Claimed._make, len(CLAIM_COLUMNS)
    out = [make(row[:width]) for row in rows]
    out.sort(key=CLAIM_ORDER)
    return out


STARTED: dict[str, Any] = {
    "state": RUNNING,
    "started_time": bindparam("now", type_=Double),
    "worker_id": bindparam("worker_id"),
    "attempts": sf.c.attempts + 1,
}
"""What starting an action writes (Pending -> InProgress, under a worker, counted)."""
