"""Cooperative cancel: telling a running action that its row was cancelled.

``cancel()`` of an InProgress action moves its row to Canceled at once (its result will
never be recorded); this is how the action learns of it. Each action run by an executor
has a ``Cancellation`` here while it runs; a cancel reaches it three ways, whichever comes
first:

* in this process, as the cancel commits (``Runtime.after_commit``);
* on PostgreSQL, from any process, by NOTIFY (``cancel:<ids>`` on the wake-up channel),
  within milliseconds;
* by the executor's poll of its running rows (``_executor/cancel_poll.py``), every
  ``poll_interval``: how SQLite's other processes learn of it, and PostgreSQL's safety net.

The action checks ``ctx.cancel_requested`` or awaits ``ctx.wait_for_cancel()``; one
declared ``@app.action(cancel="interrupt")`` is cancelled at its next ``await`` instead.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Literal, get_args

import anyio

from ._kinds import ScheduledFunctionId

CancelMode = Literal["cooperative", "interrupt"]
"""How a running action learns that its row was cancelled: ``cooperative`` (the default)
sets ``ctx.cancel_requested``; ``interrupt`` cancels it at its next ``await`` as well."""

CANCEL_MODES: tuple[str, ...] = get_args(CancelMode)


class Cancellation:
    """One running action's cancel request."""

    __slots__ = ("_event", "_interrupt", "requested")

    def __init__(self, interrupt: Callable[[], None] | None) -> None:
        self.requested = False
        # Made when first awaited: most actions never wait for a cancel.
        self._event: anyio.Event | None = None
        self._interrupt = interrupt

    def request(self) -> None:
        if self.requested:
            return
        self.requested = True
        if self._event is not None:
            self._event.set()
        if self._interrupt is not None:
            self._interrupt()

    async def wait(self) -> None:
        if self.requested:
            return
        if self._event is None:
            self._event = anyio.Event()
        await self._event.wait()


class Cancels:
    """The cancellations of the actions running in this process, by row id."""

    def __init__(self) -> None:
        self._running: dict[str, Cancellation] = {}

    def start(
        self, id: ScheduledFunctionId, interrupt: Callable[[], None] | None = None
    ) -> Cancellation:
        """An action of row ``id`` starts; ``interrupt`` is called on a cancel request
        (``cancel="interrupt"``)."""
        cancellation = self._running[id] = Cancellation(interrupt)
        return cancellation

    def end(self, id: ScheduledFunctionId) -> None:
        """Its function returned or raised: nothing is interrupted any more."""
        self._running.pop(id, None)

    def get(self, id: ScheduledFunctionId | None) -> Cancellation | None:
        return self._running.get(id) if id is not None else None

    def running(self) -> list[ScheduledFunctionId]:
        return [ScheduledFunctionId(id) for id in self._running]

    def request(self, ids: Iterable[str]) -> None:
        """These rows were cancelled: tell those running here."""
        for id in ids:
            if (cancellation := self._running.get(id)) is not None:
                cancellation.request()
