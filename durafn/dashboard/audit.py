"""Every action taken on the dashboard: when, who, what, how many rows; kept for the
page (the last ``KEEP``) and emitted through ``logging`` (``durafn.dashboard``)."""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass
from datetime import datetime

logger = logging.getLogger("durafn.dashboard")
KEEP = 200


@dataclass(frozen=True)
class Entry:
    at: datetime
    who: str
    what: str
    rows: int


class AuditLog:
    def __init__(self) -> None:
        self._entries: deque[Entry] = deque(maxlen=KEEP)

    def record(self, at: datetime, who: str, what: str, rows: int) -> None:
        self._entries.appendleft(Entry(at, who, what, rows))
        logger.info("dashboard: %s %s (%d rows)", who, what, rows)

    def recent(self) -> list[Entry]:
        """Newest first."""
        return list(self._entries)
