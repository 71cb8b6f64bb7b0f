"""Claiming batched actions (``durafn.Batch``): a batch at a time, per function and key.

A batched action's rows are Pending with a ``batch_key`` ('' when its function batches
without a key): the unqueued claims leave them alone (``batch_key IS NULL`` is in
``ix_scheduled_functions_claim``'s predicate and in theirs), and this claim takes them,
for one function at a time:

1. **Keys** (keyed batches only): which keys have due rows, from the oldest due rows of
   the function (``KEYS``: at most ``SCAN`` entries of ``ix_scheduled_functions_batched``).
   Unkeyed batches have the one key ''.
2. **Peek** at a key's first due rows, at most ``max_size`` (``PEEK``, an index range of
   ``ix_scheduled_functions_batch``, no lock): a batch is ready when there are
   ``max_size`` of them, or its oldest has waited ``max_wait``; otherwise it is ready
   at that oldest row's due time plus ``max_wait`` (the executor's wake-up).
3. **Take** a ready batch: Pending -> InProgress for the key's first due rows, at most
   ``max_size``, locked with ``SKIP LOCKED`` (``TAKE``), committed before the call.

One claim at a time takes a key's rows: it holds the key's lock (``try_lock``: an
advisory lock on PostgreSQL, SQLite's one writer) for its transaction, and a claim that
finds it held skips the key. Without it, two workers taking one key's rows at once split
them (``SKIP LOCKED`` row by row): a short batch each, seen in a test on PostgreSQL.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from sqlalchemy import Double, Integer, Text, bindparam, func, literal, select
from sqlalchemy.ext.asyncio import AsyncConnection

from ..rows import Claimed
from ..schema.tables import BATCHED, sf
from .columns import StartTime, claimed
from .take import ClaimFilter, _starting, flags_allowed

SCAN = 1000
"""How many of a function's oldest due rows a claim reads to find its keys with due rows:
keys beyond them are found as those ahead of them are taken."""


@dataclasses.dataclass(frozen=True, slots=True)
class BatchSpec:
    """A batched function, as the claim needs it (``durafn.Batch``)."""

    name: str
    max_size: int
    max_wait: float
    keyed: bool


@dataclasses.dataclass(slots=True)
class BatchClaim:
    """What one claim of batches found: the batches taken (each a list of rows of one
    function and key, in order), and when a batch not ready yet will be, for the
    executor's idle wait."""

    batches: list[list[Claimed]] = dataclasses.field(default_factory=list)
    wake_at: float | None = None
    next_due: float | None = None
    """When the next row of these functions falls due (``NEXT``), if none was taken."""

    def wake(self, at: float) -> None:
        self.wake_at = at if self.wake_at is None else min(self.wake_at, at)


def _of_function(forbidden: frozenset[str]) -> tuple[Any, ...]:
    return (BATCHED, sf.c.name == bindparam("b_name", type_=Text), flags_allowed(forbidden))


def _due() -> Any:
    return sf.c.available_at <= bindparam("now", type_=Double)


def _key_rows(forbidden: frozenset[str]) -> Any:
    """A key's first due rows, in claim order (ix_scheduled_functions_batch)."""
    return (
        select(sf.c.id, sf.c.available_at)
        .where(*_of_function(forbidden), sf.c.batch_key == bindparam("b_key", type_=Text), _due())
        .order_by(sf.c.available_at, sf.c.seq)
        .limit(bindparam("b_size", type_=Integer))
    )


@dataclasses.dataclass(frozen=True, slots=True)
class _Statements:
    keys: Any
    peek: Any
    take: Any
    next: Any


_STATEMENTS: dict[frozenset[str], _Statements] = {}


def _statements(forbidden: frozenset[str]) -> _Statements:
    st = _STATEMENTS.get(forbidden)
    if st is None:
        oldest = (
            select(sf.c.batch_key, sf.c.available_at)
            .where(*_of_function(forbidden), sf.c.kind == literal("action"), _due())
            .order_by(sf.c.available_at)
            .limit(SCAN)
            .subquery()
        )
        keys = (
            select(oldest.c.batch_key, func.min(oldest.c.available_at).label("oldest"))
            .group_by(oldest.c.batch_key)
            .order_by("oldest")
        )
        peek = _key_rows(forbidden).with_only_columns(sf.c.available_at)
        take = _starting(_key_rows(forbidden).with_for_update(skip_locked=True))
        later = select(func.min(sf.c.available_at)).where(  # ix_scheduled_functions_batched
            BATCHED,
            sf.c.kind == literal("action"),
            sf.c.available_at > bindparam("now", type_=Double),
            sf.c.name.in_(bindparam("b_names", expanding=True)),
        )
        st = _STATEMENTS[forbidden] = _Statements(keys, peek, take, later)
    return st


async def claim_batches(
    conn: AsyncConnection,
    now: float,
    worker_id: str,
    functions: Sequence[BatchSpec],
    room: int,
    serve: ClaimFilter,
    try_lock: Callable[[AsyncConnection, str], Awaitable[bool]],
    started: StartTime | float | None = None,
) -> BatchClaim:
    """Start up to ``room`` ready batches of ``functions`` under ``worker_id``, at
    ``started`` (default ``now``; the module docstring); commit before running them."""
    found = BatchClaim()
    if serve.queues is not None:  # a worker of named queues only: batched rows are unqueued
        return found
    st = _statements(serve.forbidden_flags)
    for spec in functions:
        if room <= 0:
            break
        params: dict[str, Any] = {"b_name": spec.name, "now": now, "b_size": spec.max_size}
        keys = [k for k, _ in await conn.execute(st.keys, params)] if spec.keyed else [""]
        for key in keys:
            # One claim at a time per key: two taking one key's rows at once would split
            # them between them (SKIP LOCKED), a short batch each. A key another claim
            # holds is skipped; that claim takes its rows.
            if not await try_lock(conn, json.dumps(["durafn.batch", spec.name, key])):
                continue
            while room > 0:
                params["b_key"] = key
                due = [at for (at,) in await conn.execute(st.peek, params)]
                if not due:
                    break
                ready_at = due[0] + spec.max_wait
                if len(due) < spec.max_size and ready_at > now:
                    found.wake(ready_at)
                    break
                starting = {"worker_id": worker_id, "started": now if started is None else started}
                rows = claimed(list(await conn.execute(st.take, params | starting)))
                if not rows:
                    break  # another worker's (SKIP LOCKED)
                found.batches.append(rows)
                room -= 1
                if len(rows) < spec.max_size:
                    break
    if not found.batches:  # when the executor need look again (a claim that took some will)
        names = [spec.name for spec in functions]
        found.next_due = (await conn.execute(st.next, {"now": now, "b_names": names})).scalar()
    return found
