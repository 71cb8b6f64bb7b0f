"""Helpers for the common schedules, as cron expressions: no cron syntax to remember."""

from __future__ import annotations

from .._errors import CronSyntaxError

_DAYS = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")


def every(*, hours: int = 0, minutes: int = 0, seconds: int = 0) -> str:
    """An interval from the cron's registration or last tick: ``@every 1h30m``."""
    for name, value in (("hours", hours), ("minutes", minutes), ("seconds", seconds)):
        _check_int(name, value, 0, 10**6)
    if not (hours or minutes or seconds):
        raise CronSyntaxError("every() needs a positive interval: hours, minutes or seconds")
    parts = [f"{v}{u}" for v, u in ((hours, "h"), (minutes, "m"), (seconds, "s")) if v]
    return "@every " + "".join(parts)


def hourly(*, minute: int = 0) -> str:
    """At ``minute`` past every hour."""
    return f"{_check_int('minute', minute, 0, 59)} * * * *"


def daily(*, hour: int = 0, minute: int = 0) -> str:
    """Every day at ``hour:minute`` (in the cron's time zone)."""
    return f"{_check_int('minute', minute, 0, 59)} {_check_int('hour', hour, 0, 23)} * * *"


def weekly(day: str = "sun", *, hour: int = 0, minute: int = 0) -> str:
    """Every week on ``day`` (``"mon"`` ... ``"sun"``) at ``hour:minute``."""
    if not isinstance(day, str) or day.lower()[:3] not in _DAYS:
        raise CronSyntaxError(f"weekly() day must be one of {', '.join(_DAYS)}, not {day!r}")
    return f"{_check_int('minute', minute, 0, 59)} {_check_int('hour', hour, 0, 23)} * * {day[:3]}"


def monthly(*, day: int = 1, hour: int = 0, minute: int = 0) -> str:
    """Every month on ``day`` (1-31; a month without it is skipped) at ``hour:minute``."""
    return (
        f"{_check_int('minute', minute, 0, 59)} {_check_int('hour', hour, 0, 23)} "
        f"{_check_int('day', day, 1, 31)} * *"
    )


def _check_int(name: str, value: object, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise CronSyntaxError(f"{name} must be an integer from {low} to {high}, not {value!r}")
    return value
