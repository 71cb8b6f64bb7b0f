"""The executor's poll for cancels of the actions it runs.

A cancel made in this process reaches its action as it commits, and on PostgreSQL a
NOTIFY brings other processes' cancels within milliseconds; on SQLite this poll is how a
cancel made by another process arrives (within ``poll_interval``), and on PostgreSQL it
catches one whose NOTIFY was missed (the LISTEN connection reconnecting). It reads only
while actions run: one primary-key lookup of their ids.
"""

from __future__ import annotations

import functools

import anyio

from .._errors import DatabaseError
from .._runtime import Runtime


async def poll_cancels(rt: Runtime, interval: float) -> None:
    """Every ``interval`` seconds (real time), tell running actions whose rows are
    Canceled; runs until cancelled."""
    while True:
        await anyio.sleep(interval)
        ids = rt.cancels.running()
        if not ids:
            continue
        try:
            found = await rt.transaction(
                functools.partial(rt.driver.canceled_among, ids=ids),
                read_only=True,
                single_statement=True,
                doing="looking for cancelled running actions",
                retries=0,
            )
        except DatabaseError as exc:  # the next poll tries again; the executor goes on
            rt.health.fault(exc, "looking for cancelled running actions")
            continue
        rt.cancels.request(found)
