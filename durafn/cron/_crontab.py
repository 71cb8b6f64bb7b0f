"""Graphile Worker's crontab lines: ``* * * * * task ?opts {payload}``.

Graphile's grammar and its error messages, so that a crontab written for Graphile Worker
reads the same here: five UTC time fields in a narrower grammar than ``parse``'s (numbers,
``*``, ``*/n``, strictly increasing ranges, lists; ``7`` is Sunday; no names, no ``L``,
``W`` or ``#``), a task identifier, ``?opts`` in query-string form, and a JSON5 payload
object. Days: when neither day set is full, either may match (Graphile's rule).
"""

from __future__ import annotations

import itertools
import re
import urllib.parse
import zoneinfo
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import json5

from .._errors import CronSyntaxError
from ._fields import Field
from ._schedule import Clock, Days, Schedule

_LINE = re.compile(
    r"^([0-9*/,-]+)\s+([0-9*/,-]+)\s+([0-9*/,-]+)\s+([0-9*/,-]+)\s+([0-9*/,-]+)\s+(.*)$"
)
_COMMAND = re.compile(r"^([_a-zA-Z][_a-zA-Z0-9:/_-]*)(?:\s+\?([^\s]+))?(?:\s+(\{.*\}))?$")
_NUMBER = re.compile(r"^([0-9]+)$")
_RANGE = re.compile(r"^([0-9]+)-([0-9]+)$")
_WILDCARD = re.compile(r"^\*(?:/([0-9]+))?$")
_TIME_PHRASE_PART = re.compile(r"^([0-9]+)([smhdw])")
_PERIODS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_OPTIONS = {
    "id": re.compile(r"^([_a-zA-Z][-_a-zA-Z0-9]*)$"),
    "fill": re.compile(r"^((?:[0-9]+[smhdw])+)$"),
    "max": re.compile(r"^([0-9]+)$"),
    "queue": re.compile(r"^([-a-zA-Z0-9_:]+)$"),
    "jobKey": re.compile(r"^(.*)$"),
    "jobKeyMode": re.compile(r"^(replace|preserve_run_at)$"),
    "priority": re.compile(r"^(-?[0-9]+)$"),
}
_RANGES = (
    ("minutes", 0, 59),
    ("hours", 0, 23),
    ("dates", 1, 31),
    ("months", 1, 12),
    ("days of week", 0, 6),
)


@dataclass(frozen=True)
class CronItemOptions:
    """A crontab line's ``?opts``: Graphile's names in Python's spelling."""

    backfill_period: timedelta = timedelta(0)
    """``fill``: how far back to fill in runs that were missed (0: none)."""
    max_attempts: int | None = None
    queue: str | None = None
    priority: int | None = None
    job_key: str | None = None
    job_key_mode: str | None = None
    """``replace`` (the default once ``jobKey`` is given) or ``preserve_run_at``."""


@dataclass(frozen=True)
class CronItem:
    """One crontab line: its time sets, task, identifier, options and payload, and the
    ``Schedule`` they make (UTC)."""

    minutes: list[int]
    hours: list[int]
    dates: list[int]
    months: list[int]
    dows: list[int]
    task: str
    identifier: str
    options: CronItemOptions
    payload: dict[str, Any] | None
    schedule: Schedule = field(compare=False, repr=False)


def parse_crontab(text: str) -> list[CronItem]:
    """Every item of a crontab file (comment lines start with ``#``); identifiers must
    be unique."""
    items = [
        parse_cron_item(line, number)
        for number, line in enumerate(text.splitlines(), 1)
        if line.strip() and not line.strip().startswith("#")
    ]
    identifiers = sorted(item.identifier for item in items)
    duplicates = sorted({a for a, b in itertools.pairwise(identifiers) if a == b})
    if duplicates:
        found = "', '".join(duplicates)
        raise CronSyntaxError(
            f"Invalid crontab; duplicate identifiers found: '{found}' - please use "
            "'?id=...' to specify unique identifiers for your cron items"
        )
    return items


def parse_cron_item(line: str, line_number: int = 1) -> CronItem:
    """One crontab line, such as ``30 4 * * 1 send_weekly_email ?fill=2d {a: 1}``
    (whitespace around it, as in Graphile's own test file, is no part of it)."""
    line = line.strip()
    matches = _LINE.match(line)
    if matches is None:
        raise CronSyntaxError(
            f"Could not process line '{line_number}' of crontab: '{line}': {_why(line)}"
        )
    where = f"line {line_number} of crontab"
    sets = [
        _range(f"{name} range in {where}", matches[i], low, high, wrap=name == "days of week")
        for i, (name, low, high) in enumerate(_RANGES, 1)
    ]
    command = _COMMAND.match(matches[6].strip())
    if command is None:
        raise CronSyntaxError(
            f"Invalid command specification in line {line_number} of crontab: "
            f"{_why_command(matches[6].strip())}"
        )
    task, options_text, payload_text = command.groups()
    options, identifier = _options(line_number, options_text)
    payload = _payload(line_number, payload_text)
    minutes, hours, dates, months, dows = sets
    fields = [
        _field(values, low, high) for values, (_, low, high) in zip(sets, _RANGES, strict=True)
    ]
    days = Days(fields[2], fields[3], fields[4], vixie=False)
    clock = Clock(Field((0,), False, False), fields[0], fields[1], days, zoneinfo.ZoneInfo("UTC"))
    return CronItem(
        minutes=minutes,
        hours=hours,
        dates=dates,
        months=months,
        dows=dows,
        task=task,
        identifier=identifier or task,
        options=options,
        payload=payload,
        schedule=Schedule(" ".join(line.split()[:5]), "UTC", clock),
    )


_TIME_FIELD = re.compile(r"^[0-9*/,-]+$")
_NAMES = re.compile(r"[a-zA-Z]{3}")
_TASK = re.compile(r"^[_a-zA-Z][_a-zA-Z0-9:/_-]*$")


def _why(line: str) -> str:
    """What keeps a line from being ``_LINE``: Graphile says only that it could not."""
    words = line.split()
    if len(words) < 6:
        return (
            f"expected five time fields (minute hour day month weekday) and a task, found "
            f"{len(words)} field{'s' if len(words) != 1 else ''}"
        )
    for name, word in zip((r[0] for r in _RANGES), words[:5], strict=True):
        if not _TIME_FIELD.match(word):
            if _NAMES.search(word):
                return f"names are not allowed in a Graphile line: {word} (the {name} field)"
            return (
                f"the {name} field {word!r} is not numbers, *, */n, ranges or lists of "
                "them (no L, W, # or ?)"
            )
    return "it is not five time fields followed by a task"  # pragma: no cover


def _why_command(text: str) -> str:
    task, _, rest = text.partition(" ")
    if not _TASK.match(task):
        return (
            f"the task identifier {task!r} must start with a letter or _ and hold only "
            "letters, digits and _ : - /"
        )
    rest = rest.strip()
    if rest.startswith("?"):
        _, _, rest = rest.partition(" ")
        rest = rest.strip()
    if rest and not (rest.startswith("{") and rest.endswith("}")):
        return f"after the task (and ?options), only a {{JSON5 payload}} may follow, not {rest!r}"
    return f"{text!r} is not: task ?options {{payload}}"  # pragma: no cover


def _field(values: list[int], low: int, high: int) -> Field:
    return Field(tuple(values), star=False, full=values == list(range(low, high + 1)))


def _range(where: str, text: str, low: int, high: int, *, wrap: bool = False) -> list[int]:
    """Graphile's range: numbers, ``a-b`` (b > a), ``*`` or ``*/n``, comma-separated."""
    numbers: set[int] = set()

    def add(number: int) -> None:
        value = low if wrap and number == high + 1 else number
        if value > high:
            raise CronSyntaxError(
                f"Too large value '{number}' in {where}: expected values in the range {low}-{high}."
            )
        if value < low:
            raise CronSyntaxError(
                f"Too small value '{number}' in {where}: expected values in the range {low}-{high}."
            )
        numbers.add(value)

    for part in text.split(","):
        if number := _NUMBER.match(part):
            add(int(number[1]))
        elif span := _RANGE.match(part):
            first, last = int(span[1]), int(span[2])
            if last <= first:
                raise CronSyntaxError(
                    f"Invalid range '{part}' in {where}: destination is not larger than source"
                )
            for value in range(first, last + 1):
                add(value)
        elif wildcard := _WILDCARD.match(part):
            divisor = int(wildcard[1]) if wildcard[1] else 1
            if divisor < 1:
                raise CronSyntaxError(
                    f"Invalid wildcard expression '{part}' in {where}: divisor "
                    f"'{wildcard[1]}' expected to be greater than zero"
                )
            numbers.update(range(low, high + 1, divisor))
        else:
            raise CronSyntaxError(
                f"Unsupported syntax '{part}' in {where}: this doesn't appear to be a number, "
                "range or wildcard"
            )
    return sorted(numbers)


def _options(line_number: int, text: str | None) -> tuple[CronItemOptions, str | None]:
    if text is None:
        return CronItemOptions(), None
    values: dict[str, str] = {}
    for key, value in urllib.parse.parse_qsl(text, keep_blank_values=True):
        if key in values:
            raise CronSyntaxError(
                f"Options on line {line_number} of crontab contains invalid value for "
                f"'{key}', did you specify it more than once?"
            )
        if key not in _OPTIONS:
            supported = "', '".join(_OPTIONS)
            raise CronSyntaxError(
                f"Options on line {line_number} of crontab contains unsupported key '{key}'; "
                f"supported keys are: '{supported}'."
            )
        if not _OPTIONS[key].match(value):
            raise CronSyntaxError(
                f"Options on line {line_number} of crontab contains invalid value for "
                f"'{key}', value '{value}' is not compatible with this option."
            )
        values[key] = value
    job_key = values.get("jobKey")
    options = CronItemOptions(
        backfill_period=_time_phrase(values["fill"]) if "fill" in values else timedelta(0),
        max_attempts=int(values["max"]) if "max" in values else None,
        queue=values.get("queue"),
        priority=int(values["priority"]) if "priority" in values else None,
        job_key=job_key,
        job_key_mode=values.get("jobKeyMode", "replace") if job_key is not None else None,
    )
    return options, values.get("id")


def _time_phrase(text: str) -> timedelta:
    """``4w3d2h1m``: weeks, days, hours, minutes and seconds."""
    remaining, seconds = text, 0
    while remaining:
        part = _TIME_PHRASE_PART.match(remaining)
        if part is None:  # pragma: no cover - the option's own pattern admits none such
            raise CronSyntaxError(f"Invalid time phrase '{text}', did not understand '{remaining}'")
        seconds += int(part[1]) * _PERIODS[part[2]]
        remaining = remaining[part.end() :]
    return timedelta(seconds=seconds)


def _payload(line_number: int, text: str | None) -> dict[str, Any] | None:
    if text is None:
        return None
    try:
        value = json5.loads(text)
    except ValueError as exc:
        raise CronSyntaxError(
            f"Failed to parse JSON5 payload on line {line_number} of crontab: {exc}"
        ) from None
    if not isinstance(value, dict):  # pragma: no cover - the line's pattern wants "{...}"
        raise CronSyntaxError(f"The payload on line {line_number} of crontab is not an object")
    return value
