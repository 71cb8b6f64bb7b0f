"""What the claims of one executor tell the next ones: whether the one-statement fast
path is worth trying (``FastPathHint``), and which priority levels another lane has just
taken the rest of (``LevelFloor``). Hints only: a claim is correct without them.
"""

from __future__ import annotations

import time

from ..._options import PRIORITY_RANGE
from .flow import FlowCursor


class FastPathHint:
    """Whether a claimer should try the one-statement fast path first: not while queued
    rows are due (it then finds nothing, by design), as the last full claim saw; a round
    trip saved per claim of a queued workload."""

    def __init__(self) -> None:
        self.use = True
        self.flow = FlowCursor()
        """Where the next claim's visit of the flow keys starts, and when a spent rate
        budget allows a start again (``flow``)."""
        self.contended = False
        """The last full claim skipped a named queue or a flow key that another claim held
        (``SKIP LOCKED``). That claim usually takes the queue's head or the key's rows and
        its end wakes the others; when it takes nothing (a rate budget it alone knows is
        spent, a head that changed under it), nothing would wake this claimer before its
        poll, so its idle wait looks again soon (``Wakeups.idle_wait``)."""
        self.recheck = 0.0
        """The idle wait's last look-again delay while contended (it doubles)."""


class LevelFloor:
    """The lowest priority level worth reading, as the mutation lanes of one executor
    tell each other. A batch holds its rows' locks until it commits, so when one lane has
    taken the rest of a level, the others' claims found it locked: an empty statement, a
    probe and a statement at the next level, where one would do. For ``hold`` seconds
    (the batch time: how long a batch holds its locks) after a claim took the rest of a
    level, the lanes start above it. A row of a lower level that becomes due meanwhile
    (or is released by a batch that rolled back) waits at most that long. With half the
    rows at random priorities, PostgreSQL drained mutations at 0.88x of the plain rate
    without it (five interleaved runs, 0.81-0.92x).
    """

    def __init__(self, hold: float) -> None:
        self._hold = hold
        self._floor = PRIORITY_RANGE[0]
        self._until = 0.0

    def level(self) -> int:
        if self._floor > PRIORITY_RANGE[0] and time.monotonic() >= self._until:
            self._floor = PRIORITY_RANGE[0]
        return self._floor

    def taken_below(self, level: int) -> None:
        """Every due row under ``level`` is taken (by a claim still holding them)."""
        if level > self.level():
            self._floor, self._until = level, time.monotonic() + self._hold
