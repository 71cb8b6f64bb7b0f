"""Cron expressions: parsing, validation and next-fire times, with no I/O.

``parse(expression, timezone="UTC")`` reads the OJS cron grammar: 5 fields (minute, hour,
day of month, month, day of week) or 6 with seconds first; ``*``, lists, ranges and
steps; ``L``, ``LW``, ``nW``, ``nL``, ``n#k``; month and weekday names; the ``@yearly``
family; and ``@every 1h30m``. The zone is an IANA geographic zone, and daylight saving
is exact: a wall time in the spring-forward gap does not fire, one in the fall-back fold
fires once (a periodic job, hour ``*`` or ``*/n``, in both passes). See ``_schedule`` for
the search and ``_fields`` for the grammar.
"""

from __future__ import annotations

import re
from datetime import timedelta

from .._errors import CronSyntaxError
from ._crontab import CronItem, CronItemOptions, parse_cron_item, parse_crontab
from ._fields import DAY_OF_MONTH, DAY_OF_WEEK, HOUR, MINUTE, MONTH, SECOND, parse_field
from ._helpers import daily, every, hourly, monthly, weekly
from ._schedule import Clock, Days, Every, Schedule
from ._zones import zone as _zone

__all__ = [
    "CronItem",
    "CronItemOptions",
    "CronSyntaxError",
    "Every",
    "Schedule",
    "daily",
    "every",
    "hourly",
    "monthly",
    "parse",
    "parse_cron_item",
    "parse_crontab",
    "weekly",
]

ALIASES = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
_EVERY = re.compile(r"(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?")


def parse(expression: str, timezone: str = "UTC") -> Schedule:
    """A ``Schedule`` for ``expression`` in ``timezone``; ``CronSyntaxError`` names the
    field, the token and the problem."""
    if not isinstance(expression, str):
        raise CronSyntaxError(f"a cron expression is a string, not {expression!r}")
    zone = _zone(timezone)
    text = " ".join(expression.split())
    lowered = text.lower()
    if lowered.startswith("@every"):
        return Every(text, timezone, _interval(text[len("@every") :].strip(), text), zone)
    if text.startswith("@"):
        if lowered not in ALIASES:
            raise CronSyntaxError(
                f"{text!r} is not a cron alias (@yearly, @annually, @monthly, @weekly, "
                "@daily, @midnight, @hourly, @every <duration>)"
            )
        fields = ALIASES[lowered].split()
    else:
        fields = text.split()
    if len(fields) == 5:
        fields = ["0", *fields]
    elif len(fields) != 6:
        raise CronSyntaxError(
            f"{text!r} has {len(fields)} fields; a cron expression has 5 (minute hour "
            "day-of-month month day-of-week) or 6 (seconds first)"
        )
    second, minute, hour, dom, month, dow = (
        parse_field(text, bounds)
        for text, bounds in zip(
            fields, (SECOND, MINUTE, HOUR, DAY_OF_MONTH, MONTH, DAY_OF_WEEK), strict=True
        )
    )
    days = Days(dom, month, dow, vixie=True)
    return Schedule(text, timezone, Clock(second, minute, hour, days, zone))


def _interval(text: str, expression: str) -> timedelta:
    match = _EVERY.fullmatch(text)
    if not text or match is None:
        raise CronSyntaxError(f"{expression!r}: the duration must be like 45s, 30m, 2h or 1h30m")
    hours, minutes, seconds = (int(g) if g else 0 for g in match.groups())
    interval = timedelta(hours=hours, minutes=minutes, seconds=seconds)
    if interval <= timedelta(0):
        raise CronSyntaxError(f"{expression!r}: the duration must be more than 0")
    return interval
