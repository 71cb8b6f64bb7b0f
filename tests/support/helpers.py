"""Small helpers over user tables (the system table has durafn.testing)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import anyio
from sqlalchemy import func, select, text
from sqlalchemy.ext.asyncio import AsyncConnection

import durafn

from .models import Base, Counter, Effect


async def count(app: durafn.App, model: type[Base]) -> int:
    async with app.engine.connect() as conn:
        return int((await conn.execute(select(func.count()).select_from(model))).scalar_one())


async def counter(app: durafn.App, name: str = "c") -> int:
    async with app.engine.connect() as conn:
        value = (await conn.execute(select(Counter.value).where(Counter.name == name))).scalar()
        return int(value or 0)


async def effects(app: durafn.App) -> list[str]:
    """The keys of the ``Effect`` rows, in the order they were written."""
    async with app.engine.connect() as conn:
        return list((await conn.execute(select(Effect.key).order_by(Effect.id))).scalars())


async def row_of(app: durafn.App, id: str) -> durafn.ScheduledFunction:
    """The row with this id, which must exist."""
    row = await app.get(id)
    assert row is not None
    return row


async def has_beaten(app: durafn.App, worker_id: str, at: float) -> bool:
    """Whether the worker's last heartbeat was written at ``at`` (the fake clock's time)."""
    return any(w.id == worker_id and w.heartbeat_at.timestamp() == at for w in await app.workers())


@asynccontextmanager
async def system_table_locked(app: durafn.App) -> AsyncIterator[AsyncConnection]:
    """Hold a lock that makes every claim wait (as a slow writer elsewhere would); roll
    back the yielded connection to release it."""
    async with app.engine.connect() as conn:
        await conn.begin()
        if conn.dialect.name == "postgresql":
            await conn.execute(text("LOCK TABLE _scheduled_functions IN EXCLUSIVE MODE"))
        else:
            # durafn's SQLite BEGIN IMMEDIATE (the write lock) goes with the first statement.
            await conn.execute(text("SELECT 1"))
        yield conn
        if conn.in_transaction():
            await conn.rollback()


CEILING = 300.0
"""The bound of every wait for an event in the suite: only a hang reaches it. The suite
must pass on a loaded machine (load 6-18 on 2 cores made worker processes take more than
10 s to register), so no wait is a guess at how long something takes."""


async def wait_until(
    condition: Callable[[], Awaitable[bool]],
    what: str,
    timeout: float = CEILING,
    interval: float = 0.02,
) -> float:
    """Poll ``condition`` until it holds (a ceiling only a hang reaches: a slow machine is
    slow, not wrong); return how long that took."""
    start = time.monotonic()
    while not await condition():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"timed out after {timeout:g}s waiting until {what}")
        await anyio.sleep(interval)
    return time.monotonic() - start


async def equals(value: Awaitable[object], expected: object) -> bool:
    """For ``wait_until(lambda: equals(some_read(), expected), ...)``."""
    return await value == expected


async def true(value: bool) -> bool:
    """For ``wait_until(lambda: true(plain_condition), ...)``."""
    return value
