"""``durafn explain ID`` and the flow keys of ``durafn stats``: why rows wait."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import TYPE_CHECKING

import click
from rich.table import Column

from .options import app_options, output_options
from .output import Output, iso
from .running import run_with_app

if TYPE_CHECKING:
    from .._app import App
    from .._explain import Explanation, FlowKeyInfo


@click.command()
@click.argument("function_id", metavar="ID")
@app_options
@output_options
def explain(
    function_id: str, app_ref: str | None, url: str | None, as_json: bool, verbose: bool
) -> None:
    """Why a scheduled function is where it is; for a Pending one, what holds it back
    (not due, queue paused, no worker, forbidden flag, queue or flow key full, rate
    budget spent, debounced) or that it is ready."""
    found = run_with_app(app_ref, url, functools.partial(_explain, function_id), verbose=verbose)
    out = Output(as_json)
    if as_json:
        out.json(found.model_dump(mode="json"))
        return
    if found.reason in ("finished", "running"):  # the message says it all
        out.line(f"{found.id} is {found.state.value}: {found.message}")
        return
    out.line(f"{found.id} is {found.state.value}: {found.reason}")
    out.line(found.message)
    if found.held_by:
        out.line("held by: " + " ".join(found.held_by))
    for message in found.also:
        out.line(f"then: {message}")


async def _explain(function_id: str, app: App) -> Explanation:
    return await app.explain(function_id)


STATS_KEYS = 20
"""Flow keys ``stats`` lists (those with the most due rows)."""


async def busiest_keys(app: App) -> list[FlowKeyInfo]:
    return await app.flow_keys(limit=STATS_KEYS)


def print_flow_keys(out: Output, keys: Sequence[FlowKeyInfo]) -> None:
    out.table(
        [
            Column("flow key", no_wrap=True),
            *(Column(name, justify="right") for name in ("due", "pending", "running")),
            Column("concurrency", justify="right"),
            "rate",
            "held by",
            "next start",
        ],
        [
            (
                k.key,
                k.due,
                k.pending,
                k.running,
                "" if k.concurrency is None else k.concurrency,
                k.rate or "",
                k.held or "",
                iso(k.next_start) if k.next_start is not None else "",
            )
            for k in keys
        ],
        title=f"flow keys (the {STATS_KEYS} with most due at most)",
    )
