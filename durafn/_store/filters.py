"""``RowFilter``: which rows a listing, a bulk cancel or a reschedule applies to.

One filter for every operator route, so ``list``, ``cancel_where`` and ``reschedule`` (and
the CLI commands over them) select rows the same way.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, replace

from sqlalchemy.sql.elements import ColumnElement

from .._kinds import State
from .schema.tables import sf
from .sql import argument_contains, argument_is, carries


@dataclass(frozen=True, slots=True)
class RowFilter:
    """Rows matching every field that is set (None: any)."""

    states: Sequence[State] | None = None
    name: str | None = None
    queue: str | None = None
    key: str | None = None
    flag: str | None = None
    """Rows carrying this flag."""
    error_type: str | None = None
    """Rows whose last error is of this type (a failure group, ``app.failure_groups()``)."""
    after: float | None = None
    """``scheduled_time >= after``."""
    before: float | None = None
    """``scheduled_time < before``."""
    ids: Sequence[str] | None = None
    parent: str | None = None
    """Rows this row scheduled (ix_scheduled_functions_parent)."""
    args: tuple[tuple[str, str | int | float | bool], ...] = ()
    """(dotted path, JSON scalar): rows whose argument there equals it (no index: a
    filter of the rows the other terms and the order read)."""
    contains: tuple[tuple[str, str | int | float | bool], ...] = ()
    """(dotted path, JSON scalar): rows whose argument there contains it (an array with
    it as an element, a string with it as a part, or equal)."""

    def digest(self) -> str:
        """A short fingerprint of these filters, carried by a listing's cursors so that a
        cursor is refused by a listing with other filters."""
        states = sorted(self.states or (), key=list(State).index)
        ids = sorted(self.ids or ())
        canonical = repr(replace(self, states=tuple(states), ids=tuple(ids)))
        return hashlib.blake2s(canonical.encode(), digest_size=6).hexdigest()

    def where(self) -> list[ColumnElement[bool]]:
        terms: list[ColumnElement[bool]] = []
        if self.states:
            terms.append(sf.c.state.in_(sorted(State(s).value for s in self.states)))
        if self.name is not None:
            terms.append(sf.c.name == self.name)
        if self.queue is not None:
            terms.append(sf.c.queue_name == self.queue)
        if self.key is not None:
            terms.append(sf.c.job_key == self.key)
        if self.flag is not None:
            terms.append(carries(self.flag))
        if self.error_type is not None:
            terms.append(sf.c.error_type == self.error_type)
        if self.after is not None:
            terms.append(sf.c.scheduled_time >= self.after)
        if self.before is not None:
            terms.append(sf.c.scheduled_time < self.before)
        for path, value in self.args:
            terms.append(argument_is(path, value))
        for path, value in self.contains:
            terms.append(argument_contains(path, value))
        if self.parent is not None:
            terms.append(sf.c.parent_id == self.parent)
        if self.ids is not None:
            terms.append(sf.c.id.in_(list(self.ids)))
        return terms
