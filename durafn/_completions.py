"""Completion callbacks (``on_complete``): which mutations may be one, and what a row
keeps of its callback.

``on_complete=fn`` is a job option (per call, ``ref.options(on_complete=fn)``, or on the
decorator): ``fn`` is a registered mutation taking one ``Completion``, scheduled when the
row finishes for good (Success, Failed after its last attempt, Canceled). The row keeps
the callback as data (``_options.resolve``: its name, its parameter, its options resolved when the
row is scheduled), so whichever process finishes, cancels or rescues the row writes the
callback's row in the same transaction, without the callback's code
(``_store/write/completions.py``). A callback row has no callback of its own.
"""

from __future__ import annotations

import functools
from typing import Any, Protocol

from ._checks import Error
from ._errors import DurafnError
from ._kinds import FunctionKind, ScheduledFunctionId, State


class CompletionCallback(Protocol):
    """What a completion callback is to the options that carry it: a registered
    mutation's reference (``durafn.MutationRef``), seen through what they read of it."""

    @property
    def kind(self) -> FunctionKind: ...
    @property
    def name(self) -> str: ...
    @property
    def parameters(self) -> list[str]: ...
    @property
    def registered(self) -> CompletionCallback: ...
    def encode_args(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str: ...
    def __hash__(self) -> int: ...  # checked once per function (``_unfit``)


def check_on_complete(name: str, value: object, *, error: Error) -> CompletionCallback:
    """A completion callback: a mutation whose one parameter takes a ``Completion``."""
    if getattr(value, "kind", None) is not FunctionKind.MUTATION:
        raise error(
            f"{name} must be a mutation (@app.mutation), scheduled with the Completion when "
            f"the row finishes for good; not {value!r}"
        )
    ref: CompletionCallback = value  # type: ignore[assignment]  # a MutationRef: its kind
    problem = _unfit(ref.registered)
    if problem is not None:
        raise error(f"{name}: {problem}")
    return ref


@functools.lru_cache(maxsize=256)
def _unfit(ref: CompletionCallback) -> str | None:
    """Why ``ref`` cannot be a callback, or None (checked once per function)."""
    if len(ref.parameters) != 1:
        return (
            f"{ref.name!r} takes {len(ref.parameters)} parameters besides ctx; a completion "
            "callback takes one, the Completion (async def done(ctx, c: durafn.Completion))"
        )
    from ._models import Completion  # pydantic's: loaded once a callback is checked

    sample = Completion(
        id=ScheduledFunctionId("00000000-0000-7000-8000-000000000000"),
        name="sample",
        state=State.SUCCESS,
    )
    try:
        ref.encode_args((sample,), {})
    except DurafnError as exc:
        return f"{ref.name!r} cannot be given a durafn.Completion: {exc}"
    return None
