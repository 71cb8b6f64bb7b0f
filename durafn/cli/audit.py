"""``durafn audit``: what operators did, newest first (the dashboard's actions and the
command line's changes, kept in ``_durafn_audit`` for the retention period)."""

from __future__ import annotations

import click
from rich.table import Column

from .options import app_options, output_options
from .output import Output, iso
from .running import run_with_app


@click.command()
@click.option(
    "--limit",
    type=click.IntRange(1, 10_000),
    default=50,
    show_default=True,
    help="How many entries to show.",
)
@click.option(
    "--before",
    type=click.IntRange(1),
    metavar="ID",
    help="Entries older than this one (the next page: the last id shown).",
)
@app_options
@output_options
def audit(
    limit: int,
    before: int | None,
    app_ref: str | None,
    url: str | None,
    as_json: bool,
    verbose: bool,
) -> None:
    """What operators did, newest first: when, who, through what (the dashboard or the
    command line), which action on what, how many rows it changed, and what came of it."""
    found = run_with_app(
        app_ref, url, lambda app: app.audit_log(limit=limit, before=before), verbose=verbose
    )
    out = Output(as_json)
    if as_json:
        out.json([e.model_dump(mode="json") for e in found])
        return
    if not found:
        out.line("nothing recorded" + (f" before entry {before}" if before else ""))
        return
    out.table(
        [
            Column("id", justify="right", no_wrap=True),
            Column("when", no_wrap=True),
            "who",
            "via",
            "action",
            "on",
            Column("rows", justify="right"),
            "outcome",
        ],
        [(e.id, iso(e.at), e.who, e.via, e.action, e.target, e.rows, e.outcome) for e in found],
    )
    if len(found) == limit:
        out.line(f"older entries: durafn audit --before {found[-1].id}")
