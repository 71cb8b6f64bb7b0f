"""What durable workflows reach inside durafn's other parts, in one place: a turn runs
inside a mutation (its connection, its parts) and writes through a scheduler (its
runtime, its writer, a row whose id the step chooses). Each is a private attribute of
its owner; were one to move, this module is the one to change."""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection

from .._context import MutationCtx, MutationParts
from .._registry import SchedulableRef
from .._runtime import Runtime
from .._scheduler import Scheduler


def connection(ctx: MutationCtx) -> AsyncConnection:
    """The connection of the mutation's transaction (the turn's)."""
    return ctx._parts._conn


def parts(ctx: MutationCtx) -> MutationParts:
    """The mutation's parts: its session, its writer, and how a writer is made."""
    return ctx._parts


def runtime_of(where: MutationCtx | Scheduler) -> Runtime:
    return where._rt


def joined(scheduler: Scheduler) -> AbstractAsyncContextManager[AsyncConnection] | None:
    """The scheduler's own transaction's connection, or None where each call commits on
    its own (``_writers.py``'s ``transaction_connection``)."""
    joining = getattr(scheduler._writer, "transaction_connection", None)
    found: AbstractAsyncContextManager[AsyncConnection] | None = (
        joining() if joining is not None else None
    )
    return found


async def schedule_as(
    scheduler: Scheduler, id: str, ref: SchedulableRef[Any, Any], values: dict[str, Any]
) -> None:
    """Schedule ``ref`` now with ``values`` as a row of the id given (an action step's:
    made from the workflow's id and the step's number), checked and counted as any."""
    now = runtime_of(scheduler).clock.now()
    row = scheduler._row(now, now, ref, (), dict(values))
    row["id"] = id  # type: ignore[typeddict-item]
    await scheduler._writer.add([row])
