"""What the executor's tasks share to wait, race and pace themselves.

``Signal`` is the broadcast wake-up every loop sleeps on; ``first_of`` races waits;
``shielded`` keeps a database statement from being cancelled half-way;
``single_errors_unwrapped`` lets ``async with executor`` raise one loop's error as itself;
``Pace`` is the recent duration a loop sizes its next claim by.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import anyio

T = TypeVar("T")


class Signal:
    """A broadcast wake-up: ``current()`` returns an event set by the next ``fire()``.

    Capture the event *before* looking for work, wait on it after: a fire in between is
    then never lost.
    """

    def __init__(self) -> None:
        self._event: anyio.Event | None = None

    def current(self) -> anyio.Event:
        if self._event is None:
            self._event = anyio.Event()
        return self._event

    def fire(self) -> None:
        if self._event is not None:
            self._event.set()
            self._event = None


class Pace:
    """A moving average of recent durations (seconds) that follows recent samples; the
    first sample stands alone. 0.0 until there is one."""

    __slots__ = ("_weight", "seconds")

    def __init__(self, weight: float = 0.5) -> None:
        self.seconds = 0.0
        self._weight = weight

    def add(self, sample: float) -> None:
        previous = self.seconds
        self.seconds = previous + (sample - previous) * self._weight if previous else sample


async def shielded(work: Awaitable[T]) -> T:
    """Await database work shielded from cancellation.

    A statement cancelled half-way costs its connection (SQLAlchemy invalidates it), and on
    SQLite it used to leave a task behind that hung the event loop's shutdown. So a
    stopping executor (or a cancelled caller) lets the statement finish and stops at its
    next wait instead. User code inside keeps its own time limit (an inner scope).
    """
    with anyio.CancelScope(shield=True):
        result = await work
    return result


async def first_of(*waiters: Callable[[], Awaitable[Any]]) -> None:
    """Return as soon as any of the awaitables completes; cancel the others."""
    async with anyio.create_task_group() as tg:

        async def _run(waiter: Callable[[], Awaitable[Any]]) -> None:
            await waiter()
            tg.cancel_scope.cancel()

        for waiter in waiters:
            tg.start_soon(_run, waiter)


@asynccontextmanager
async def single_errors_unwrapped() -> AsyncIterator[None]:
    """Raise a task group's error as itself (``except DatabaseError`` then works) when
    there is one, or when parallel loops all failed the same way; otherwise the group."""
    try:
        yield
    except BaseExceptionGroup as group:
        leaves = _leaves(group)  # nested task groups nest their groups
        if len({type(exc) for exc in leaves}) == 1:
            raise leaves[0] from None
        raise


def _leaves(group: BaseExceptionGroup[BaseException]) -> list[BaseException]:
    found: list[BaseException] = []
    for exc in group.exceptions:
        found.extend(_leaves(exc) if isinstance(exc, BaseExceptionGroup) else [exc])
    return found
