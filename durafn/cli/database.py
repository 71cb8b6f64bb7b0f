"""``durafn migrate`` and ``durafn stats``: the system tables, and how the work stands."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import click
from rich.table import Column

from .explain import busiest_keys, print_flow_keys
from .options import app_options, output_options
from .output import Output, duration, iso, plural, state_text
from .queues import print_queues
from .running import run_with_app

if TYPE_CHECKING:
    from .._app import App
    from .._explain import FlowKeyInfo
    from .._models import QueueInfo, Stats, WorkerInfo


@click.command()
@app_options
@output_options
def migrate(app_ref: str | None, url: str | None, as_json: bool, verbose: bool) -> None:
    """Create or upgrade durafn's system tables (refuses a newer schema than it knows)."""

    version = run_with_app(app_ref, url, lambda app: app.migrate(), verbose=verbose, create=True)
    if as_json:
        Output(True).json({"schema_version": version})
    else:
        click.echo(f"durafn system tables are at version {version}")


@click.command()
@app_options
@output_options
def stats(app_ref: str | None, url: str | None, as_json: bool, verbose: bool) -> None:
    """Rows by state, how late due work is, when the next row is due, the queues and
    flow keys with work waiting or running (and what holds it), and the workers."""
    workers, snapshot, queues, keys = run_with_app(app_ref, url, read_stats, verbose=verbose)
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
                ],
                "queues": [q.model_dump(mode="json") for q in queues],
                "flow_keys": [k.model_dump(mode="json") for k in keys],
            }
        )
        return
    print_stats(out, snapshot)
    busy = [q for q in queues if q.pending or q.running or q.paused]
    if busy:
        shown = sorted(busy, key=lambda q: (-q.due, -q.running, q.name))[:STATS_QUEUES]
        more = len(busy) - len(shown)
        print_queues(
            out, shown, title="queues" + (f" (the {len(shown)} with most due)" if more else "")
        )
        if more:
            out.line(f"{plural(more, 'more queue')} with work: durafn queue ls")
    if keys:
        print_flow_keys(out, keys)
    print_workers(out, workers, ages)


STATS_QUEUES = 20
"""Queues ``stats`` lists (those with the most due rows); ``queue ls`` lists them all."""


async def read_stats(
    app: App,
) -> tuple[list[WorkerInfo], Stats, list[QueueInfo], list[FlowKeyInfo]]:
    # Workers first, so that the snapshot's clock reading is later than any heartbeat read.
    return await app.workers(), await app.stats(), await app.queues(), await busiest_keys(app)


def print_stats(out: Output, snapshot: Stats) -> None:
    out.table(
        ["state", Column("rows", justify="right")],
        [(state_text(state), n) for state, n in snapshot.counts.items()],
    )
    if snapshot.oldest_due is None:
        out.line("lag: 0 s (nothing is due)")
    else:
        lag = duration(snapshot.lag)
        out.line(f"lag: {lag} (oldest due row: due at {iso(snapshot.oldest_due)})")
    if snapshot.next_due is None:
        out.line("next due: nothing is scheduled later")
    else:
        wait = (snapshot.next_due - snapshot.at).total_seconds()
        out.line(f"next due: {iso(snapshot.next_due)} (in {duration(wait)})")


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
