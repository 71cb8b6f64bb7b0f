"""The ``durafn`` command line.

Built on click (well kept, typed, what most Python tools already depend on) and rich (tables
and colour that degrade to plain text when the output is not a terminal, so we do not
hand-write terminal detection or column layout).

Every command takes the app (``--app pkg.module:app`` or ``$DURAFN_APP``) and/or the
database (``--url`` or ``$DURAFN_DATABASE_URL``; it wins over the URL the app was built
with). Errors print one line and exit 1; ``--verbose`` adds the traceback. The inspection
commands (``ls``, ``show``, ``cancel``, ``stats``, ``clear``) create nothing: neither the
system tables nor a SQLite file where a path was mistyped.
"""

from __future__ import annotations

import enum
import functools
import importlib
import json
import os
import sys
import traceback
from collections.abc import Awaitable, Callable, Collection, Iterable, Sequence
from datetime import UTC, datetime
from typing import Any, NoReturn, ParamSpec, TypeVar

import anyio
import click
from rich.console import Console, RenderableType
from rich.table import Column, Table
from rich.text import Text

from ._app import App
from ._clock import to_datetime
from ._errors import DurafnError, NotFoundError
from ._executor import ExecutorConfig, ExecutorOptions, make_config
from ._supervisor import supervise
from ._types import (
    FINISHED_STATES,
    CancelResult,
    ErrorInfo,
    ScheduledFunction,
    State,
    Stats,
    WorkerInfo,
)
from ._worker import configure_logging, serve

P = ParamSpec("P")
T = TypeVar("T")

URL_HELP = (
    "Database URL (sqlite:///file.db or postgresql://user@host/db); default $DURAFN_DATABASE_URL."
)
APP_HELP = "The app, as pkg.module:attribute (default attribute: app); default $DURAFN_APP."


class CliError(DurafnError):
    """A problem with what the command was given (an app path, an id): one line for the user."""


# -- the app and the database ----------------------------------------------------------


def load_app(ref: str) -> App:
    """Import ``pkg.module:attr`` (the current directory on the path, as uvicorn does)."""
    module_name, _, attr = ref.partition(":")
    attr = attr or "app"
    if not module_name or not all(p.isidentifier() for p in module_name.split(".")):
        raise CliError(f"{ref!r} is not an app reference; use pkg.module:app")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            raise CliError(
                f"cannot import {module_name!r} (from --app {ref!r}): no module named "
                f"{exc.name!r}; run durafn from your project's directory or fix the path"
            ) from exc
        raise  # the user's module failed to import something itself: show that
    try:
        value = functools.reduce(getattr, attr.split("."), module)
    except AttributeError:
        raise CliError(
            f"module {module_name!r} has no attribute {attr!r} (from --app {ref!r})"
        ) from None
    if not isinstance(value, App):
        what = "a class" if isinstance(value, type) else f"a {type(value).__name__}"
        raise CliError(f"{ref!r} is {what}, not a durafn.App")
    return value


def open_app(app_ref: str | None, url: str | None, *, create: bool = False) -> App:
    """The app to work with: the user's (``--app``), on ``--url`` if given, or a bare app
    on ``--url`` for commands that only read and write rows.

    ``create``: may create the system tables (SQLite's first use); inspection commands
    must not, so that a mistyped path is an error rather than a new empty database.
    """
    if app_ref:
        app = load_app(app_ref)
        if url:
            app._use_url(url)
    elif url:
        app = App(url)
    else:
        raise CliError(
            "no database given: pass --url (or set DURAFN_DATABASE_URL), or --app "
            "(or DURAFN_APP) for an app that names its database"
        )
    if not create:
        app._inspect_only()
    return app


# -- running and reporting -------------------------------------------------------------


def fail(message: str) -> NoReturn:
    click.echo(f"error: {message}", err=True)
    sys.exit(1)


def run(body: Callable[[], Awaitable[T]], *, verbose: bool) -> T:
    """Run an async command body; errors become one line on stderr and exit status 1."""
    try:
        return anyio.run(body)
    except (click.ClickException, click.Abort):
        raise  # click's own (a declined confirmation): click reports them its way
    except (DurafnError, OSError) as exc:
        if verbose:
            traceback.print_exc()
        fail(str(exc))
    except Exception as exc:
        if verbose:
            traceback.print_exc()
        fail(
            f"{type(exc).__module__}.{type(exc).__qualname__}: {exc} "
            "(run with --verbose for the traceback)"
        )


def run_with_app(
    app_ref: str | None,
    url: str | None,
    body: Callable[[App], Awaitable[T]],
    *,
    verbose: bool,
    create: bool = False,
) -> T:
    """``run`` a body that needs the app, opened as ``open_app`` does and always closed."""

    async def _run() -> T:
        app = open_app(app_ref, url, create=create)
        try:
            return await body(app)
        finally:
            await app.aclose()

    return run(_run, verbose=verbose)


PIPE_WIDTH = 1000
"""Console width when stdout is not a terminal: there is no screen to fit, and an id folded
over two lines would defeat grep and copy-paste."""


class Output:
    """Tables and key/value blocks for people, or JSON for programs (``--json``)."""

    def __init__(self, as_json: bool) -> None:
        self.as_json = as_json
        self.console = Console(highlight=False, soft_wrap=False)
        if not self.console.is_terminal:
            self.console.width = PIPE_WIDTH

    def json(self, value: Any) -> None:
        click.echo(json.dumps(value, indent=2, default=str))

    def table(
        self, columns: Sequence[str | Column], rows: Iterable[Sequence[Any]], title: str = ""
    ) -> None:
        """``columns``: names, or rich ``Column``s made for this table (they keep its cells)."""
        table = Table(
            *(Column(c, overflow="fold") if isinstance(c, str) else c for c in columns),
            title=title or None,
            title_justify="left",
            header_style="bold",
        )
        for row in rows:
            table.add_row(*map(cell, row))
        self.console.print(table)

    def fields(self, pairs: Iterable[tuple[str, Any]]) -> None:
        """A key/value block, one row per field."""
        table = Table(show_header=False)
        table.add_column(style="bold", no_wrap=True)
        table.add_column(overflow="fold")
        for key, value in pairs:
            table.add_row(key, cell(value))
        self.console.print(table)

    def line(self, text: str) -> None:
        self.console.print(text, markup=False)


def cell(value: Any) -> RenderableType:
    # Text, not str: rich would read "[...]" in an error message or an argument as markup.
    if isinstance(value, Text):
        return value
    return Text("" if value is None else str(value))


# -- formatting --------------------------------------------------------------------------

STATE_STYLES = {
    State.PENDING: "",
    State.IN_PROGRESS: "cyan",
    State.SUCCESS: "green",
    State.FAILED: "red",
    State.CANCELED: "yellow",
}

ERROR_WIDTH = 60
"""How much of an error ``ls`` shows; ``show`` has all of it."""


def iso(when: datetime | None) -> str:
    """UTC to the millisecond: one zone and one width, so that columns line up and sort."""
    if when is None:
        return ""
    return when.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def state_text(state: State) -> Text:
    return Text(state.value, style=STATE_STYLES[state])


def error_text(error: ErrorInfo | None) -> str:
    return "" if error is None else f"{error.type}: {error.message}"


def shorten(text: str, width: int) -> str:
    """The first line of ``text``, at most ``width`` characters; "…" says something was cut."""
    first, *rest = text.splitlines() or [""]
    if len(first) <= width and not rest:
        return first
    return first[: width - 1] + "…"


def field_value(name: str, value: Any) -> RenderableType:
    """One field of a row, as ``show`` prints it."""
    if name in ("args", "result"):
        return cell(json.dumps(value, indent=2, ensure_ascii=False, default=str))
    if isinstance(value, State):
        return state_text(value)
    if isinstance(value, datetime):
        return cell(iso(value))
    if isinstance(value, ErrorInfo):
        return cell(error_text(value))
    if isinstance(value, enum.Enum):
        return cell(value.value)
    return cell(value)


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


def stdin_is_terminal() -> bool:
    return sys.stdin.isatty()


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


# -- commands ------------------------------------------------------------------------------


@click.group()
@click.version_option(package_name="durafn")
def main() -> None:
    """durafn: durable scheduled functions.

    Run workers, create the system tables, and inspect or cancel scheduled functions.
    """


# The worker's defaults are the executor's: one place to change them.
_DEFAULTS = ExecutorConfig()


@main.command()
@app_options
@click.option(
    "--concurrency",
    type=click.IntRange(min=1),
    default=_DEFAULTS.concurrency,
    show_default=True,
    help="Actions running at once in each process.",
)
@click.option(
    "-n",
    "--processes",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Worker processes to run under one supervisor.",
)
@click.option(
    "--exit-on-complete",
    is_flag=True,
    help="Run everything due now (and what it schedules due now), then exit 0.",
)
@click.option(
    "--grace-period",
    type=click.FloatRange(min=0),
    default=_DEFAULTS.grace_period,
    show_default=True,
    help="Seconds running actions get to finish after SIGTERM/SIGINT.",
)
@click.option(
    "--heartbeat-interval",
    type=click.FloatRange(min=0, min_open=True),
    default=_DEFAULTS.heartbeat_interval,
    show_default=True,
    help="Seconds between heartbeats.",
)
@click.option(
    "--worker-timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=_DEFAULTS.worker_timeout,
    show_default=True,
    help="Seconds without a heartbeat after which a worker is lost and its running "
    "actions are recorded Failed.",
)
@click.option(
    "--poll-interval",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Fallback poll for work no wake-up announced [default: 0.5 SQLite, 5 PostgreSQL].",
)
@click.option(
    "--batch-size",
    type=click.IntRange(min=1),
    default=_DEFAULTS.batch_size,
    show_default=True,
    help="Mutations committed together.",
)
@click.option(
    "--name", "worker_name", default=None, help="Label for this worker [default: host:pid]."
)
@click.option(
    "--log-level",
    type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
    default="INFO",
    show_default=True,
    help="DEBUG logs one line per state change.",
)
@verbose_option
def worker(
    app_ref: str | None,
    url: str | None,
    concurrency: int,
    processes: int,
    exit_on_complete: bool,
    grace_period: float,
    heartbeat_interval: float,
    worker_timeout: float,
    poll_interval: float | None,
    batch_size: int,
    worker_name: str | None,
    log_level: str,
    verbose: bool,
) -> None:
    """Run due scheduled functions until stopped (SIGTERM/SIGINT: graceful; twice: at once)."""
    configure_logging(log_level)
    if not app_ref:
        fail(
            "durafn worker needs the app that defines the functions: --app pkg.module:app "
            "(or DURAFN_APP)"
        )
    options: ExecutorOptions = {
        "concurrency": concurrency,
        "grace_period": grace_period,
        "heartbeat_interval": heartbeat_interval,
        "worker_timeout": worker_timeout,
        "poll_interval": poll_interval,
        "batch_size": batch_size,
        "worker_name": worker_name,
    }
    try:
        make_config(options)  # a bad combination fails here, not in every child
        if processes > 1:
            load_app(app_ref)  # likewise a bad --app: before any child is started
    except DurafnError as exc:
        fail(str(exc))
    if processes > 1:
        args = ["--app", app_ref, "--log-level", log_level]
        for flag, value in (
            ("--url", url),
            ("--concurrency", concurrency),
            ("--grace-period", grace_period),
            ("--heartbeat-interval", heartbeat_interval),
            ("--worker-timeout", worker_timeout),
            ("--batch-size", batch_size),
            ("--poll-interval", poll_interval),
            ("--name", worker_name),
        ):
            if value is not None:
                args += [flag, str(value)]
        args += ["--exit-on-complete"] if exit_on_complete else []
        args += ["--verbose"] if verbose else []
        sys.exit(run(lambda: supervise(args, processes), verbose=verbose))

    async def _serve() -> int:
        app = open_app(app_ref, url, create=True)
        try:
            return await serve(app, options, exit_on_complete=exit_on_complete)
        finally:
            await app.aclose()

    sys.exit(run(_serve, verbose=verbose))


@main.command()
@app_options
@output_options
def migrate(app_ref: str | None, url: str | None, as_json: bool, verbose: bool) -> None:
    """Create or upgrade durafn's system tables (refuses a newer schema than it knows)."""

    version = run_with_app(app_ref, url, App.migrate, verbose=verbose, create=True)
    if as_json:
        Output(True).json({"schema_version": version})
    else:
        click.echo(f"durafn system tables are at version {version}")


@main.command("ls")
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


@main.command()
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
        raise NotFoundError(function_id)
    return row


@main.command()
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


@main.command()
@app_options
@output_options
def stats(app_ref: str | None, url: str | None, as_json: bool, verbose: bool) -> None:
    """Rows by state, how late due work is, when the next row is due, and the workers."""
    workers, snapshot = run_with_app(app_ref, url, read_stats, verbose=verbose)
    # Negative when a worker's host clock runs ahead of this one's: shown, not hidden.
    ages = [(snapshot.at - w.heartbeat_at).total_seconds() for w in workers]
    out = Output(as_json)
    if as_json:
        out.json(
            snapshot.model_dump(mode="json")
            | {
                "workers": [
                    w.model_dump(mode="json") | {"seconds_since_heartbeat": age}
                    for w, age in zip(workers, ages, strict=True)
                ]
            }
        )
        return
    print_stats(out, snapshot)
    print_workers(out, workers, ages)


async def read_stats(app: App) -> tuple[list[WorkerInfo], Stats]:
    # Workers first, so that the snapshot's clock reading is later than any heartbeat read.
    return await app.workers(), await app.stats()


def print_stats(out: Output, snapshot: Stats) -> None:
    out.table(
        ["state", Column("rows", justify="right")],
        [(state_text(state), n) for state, n in snapshot.counts.items()],
    )
    if snapshot.oldest_due is None:
        out.line("lag: 0.000s (nothing is due)")
    else:
        out.line(f"lag: {snapshot.lag:.3f}s (oldest due row: due at {iso(snapshot.oldest_due)})")
    if snapshot.next_due is None:
        out.line("next due: nothing is scheduled later")
    else:
        wait = (snapshot.next_due - snapshot.at).total_seconds()
        out.line(f"next due: {iso(snapshot.next_due)} (in {wait:.3f}s)")


def print_workers(out: Output, workers: Sequence[WorkerInfo], ages: Sequence[float]) -> None:
    if not workers:
        out.line("workers: none registered")
        return
    out.table(
        ["worker", "hostname", "pid", "concurrency", "running", "last heartbeat"],
        [
            (w.id, w.hostname, w.pid, w.concurrency, w.running, f"{age:.1f}s ago")
            for w, age in zip(workers, ages, strict=True)
        ],
        title="workers",
    )


@main.command()
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
    type=click.FloatRange(min=0),
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
    if not yes and not stdin_is_terminal():
        fail("clear asks before deleting, but stdin is not a terminal; pass --yes to confirm")
    deleted = run_with_app(
        app_ref,
        url,
        functools.partial(clear_rows, states or FINISHED_STATES, older_than, confirm=not yes),
        verbose=verbose,
    )
    if as_json:
        Output(True).json({"deleted": deleted})
    else:
        Output(False).line(f"deleted {deleted} finished rows" if deleted else "nothing to delete")


async def clear_rows(
    states: Collection[State], older_than: float, app: App, *, confirm: bool
) -> int:
    # One cutoff for the count and the delete: what is deleted is what was confirmed.
    before = to_datetime(app.clock.now() - older_than)
    if confirm:
        count = await app.count_finished(completed_before=before, states=states)
        if count == 0:
            return 0
        # Blocks the event loop while it waits for the answer; nothing else runs meanwhile.
        click.confirm(f"Delete {count} finished rows?", abort=True, err=True)
    return await app.delete_finished(completed_before=before, states=states)


if __name__ == "__main__":
    main()
