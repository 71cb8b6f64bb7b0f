"""Completion callbacks (``on_complete``): which mutations may be one, and what a row
keeps of its callback.

``on_complete=fn`` is a job option (per call, ``ref.options(on_complete=fn)``, or on the
decorator): ``fn`` is a registered mutation taking one ``Completion``, scheduled when the
row finishes for good (Success, Failed after its last attempt, Canceled). The row keeps
the callback as data (``spec``: its name, its parameter, its options resolved when the
row is scheduled), so whichever process finishes, cancels or rescues the row writes the
callback's row in the same transaction, without the callback's code
(``_store/_completions.py``). A callback row has no callback of its own.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ._checks import Error
from ._errors import DurafnError
from ._registry import MutationRef
from ._types import Completion, ScheduledFunctionId, State

if TYPE_CHECKING:
    from ._options import Queue, RowOptions

_SAMPLE = Completion(
    id=ScheduledFunctionId("00000000-0000-7000-8000-000000000000"),
    name="sample",
    state=State.SUCCESS,
)


def check_on_complete(name: str, value: object, *, error: Error) -> MutationRef[Any, Any]:
    """A completion callback: a mutation whose one parameter takes a ``Completion``."""
    if not isinstance(value, MutationRef):
        raise error(
            f"{name} must be a mutation (@app.mutation), scheduled with the Completion when "
            f"the row finishes for good; not {value!r}"
        )
    problem = _unfit(value.registered)
    if problem is not None:
        raise error(f"{name}: {problem}")
    return value


@functools.lru_cache(maxsize=256)
def _unfit(ref: MutationRef[Any, Any]) -> str | None:
    """Why ``ref`` cannot be a callback, or None (checked once per function)."""
    if len(ref.parameters) != 1:
        return (
            f"{ref.name!r} takes {len(ref.parameters)} parameters besides ctx; a completion "
            "callback takes one, the Completion (async def done(ctx, c: durafn.Completion))"
        )
    try:
        ref.encode_args((_SAMPLE,), {})
    except DurafnError as exc:
        return f"{ref.name!r} cannot be given a durafn.Completion: {exc}"
    return None


def spec(
    ref: MutationRef[Any, Any],
    options: RowOptions,
    queues: Mapping[str, Queue],
) -> str:
    """What a row keeps of its callback ``ref``, whose own options resolve to ``options``."""
    attributes = queues.get(options.queue) if options.queue is not None else None
    return json.dumps(
        {
            "name": ref.name,
            "param": ref.parameters[0],
            "priority": options.priority,
            "queue": options.queue,
            "concurrency": 1 if attributes is None else attributes.concurrency,
            "flags": options.flags,
            "retry": options.retry,
            "max_attempts": options.max_attempts,
        },
        separators=(",", ":"),
    )
