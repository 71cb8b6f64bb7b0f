"""The options commands share (``--app``, ``--url``, ``--json``, ``--verbose``) and the
parsing of option values (states, date-times)."""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Collection, Sequence
from datetime import UTC, datetime
from typing import ParamSpec, TypeVar

import click

from .._kinds import State

P = ParamSpec("P")
T = TypeVar("T")

URL_HELP = (
    "Database URL (sqlite:///file.db or postgresql://user@host/db); default $DURAFN_DATABASE_URL."
)
APP_HELP = "The app, as pkg.module:attribute (default attribute: app); default $DURAFN_APP."


# -- shared options ----------------------------------------------------------------------


def app_options(f: Callable[P, T]) -> Callable[P, T]:
    f = click.option("--app", "app_ref", envvar="DURAFN_APP", metavar="MODULE:APP", help=APP_HELP)(
        f
    )
    return click.option("--url", envvar="DURAFN_DATABASE_URL", help=URL_HELP)(f)


def output_options(f: Callable[P, T]) -> Callable[P, T]:
    f = click.option("--json", "as_json", is_flag=True, help="Machine-readable JSON output.")(f)
    return verbose_option(f)


def verbose_option(f: Callable[P, T]) -> Callable[P, T]:
    return click.option("--verbose", "-v", is_flag=True, help="Show tracebacks on errors.")(f)


# -- option values -----------------------------------------------------------------------

STATE_NAMES = {s.value.lower(): s for s in State} | {
    "in-progress": State.IN_PROGRESS,
    "cancelled": State.CANCELED,
}
"""What ``--state`` accepts, in any case: the stored names and the spellings people type."""


def state_choice(allowed: Collection[State]) -> click.Choice[str]:
    names = [name for name, state in STATE_NAMES.items() if state in allowed]
    return click.Choice(names, case_sensitive=False)


def to_states(ctx: click.Context, param: click.Parameter, values: Sequence[str]) -> list[State]:
    return [STATE_NAMES[value.lower()] for value in values]


def to_datetime_option(
    ctx: click.Context, param: click.Parameter, value: str | None
) -> datetime | None:
    """ISO 8601; without a zone, UTC (the zone durafn shows every time in)."""
    if value is None:
        return None
    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        raise click.BadParameter(
            f"{value!r} is not an ISO 8601 date-time (e.g. 2030-01-31T12:00:00Z)"
        ) from None
    return when if when.tzinfo else when.replace(tzinfo=UTC)


class Seconds(click.ParamType):  # type: ignore[type-arg]
    """A finite number of seconds, at least ``minimum`` (``positive``: above it) and at
    most a century: ``nan``, ``inf`` and ``1e300`` are usage errors, not an overflow later."""

    name = "seconds"
    CENTURY = 100 * 365.25 * 86400

    def __init__(self, minimum: float = 0.0, *, positive: bool = False) -> None:
        self.minimum = minimum
        self.positive = positive

    def convert(
        self, value: object, param: click.Parameter | None, ctx: click.Context | None
    ) -> float:
        if isinstance(value, float):
            seconds = value
        else:
            try:
                seconds = float(str(value))
            except ValueError:
                self.fail(f"{value!r} is not a number of seconds", param, ctx)
        if not math.isfinite(seconds) or seconds > self.CENTURY:
            self.fail(f"{value} is not a finite number of seconds up to a century", param, ctx)
        if seconds < self.minimum or (self.positive and seconds == self.minimum):
            relation = ">" if self.positive else ">="
            self.fail(f"{seconds!r} is not in the range x{relation}{self.minimum:g}", param, ctx)
        return seconds


def stdin_is_terminal() -> bool:
    return sys.stdin.isatty()
