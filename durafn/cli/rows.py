"""The commands on rows: ``ls``, ``show``, ``cancel`` and ``clear``. They create nothing:
neither the system tables nor a SQLite file where a path was mistyped."""

from __future__ import annotations

import functools
import sys
from collections.abc import Collection, Sequence
from datetime import datetime
from typing import Any

import click
from rich.table import Column

from .._app import App
from .._checks import scheduled_id
from .._clock import to_datetime
from .._errors import NotFoundError
from .._types import FINISHED_STATES, CancelResult, ScheduledFunction, State
from . import options
from .options import (
    Seconds,
    app_options,
    output_options,
    state_choice,
    to_datetime_option,
    to_states,
)
from .output import ERROR_WIDTH, Output, error_text, field_value, iso, shorten, state_text
from .running import fail, run_with_app


@click.command("ls")
@click.option(
    "--state",
    "states",
    type=state_choice(tuple(State)),
    multiple=True,
    callback=to_states,
    help="Only rows in this state (repeatable).",
)
@click.option("--name", help="Only rows of the function with this durable name.")
@click.option(
    "--after",
    callback=to_datetime_option,
    metavar="DATETIME",
    help="Only rows scheduled at or after this time (ISO 8601; UTC if no zone is given).",
)
@click.option(
    "--before",
    callback=to_datetime_option,
    metavar="DATETIME",
    help="Only rows scheduled before this time (ISO 8601; UTC if no zone is given).",
)
@click.option(
    "--limit", type=click.IntRange(1, 10_000), default=50, show_default=True, help="Page size."
)
@click.option("--cursor", help="Show the page after the one that printed this cursor.")
@app_options
@output_options
def list_rows(
    states: list[State],
    name: str | None,
    after: datetime | None,
    before: datetime | None,
    limit: int,
    cursor: str | None,
    app_ref: str | None,
    url: str | None,
    as_json: bool,
    verbose: bool,
) -> None:
    """List scheduled functions in scheduled-time order, a page at a time."""
    page = run_with_app(
        app_ref,
        url,
        lambda app: app.list(
            state=states or None,
            name=name,
            scheduled_after=after,
            scheduled_before=before,
            limit=limit,
            cursor=cursor,
        ),
        verbose=verbose,
    )
    out = Output(as_json)
    if as_json:
        out.json(page.model_dump(mode="json"))
        return
    if page.items:
        out.table(list_columns(), map(list_row, page.items))
    else:
        out.line("no scheduled functions match")
    if page.next_cursor:
        out.line(f"next page: --cursor {page.next_cursor}")


def list_columns() -> list[str | Column]:
    # Ids and times never wrap: on a narrow terminal the name and error columns give way.
    whole = [Column(name, no_wrap=True) for name in ("id", "scheduled", "started", "completed")]
    return [whole[0], "name", "kind", "state", *whole[1:], "attempts", "error"]


def list_row(row: ScheduledFunction) -> list[Any]:
    return [
        row.id,
        row.name,
        row.kind.value,
        state_text(row.state),
        iso(row.scheduled_time),
        iso(row.started_time),
        iso(row.completed_time),
        row.attempts,
        shorten(error_text(row.error), ERROR_WIDTH),
    ]


@click.command()
@click.argument("function_id", metavar="ID")
@app_options
@output_options
def show(
    function_id: str, app_ref: str | None, url: str | None, as_json: bool, verbose: bool
) -> None:
    """Show every field of one scheduled function."""
    row = run_with_app(app_ref, url, functools.partial(get_row, function_id), verbose=verbose)
    out = Output(as_json)
    if as_json:
        out.json(row.model_dump(mode="json"))
    else:
        out.fields((name, field_value(name, getattr(row, name))) for name in type(row).model_fields)


async def get_row(function_id: str, app: App) -> ScheduledFunction:
    row = await app.get(function_id)
    if row is None:
        raise NotFoundError(function_id, malformed=scheduled_id(function_id) is None)
    return row


@click.command()
@click.argument("function_ids", metavar="ID...", nargs=-1, required=True)
@app_options
@output_options
def cancel(
    function_ids: tuple[str, ...],
    app_ref: str | None,
    url: str | None,
    as_json: bool,
    verbose: bool,
) -> None:
    """Cancel scheduled functions: a Pending one never runs, a running action's result is
    discarded, a finished one is left as it is. Exits 1 if an id was not found."""
    outcomes = run_with_app(
        app_ref, url, functools.partial(cancel_each, function_ids), verbose=verbose
    )
    results = [o for o in outcomes if isinstance(o, CancelResult)]
    out = Output(as_json)
    if as_json:
        out.json([r.model_dump(mode="json") for r in results])
    for outcome in outcomes:
        if isinstance(outcome, NotFoundError):
            click.echo(f"error: {outcome}", err=True)
        elif not as_json:
            out.line(describe_cancel(outcome))
    if len(results) < len(outcomes):
        sys.exit(1)


async def cancel_each(function_ids: Sequence[str], app: App) -> list[CancelResult | NotFoundError]:
    # Every id is tried: one unknown id must not leave the others running.
    outcomes: list[CancelResult | NotFoundError] = []
    for function_id in function_ids:
        try:
            outcomes.append(await app.cancel(function_id))
        except NotFoundError as exc:
            outcomes.append(exc)
    return outcomes


def describe_cancel(result: CancelResult) -> str:
    previous = result.previous_state.value
    if result.canceled:
        return f"canceled {result.id} (was {previous})"
    return f"{result.id} had already finished ({previous}); nothing to cancel"


@click.command()
@click.option(
    "--state",
    "states",
    type=state_choice(FINISHED_STATES),
    multiple=True,
    callback=to_states,
    help="Only rows in this finished state (repeatable); default: all three.",
)
@click.option(
    "--older-than",
    type=Seconds(),
    default=0.0,
    metavar="SECONDS",
    help="Only rows completed at least this many seconds ago.",
)
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@app_options
@output_options
def clear(
    states: list[State],
    older_than: float,
    yes: bool,
    app_ref: str | None,
    url: str | None,
    as_json: bool,
    verbose: bool,
) -> None:
    """Delete finished rows (Success, Failed, Canceled) in batches; Pending and InProgress
    rows are never deleted."""
    if not yes and not options.stdin_is_terminal():
        fail("clear asks before deleting, but stdin is not a terminal; pass --yes to confirm")
    states = states or list(FINISHED_STATES)
    # Count, ask, delete: the question is asked between two runs of the event loop, not
    # inside one, so that Ctrl-C at the prompt stops the command at once ("Aborted!").
    # One cutoff for the count and the delete: what is deleted is what was confirmed.
    before, count = run_with_app(
        app_ref, url, functools.partial(count_rows, states, older_than), verbose=verbose
    )
    if count and not yes:
        click.confirm(f"Delete {count} finished rows?", abort=True, err=True)
    deleted = 0
    if count:
        deleted = run_with_app(
            app_ref, url, functools.partial(delete_rows, states, before), verbose=verbose
        )
    if as_json:
        Output(True).json({"deleted": deleted})
    else:
        Output(False).line(f"deleted {deleted} finished rows" if deleted else "nothing to delete")


async def count_rows(
    states: Collection[State], older_than: float, app: App
) -> tuple[datetime, int]:
    before = to_datetime(app.clock.now() - older_than)
    return before, await app.count_finished(completed_before=before, states=states)


async def delete_rows(states: Collection[State], before: datetime, app: App) -> int:
    return await app.delete_finished(completed_before=before, states=states)
