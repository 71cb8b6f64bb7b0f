"""``App.watch``: wake a reader (a live page, a monitor) when rows may have changed,
rather than have it poll the database at a fixed rate.

Fed by the same wake-ups the executors sleep on: this process's own writes
(``Runtime.wake``) and, on PostgreSQL, every process's NOTIFY (new rows, freed slots,
cancels), through the driver's LISTEN connection. SQLite has no such channel between
processes: there, and for the changes that send no signal (a row ending), the poll.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Collection
from contextlib import asynccontextmanager

import anyio

from ._checks import positive_seconds
from ._errors import ArgumentError
from ._kinds import FunctionKind
from ._public import publish
from ._runtime import Runtime


class Watch:
    """What ``App.watch`` yields: ``await changed()`` until the next reason to read."""

    def __init__(self, poll: float, settle: float) -> None:
        self._poll = poll
        self._settle = settle
        self._signal = anyio.Event()
        self.listening = False
        """Whether other processes' changes wake it (PostgreSQL's LISTEN)."""

    def fire(self, _: Collection[FunctionKind] | list[str] = ()) -> None:
        self._signal.set()

    async def changed(self) -> None:
        """Return once something may have changed (a wake-up) or ``poll`` seconds have
        passed, and never sooner than ``settle`` seconds after the previous return: a
        drain sending a NOTIFY per batch wakes a reader at most once per ``settle``."""
        await anyio.sleep(self._settle)
        with anyio.move_on_after(max(0.0, self._poll - self._settle)):
            await self._signal.wait()
        self._signal = anyio.Event()


@asynccontextmanager
async def watch(rt: Runtime, poll: float, settle: float) -> AsyncIterator[Watch]:
    poll = positive_seconds("poll", poll)
    settle = positive_seconds("settle", settle)
    if settle > poll:
        raise ArgumentError(f"settle ({settle} s) must not exceed poll ({poll} s)")
    found = Watch(poll, settle)
    rt._wake_listeners.add(found.fire)
    try:
        async with rt.driver.listen(rt.engine, found.fire, found.fire) as listening:
            found.listening = listening
            yield found
    finally:
        rt._wake_listeners.discard(found.fire)


publish(globals())
