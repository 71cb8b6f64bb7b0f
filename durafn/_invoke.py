"""Running a function directly (``app.run_*`` and ``ctx.run_*``), not from a scheduled row."""

from __future__ import annotations

import functools
from typing import Any, TypeVar

import anyio
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession, AsyncTransaction

from ._context import (
    ActionCtx,
    MutationCtx,
    MutationParts,
    QueryCtx,
    SystemTable,
    read_only_session,
)
from ._errors import ArgumentError, FunctionTimeoutError, TransactionError
from ._kinds import FunctionKind, ScheduledFunctionId
from ._registry import ActionRef, FunctionRef, MutationRef, QueryRef
from ._runtime import Inline, Runtime
from ._writers import BufferedWriter, Enqueued

R = TypeVar("R")


class Timeouts:
    """Default time limits per kind; a function's own ``timeout=`` wins."""

    def __init__(self, mutation: float, action: float, query: float) -> None:
        self._by_kind = {
            FunctionKind.MUTATION: float(mutation),
            FunctionKind.ACTION: float(action),
            FunctionKind.QUERY: float(query),
        }

    def for_(self, ref: FunctionRef[Any, Any]) -> float:
        return self._by_kind[ref.kind] if ref.timeout is None else ref.timeout


async def call_with_timeout(
    ref: FunctionRef[Any, R], ctx: Any, values: dict[str, Any], timeout: float
) -> R:
    """Await the user's function; past ``timeout`` seconds, cancel it and raise.

    Only this scope's own expiry becomes FunctionTimeoutError: a TimeoutError the
    function raises itself (its own ``fail_after``) is the function's error, unchanged.
    """
    with anyio.move_on_after(timeout):
        return await ref.fn(ctx, **values)
    raise timeout_error(ref, timeout)


def timeout_error(ref: FunctionRef[Any, Any], timeout: float) -> FunctionTimeoutError:
    return FunctionTimeoutError(
        f"{ref.kind} {ref.name!r} ran longer than its time limit of {timeout:g}s and was "
        "stopped; raise the limit with timeout=... on its decorator"
    )


def mutation_session(conn: AsyncConnection) -> AsyncSession:
    """The ``ctx.db`` of a mutation, joined to durafn's transaction on ``conn``.

    "rollback_only": the user's ``ctx.db.commit()`` commits nothing of durafn's, and a
    ``ctx.db.rollback()`` shows in the transaction (``check_transaction`` reports it).
    """
    return AsyncSession(bind=conn, expire_on_commit=False, join_transaction_mode="rollback_only")


def check_transaction(
    conn: AsyncConnection,
    root: AsyncTransaction,
    savepoint: AsyncTransaction | None,
    session: AsyncSession,
    ref: FunctionRef[Any, Any],
) -> None:
    """Raise TransactionError if the mutation ended the transaction it was given."""
    sync = conn.sync_connection
    ours = savepoint.sync_transaction if savepoint is not None else None
    intact = (
        sync is not None
        and root.is_active
        and sync.get_transaction() is root.sync_transaction
        and (savepoint is None or savepoint.is_active)
        # A savepoint the user left open would swallow what follows (its neighbours'
        # writes, when they share the transaction): the innermost must be ours, or none.
        and sync.get_nested_transaction() is ours
        and not session.in_nested_transaction()
    )
    if not intact:
        raise TransactionError(
            f"mutation {ref.name!r} rolled back or committed its own transaction "
            "(ctx.db.rollback(), a failed flush it caught, or a begin_nested() it left "
            "open); durafn owns the transaction: raise an exception to abort a mutation, "
            "and use `async with ctx.db.begin_nested():` for a savepoint"
        )


class Invoker:
    def __init__(self, runtime: Runtime, timeouts: Timeouts) -> None:
        self._rt = runtime
        self.timeouts = timeouts

    async def query(
        self, ref: QueryRef[Any, R], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> R:
        ref = self._check(ref, QueryRef)
        values = ref.validate_call(args, kwargs)
        timeout = self.timeouts.for_(ref)

        async def _body(conn: AsyncConnection) -> R:
            session = read_only_session(conn)
            try:
                ctx = QueryCtx(self._rt, session, SystemTable(self._rt, conn))
                return await call_with_timeout(ref, ctx, values, timeout)
            finally:
                await session.close()

        return await self._rt.transaction(
            _body, read_only=True, doing=f"running query {ref.name!r}", user_code=True
        )

    async def mutation(
        self,
        ref: MutationRef[Any, R],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        *,
        parent_id: ScheduledFunctionId | None = None,
    ) -> R:
        ref = self._check(ref, MutationRef)
        values = ref.validate_call(args, kwargs)
        timeout = self.timeouts.for_(ref)
        woken: set[FunctionKind] = set()
        written: list[Enqueued] = []
        inline: list[Inline] = []

        async def _body(conn: AsyncConnection) -> R:
            woken.clear()
            written.clear()
            inline.clear()
            root = conn.get_transaction()
            assert root is not None
            session = mutation_session(conn)
            parts = MutationParts(
                self._rt,
                conn,
                session,
                functools.partial(BufferedWriter, self._rt, conn, check_parent=parent_id),
                parent_id=parent_id,
            )
            try:
                result = await call_with_timeout(
                    ref, MutationCtx(self._rt, parts, parent_id), values, timeout
                )
                check_transaction(conn, root, None, session, ref)
                if parts.limit_error is not None:
                    raise parts.limit_error
                await session.flush()
                if parts.writer is not None:
                    await parts.writer.flush()
            finally:
                await session.close()
            if parts.writer is not None:
                woken.update(parts.writer.woken)
                written.extend(parts.writer.enqueued)
                inline.extend(parts.writer.inline)
            return result

        result = await self._rt.transaction(
            _body, doing=f"running mutation {ref.name!r}", user_code=True
        )
        self._rt.wake(woken)
        await self._rt.hooks.enqueued(written)
        await self._rt.run_inline(inline)
        return result

    async def action(
        self,
        ref: ActionRef[Any, R],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        *,
        run_id: ScheduledFunctionId | None = None,
    ) -> R:
        ref = self._check(ref, ActionRef)
        values = ref.validate_call(args, kwargs)
        await self._rt.ensure_ready()
        ctx = self.action_ctx(run_id)
        return await call_with_timeout(ref, ctx, values, self.timeouts.for_(ref))

    def action_ctx(self, run_id: ScheduledFunctionId | None) -> ActionCtx:
        return ActionCtx(self._rt, self, run_id)

    def _check(self, ref: Any, kind: type[Any]) -> Any:
        resolved = self._rt.registry.resolve(ref)
        if not isinstance(resolved, kind):
            wanted = FunctionKind(kind.__name__.removesuffix("Ref").lower())
            raise ArgumentError(
                f"{resolved.name!r} is {resolved.kind.with_article}, not "
                f"{wanted.with_article}; call it with run_{resolved.kind}"
            )
        return resolved
