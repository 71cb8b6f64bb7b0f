"""One cron field, parsed: the values it allows, and the day rules that need a month.

The grammar (OJS cron, which is Vixie cron's plus ``L``, ``W`` and ``#``): a field is a
comma-separated list of items; an item is ``*``, a value, a range ``a-b`` (``a-a`` is the
one value ``a``; a reversed range is an error), any of those with a step ``/n`` (``a/n``
runs from ``a`` to the end of the field), and in the day fields the month-dependent forms
(``L``, ``LW``, ``nW`` for the day of the month; ``nL`` and ``n#k`` for the day of week).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field

from .._errors import CronSyntaxError

_MONTH_NAMES = ("JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC")
MONTHS = {name: n for n, name in enumerate(_MONTH_NAMES, 1)}
WEEKDAYS = {name: n for n, name in enumerate(("SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"))}


@dataclass(frozen=True, eq=False)  # compared and hashed as the singletons they are
class Bounds:
    name: str
    low: int
    high: int
    names: dict[str, int] = field(default_factory=dict)


SECOND = Bounds("second", 0, 59)
MINUTE = Bounds("minute", 0, 59)
HOUR = Bounds("hour", 0, 23)
DAY_OF_MONTH = Bounds("day-of-month", 1, 31)
MONTH = Bounds("month", 1, 12, MONTHS)
DAY_OF_WEEK = Bounds("day-of-week", 0, 7, WEEKDAYS)  # 7 is Sunday too


@dataclass(frozen=True)
class Field:
    """A parsed field: ``values`` (sorted), whether it began with ``*`` (the Vixie day
    rule and the DST rule look at that), whether it allows every value, and the
    month-dependent day rules it holds."""

    values: tuple[int, ...]
    star: bool
    full: bool
    last_day: bool = False  # L
    last_weekday: bool = False  # LW
    nearest_weekdays: tuple[int, ...] = ()  # nW
    last_of_weekdays: tuple[int, ...] = ()  # nL: the last such weekday of the month
    nth_weekdays: tuple[tuple[int, int], ...] = ()  # n#k: (weekday, k)

    @property
    def month_rules(self) -> bool:
        return bool(
            self.last_day
            or self.last_weekday
            or self.nearest_weekdays
            or self.last_of_weekdays
            or self.nth_weekdays
        )


_NUMBER = re.compile(r"\d+")


@functools.lru_cache(maxsize=1024)
def parse_field(text: str, bounds: Bounds) -> Field:
    """Parse one field; CronSyntaxError names the field, the token and the problem.

    Cached (a ``Field`` is immutable): most expressions share most of their fields
    (``*`` above all), and parsing them again was most of a parse's time."""
    if not text:
        raise CronSyntaxError(f"{bounds.name}: the field is empty")
    values: set[int] = set()
    last_day = last_weekday = False
    nearest: set[int] = set()
    last_of: set[int] = set()
    nth: set[tuple[int, int]] = set()
    for item in text.split(","):
        if not item:
            raise CronSyntaxError(f"{bounds.name}: empty item in {text!r}")
        upper = item.upper()
        if bounds is DAY_OF_MONTH and upper == "L":
            last_day = True
        elif bounds is DAY_OF_MONTH and upper == "LW":
            last_weekday = True
        elif bounds is DAY_OF_MONTH and upper.endswith("W"):
            nearest.add(_value(upper[:-1], bounds, item))
        elif bounds is DAY_OF_WEEK and "#" in upper:
            nth.add(_nth(upper, item))
        elif bounds is DAY_OF_WEEK and upper.endswith("L"):  # no weekday name ends in L
            last_of.add(_value(upper[:-1], bounds, item) % 7)
        else:
            values.update(_item_values(upper, bounds, item))
    if bounds is DAY_OF_WEEK and 7 in values:
        values.discard(7)
        values.add(0)
    top = 6 if bounds is DAY_OF_WEEK else bounds.high
    return Field(
        values=tuple(sorted(values)),
        star=text.startswith("*"),
        full=values >= set(range(bounds.low, top + 1)),
        last_day=last_day,
        last_weekday=last_weekday,
        nearest_weekdays=tuple(sorted(nearest)),
        last_of_weekdays=tuple(sorted(last_of)),
        nth_weekdays=tuple(sorted(nth)),
    )


def _nth(upper: str, item: str) -> tuple[int, int]:
    """``n#k``: the k-th weekday n of the month."""
    day_text, _, nth_text = upper.partition("#")
    weekday = _value(day_text, DAY_OF_WEEK, item) % 7
    if not _NUMBER.fullmatch(nth_text) or not 1 <= int(nth_text) <= 5:
        raise CronSyntaxError(
            f"{DAY_OF_WEEK.name}: in {item!r} the occurrence must be 1 to 5 (n#k: the k-th "
            "weekday n of the month)"
        )
    return weekday, int(nth_text)


def _item_values(upper: str, bounds: Bounds, item: str) -> range:
    """``*``, ``a``, ``a-b``, each optionally ``/step``."""
    body, slash, step_text = upper.partition("/")
    step = 1
    if slash:
        if not _NUMBER.fullmatch(step_text):
            raise CronSyntaxError(f"{bounds.name}: the step in {item!r} is not a number")
        step = int(step_text)
        if step == 0:
            raise CronSyntaxError(f"{bounds.name}: the step in {item!r} is 0")
    high = 6 if bounds is DAY_OF_WEEK and body == "*" else bounds.high
    if body == "*":
        low = bounds.low
    elif "-" in body:
        first, _, last = body.partition("-")
        low, high = _value(first, bounds, item), _value(last, bounds, item)
        if low > high:
            raise CronSyntaxError(f"{bounds.name}: the range {item!r} is reversed ({low} > {high})")
    else:
        low = _value(body, bounds, item)
        if not slash:
            return range(low, low + 1)
        # a/n: from a to the end of the field
        high = 6 if bounds is DAY_OF_WEEK else bounds.high
    return range(low, high + 1, step)


def _value(text: str, bounds: Bounds, item: str) -> int:
    if text in bounds.names:
        return bounds.names[text]
    if not _NUMBER.fullmatch(text):
        what = "a name or number" if bounds.names else "a number"
        raise CronSyntaxError(f"{bounds.name}: {item!r} is not {what}")
    value = int(text)
    if not bounds.low <= value <= bounds.high:
        raise CronSyntaxError(f"{bounds.name}: {value} is out of range {bounds.low}-{bounds.high}")
    return value
