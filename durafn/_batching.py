"""Batched actions: ``@app.action(batch=Batch(max_size=100, max_wait=2.0))``.

Each call is scheduled as one row, of one item (the reference's signature is the item's:
``run_after(0, send, Email(...))``); a worker hands due rows of the function to one call
as a list, ``max_size`` at a time, or fewer once the oldest has waited ``max_wait``
(``_store/claim/batched.py``). The call returns one result per item, in order, or a
``ItemFailed`` in an item's slot; every row keeps its own state, result, attempts and
retry policy (``_executor/batched.py``). A row that reaches a worker alone (run inline,
``app.run_action``, adopted after an uncertain claim) runs as a batch of one.

Actions only, by decision: durafn already runs due mutations in group-commit batches (one
transaction, a savepoint per row), which is the saving a batch would bring, and a mutation
batch could not keep each row's exactly-once: an item that failed would either roll back
the others' writes or commit writes made for it.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import functools
import inspect
import operator
import types
import typing
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, ParamSpec, TypeVar

from ._checks import finite_seconds, integer, text
from ._errors import ArgumentError, BatchItemError, BatchResultError, RegistrationError
from ._public import publish
from ._registry import ActionRef
from ._signatures import describe

P = ParamSpec("P")
R = TypeVar("R", covariant=True)

MAX_BATCH = 10_000
"""The largest ``max_size``: a claim of one statement and a call's list."""
MAX_WAIT = 86_400.0
"""The longest ``max_wait``: a day."""
MAX_KEY = 1000
"""Characters of a batch key."""


@dataclasses.dataclass(frozen=True, slots=True)
class Batch:
    """How a batched action's rows are handed to it: up to ``max_size`` (1 to 10,000)
    due rows in one call, or the rows due so far once the oldest of them has waited
    ``max_wait`` seconds (0 to a day; 0: whatever is due, at once). ``key``: a function
    of an item giving a string (at most 1,000 characters); a call gets items of one key
    only, and each key is batched on its own (Inngest's ``batchEvents.key``)."""

    max_size: int = 100
    max_wait: float = 1.0
    key: Callable[[Any], str] | None = None

    def __post_init__(self) -> None:
        integer("Batch(max_size)", self.max_size, high=MAX_BATCH, error=RegistrationError)
        wait = finite_seconds("Batch(max_wait)", self.max_wait, error=RegistrationError)
        if not 0 <= wait <= MAX_WAIT:
            raise RegistrationError(
                f"Batch(max_wait) must be from 0 to {MAX_WAIT:g} seconds, not {self.max_wait!r}"
            )
        object.__setattr__(self, "max_wait", wait)
        if self.key is not None and not callable(self.key):
            raise RegistrationError(
                f"Batch(key) must be a function of an item giving a string, not {self.key!r}"
            )


class ItemFailed:
    """Return it in an item's slot: that item's row failed with ``error`` (an exception,
    or a message), and its retry policy decides what follows; the others keep their
    results. ``ItemFailed(durafn.Snooze(60))`` snoozes the one row."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException | str) -> None:
        if isinstance(error, str):
            error = BatchItemError(error)
        if not isinstance(error, BaseException):
            raise ArgumentError(f"ItemFailed takes an exception or a message, not {error!r}")
        self.error: BaseException = error

    def __repr__(self) -> str:
        return f"ItemFailed({self.error!r})"


def refuse_options(
    name: str, queue: object, flow: object, after: object, *, error: type[Exception]
) -> None:
    """A batched action's rows are claimed a batch at a time, by a claim of their own:
    a named queue, flow control and ``after=`` do not apply to them (the one rule, for
    the decorator and for each call)."""
    given = [what for what, value in (("queue", queue), ("flow", flow), ("after", after)) if value]
    if given:
        raise error(
            f"{name!r} is a batched action: its rows are claimed a batch at a time, so "
            f"{', '.join(given)}= does not apply to them (named queues, flow control and "
            "after= are refused for batched actions)"
        )


def split_results(results: object, size: int, name: str) -> list[Any]:
    """A batch call's return value as one result (or ``ItemFailed``) per item; a
    ``BatchResultError`` for every item if it is not a sequence of ``size``."""
    if not isinstance(results, Sequence) or isinstance(results, str | bytes):
        raise BatchResultError(
            f"the batched action {name!r} returned {type(results).__name__}, not a list of "
            f"one result per item ({size} items)"
        )
    if len(results) != size:
        raise BatchResultError(
            f"the batched action {name!r} returned {len(results)} results for {size} items; "
            "return one per item, in order (ItemFailed(...) for an item that failed)"
        )
    return list(results)


class BatchActionRef(ActionRef[P, R]):
    """A batched action (``@app.action(batch=...)``): scheduled one item per row, run
    with a list of items. Its signature, for scheduling, is the item's; ``batch_fn`` is
    the function as written."""

    batch: Batch

    def __init__(
        self,
        fn: Callable[..., Awaitable[Any]],
        *,
        name: str | None,
        timeout: float | None,
        ctx_types: tuple[type, ...],
        batch: Batch | None = None,
    ) -> None:
        if not isinstance(batch, Batch):
            raise RegistrationError(f"batch= takes a durafn.Batch(...), not {batch!r}")
        item, result = _item_types(fn)
        one = _one_at_a_time(fn, item, result)
        super().__init__(
            one,
            name=name or f"{fn.__module__}:{fn.__qualname__}",
            timeout=timeout,
            ctx_types=ctx_types,
        )
        self.batch = batch
        self.batch_fn = fn
        self.__wrapped__ = fn  # type: ignore[assignment]  # the function as written

    def item_of(self, args: str) -> Any:
        """The item a row holds, validated (``ArgumentError`` if it no longer fits)."""
        return self.decode_args(args)["item"]

    def key_of(self, values: dict[str, Any]) -> str:
        """The batch key of a call's validated arguments ('' without ``Batch(key)``)."""
        if self.batch.key is None:
            return ""
        try:
            key = self.batch.key(values["item"])
        except Exception as exc:
            raise ArgumentError(f"the batch key of {self.name!r} raised {exc!r}") from None
        what = f"the batch key of {self.name!r}"
        if isinstance(key, str) and len(key) > MAX_KEY:
            raise ArgumentError(f"{what} must be at most {MAX_KEY} characters, not {len(key)}")
        return text(what, key)  # a string, no NUL, valid Unicode


def _item_types(fn: Callable[..., Any]) -> tuple[Any, Any]:
    """The item type and the per-item result type of ``async def f(ctx, items: list[T])
    -> list[R]`` (``Any`` where not annotated)."""
    try:
        params = list(inspect.signature(fn).parameters.values())
        hints = typing.get_type_hints(fn)
    except Exception as exc:
        raise RegistrationError(f"cannot read the signature of {describe(fn)}: {exc}") from exc
    if len(params) != 2 or params[1].kind not in (
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
        inspect.Parameter.POSITIONAL_ONLY,
    ):
        raise RegistrationError(
            f"a batched action takes the context and the list of items: async def "
            f"{getattr(fn, '__name__', 'f')}(ctx: ActionCtx, items: list[Item]); "
            f"{describe(fn)} does not"
        )
    return _element(hints.get(params[1].name), "items"), _element(hints.get("return"), "return")


def _element(hint: Any, what: str) -> Any:
    if hint is None:
        return Any
    if (
        typing.get_origin(hint) not in (list, collections.abc.Sequence)
        or len(typing.get_args(hint)) != 1
    ):
        raise RegistrationError(
            f"a batched action's {what} type must be list[...] (one per item), not {hint!r}"
        )
    [element] = typing.get_args(hint)
    if typing.get_origin(element) in (typing.Union, types.UnionType):
        kept = [a for a in typing.get_args(element) if a is not ItemFailed]
        element = functools.reduce(operator.or_, kept) if kept else Any
    return Any if element is ItemFailed else element


def _one_at_a_time(fn: Callable[..., Awaitable[Any]], item: Any, result: Any) -> Any:
    """``fn`` as a function of one item (the scheduling signature, and how a row that
    reaches a worker alone runs: a batch of one)."""

    async def one(ctx: Any, item: Any) -> Any:
        [outcome] = split_results(await fn(ctx, [item]), 1, describe(fn))
        if isinstance(outcome, ItemFailed):
            raise outcome.error
        return outcome

    one.__annotations__ = {"item": item, "return": result}
    one.__module__, one.__qualname__, one.__name__ = fn.__module__, fn.__qualname__, fn.__name__
    one.__doc__ = fn.__doc__
    return one


publish(globals())
