"""The commands that change rows: ``cancel``, ``retry`` and ``reschedule`` (by id, or
every row filters match, after a confirmation, in batches)."""

from __future__ import annotations

import functools
import sys
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

import click

from .._checks import scheduled_id
from .._errors import NotFoundError
from .._kinds import ScheduledFunctionId, State
from . import options
from .options import app_options, output_options, to_datetime_option
from .output import Output, plural
from .prompt import confirm
from .rows import filter_options
from .running import Audited, fail, run_with_app

if TYPE_CHECKING:
    from .._app import App
    from .._models import CancelResult


@click.command()
@click.argument("function_ids", metavar="[ID...]", nargs=-1)
@filter_options
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation (filters).")
@app_options
@output_options
def cancel(
    function_ids: tuple[str, ...],
    name: str | None,
    queue: str | None,
    key: str | None,
    flag: str | None,
    after: datetime | None,
    before: datetime | None,
    yes: bool,
    app_ref: str | None,
    url: str | None,
    as_json: bool,
    verbose: bool,
) -> None:
    """Cancel scheduled functions by id: a Pending one never runs, a running action's
    result is discarded, a finished one is left as it is; exits 1 if an id was not found.
    Or, with filters instead of ids, every Pending row they match, in batches, after
    saying how many and asking (--yes: without asking)."""
    filters = _filters(name, queue, key, flag, after, before)
    if not function_ids:
        _every_matching("cancel", State.PENDING, filters, yes, app_ref, url, as_json, verbose)
        return
    if filters:
        raise click.UsageError("give ids or filters, not both")
    outcomes = run_with_app(
        app_ref,
        url,
        functools.partial(cancel_each, function_ids),
        verbose=verbose,
        audited=Audited(
            "cancel",
            " ".join(function_ids),
            lambda found: sum(1 for o in found if not isinstance(o, NotFoundError) and o.canceled),
            lambda found: "; ".join(
                str(o) if isinstance(o, NotFoundError) else describe_cancel(o) for o in found
            ),
        ),
    )
    results = [o for o in outcomes if not isinstance(o, NotFoundError)]
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


@click.command()
@click.argument("function_ids", metavar="[ID...]", nargs=-1)
@click.option(
    "--run-at",
    callback=to_datetime_option,
    metavar="DATETIME",
    help="The new time (ISO 8601; UTC if no zone is given).",
)
@click.option("--priority", type=int, help="The new priority (lower runs first).")
@click.option("--max-attempts", type=int, help="The new limit on runs in all (its retry policy's).")
@filter_options
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation (filters).")
@app_options
@output_options
def reschedule(
    function_ids: tuple[str, ...],
    run_at: datetime | None,
    priority: int | None,
    max_attempts: int | None,
    name: str | None,
    queue: str | None,
    key: str | None,
    flag: str | None,
    after: datetime | None,
    before: datetime | None,
    yes: bool,
    app_ref: str | None,
    url: str | None,
    as_json: bool,
    verbose: bool,
) -> None:
    """Change the time, priority and/or attempts limit of Pending rows: these ids, or
    every one the filters match (none: every Pending row), in batches, after saying how
    many and asking (--yes: without asking), as cancel and retry by filters do."""
    filters = _filters(name, queue, key, flag, after, before)
    if function_ids and filters:
        raise click.UsageError("give ids or filters, not both")
    if run_at is None and priority is None and max_attempts is None:
        raise click.UsageError("say what to change: --run-at, --priority and/or --max-attempts")

    def change(app: App) -> Awaitable[int]:
        return app.reschedule(
            list(function_ids) or None,
            run_at=run_at,
            priority=priority,
            max_attempts=max_attempts,
            name=name,
            queue=queue,
            key=key,
            flag=flag,
            scheduled_after=after,
            scheduled_before=before,
        )

    if not function_ids:
        _every_matching(
            "reschedule", State.PENDING, filters, yes, app_ref, url, as_json, verbose, change
        )
        return
    said = _said_change(run_at, priority, max_attempts)
    count = run_with_app(
        app_ref,
        url,
        change,
        verbose=verbose,
        audited=Audited(
            "reschedule", " ".join(function_ids), int, lambda n: f"{n} rescheduled to {said}"
        ),
    )
    if as_json:
        Output(True).json({"rescheduled": count})
    else:
        click.echo(f"{plural(count, 'Pending row')} rescheduled")


@click.command()
@click.argument("function_ids", metavar="[ID...]", nargs=-1)
@click.option(
    "--run-at",
    callback=to_datetime_option,
    metavar="DATETIME",
    help="When to run them (ISO 8601; UTC if no zone is given). Default: now.",
)
@filter_options
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation (filters).")
@app_options
@output_options
def retry(
    function_ids: tuple[str, ...],
    run_at: datetime | None,
    name: str | None,
    queue: str | None,
    key: str | None,
    flag: str | None,
    after: datetime | None,
    before: datetime | None,
    yes: bool,
    app_ref: str | None,
    url: str | None,
    as_json: bool,
    verbose: bool,
) -> None:
    """Put Failed rows back to Pending for a fresh set of attempts (their history kept).
    Ids of rows that are not Failed are left alone, and named; exits 1 if an id was not
    found. Or, with filters instead of ids, every Failed row they match, in batches,
    after saying how many and asking (--yes: without asking)."""
    filters = _filters(name, queue, key, flag, after, before)
    if not function_ids:
        filters["run_at"] = run_at
        _every_matching("retry", State.FAILED, filters, yes, app_ref, url, as_json, verbose)
        return
    if filters:
        raise click.UsageError("give ids or filters, not both")

    async def _retry(app: App) -> tuple[list[ScheduledFunctionId], dict[str, State | None]]:
        moved = await app.retry(list(function_ids), run_at=run_at)
        left: dict[str, State | None] = {}
        for id in function_ids:
            if scheduled_id(id) not in set(moved):
                row = await app.get(id)
                left[id] = None if row is None else row.state
        return moved, left

    moved, left = run_with_app(
        app_ref,
        url,
        _retry,
        verbose=verbose,
        audited=Audited(
            "retry",
            " ".join(function_ids),
            lambda result: len(result[0]),
            lambda result: f"{len(result[0])} put back to Pending",
        ),
    )
    not_failed = [id for id, state in left.items() if state is not None]
    not_found = [id for id, state in left.items() if state is None]
    if as_json:
        Output(True).json({"retried": moved, "not_failed": not_failed, "not_found": not_found})
    else:
        click.echo(f"{plural(len(moved), 'Failed row')} put back to Pending")
        for id in not_failed:
            click.echo(f"{id}: {left[id]}, not Failed; left as it is")
    for id in not_found:
        click.echo(f"error: {NotFoundError(id, malformed=scheduled_id(id) is None)}", err=True)
    if not_found:  # as cancel: a script learns that an id it gave matched nothing
        sys.exit(1)


def _filters(
    name: str | None,
    queue: str | None,
    key: str | None,
    flag: str | None,
    after: datetime | None,
    before: datetime | None,
) -> dict[str, Any]:
    """The filter options given (none: an empty dict)."""
    given = {
        "name": name,
        "queue": queue,
        "key": key,
        "flag": flag,
        "scheduled_after": after,
        "scheduled_before": before,
    }
    return {k: v for k, v in given.items() if v is not None}


_DONE = {
    "cancel": ("canceled", "canceled"),
    "retry": ("retried", "put back to Pending"),
    "reschedule": ("rescheduled", "rescheduled"),
}


def _every_matching(
    verb: str,
    state: State,
    filters: dict[str, Any],
    yes: bool,
    app_ref: str | None,
    url: str | None,
    as_json: bool,
    verbose: bool,
    change: Callable[[App], Awaitable[int]] | None = None,
) -> None:
    """``cancel`` or ``retry`` every row in ``state`` the filters match (``cancel_where``,
    ``retry_where``: in batches), or ``change`` them (``reschedule``, whose filters may
    be none: every Pending row), after saying how many and asking, unless ``yes``."""
    counted = {k: v for k, v in filters.items() if k != "run_at"}
    if not counted and change is None:
        raise click.UsageError(f"name the rows to {verb}: ids, or filters (--queue, ...)")
    key, done = _DONE[verb]
    rows = f"{state.value} row"
    if not yes and not options.stdin_is_terminal():
        fail(f"{verb} asks before changing rows, but stdin is not a terminal; pass --yes")
    if not yes:  # asked between two runs of the event loop, as clear asks
        matching = run_with_app(
            app_ref, url, lambda app: app.count(state=state, **counted), verbose=verbose
        )
        if not matching:
            if as_json:
                Output(True).json({key: 0})
            else:
                click.echo(f"no {rows} matches; nothing to {verb}")
            return
        confirm(f"{verb.capitalize()} {plural(matching, rows)}?")

    def where(app: App) -> Awaitable[int]:
        return app.cancel_where(**filters) if verb == "cancel" else app.retry_where(**filters)

    target = ", ".join(f"{k}={v}" for k, v in counted.items()) or "every row"
    count = run_with_app(
        app_ref,
        url,
        change or where,
        verbose=verbose,
        audited=Audited(
            f"{verb} every {state.value} row", target, int, lambda n: f"{plural(n, rows)} {done}"
        ),
    )
    if as_json:
        Output(True).json({key: count})
    else:
        click.echo(f"{plural(count, rows)} {done}")


async def cancel_each(function_ids: Sequence[str], app: App) -> list[CancelResult | NotFoundError]:
    # Every id is tried: one unknown id must not leave the others running.
    outcomes: list[CancelResult | NotFoundError] = []
    for function_id in function_ids:
        try:
            outcomes.append(await app.cancel(function_id))
        except NotFoundError as exc:
            outcomes.append(exc)
    return outcomes


def _said_change(run_at: datetime | None, priority: int | None, attempts: int | None) -> str:
    parts = [f"run at {run_at.isoformat()}"] if run_at else []
    parts += [f"priority {priority}"] if priority is not None else []
    parts += [f"max attempts {attempts}"] if attempts is not None else []
    return " and ".join(parts)


def describe_cancel(result: CancelResult) -> str:
    previous = result.previous_state.value
    if result.canceled:
        return f"canceled {result.id} (was {previous})"
    return f"{result.id} had already finished ({previous}); nothing to cancel"
