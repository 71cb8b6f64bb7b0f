"""The store's statements, run from synchronous code: one write path for both.

Every statement durafn issues is written once, as ``async`` code over an
``AsyncConnection`` (``_store/``). Over a *synchronous* SQLAlchemy ``Connection`` (a
Django or Flask request's, a script's) the same code runs unchanged: ``Bridge`` gives the
sync connection the face of an ``AsyncConnection`` (the handful of its methods the
store calls: ``execute``, ``exec_driver_sql``, ``run_sync``, ``info``, ``dialect``),
each an ``async def`` that does its work synchronously and never suspends. A coroutine
built on it therefore finishes in one step, which ``run_now`` takes: the statements, the
options, the validation and the errors are those of the async route, byte for byte.

Only a coroutine that suspends for real (an ``await`` of I/O outside the bridge, which
the write path never does) cannot be run so: ``run_now`` closes it and says so.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Mapping
from typing import Any, TypeVar, cast

from sqlalchemy.engine import Connection, CursorResult, Result
from sqlalchemy.ext.asyncio import AsyncConnection

from ._errors import DurafnError

T = TypeVar("T")


def run_now(coro: Coroutine[Any, Any, T]) -> T:
    """The value of ``coro``, which must finish without suspending (see the module)."""
    try:
        coro.send(None)
    except StopIteration as done:
        value: T = done.value
        return value
    coro.close()
    raise DurafnError(
        "a synchronous call of durafn reached code that waits on an event loop (an async "
        "enqueue hook, or inline mode): call the async API (app.scheduler(...)) from "
        "async code instead"
    )


class Bridge:
    """An ``AsyncConnection``'s face on a sync ``Connection`` (see the module)."""

    __slots__ = ("sync_connection",)

    def __init__(self, connection: Connection) -> None:
        self.sync_connection = connection

    def as_async(self) -> AsyncConnection:
        """This bridge, typed as what the store's functions take: it provides every
        method of ``AsyncConnection`` that they call."""
        return cast(AsyncConnection, self)

    async def execute(
        self,
        statement: Any,
        parameters: Any = None,
        *,
        execution_options: Mapping[str, Any] | None = None,
    ) -> Result[Any]:
        result = self.sync_connection.execute(
            statement, parameters, execution_options=execution_options
        )
        # Buffered, as AsyncConnection.execute's are: an UPDATE ... RETURNING whose rows
        # nobody reads must still have run to its end on SQLite.
        return _buffered(result)

    async def exec_driver_sql(
        self,
        statement: str,
        parameters: Any = None,
        execution_options: Mapping[str, Any] | None = None,
    ) -> Result[Any]:
        result = self.sync_connection.exec_driver_sql(statement, parameters, execution_options)
        return _buffered(result)

    async def run_sync(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        return fn(self.sync_connection, *args, **kwargs)

    @property
    def info(self) -> dict[Any, Any]:
        return self.sync_connection.info

    @property
    def dialect(self) -> Any:
        return self.sync_connection.dialect

    @property
    def invalidated(self) -> bool:
        return self.sync_connection.invalidated


def _buffered(result: CursorResult[Any]) -> Result[Any]:
    if not result.returns_rows:
        return result  # a CursorResult: its rowcount is read
    return result.freeze()()
