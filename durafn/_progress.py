"""A running action's progress (``ctx.progress``): validated, then written to its row at
most once per ``INTERVAL`` seconds of the app's clock.

A call within the interval of the last write is not written; the first call after it
writes its own, newer, report. A loop that reports every item costs one statement a
second, not one an item, and a run that never reports costs nothing; the price is that a
report made less than ``INTERVAL`` after the last write, with none after it, is not
stored (a run's last report before it ends, if it came that soon).
"""

from __future__ import annotations

import math

from ._checks import is_number, text
from ._errors import ArgumentError
from ._kinds import ScheduledFunctionId
from ._runtime import Runtime

INTERVAL = 1.0
"""Seconds between two writes of one run's progress."""
MAX_MESSAGE = 1000
"""Characters of a progress message kept (a status line, not a log)."""


def checked(fraction: object, message: object) -> tuple[float, str | None]:
    if not is_number(fraction) or not math.isfinite(fraction) or not 0 <= fraction <= 1:
        raise ArgumentError(f"progress must be a number from 0 to 1, not {fraction!r}")
    if message is not None:
        text("the progress message", message)
        assert isinstance(message, str)
        if len(message) > MAX_MESSAGE:
            raise ArgumentError(
                f"the progress message must be at most {MAX_MESSAGE} characters, not "
                f"{len(message)}: report a status line, and log the rest"
            )
    return float(fraction), message


class Progress:
    """One run's reports, and when the last was written."""

    __slots__ = ("_id", "_rt", "_written_at")

    def __init__(self, rt: Runtime, id: ScheduledFunctionId) -> None:
        self._rt, self._id = rt, id
        self._written_at = -math.inf

    async def report(self, fraction: float, message: str | None) -> bool:
        """Write it if the interval has passed since the last write; returns whether it
        was written (False also when the row has ended meanwhile)."""
        now = self._rt.clock.now()
        if now - self._written_at < INTERVAL:
            return False
        self._written_at = now
        driver = self._rt.driver
        return await self._rt.transaction(
            lambda conn: driver.set_progress(conn, self._id, fraction, message),
            doing="recording progress",
            single_statement=True,
        )
