"""The hand-off: an action of a named queue that ends gives its queue's slot to the
queue's next row, in the transaction that writes its end, under the same worker.

Without it a serial queue paid, per row, a finish (its transaction and a NOTIFY), the
wake-up of a claimer and a whole claim (levels, candidates, the queue's lock, its running
count, its head, the start: six statements): one serial queue of no-op actions drained at
0.11 of its round-trip limit on PostgreSQL. With it, the finish's transaction takes the
queue's lock, and one UPDATE starts the successor: no claim, no wake-up.

A successor is started only where the claim would have started it:

* the queue is limited (``concurrency`` set), not paused, its lock free (``SKIP LOCKED``:
  a claim choosing from it decides instead), and has a free slot once this finish's rows
  have ended (counted in the same transaction, after the lock: a new snapshot);
* the queue's head (its first due row, whatever its kind) is an action without a flag the
  worker refuses; a mutation or a refused row at the head: nothing, as for a claim;
* nothing due is ahead of it in claim order (priority, due time, order written). One
  probe per claim index says so: no unqueued or queued Pending action at a more urgent
  priority (due or not: a probe for "due" would read every future row of those levels;
  such a row only sends the successor the ordinary way), none at its priority due before
  it, and no keyed action due (keyed rows are ordered by their keys' turns, which only the
  claim knows). Rows of a queue that cannot run now (paused, busy, a mutation at its
  head) hold it back too: the probes read the claim indexes' first entries, not which
  queues may run (what the claim's candidates statement costs). A queue's own later rows
  come after its head in that order, so they never hold it back.

Any of those false, the queue's slot is left to the claim, as before (its end notifies),
and so are the slots of the batch's other queues: the hand-off stops at its first miss.
At most one successor per queue and finish batch: a queue of concurrency N whose N rows
end together hands one slot on and leaves the rest to the claim.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Double, Integer, Text, bindparam, exists, func, select, tuple_, update
from sqlalchemy.ext.asyncio import AsyncConnection

from ..._kinds import FunctionKind
from ..rows import Claimed
from ..schema.tables import sf
from ..sql import PENDING, RUNNING
from .columns import CLAIM_COLUMNS, STARTED, StartTime, claimed
from .queues import LOCK_QUEUES, in_queue_order
from .take import ClaimFilter, flags_allowed

_ACTION = FunctionKind.ACTION.value


def _ahead(queued: bool) -> Any:
    """A Pending action of one claim index (``_pending``'s predicate) ahead of the
    successor in claim order: at a more urgent level (the index's first entry), or at
    its level due before it (a row-value range of the index).

    Each written ``ORDER BY`` the index's order ``LIMIT 1``, not ``EXISTS``: with fresh
    rows and stale statistics PostgreSQL answered the queued ones' EXISTS from
    ix_scheduled_functions_queue, reading all of it (0.2 ms per 4,000 queued rows)."""
    other = sf.alias(f"ahead_{int(queued)}")
    pending = (
        other.c.state == PENDING,
        other.c.kind == _ACTION,
        other.c.queue_name.is_not(None) if queued else other.c.queue_name.is_(None),
        other.c.flow_key.is_(None),
    )
    first_level = (
        select(other.c.priority).where(*pending).order_by(other.c.priority).limit(1)
    ).scalar_subquery()
    earlier = (
        select(other.c.seq)
        .where(
            *pending,
            other.c.priority == sf.c.priority,
            tuple_(other.c.available_at, other.c.seq) < tuple_(sf.c.available_at, sf.c.seq),
        )
        .order_by(other.c.available_at, other.c.seq)
        .limit(1)
    ).scalar_subquery()
    # None at all: the successor's own level, so not "more urgent".
    return (func.coalesce(first_level, sf.c.priority) < sf.c.priority) | earlier.is_not(None)


@functools.cache
def successor(forbidden: frozenset[str]) -> Any:
    """Start ``:queue``'s head (Pending -> InProgress under ``:worker_id``) if the module
    docstring's conditions hold; returns it, or nothing."""
    # ix_scheduled_functions_queue: the queue's first due row, whatever its kind.
    head = in_queue_order(bindparam("queue", type_=Text), sf.c.id).limit(1).scalar_subquery()
    # ix_scheduled_functions_running: the actions running anywhere (this finish's own
    # rows are Success by now, in this transaction).
    busy = sf.alias("busy")
    running = (
        select(func.count())
        .where(busy.c.state == RUNNING, busy.c.queue_name == bindparam("queue", type_=Text))
        .scalar_subquery()
    )
    # ix_scheduled_functions_keyed_due: its first entry.
    keyed = sf.alias("keyed")
    keyed_due = exists().where(
        keyed.c.state == PENDING,
        keyed.c.kind == _ACTION,
        keyed.c.flow_key.is_not(None),
        keyed.c.available_at <= bindparam("now", type_=Double),
    )
    return (
        update(sf)
        .where(
            sf.c.id == head,
            sf.c.state == PENDING,
            sf.c.kind == _ACTION,
            flags_allowed(forbidden),
            running < bindparam("concurrency", type_=Integer),
            ~_ahead(False),
            ~_ahead(True),
            ~keyed_due,
        )
        .values(**STARTED)
        .returning(*CLAIM_COLUMNS)
    )


async def hand_off(
    conn: AsyncConnection,
    now: float,
    names: Sequence[str],
    room: int,
    worker_id: str,
    serve: ClaimFilter,
    started: StartTime | float | None = None,
) -> list[Claimed]:
    """Start the successors of ``names`` (the queues of actions this transaction has just
    finished), at most ``room``, under ``worker_id``, at ``started`` (default ``now``);
    the rows started."""
    names = sorted({n for n in names if serve.queues is None or n in serve.queues})
    statement = successor(serve.forbidden_flags)
    taken: list[Any] = []
    for name in names[:room]:
        # One queue's lock at a time: a lock held on a queue this finish then leaves
        # alone would make the claims that meet it skip it until the commit.
        lock = (await conn.execute(LOCK_QUEUES, {"names": [name]})).first()
        if lock is None or lock.concurrency is None:  # a claim's, paused, or unlimited
            break
        params = {"queue": name, "now": now, "concurrency": lock.concurrency}
        at = now if started is None else started
        found = (
            await conn.execute(statement, {**params, "worker_id": worker_id, "started": at})
        ).all()
        if not found:
            # Mostly the claim order: rows of other queues are due before this one's
            # next, and so before the others' (1000 queues of interleaved rows). A
            # statement per queue for nothing halved that drain: stop at the first miss.
            break
        taken.extend(found)
    return claimed(taken)
