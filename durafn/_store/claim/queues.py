"""The queued part of a claim: which queues may run (``queue_may_run``) and have their
head among the due rows (``heads_only``); then for each, in claim order, take its lock,
count its running rows, and read its head (``take.take`` calls ``queue_heads``; the
module docstring of ``take`` says why it is safe).
"""

from __future__ import annotations

import functools
from typing import Any

from sqlalchemy import (
    ARRAY,
    Double,
    Integer,
    Select,
    Text,
    and_,
    bindparam,
    false,
    func,
    literal,
    select,
    true,
    union_all,
)
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql.elements import ColumnElement

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


def in_queue_order(queue: Any, *columns: Any, table: Any = sf) -> Select[Any]:
    """``columns`` of ``queue``'s due rows (of ``table``, ``_scheduled_functions`` or an
    alias of it) in queue order: priority, due time, order written (every reader of a
    queue's head: the claim's, the hand-off's, the candidates' check)."""
    return (
        select(*columns)
        .where(
            table.c.state == PENDING,
            table.c.flow_key.is_(None),
            table.c.queue_name == queue,
            table.c.available_at <= bindparam("now", type_=Double),
        )
        .order_by(table.c.priority, table.c.available_at, table.c.seq)
    )


# ix_scheduled_functions_queue: (queue_name, priority, available_at, seq). Every kind:
# a queue's order is across its mutations and actions. No SKIP LOCKED: holding the
# queue's lock, only a momentary writer (a cancel, a key's replace) can hold its rows.
# ``flow_key IS NULL``, as in the index's predicate: without it PostgreSQL could not use
# the index (1000 serial queues drained at 0.26x-0.52x), and a keyed row in a routing
# queue is the flow claim's to take, never the queue's.
QUEUE_HEAD = (
    in_queue_order(bindparam("queue", type_=Text), *CLAIM_COLUMNS, sf.c.kind, sf.c.flags)
    .limit(bindparam("limit", type_=Integer))
    .with_for_update()
)


def _heads_lateral() -> Any:
    """``QUEUE_HEAD`` of many queues in one statement (PostgreSQL's LATERAL): for each
    ``(queue, limit)`` of the arrays, its first ``limit`` due rows, locked. A statement
    per queue made a claim of 64 rows of 64 queues 67 round trips: 1,000 serial queues
    of actions drained at 0.1x the unqueued drain."""
    wanted = (
        func.unnest(
            bindparam("names", type_=ARRAY(Text)), bindparam("limits", type_=ARRAY(Integer))
        )
        .table_valued("queue", "n", with_ordinality="nth")
        .render_derived("wanted")
    )
    head = (
        in_queue_order(wanted.c.queue, *CLAIM_COLUMNS, sf.c.kind, sf.c.flags)
        .limit(wanted.c.n)
        .with_for_update()
        .lateral("head")
    )
    return (
        select(*head.c)
        .select_from(wanted.join(head, true()))
        .order_by(wanted.c.nth, head.c.priority, head.c.available_at, head.c.seq)
    )


QUEUE_HEADS = _heads_lateral()
UNION_ARMS = 64
"""Queues per statement of ``_heads_union`` (SQLite allows 500 arms to a compound)."""


@functools.cache
def _heads_union(arms: int) -> Any:
    """``QUEUE_HEAD`` of ``arms`` queues in one statement, for engines without LATERAL
    (SQLite): one ``LIMIT`` range of ix_scheduled_functions_queue per arm, ``:q<i>``,
    ``:n<i>``. Through aiosqlite a statement per queue cost 0.33 ms: 1,000 serial queues
    of actions drained at 0.12x the unqueued drain."""
    parts = []
    for i in range(arms):
        nth = literal(i, Integer).label("nth")
        queue = bindparam(f"q{i}", type_=Text)
        arm = (
            in_queue_order(queue, *CLAIM_COLUMNS, sf.c.kind, sf.c.flags, nth)
            .limit(bindparam(f"n{i}", type_=Integer))
            .subquery(f"arm{i}")
        )
        parts.append(select(*arm.c))
    every = union_all(*parts).subquery("heads")
    return select(*every.c).order_by(
        every.c.nth, every.c.priority, every.c.available_at, every.c.seq
    )


async def queue_heads(
    conn: AsyncConnection,
    kind: FunctionKind,
    now: float,
    names: list[str],
    room: int,
    forbidden: frozenset[str],
    lateral: bool = False,
) -> tuple[list[Claimed], bool]:
    """The rows of ``names`` this claim may run: each queue's lock taken, then its head
    (``lateral``: every queue's in one statement); and whether a queue was skipped
    because another claim held it."""
    held = {r.name: r.concurrency for r in await conn.execute(LOCK_QUEUES, {"names": names})}
    skipped = len(held) < len(names)
    if not held:
        return [], skipped
    running = dict((await conn.execute(RUNNING_IN, {"names": list(held)})).tuples().all())
    limits: dict[str, int] = {}
    for name in names:  # in claim order
        concurrency = held.get(name, 0)
        free_slots = room if concurrency is None else concurrency - running.get(name, 0)
        if free_slots > 0:
            # A mutation batch runs its rows of a queue one after another: one slot for all.
            limits[name] = room if kind is FunctionKind.MUTATION else min(free_slots, room)
    if not limits:  # every queue held here is full (a serial queue's action is running)
        return [], skipped
    taken: list[Claimed] = []
    if kind is FunctionKind.MUTATION and not lateral:
        # One queue at a time, each as many rows as the batch has room for: one writer
        # at a time (SQLite) contends for nothing, and a serial queue's rows then run
        # one after another in few statements (shares of the batch, one row of each of
        # 256 queues, drained 1,000 serial queues at 0.76x this).
        for name, limit in limits.items():
            if len(taken) >= room:
                break
            params = {"queue": name, "now": now, "limit": min(limit, room - len(taken))}
            found = list(await conn.execute(QUEUE_HEAD, params))
            _take_heads(found, kind, forbidden, room, taken)
        return taken, skipped
    if len(limits) == 1:
        [(name, limit)] = limits.items()
        params = {"queue": name, "now": now, "limit": limit}
        _take_heads(list(await conn.execute(QUEUE_HEAD, params)), kind, forbidden, room, taken)
        return taken, skipped
    if kind is FunctionKind.MUTATION:
        # A share of the batch each: with ``room`` rows per queue the statement read and
        # locked (a row lock is a write) up to room x queues rows to take room of them,
        # and the lanes' claims found their queues locked by one another; 1,000 serial
        # queues of mutations drained at 0.6x a statement per queue.
        share = max(1, room // len(limits))
        limits = {name: min(limit, share) for name, limit in limits.items()}
    if lateral:
        params = {"names": list(limits), "limits": list(limits.values()), "now": now}
        _take_heads(list(await conn.execute(QUEUE_HEADS, params)), kind, forbidden, room, taken)
        return taken, skipped
    wanted = list(limits.items())
    for start in range(0, len(wanted), UNION_ARMS):
        chunk = wanted[start : start + UNION_ARMS]
        arms: dict[str, Any] = {"now": now}
        for i, (name, limit) in enumerate(chunk):
            arms[f"q{i}"], arms[f"n{i}"] = name, limit
        found = list(await conn.execute(_heads_union(len(chunk)), arms))
        _take_heads(found, kind, forbidden, room, taken)
        if len(taken) >= room:
            break
    return taken, skipped


def _take_heads(
    found: list[Any], kind: FunctionKind, forbidden: frozenset[str], room: int, taken: list[Claimed]
) -> None:
    """Append to ``taken`` (up to ``room``) the rows of ``found`` (queue heads, each queue's
    in queue order, the queues in claim order) this claim may run."""
    refused: set[str] = set()
    for row in found:
        if len(taken) >= room:
            return
        if row.queue_name in refused:
            continue
        if row.kind != kind.value or _forbidden(row.flags, forbidden):
            refused.add(row.queue_name)  # the queue's next row is not ours: nothing after it
            continue
        taken.append(Claimed._make(row[: len(CLAIM_COLUMNS)]))


def _forbidden(stored: str | None, forbidden: frozenset[str]) -> bool:
    return stored is not None and any(f",{f}," in stored for f in forbidden)


def queue_may_run() -> ColumnElement[bool]:
    """The row's queue is neither paused nor at its concurrency (judged without locks;
    the claim checks again under the queue's lock)."""
    running = sf.alias("running")
    full = (
        select(running.c.queue_name)
        .join(queues, queues.c.name == running.c.queue_name)
        # ix_scheduled_functions_running: as many entries as actions running anywhere.
        .where(running.c.state == RUNNING, queues.c.concurrency.is_not(None))
        .group_by(running.c.queue_name, queues.c.concurrency)
        .having(func.count() >= queues.c.concurrency)
    )
    paused = select(queues.c.name).where(queues.c.paused)  # ix_durafn_queues_paused
    return and_(~sf.c.queue_name.in_(paused), ~sf.c.queue_name.in_(full))


def heads_only(candidates: Select[Any]) -> Select[Any]:
    """Of ``candidates`` (queue, priority, due, seq of due queued rows), those that are
    their queue's head: its first due row, whatever its kind (``ix_scheduled_functions_
    queue``, one probe each). A claim locks only queues whose head it may run: a lock
    held by a claim that then took nothing (a mutation claim reading a queue whose head
    is an action) made the other kind's claims skip the queue (SKIP LOCKED) and sleep
    until their poll, 5 s on PostgreSQL, with nothing to wake them.

    Probed after the candidates' LIMIT, not as a filter of their scan: as a filter it
    rejected every row of a long queue but the first, so the scan read the whole queue
    to fill its LIMIT (one serial queue of 2,000 actions drained at 0.55x). And only each
    queue's first candidate is probed, the one that can be its head (a probe for each of
    a long queue's hundred candidates still cost the drain a fifth)."""
    read = candidates.subquery("candidates")
    numbered = select(
        *read.c,
        func.row_number()
        .over(partition_by=read.c.queue_name, order_by=(read.c.available_at, read.c.seq))
        .label("nth"),
    ).subquery("numbered")
    columns = (numbered.c[c] for c in ("queue_name", "priority", "available_at", "seq"))
    found = select(*columns).where(numbered.c.nth == 1).subquery("firsts")
    head = sf.alias("head")
    first = in_queue_order(found.c.queue_name, head.c.seq, table=head).limit(1).scalar_subquery()
    return (
        select(found.c.queue_name, found.c.priority, found.c.available_at, found.c.seq)
        .where(found.c.seq == first)
        .order_by(found.c.available_at, found.c.seq)
    )
