"""``durafn cron``: check a cron expression; ``durafn crons`` and ``durafn cron
enable|disable|remove|trigger NAME``: the app's registry of crons."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime

import click
from rich.table import Column

from .._errors import DurafnError
from .options import app_options, output_options, to_datetime_option, verbose_option
from .output import Output
from .running import fail, run_with_app


@click.group()
def cron() -> None:
    """Cron expressions (check one) and the app's crons (enable, disable, remove, trigger)."""


@click.command("crons")
@app_options
@output_options
def list_crons(app_ref: str | None, url: str | None, as_json: bool, verbose: bool) -> None:
    """The registry's crons: schedule, next run (in the cron's zone and here), runs."""
    found = run_with_app(app_ref, url, lambda app: app.crons(), verbose=verbose)
    out = Output(as_json)
    if as_json:
        out.json([c.model_dump(mode="json") for c in found])
        return
    if not found:
        out.line(
            "no crons registered: an app's crons are registered when a worker of it starts "
            "(durafn worker --app MODULE:APP), or by app.register_cron"
        )
        return
    out.table(
        [
            Column("name", no_wrap=True),
            "schedule",
            "next run",
            Column("runs", justify="right"),
            "last skip",
        ],
        [
            (
                c.name + _switch(c.enabled, c.switched_by_hand),
                f"{c.schedule} ({c.timezone})\n{c.describe}",
                _next_run(c.next_run_at, c.timezone),
                c.run_count,
                c.last_skip_reason or "",
            )
            for c in found
        ],
    )


def _switch(enabled: bool, by_hand: bool) -> str:
    if by_hand:
        return " (enabled by hand)" if enabled else " (disabled by hand)"
    return "" if enabled else " (disabled)"


def _next_run(at: datetime | None, timezone: str) -> str:
    if at is None:
        return "-"
    from ..cron import parse

    zone = parse("* * * * *", timezone).zone
    here = at.astimezone().isoformat(timespec="seconds")
    return f"{at.astimezone(zone).isoformat(timespec='seconds')}\n{here} here"


def _change(
    name: str, app_ref: str | None, url: str | None, as_json: bool, verbose: bool, verb: str
) -> None:
    """Run ``App.<verb>_cron(name)`` and say what it did."""
    method = {"enabled": "enable", "disabled": "disable", "removed": "remove"}.get(verb, "trigger")
    result = run_with_app(
        app_ref, url, lambda app: getattr(app, f"{method}_cron")(name), verbose=verbose
    )
    if verb == "removed" and not result:
        fail(f"no cron named {name!r} (durafn crons lists them)")
    out = Output(as_json)
    if as_json:
        out.json({"cron": name, verb: True, **({"id": result} if verb == "triggered" else {})})
    elif verb == "triggered":
        out.line(f"cron {name} triggered: {result}")
    else:
        out.line(f"cron {name} {verb}")


@cron.command()
@click.argument("name")
@app_options
@output_options
def enable(name: str, app_ref: str | None, url: str | None, as_json: bool, verbose: bool) -> None:
    """Let cron NAME run again, from its next tick after now."""
    _change(name, app_ref, url, as_json, verbose, "enabled")


@cron.command()
@click.argument("name")
@app_options
@output_options
def disable(name: str, app_ref: str | None, url: str | None, as_json: bool, verbose: bool) -> None:
    """Stop cron NAME without removing it; it stays stopped across restarts and deploys
    until it is enabled again."""
    _change(name, app_ref, url, as_json, verbose, "disabled")


@cron.command()
@click.argument("name")
@app_options
@output_options
def remove(name: str, app_ref: str | None, url: str | None, as_json: bool, verbose: bool) -> None:
    """Remove cron NAME from the registry (one declared in code returns on the next deploy)."""
    _change(name, app_ref, url, as_json, verbose, "removed")


@cron.command()
@click.argument("name")
@app_options
@output_options
def trigger(name: str, app_ref: str | None, url: str | None, as_json: bool, verbose: bool) -> None:
    """Run cron NAME's function now, once, outside its schedule, as a tick would run (its
    options, queue and overlap policy); needs --app."""
    _change(name, app_ref, url, as_json, verbose, "triggered")


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
    from ..cron import parse

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
