"""Action time limits: one watch task for every action worker, not a timer per action.

Each action worker is a ``Slot``: the cancel scope its actions run in and the action it is
running now. ``DeadlineWatch`` sleeps until the soonest deadline among the slots and
cancels the scope of an action past its limit (the worker records it Failed with
``FunctionTimeoutError`` and opens a fresh scope for the next row). A scope with a
deadline per action cost 16 us to enter and leave, more than the rest of a no-op action's
run in the worker (measured on the 2-core machine).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import anyio

from .._store import Claimed
from .tasks import Signal


@dataclass(eq=False, slots=True)
class Slot:
    """One action worker: the cancel scope its actions run in and the one it is running."""

    scope: anyio.CancelScope | None = None
    row: Claimed | None = None
    started: float = 0.0
    deadline: float = math.inf
    expired: bool = False
    """The running action outlived its time limit and its scope was cancelled."""
    interrupted: bool = False
    """The running action's row was cancelled and its scope too (``cancel="interrupt"``)."""

    def interrupt(self) -> None:
        """Cancel the running action at its next ``await``, for its row's cancel."""
        if self.scope is not None and self.row is not None and not self.expired:
            self.interrupted = True
            self.scope.cancel()


class DeadlineWatch:
    """Cancels each running action that outlives its time limit."""

    def __init__(self, slots: set[Slot]) -> None:
        self._slots = slots
        self._changed = Signal()
        self._until = math.inf  # when the watch next looks
        # Shielded like the workers: time limits hold through a stop's grace period even
        # when the host was cancelled; ``stop`` cancels it once the actions are done.
        self._scope = anyio.CancelScope(shield=True)

    def begin(self) -> None:
        """A new run of the executor (before ``run`` is started)."""
        self._scope = anyio.CancelScope(shield=True)

    def stop(self) -> None:
        self._scope.cancel()

    def arm(self, deadline: float) -> None:
        """A slot started an action due to end by ``deadline`` (``time.monotonic``)."""
        if deadline < self._until:
            self._changed.fire()

    async def run(self) -> None:
        """Woken at the soonest deadline (so, with one time limit, about once per limit)."""
        with self._scope:
            while True:
                changed = self._changed.current()
                now = time.monotonic()
                soonest = math.inf
                for slot in self._slots:
                    if slot.row is None or slot.expired:
                        continue
                    if slot.deadline <= now and slot.scope is not None:
                        slot.expired = True
                        slot.scope.cancel()
                    else:
                        soonest = min(soonest, slot.deadline)
                self._until = soonest
                with anyio.move_on_after(soonest - now):
                    await changed.wait()
