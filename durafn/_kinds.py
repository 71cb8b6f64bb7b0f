"""The states a row goes through, the kinds of function, and row ids: plain enums and a
string type, with no pydantic under them (``_models`` has the models), so that what
needs only these (the command line's options, the checks) loads without it."""

from __future__ import annotations

import enum
from typing import NewType

from ._public import publish

ScheduledFunctionId = NewType("ScheduledFunctionId", str)
"""The id of a row of ``_scheduled_functions``: a time-ordered UUID in text form."""


class State(enum.StrEnum):
    """The state of a scheduled function, as stored (the names Convex uses)."""

    PENDING = "Pending"
    IN_PROGRESS = "InProgress"
    SUCCESS = "Success"
    FAILED = "Failed"
    CANCELED = "Canceled"

    @property
    def finished(self) -> bool:
        return self in FINISHED_STATES


FINISHED_STATES = frozenset({State.SUCCESS, State.FAILED, State.CANCELED})


class FunctionKind(enum.StrEnum):
    """What kind of function a row or reference is."""

    QUERY = "query"
    MUTATION = "mutation"
    ACTION = "action"

    @property
    def with_article(self) -> str:
        """ "a mutation", "an action", "a query": for messages."""
        return f"an {self.value}" if self.value[0] in "aeiou" else f"a {self.value}"


publish(globals())
