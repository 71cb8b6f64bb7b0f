"""The queued part of a claim: for each named queue with due rows, in claim order, take
its lock, count its running rows, and read its head (``take.take`` calls
``queue_heads``; the module docstring of ``take`` says why it is safe).
"""

from __future__ import annotations

from sqlalchemy import Double, Integer, Text, bindparam, false, func, select
from sqlalchemy.ext.asyncio import AsyncConnection

from ..._kinds import FunctionKind
from ..rows import Claimed
from ..schema.tables import queues, sf
from ..sql import PENDING, RUNNING
from .columns import CLAIM_COLUMNS

# Taken while choosing a queue's rows; SKIP LOCKED: another claim has it (primary key).
LOCK_QUEUES = (
    select(queues.c.name, queues.c.concurrency)
    .where(queues.c.name.in_(bindparam("names", expanding=True)), queues.c.paused == false())
    .order_by(queues.c.name)
    .with_for_update(skip_locked=True)
)
RUNNING_IN = (
    select(sf.c.queue_name, func.count())
    .where(sf.c.state == RUNNING, sf.c.queue_name.in_(bindparam("names", expanding=True)))
    .group_by(sf.c.queue_name)
)
# ix_scheduled_functions_queue: (queue_name, priority, available_at, seq). Every kind:
# a queue's order is across its mutations and actions. No SKIP LOCKED: holding the
# queue's lock, only a momentary writer (a cancel, a key's replace) can hold its rows.
# ``flow_key IS NULL``, as in the index's predicate: without it PostgreSQL could not use
# the index (1000 serial queues drained at 0.26x-0.52x), and a keyed row in a routing
# queue is the flow claim's to take, never the queue's.
QUEUE_HEAD = (
    select(*CLAIM_COLUMNS, sf.c.kind, sf.c.flags)
    .where(
        sf.c.state == PENDING,
        sf.c.flow_key.is_(None),
        sf.c.queue_name == bindparam("queue", type_=Text),
        sf.c.available_at <= bindparam("now", type_=Double),
    )
    .order_by(sf.c.priority, sf.c.available_at, sf.c.seq)
    .limit(bindparam("limit", type_=Integer))
    .with_for_update()
)


async def queue_heads(
    conn: AsyncConnection,
    kind: FunctionKind,
    now: float,
    names: list[str],
    room: int,
    forbidden: frozenset[str],
) -> tuple[list[Claimed], bool]:
    """The rows of ``names`` this claim may run: each queue's lock taken, then its head;
    and whether a queue was skipped because another claim held it."""
    held = {r.name: r.concurrency for r in await conn.execute(LOCK_QUEUES, {"names": names})}
    skipped = len(held) < len(names)
    if not held:
        return [], skipped
    running = dict((await conn.execute(RUNNING_IN, {"names": list(held)})).tuples().all())
    taken: list[Claimed] = []
    for name in names:  # in claim order
        if name not in held or len(taken) >= room:
            continue
        concurrency = held[name]
        free_slots = room if concurrency is None else concurrency - running.get(name, 0)
        if free_slots <= 0:
            continue
        # A mutation batch runs its rows of a queue one after another: one slot for all.
        limit = room - len(taken) if kind is FunctionKind.MUTATION else free_slots
        params = {"queue": name, "now": now, "limit": min(limit, room - len(taken))}
        for row in await conn.execute(QUEUE_HEAD, params):
            if row.kind != kind.value or _forbidden(row.flags, forbidden):
                break  # the queue's next row is not ours to run: nothing after it either
            taken.append(Claimed._make(row[: len(CLAIM_COLUMNS)]))
    return taken, skipped


def _forbidden(stored: str | None, forbidden: frozenset[str]) -> bool:
    return stored is not None and any(f",{f}," in stored for f in forbidden)
