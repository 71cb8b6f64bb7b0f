"""``durafn cron``: check a cron expression before it goes into an app."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime

import click

from .._errors import DurafnError
from ..cron import parse
from .options import to_datetime_option, verbose_option
from .output import Output
from .running import fail


@click.group()
def cron() -> None:
    """Cron expressions: check one, and see when it fires."""


@cron.command()
@click.argument("expression")
@click.option("--tz", "timezone", default="UTC", show_default=True, help="IANA time zone.")
@click.option(
    "--count", type=click.IntRange(1, 1000), default=5, show_default=True, help="Fire times."
)
@click.option(
    "--after",
    callback=to_datetime_option,
    metavar="DATETIME",
    help="Count from this time (ISO 8601; UTC if no zone is given) [default: now].",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable JSON output.")
@verbose_option
def check(
    expression: str,
    timezone: str,
    count: int,
    after: datetime | None,
    as_json: bool,
    verbose: bool,
) -> None:
    """Say what EXPRESSION means and print its next fire times, or the error."""
    try:
        schedule = parse(expression, timezone)
    except DurafnError as exc:
        fail(str(exc))
    start = after or datetime.now(UTC)
    times = [t.isoformat() for t in itertools.islice(schedule.iter_after(start), count)]
    out = Output(as_json)
    if as_json:
        out.json(
            {
                "expression": expression,
                "timezone": timezone,
                "describe": schedule.describe(),
                "next": times,
            }
        )
        return
    out.line(schedule.describe())
    for when in times:
        out.line(when)
    if not times:
        out.line("never fires")
