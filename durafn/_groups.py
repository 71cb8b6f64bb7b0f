"""Groups: one completion callback once every row of a group has finished for good.

``await ctx.scheduler.group(ids, on_complete=summarize)`` (or ``app.scheduler()``)
writes, through the same scheduler (the same transaction, the same limits), one row of
durafn's own mutation ``durafn:group_complete``, scheduled ``after=`` the group's rows
(``write/dependencies.py``). The trigger that releases it runs in the transaction of the
group's last finish; the mutation then counts the rows' final states and schedules
``summarize(GroupCompletion(...))`` in its own transaction. Both are rows: the callback
is never lost (a crash leaves one of them Pending) and never written twice (a mutation
runs exactly once). Every app registers ``durafn:group_complete``, so every worker runs
it; ``app.functions()`` does not list it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel
from sqlalchemy import func, select

from ._checks import Error
from ._errors import SchedulingError
from ._kinds import FunctionKind, ScheduledFunctionId, State
from ._models import FROZEN
from ._public import publish

GROUP_COMPLETE = "durafn:group_complete"
"""The durable name of durafn's mutation that completes a group."""


class GroupCompletion(BaseModel):
    """How a group finished: what its ``on_complete`` mutation is given.

    Declare the callback's parameter with this type:
    ``async def summarize(ctx, group: durafn.GroupCompletion)``."""

    model_config = FROZEN

    size: int
    """How many rows the group had."""
    succeeded: int
    failed: int
    canceled: int
    missing: int = 0
    """Rows removed (by retention) before the group completed: not counted above."""
    ids: list[ScheduledFunctionId]
    """The group's rows, in the order given."""


def check_group_callback(name: str, value: object, *, error: Error) -> Any:
    """A group's callback: a mutation whose one parameter takes a ``GroupCompletion``."""
    if getattr(value, "kind", None) is not FunctionKind.MUTATION:
        raise error(
            f"{name} must be a mutation (@app.mutation) taking a durafn.GroupCompletion; "
            f"not {value!r}"
        )
    parameters: list[str] = getattr(value, "parameters", [])
    if len(parameters) != 1:
        raise error(
            f"{name}: {getattr(value, 'name', value)!r} takes {len(parameters)} parameters "
            "besides ctx; a group's callback takes one (async def done(ctx, g: "
            "durafn.GroupCompletion))"
        )
    sample = GroupCompletion(size=0, succeeded=0, failed=0, canceled=0, ids=[])
    try:
        value.encode_args((sample,), {})  # type: ignore[attr-defined]
    except Exception as exc:
        raise error(f"{name}: it cannot be given a durafn.GroupCompletion: {exc}") from None
    return value


def group_ids(value: object) -> list[str]:
    if isinstance(value, str) or not isinstance(value, Iterable):
        raise SchedulingError(f"group takes a list of row ids, not {value!r}")
    return list(value)


async def complete_group(ctx: Any, callback: str, ids: list[ScheduledFunctionId]) -> None:
    """``durafn:group_complete``: count the group's final states, schedule its callback."""
    from ._store import scheduled_functions as sf

    states: Counter[str] = Counter()
    for start in range(0, len(ids), 500):  # SQLite's limit on bound parameters
        chunk = ids[start : start + 500]
        rows = await ctx.db.execute(
            select(sf.c.state, func.count()).where(sf.c.id.in_(chunk)).group_by(sf.c.state)
        )
        states.update({state: count for state, count in rows})
    counted = sum(states.values())
    completion = GroupCompletion(
        size=len(ids),
        succeeded=states[State.SUCCESS.value],
        failed=states[State.FAILED.value],
        canceled=states[State.CANCELED.value],
        missing=len(ids) - counted,
        ids=ids,
    )
    await ctx.scheduler.run_after(0, callback, completion)


publish(globals())
