"""A schedule in a short line of English, for the CLI, dashboards and error messages:
``at 09:00 on Monday through Friday, America/New_York``."""

from __future__ import annotations

import calendar
from collections.abc import Callable, Sequence

from ._fields import Field

_WEEKDAYS = ("Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday")
_ORDINALS = {1: "first", 2: "second", 3: "third", 4: "fourth", 5: "fifth"}


def describe(
    second: Field, minute: Field, hour: Field, dom: Field, month: Field, dow: Field, zone: str
) -> str:
    parts = [_time(second.values, minute, hour)]
    days = _days(dom, dow)
    if days:
        parts.append(days)
    if not month.full:
        parts.append("in " + _spans(month.values, lambda m: calendar.month_name[m]))
    return " ".join(parts) + f", {zone}"


def _time(seconds: Sequence[int], minute: Field, hour: Field) -> str:
    minutes, hours = minute.values, hour.values
    at_second = seconds != (0,)
    if len(hours) == 1 and len(minutes) == 1 and len(seconds) == 1:
        clock = f"{hours[0]:02d}:{minutes[0]:02d}"
        return f"at {clock}:{seconds[0]:02d}" if at_second else f"at {clock}"
    prefix = ""
    if at_second:
        noun = "second" if len(seconds) == 1 else "seconds"
        prefix = "every second" if len(seconds) == 60 else f"at {noun} {_list(seconds)}"
        if minute.full and hour.full:
            return prefix if len(seconds) == 60 else prefix + " of every minute"
        prefix += ", "
    if minute.full and hour.full:
        return "every minute"
    if step := _step(minutes, 60):
        what = f"every {step} minutes"
    elif len(minutes) == 1:
        what = f"at minute {minutes[0]}"
    else:
        what = f"at minutes {_list(minutes)}"
    if hour.full:
        return prefix + (what if step else what + " of every hour")
    if hour_step := _step(hours, 24):
        return prefix + f"{what}, every {hour_step} hours"
    return (
        prefix + f"{what} past hour {_list(hours)}"
        if len(hours) == 1
        else (prefix + f"{what} past hours {_list(hours)}")
    )


def _days(dom: Field, dow: Field) -> str:
    by_dom = _dom(dom)
    by_dow = _dow(dow)
    if by_dom and by_dow:
        return f"{by_dom} or {by_dow}"
    return by_dom or by_dow


def _dom(dom: Field) -> str:
    if dom.full and not dom.month_rules:
        return ""
    parts = []
    if dom.values and not dom.full:
        parts.append(f"day {_list(dom.values)} of the month")
    if dom.last_day:
        parts.append("the last day of the month")
    if dom.last_weekday:
        parts.append("the last weekday of the month")
    parts += [f"the weekday nearest day {d}" for d in dom.nearest_weekdays]
    return "on " + " and ".join(parts)


def _dow(dow: Field) -> str:
    if dow.full and not dow.month_rules:
        return ""
    parts = []
    if dow.values and not dow.full:
        parts.append(_spans(dow.values, lambda d: _WEEKDAYS[d]))
    parts += [f"the last {_WEEKDAYS[d]} of the month" for d in dow.last_of_weekdays]
    parts += [f"the {_ORDINALS[k]} {_WEEKDAYS[d]} of the month" for d, k in dow.nth_weekdays]
    return "on " + " and ".join(parts)


def _step(values: Sequence[int], cycle: int) -> int | None:
    """n if ``values`` are 0, n, 2n, ... through the whole cycle (n > 1)."""
    if len(values) < 2 or values[0] != 0:
        return None
    step = values[1] - values[0]
    expected = list(range(0, cycle, step))
    return step if step > 1 and list(values) == expected else None


def _list(values: Sequence[int]) -> str:
    return _spans(values, str)


def _spans(values: Sequence[int], label: Callable[[int], str]) -> str:
    """``Monday through Friday``, ``1, 15 and 30``: runs of three or more become ranges."""
    runs: list[list[int]] = []
    for value in values:
        if runs and value == runs[-1][-1] + 1:
            runs[-1].append(value)
        else:
            runs.append([value])
    words: list[str] = []
    for run in runs:
        if len(run) >= 3:
            words.append(f"{label(run[0])} through {label(run[-1])}")
        else:
            words.extend(label(v) for v in run)
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]
