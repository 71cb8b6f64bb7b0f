"""The commands on rows: ``ls``, ``show``, ``cancel`` and ``clear``. They create nothing:
neither the system tables nor a SQLite file where a path was mistyped."""

from __future__ import annotations

import functools
from collections.abc import Collection
from datetime import datetime
from typing import TYPE_CHECKING, Any

import click
from rich.table import Column

from .._checks import argument_filters, scheduled_id
from .._clock import to_datetime
from .._errors import ArgumentError, NotFoundError
from .._kinds import FINISHED_STATES, State
from . import options
from .options import (
    Seconds,
    app_options,
    output_options,
    state_choice,
    to_datetime_option,
    to_states,
)
from .output import (
    ERROR_WIDTH,
    PIPE_WIDTH,
    SHOW_BOUND,
    Output,
    error_text,
    field_value,
    iso,
    plural,
    short_time,
    shorten,
    state_text,
)
from .prompt import confirm
from .running import Audited, fail, run_with_app

if TYPE_CHECKING:
    from .._app import App
    from .._models import ScheduledFunction


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
@click.option("--queue", help="Only rows of this named queue.")
@click.option("--key", help="Only rows scheduled with this job key.")
@click.option("--flag", help="Only rows carrying this flag.")
@click.option("--parent", help="Only rows the row with this id scheduled.")
@click.option(
    "--arg",
    "arg_filters",
    multiple=True,
    metavar="PATH=VALUE",
    help="Only rows whose argument at PATH (a.b for nested) equals VALUE (JSON or text); "
    "PATH~VALUE: contains it (an array holding it, a string holding it as a part).",
)
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
@click.option("--newest", is_flag=True, help="Latest scheduled first.")
@click.option(
    "--wide", is_flag=True, help="Every column, however narrow the terminal (kind, times, ...)."
)
@app_options
@output_options
def list_rows(
    states: list[State],
    name: str | None,
    queue: str | None,
    key: str | None,
    flag: str | None,
    parent: str | None,
    arg_filters: tuple[str, ...],
    after: datetime | None,
    before: datetime | None,
    limit: int,
    cursor: str | None,
    newest: bool,
    wide: bool,
    app_ref: str | None,
    url: str | None,
    as_json: bool,
    verbose: bool,
) -> None:
    """List scheduled functions in scheduled-time order (--newest: latest first), a page
    at a time. On a narrow terminal: id, name, state and when it is due or was completed
    (--wide, or `show ID`, for the rest)."""
    if cursor is not None:
        from .._store import decode_cursor

        try:
            decode_cursor(cursor, newest)
        except ArgumentError as exc:
            raise click.BadParameter(str(exc), param_hint="--cursor") from None
    try:
        equal, contain = argument_filters(arg_filters)
    except ArgumentError as exc:
        fail(str(exc))
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
            newest_first=newest,
            queue=queue,
            key=key,
            flag=flag,
            parent=parent,
            args=equal or None,
            args_contain=contain or None,
        ),
        verbose=verbose,
    )
    out = Output(as_json)
    if as_json:
        out.json(page.model_dump(mode="json"))
        return
    if not page.items:
        out.line("no scheduled functions match")
    elif wide or out.width >= WIDE_FROM:
        if wide:  # as wide as the columns need: the terminal wraps the lines, cuts nothing
            out.width = PIPE_WIDTH
        out.table(list_columns(), map(list_row, page.items))
    else:
        out.table(narrow_columns(), map(narrow_row, page.items), compact=True)
    if page.next_cursor:
        more = " --newest" if newest else ""
        out.line(f"next page: --cursor {page.next_cursor}{more}")


WIDE_FROM = 160
"""Terminal columns from which ``ls`` shows every column: below, the four that matter
fit in 80 (an id is 36 characters and is never cut: it is what ``show`` and ``cancel``
take)."""


def list_columns() -> list[str | Column]:
    # Ids and times never wrap: on a narrow terminal the name and error columns give way.
    whole = [Column(name, no_wrap=True) for name in ("id", "scheduled", "started", "completed")]
    return [whole[0], "name", "kind", "state", *whole[1:], "attempts", "priority", "queue", "error"]


def narrow_columns() -> list[str | Column]:
    return [
        Column("id", no_wrap=True, min_width=36),
        Column("name", overflow="fold", ratio=1),
        Column("state", no_wrap=True),
        Column("due / completed", no_wrap=True),
    ]


def narrow_row(row: ScheduledFunction) -> list[Any]:
    """Completed rows show when they completed; the others when they are due."""
    when = row.completed_time if row.completed_time is not None else row.scheduled_time
    return [row.id, row.name, state_cell(row), short_time(when)]


def state_cell(row: ScheduledFunction) -> Any:
    """Its state; a running row's with the progress it reported (``ctx.progress``)."""
    cell = state_text(row.state)
    if row.state is State.IN_PROGRESS and row.progress is not None:
        cell.append(f" {row.progress:.0%}")
    return cell


def list_row(row: ScheduledFunction) -> list[Any]:
    return [
        row.id,
        row.name,
        row.kind.value,
        state_cell(row),
        iso(row.scheduled_time),
        iso(row.started_time),
        iso(row.completed_time),
        row.attempts,
        row.priority,
        row.queue or "",
        shorten(error_text(row.error), ERROR_WIDTH),
    ]


@click.command()
@click.argument("function_id", metavar="ID")
@click.option(
    "--full",
    is_flag=True,
    help=f"Print every field whole (each is cut at {SHOW_BOUND:,} characters otherwise).",
)
@app_options
@output_options
def show(
    function_id: str,
    full: bool,
    app_ref: str | None,
    url: str | None,
    as_json: bool,
    verbose: bool,
) -> None:
    """Show every field of one scheduled function: each at most 4,000 characters
    unless --full (an argument may hold megabytes). --json prints the whole row."""
    row = run_with_app(app_ref, url, functools.partial(get_row, function_id), verbose=verbose)
    out = Output(as_json)
    if as_json:
        out.json(row.model_dump(mode="json"))
    else:
        bound = None if full else SHOW_BOUND
        out.fields(
            (name, field_value(name, getattr(row, name), bound)) for name in type(row).model_fields
        )


async def get_row(function_id: str, app: App) -> ScheduledFunction:
    row = await app.get(function_id)
    if row is None:
        raise NotFoundError(function_id, malformed=scheduled_id(function_id) is None)
    return row


def filter_options(fn: Any) -> Any:
    """The row filters of ``cancel`` and ``reschedule`` (as ``ls`` has them)."""
    for option in reversed(
        [
            click.option("--name", help="Rows of the function with this durable name."),
            click.option("--queue", help="Rows of this named queue."),
            click.option("--key", help="Rows scheduled with this job key."),
            click.option("--flag", help="Rows carrying this flag."),
            click.option(
                "--after",
                callback=to_datetime_option,
                metavar="DATETIME",
                help="Rows scheduled at or after this time (ISO 8601; UTC if no zone).",
            ),
            click.option(
                "--before",
                callback=to_datetime_option,
                metavar="DATETIME",
                help="Rows scheduled before this time (ISO 8601; UTC if no zone).",
            ),
        ]
    ):
        fn = option(fn)
    return fn


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
        confirm(f"Delete {plural(count, 'finished row')}?")
    deleted = 0
    if count:
        deleted = run_with_app(
            app_ref,
            url,
            functools.partial(delete_rows, states, before),
            verbose=verbose,
            audited=Audited(
                "clear",
                f"{'/'.join(s.value for s in states)} rows completed before {before.isoformat()}",
                int,
                lambda n: f"deleted {plural(n, 'finished row')}",
            ),
        )
    if as_json:
        Output(True).json({"deleted": deleted})
    else:
        done = f"deleted {plural(deleted, 'finished row')}" if deleted else "nothing to delete"
        Output(False).line(done)


async def count_rows(
    states: Collection[State], older_than: float, app: App
) -> tuple[datetime, int]:
    before = to_datetime(app.clock.now() - older_than)
    return before, await app.count_finished(completed_before=before, states=states)


async def delete_rows(states: Collection[State], before: datetime, app: App) -> int:
    return await app.delete_finished(completed_before=before, states=states)
