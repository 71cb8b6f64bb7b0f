"""``durafn queue ls|pause|resume``: the named queues, and stopping or restarting them."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

import click
from rich.table import Column

from .options import app_options, output_options
from .output import Output, duration, plural
from .running import Audited, run_with_app

if TYPE_CHECKING:
    from .._models import QueueInfo


@click.group()
def queue() -> None:
    """Named queues: list them, pause and resume them (on every worker at once)."""


@queue.command("ls")
@app_options
@output_options
def list_queues(app_ref: str | None, url: str | None, as_json: bool, verbose: bool) -> None:
    """Every named queue: its concurrency, whether paused, its rows due, Pending, running,
    and how long its longest-waiting due row has waited."""
    found = run_with_app(app_ref, url, lambda app: app.queues(), verbose=verbose)
    out = Output(as_json)
    if as_json:
        out.json([q.model_dump(mode="json") for q in found])
    elif not found:
        out.line("no named queues")
    else:
        print_queues(out, found)


def print_queues(out: Output, queues: Sequence[QueueInfo], title: str = "") -> None:
    now = time.time()  # the rows' times are the wall clock's (the app's own clock)
    out.table(
        [
            Column("queue", no_wrap=True),
            Column("concurrency", justify="right"),
            "paused",
            *(Column(name, justify="right") for name in ("due", "pending", "running", "waited")),
        ],
        [
            (
                q.name,
                "no limit" if q.concurrency is None else q.concurrency,
                "paused" if q.paused else "",
                q.due,
                q.pending,
                q.running,
                "" if q.oldest_due_at is None else duration(max(0.0, now - q.oldest_due_at)),
            )
            for q in queues
        ],
        title=title,
    )


@queue.command()
@click.argument("names", nargs=-1, required=True)
@app_options
@output_options
def pause(
    names: tuple[str, ...], app_ref: str | None, url: str | None, as_json: bool, verbose: bool
) -> None:
    """Stop these queues' rows from starting; they stay Pending (running ones finish)."""
    changed = run_with_app(
        app_ref,
        url,
        lambda app: app.pause_queue(*names),
        verbose=verbose,
        audited=_audited("pause", names),
    )
    _report(Output(as_json), names, changed, "paused")


@queue.command()
@click.argument("names", nargs=-1, required=True)
@app_options
@output_options
def resume(
    names: tuple[str, ...], app_ref: str | None, url: str | None, as_json: bool, verbose: bool
) -> None:
    """Let paused queues' rows start again."""
    changed = run_with_app(
        app_ref,
        url,
        lambda app: app.resume_queue(*names),
        verbose=verbose,
        audited=_audited("resume", names),
    )
    _report(Output(as_json), names, changed, "resumed")


def _audited(verb: str, names: Sequence[str]) -> Audited:
    done = f"{verb}d"
    return Audited(f"queue {verb}", " ".join(names), int, lambda n: f"{plural(n, 'queue')} {done}")


def _report(out: Output, names: Sequence[str], changed: int, done: str) -> None:
    if out.as_json:
        out.json({"queues": list(names), done: changed})
    else:
        already = len(set(names)) - changed
        note = f" ({already} already {done})" if already else ""
        out.line(f"{plural(changed, 'queue')} {done}{note}")
