"""``durafn cron``: check a cron expression; ``durafn crons`` and ``durafn cron
enable|disable|skip|remove|trigger NAME``: the app's registry of crons."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

import click
from rich.table import Column

from .._errors import DurafnError
from .options import app_options, output_options, to_datetime_option, verbose_option
from .output import Output
from .running import Audited, fail, run_with_app

if TYPE_CHECKING:
    from .._models import CronInfo


@click.group()
def cron() -> None:
    """Cron expressions (check one) and the app's crons (enable, disable, remove, trigger)."""


@click.command("crons")
@click.option(
    "--next",
    "count",
    type=click.IntRange(1, 100),
    default=None,
    help="Also each cron's next N fire times, in its zone, with daylight saving marked.",
)
@app_options
@output_options
def list_crons(
    count: int | None, app_ref: str | None, url: str | None, as_json: bool, verbose: bool
) -> None:
    """The registry's crons: schedule, next run (in the cron's zone and here), runs."""
    found = run_with_app(app_ref, url, lambda app: app.crons(), verbose=verbose)
    out = Output(as_json)
    if as_json:
        out.json(
            [
                c.model_dump(mode="json") | ({"next": fire_times(c, count)} if count else {})
                for c in found
            ]
        )
        return
    if count:
        for c in found:
            out.line(f"{c.name}: {c.schedule} ({c.timezone})")
            for line in fire_times(c, count) or ["  no next fire time (disabled, or finished)"]:
                out.line(f"  {line}")
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


MISSED = "  (missed: due while no worker ran; its catch_up decides whether it runs)"


def fire_times(c: CronInfo, count: int, now: datetime | None = None) -> list[str]:
    """The cron's next ``count`` fire times from its next run, in its zone, each marked
    where daylight saving shapes it: a wall time the spring-forward gap skipped before it
    (OJS's dst_skip), or one the autumn fold repeats (which of the two it is). A next run
    already past (no worker has ticked since) is marked missed, and the times after it
    are those to come."""
    from .._cron_rules import schedule_of

    if c.next_run_at is None:
        return []
    now = datetime.now(UTC) if now is None else now
    schedule = schedule_of(c.schedule, c.timezone, c.source)
    zone = schedule.zone
    start = max(c.next_run_at, now)
    times = [c.next_run_at, *itertools.islice(schedule.iter_after(start), count - 1)]
    lines: list[str] = []
    before = c.next_run_at - timedelta(seconds=1)
    for at in times:
        local = at.astimezone(zone)
        line = local.isoformat(timespec="seconds")
        if at < now:
            line += MISSED
        other = local.replace(fold=1 - local.fold)
        if other.utcoffset() != local.utcoffset():
            which = "first" if local.fold == 0 else "second"
            line += f"  (DST fold: the {which} {local:%H:%M})"
        gaps = schedule.skipped(before, at)
        if gaps:
            line += f"  (DST gap: {', '.join(f'{g:%H:%M}' for g in gaps)} skipped before it)"
        lines.append(line)
        before = at
    return lines


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
    missed = "\n(missed: no worker ran)" if at < datetime.now(UTC) else ""
    return f"{at.astimezone(zone).isoformat(timespec='seconds')}\n{here} here{missed}"


def _change(
    name: str, app_ref: str | None, url: str | None, as_json: bool, verbose: bool, verb: str
) -> None:
    """Run ``App.<verb>_cron(name)`` and say what it did."""
    method = {"enabled": "enable", "disabled": "disable", "removed": "remove"}.get(verb, "trigger")
    result = run_with_app(
        app_ref,
        url,
        lambda app: getattr(app, f"{method}_cron")(name),
        verbose=verbose,
        audited=Audited(
            f"cron {method}",
            name,
            lambda r: 1 if verb == "triggered" else 0,
            lambda r: (
                f"no cron named {name!r}"
                if verb == "removed" and not r
                else f"cron {name} {verb}" + (f": row {r}" if verb == "triggered" else "")
            ),
        ),
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
def skip(name: str, app_ref: str | None, url: str | None, as_json: bool, verbose: bool) -> None:
    """Skip cron NAME's next tick: it runs next at the one after."""
    skipped = run_with_app(
        app_ref,
        url,
        lambda app: app.skip_next_tick(name),
        verbose=verbose,
        audited=Audited(
            "cron skip", name, lambda _: 0, lambda at: f"the tick at {at.isoformat()} skipped"
        ),
    )
    out = Output(as_json)
    if as_json:
        out.json({"cron": name, "skipped": skipped.isoformat()})
    else:
        missed = " (it was due already: no worker has ticked it)"
        late = missed if skipped < datetime.now(UTC) else ""
        out.line(f"cron {name}: the tick at {skipped.isoformat()}{late} will be skipped")


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
