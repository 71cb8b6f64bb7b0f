"""``durafn operations ls|show|run|cancel``: the tracked bulk changes (``app.operations``,
started by the dashboard's bulk and failure-group actions), and running or stopping one
where no worker is running to do it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import click
from rich.table import Column

from .options import app_options, output_options
from .output import Output, iso
from .running import Audited, run_with_app

if TYPE_CHECKING:
    from .._models import Operation


@click.group()
def operations() -> None:
    """Tracked bulk changes: list them, show one, run or cancel one."""


@operations.command("ls")
@click.option("--limit", type=click.IntRange(1, 10_000), default=50, show_default=True)
@click.option("--before", type=click.IntRange(1), metavar="ID", help="Older than this one.")
@app_options
@output_options
def list_operations(
    limit: int,
    before: int | None,
    app_ref: str | None,
    url: str | None,
    as_json: bool,
    verbose: bool,
) -> None:
    """The operations, newest first: what, on which rows, who, when, state, progress."""
    found = run_with_app(
        app_ref, url, lambda app: app.operations(limit=limit, before=before), verbose=verbose
    )
    out = Output(as_json)
    if as_json:
        out.json([o.model_dump(mode="json") for o in found])
    elif not found:
        out.line("no operations" + (f" before {before}" if before else ""))
    else:
        _table(out, found)


@operations.command()
@click.argument("id", type=click.IntRange(1))
@app_options
@output_options
def show(id: int, app_ref: str | None, url: str | None, as_json: bool, verbose: bool) -> None:
    """One operation, as it stands."""
    found = run_with_app(app_ref, url, lambda app: app.operation(id), verbose=verbose)
    out = Output(as_json)
    if as_json:
        out.json(found.model_dump(mode="json"))
    else:
        _table(out, [found])


@operations.command("run")
@click.argument("id", type=click.IntRange(1))
@app_options
@output_options
def run_operation(
    id: int, app_ref: str | None, url: str | None, as_json: bool, verbose: bool
) -> None:
    """Run an operation to its end here, a page at a time (safe beside the workers
    running it: each page is taken by one)."""
    found = run_with_app(app_ref, url, lambda app: app.run_operation(id), verbose=verbose)
    out = Output(as_json)
    if as_json:
        out.json(found.model_dump(mode="json"))
    else:
        out.line(f"operation {found.id}: {found.state}, {found.done} rows changed")


@operations.command()
@click.argument("id", type=click.IntRange(1))
@app_options
@output_options
def cancel(id: int, app_ref: str | None, url: str | None, as_json: bool, verbose: bool) -> None:
    """Stop a running operation: no page starts after this; changed rows stay changed."""
    stopped = run_with_app(
        app_ref,
        url,
        lambda app: app.cancel_operation(id),
        verbose=verbose,
        audited=Audited(
            "cancel operation", str(id), lambda _: 0, lambda s: "canceled" if s else "had ended"
        ),
    )
    out = Output(as_json)
    if as_json:
        out.json({"operation": id, "canceled": stopped})
    else:
        out.line(f"operation {id} " + ("canceled" if stopped else "had ended: nothing to cancel"))


def _table(out: Output, found: Sequence[Operation]) -> None:
    out.table(
        [
            Column("id", justify="right", no_wrap=True),
            "kind",
            "rows",
            "who",
            Column("started", no_wrap=True),
            "state",
            Column("changed", justify="right"),
            Column("of", justify="right"),
        ],
        [
            (
                o.id,
                o.kind,
                ", ".join(f"{k}={v}" for k, v in sorted(o.filter.items())),
                o.who,
                iso(o.created_at),
                o.state + (f" ({o.error})" if o.error else ""),
                o.done,
                f"{o.total}+" if o.total_bounded else o.total,
            )
            for o in found
        ],
    )
