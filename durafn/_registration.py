"""Registering functions on an app: ``@app.query``, ``@app.mutation``, ``@app.action``
(batched or not), and the app's hooks (``@app.on``). A part of ``App``."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Concatenate, ParamSpec, Protocol, TypeVar, overload

from typing_extensions import Unpack

from ._batching import Batch, BatchActionRef, ItemFailed, refuse_options
from ._cancels import CANCEL_MODES, CancelMode
from ._checks import integer, optional
from ._context import ActionCtx, MutationCtx, QueryCtx
from ._errors import RegistrationError
from ._hooks import HookName, HookT, check_hook
from ._options import JobOptions
from ._registry import ActionRef, FunctionRef, JobOptionArgs, MutationRef, QueryRef
from ._retention import Retention, check_retention
from ._retries import MAX_SNOOZES, SNOOZE_LIMIT
from ._runtime import Runtime
from ._sync_functions import SyncMutationCtx, greenlet_mutation, threaded_action

P = ParamSpec("P")
R = TypeVar("R")
I = TypeVar("I")  # noqa: E741 (a batched action's item)
T = TypeVar("T")  # its result per item


class MutationDecorator(Protocol):
    """``@app.mutation(...)``: over an ``async def`` or a ``def`` (``_sync_functions``)."""

    @overload
    def __call__(
        self, fn: Callable[Concatenate[MutationCtx, P], Awaitable[R]], /
    ) -> MutationRef[P, R]: ...

    @overload
    def __call__(
        self, fn: Callable[Concatenate[SyncMutationCtx, P], R], /
    ) -> MutationRef[P, R]: ...


class ActionDecorator(Protocol):
    """``@app.action(...)``: over an ``async def`` or a ``def`` (``_sync_functions``)."""

    @overload
    def __call__(
        self, fn: Callable[Concatenate[ActionCtx, P], Awaitable[R]], /
    ) -> ActionRef[P, R]: ...

    @overload
    def __call__(self, fn: Callable[Concatenate[ActionCtx, P], R], /) -> ActionRef[P, R]: ...


class Registration:
    """The registering half of ``App`` (a base class of it)."""

    _rt: Runtime

    @overload
    def query(self, fn: Callable[Concatenate[QueryCtx, P], Awaitable[R]]) -> QueryRef[P, R]: ...

    @overload
    def query(
        self, *, name: str | None = None, timeout: float | None = None
    ) -> Callable[[Callable[Concatenate[QueryCtx, P], Awaitable[R]]], QueryRef[P, R]]: ...

    def query(
        self, fn: Any = None, *, name: str | None = None, timeout: float | None = None
    ) -> Any:
        """Register a read-only function: ``async def f(ctx: QueryCtx, ...)``."""
        return self._register(QueryRef, (QueryCtx,), fn, name, timeout)

    @overload
    def mutation(
        self, fn: Callable[Concatenate[MutationCtx, P], Awaitable[R]]
    ) -> MutationRef[P, R]: ...

    @overload
    def mutation(self, fn: Callable[Concatenate[SyncMutationCtx, P], R]) -> MutationRef[P, R]: ...

    @overload
    def mutation(
        self,
        *,
        name: str | None = None,
        timeout: float | None = None,
        retention: Retention | None = None,
        snooze_limit: int = SNOOZE_LIMIT,
        **options: Unpack[JobOptionArgs],
    ) -> MutationDecorator: ...

    def mutation(
        self,
        fn: Any = None,
        *,
        name: str | None = None,
        timeout: float | None = None,
        retention: Retention | None = None,
        snooze_limit: int = SNOOZE_LIMIT,
        **options: Unpack[JobOptionArgs],
    ) -> Any:
        """Register a transactional function: ``async def f(ctx: MutationCtx, ...)``.

        Scheduled, it runs exactly once; ``timeout`` (seconds) overrides the app default.
        Job options (``priority``, ``queue``, ``key``, ``key_mode``, ``flags``,
        ``retry``) are the defaults of its scheduled calls; ``ref.options(...)`` overrides
        them per call. With ``retry``, a run that raises is rolled back and tried again
        later, its effects committed once, by the run that succeeds. ``retention``: how
        long its finished rows are kept, per state (``durafn.Retention``).
        ``snooze_limit``: how many times one row may ``raise durafn.Snooze(...)``.
        """
        return self._register(
            MutationRef, (MutationCtx,), fn, name, timeout, options, retention, snooze_limit
        )

    @overload
    def action(self, fn: Callable[Concatenate[ActionCtx, P], Awaitable[R]]) -> ActionRef[P, R]: ...

    @overload
    def action(self, fn: Callable[Concatenate[ActionCtx, P], R]) -> ActionRef[P, R]: ...

    @overload
    def action(
        self,
        *,
        batch: Batch,
        name: str | None = None,
        timeout: float | None = None,
        retention: Retention | None = None,
        snooze_limit: int = SNOOZE_LIMIT,
        **options: Unpack[JobOptionArgs],
    ) -> Callable[
        [Callable[[ActionCtx, list[I]], Awaitable[Sequence[T | ItemFailed]]]], ActionRef[[I], T]
    ]: ...

    @overload
    def action(
        self,
        *,
        name: str | None = None,
        timeout: float | None = None,
        retention: Retention | None = None,
        cancel: CancelMode = "cooperative",
        snooze_limit: int = SNOOZE_LIMIT,
        **options: Unpack[JobOptionArgs],
    ) -> ActionDecorator: ...

    def action(
        self,
        fn: Any = None,
        *,
        name: str | None = None,
        timeout: float | None = None,
        retention: Retention | None = None,
        cancel: CancelMode = "cooperative",
        snooze_limit: int = SNOOZE_LIMIT,
        batch: Batch | None = None,
        **options: Unpack[JobOptionArgs],
    ) -> Any:
        """Register a side-effecting function: ``async def f(ctx: ActionCtx, ...)``.

        Scheduled, it runs at most once and is never retried by durafn, unless it has a
        ``retry`` policy: then it runs at least once until it succeeds or runs out of
        attempts (a failure, its time limit, its worker lost, a stop's grace period).
        ``cancel``: how a run learns of its row's cancel: ``"cooperative"`` sets
        ``ctx.cancel_requested`` (and ends ``ctx.wait_for_cancel()``), ``"interrupt"`` also
        cancels it at its next ``await``. Job options, ``snooze_limit``: as ``mutation``.
        ``batch``: a ``durafn.Batch``; the function then takes a list of items
        (``async def f(ctx, items: list[Item]) -> list[Result]``), each call schedules one
        item, and due rows are handed to it together (``_batching``).
        """
        if cancel not in CANCEL_MODES:
            raise RegistrationError(
                f"cancel must be one of {', '.join(CANCEL_MODES)}, not {cancel!r}"
            )
        if batch is not None:
            return self._register(
                functools.partial(BatchActionRef[Any, Any], batch=batch),
                (ActionCtx,),
                fn,
                name,
                timeout,
                options,
                retention,
                snooze_limit,
                batched=True,
            )
        return self._register(
            ActionRef, (ActionCtx,), fn, name, timeout, options, retention, snooze_limit, cancel
        )

    def on(self, hook: HookName) -> Callable[[HookT], HookT]:
        """Register a lifecycle hook for every function: ``@app.on("failure")`` over
        ``def alert(event: durafn.HookEvent)`` (or ``async def``). Hooks: ``enqueue``,
        ``before``, ``after``, ``success``, ``error``, ``failure`` (see the README); they
        run in-process, outside the guarantees, and one that raises changes nothing."""
        name = check_hook(hook)

        def _add(fn: HookT) -> HookT:
            self._rt.hooks.add(name, fn)
            return fn

        return _add

    def _register(
        self,
        cls: Callable[..., FunctionRef[Any, Any]],
        ctx_types: tuple[type, ...],
        fn: Any,
        name: str | None,
        timeout: float | None,
        options: JobOptionArgs | None = None,
        retention: Retention | None = None,
        snooze_limit: int = SNOOZE_LIMIT,
        cancel: CancelMode | None = None,
        batched: bool = False,
    ) -> Any:
        # Checked before decorating, so a bad option names the decorator's line.
        defaults = JobOptions.checked(error=RegistrationError, **(options or {}))
        if defaults.after is not None:
            raise RegistrationError(
                "after= names rows, so it is given per call: ref.options(after=[id, ...])"
            )
        if batched:
            who = name or "this action"
            refuse_options(who, defaults.queue, defaults.flow, None, error=RegistrationError)
        optional(check_retention, "retention", retention, error=RegistrationError)
        integer("snooze_limit", snooze_limit, low=0, high=MAX_SNOOZES, error=RegistrationError)

        def decorate(f: Callable[..., Any]) -> FunctionRef[Any, Any]:
            f, types = _plain_def(f, ctx_types, batched)
            ref = cls(f, name=name, timeout=timeout, ctx_types=types)
            ref.job_options = defaults
            ref.retention = retention
            ref.snooze_limit = snooze_limit
            if isinstance(ref, ActionRef) and cancel is not None:
                ref.cancel = cancel
            self._rt.registry.add(ref)
            return ref

        return decorate if fn is None else decorate(fn)

    def functions(self) -> list[str]:
        """The durable names registered on this app."""
        return self._rt.registry.names()

    def function(self, name: str) -> FunctionRef[Any, Any]:
        """The function registered as ``name`` (a durable name); UnknownFunctionError if
        none is: to schedule by name from a tool (``scheduler().run_after(0, name, ...)``
        validates the arguments the same way)."""
        return self._rt.registry.get(name)


def _plain_def(
    fn: Callable[..., Any], ctx_types: tuple[type, ...], batched: bool
) -> tuple[Callable[..., Any], tuple[type, ...]]:
    """``fn`` as the executor awaits it, and the context types its first parameter may
    name: a ``def`` action in a thread of the pool, a ``def`` mutation in its batch's
    transaction through a sync ``Session`` (``_sync_functions``); others unchanged (a
    ``def`` query, or batched action, is refused by ``FunctionRef`` as before)."""
    if inspect.iscoroutinefunction(fn) or not callable(fn) or batched:
        return fn, ctx_types
    if ctx_types == (ActionCtx,):
        return threaded_action(fn), ctx_types
    if ctx_types == (MutationCtx,):
        if _first_annotation(fn) in (MutationCtx, "MutationCtx", "durafn.MutationCtx"):
            raise RegistrationError(
                f"{getattr(fn, '__qualname__', fn)} is a plain def mutation, which receives a "
                "durafn.SyncMutationCtx (ctx.db a sync Session in its batch's transaction): "
                "annotate its ctx so, or declare it 'async def' to receive a MutationCtx"
            )
        return greenlet_mutation(fn), (SyncMutationCtx,)
    return fn, ctx_types


def _first_annotation(fn: Callable[..., Any]) -> object:
    try:
        first = next(iter(inspect.signature(fn).parameters.values()), None)
    except (TypeError, ValueError):
        return None
    return None if first is None else first.annotation
