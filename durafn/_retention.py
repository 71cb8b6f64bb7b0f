"""How long finished rows are kept, by state (delayed_job's ``destroy_failed_jobs``):
``Retention(success=0, failed=30 * 86400)`` deletes Success rows at the next sweep and
keeps Failed ones a month. Given to an executor (``retention=``, every function) or to a
function's decorator (its rows only); a state left None keeps the layer beneath's period
(the executor's, then 7 days).
"""

from __future__ import annotations

from dataclasses import dataclass

from ._checks import Error, non_negative_seconds, optional
from ._errors import ArgumentError
from ._kinds import State
from ._public import publish

DEFAULT = 7 * 86400.0
FINISHED = (State.SUCCESS, State.FAILED, State.CANCELED)


@dataclass(frozen=True, slots=True)
class Retention:
    """Seconds a finished row is kept after its ``completed_time``, per final state."""

    success: float | None = None
    failed: float | None = None
    canceled: float | None = None

    def __post_init__(self) -> None:
        for name in ("success", "failed", "canceled"):
            optional(non_negative_seconds, f"Retention {name}", getattr(self, name))

    def of(self, state: State) -> float | None:
        return {State.SUCCESS: self.success, State.FAILED: self.failed}.get(state, self.canceled)

    def over(self, base: dict[State, float]) -> dict[State, float]:
        """Seconds per state: this retention's, the base's where it says nothing."""
        return {s: base[s] if (mine := self.of(s)) is None else mine for s in FINISHED}


def periods(
    value: object, name: str = "retention", error: Error = ArgumentError
) -> dict[State, float]:
    """Seconds per finished state, from a number (every state) or a ``Retention``."""
    if isinstance(value, Retention):
        return value.over(dict.fromkeys(FINISHED, DEFAULT))
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise error(
            f"{name} must be a number of seconds or a durafn.Retention(success=, failed=, "
            f"canceled=), not {value!r}"
        )
    seconds = non_negative_seconds(name, value, error=error)
    return dict.fromkeys(FINISHED, seconds)


def check_retention(name: str, value: object, *, error: Error = ArgumentError) -> Retention:
    if not isinstance(value, Retention):
        raise error(
            f"{name} must be a durafn.Retention(success=, failed=, canceled=), not {value!r}"
        )
    return value


publish(globals())
