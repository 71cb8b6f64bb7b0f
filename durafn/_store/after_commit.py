"""What a transaction asks of this process once it commits, noted by the statements that
cause it: wake the executors (completion callbacks were written), tell running actions
that their rows were cancelled, look for rows a finish freed.

Kept on the connection (``conn.info``, which outlives the checkout): whoever commits takes
the notes (``Runtime.transaction``, a mutation batch, a write joined to a caller's
session) and acts on them after the commit; each transaction first drops what a
rolled-back one may have left.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sqlalchemy.ext.asyncio import AsyncConnection

from .._kinds import FunctionKind

if TYPE_CHECKING:
    from .rows import NewRow

_KEY = "durafn.after_commit"


@dataclass(slots=True)
class AfterCommit:
    wake: set[FunctionKind] = field(default_factory=set)
    """Kinds of rows written that this process's executors should look for."""
    canceled: set[str] = field(default_factory=set)
    """Rows cancelled: actions of theirs running here are told (``Runtime.cancels``)."""
    written: list[NewRow] = field(default_factory=list)
    """Rows durafn wrote on its own (completion callbacks), for inline mode to run."""
    maybe_freed: set[str] = field(default_factory=set)
    """Rows waiting for others (``after=``) whose edges a finish here deleted: free if
    none is left, which the executor looks at once the commit is made
    (``_executor/releases.py``)."""


def note(conn: AsyncConnection) -> AfterCommit:
    """This transaction's notes, to add to."""
    notes = conn.info.get(_KEY)
    if notes is None:
        notes = conn.info[_KEY] = AfterCommit()
    assert isinstance(notes, AfterCommit)
    return notes


def take_notes(conn: AsyncConnection) -> AfterCommit | None:
    """The notes of the transaction on ``conn`` (None if none), cleared."""
    notes = conn.info.pop(_KEY, None)
    assert notes is None or isinstance(notes, AfterCommit)
    return notes
