"""The ``durafn`` command line.

Built on click (well kept, typed, what most Python tools already depend on) and rich (tables
and colour that degrade to plain text when the output is not a terminal, so we do not
hand-write terminal detection or column layout).

Every command takes the app (``--app pkg.module:app`` or ``$DURAFN_APP``) and/or the
database (``--url`` or ``$DURAFN_DATABASE_URL``; it wins over the URL the app was built
with). Errors print one line and exit 1; ``--verbose`` adds the traceback. The inspection
commands (``ls``, ``show``, ``cancel``, ``stats``, ``clear``) create nothing: neither the
system tables nor a SQLite file where a path was mistyped.

One module per command group (``worker``; ``database``: migrate, stats; ``rows``: ls,
show, clear; ``changes``: cancel, reschedule, retry; ``queues``: queue ls, pause, resume; ``cron``:
crons, cron check, enable, disable, remove, trigger), each a plain ``click.command`` (or
group) added to ``main`` here. What they share: ``running`` (the app, the async body,
errors), ``options`` and ``output``.
"""

from __future__ import annotations

import click

from .. import _signals
from .changes import cancel, reschedule, retry
from .cron import cron, list_crons
from .dashboard import dashboard
from .database import migrate, stats
from .flow import explain
from .metrics import metrics
from .queues import queue
from .rows import clear, list_rows, show
from .running import CliError, load_app
from .worker import worker

__all__ = ["CliError", "load_app", "main"]


@click.group()
@click.version_option(package_name="durafn")
@click.pass_context
def main(ctx: click.Context) -> None:
    """durafn: durable scheduled functions.

    Run workers, create the system tables, and inspect or cancel scheduled functions.
    """
    # SIGTERM and SIGINT have been recorded since the process started (``_signals``): a
    # worker handles them itself and keeps recording until it exits; every other command
    # gets default handling back, and what came meanwhile now.
    if ctx.invoked_subcommand == "worker":
        _signals.record()
    else:
        _signals.release()


main.add_command(worker)
main.add_command(migrate)
main.add_command(stats)
main.add_command(metrics)
main.add_command(list_rows)
main.add_command(show)
main.add_command(explain)
main.add_command(cancel)
main.add_command(reschedule)
main.add_command(retry)
main.add_command(clear)
main.add_command(cron)
main.add_command(list_crons)
main.add_command(queue)
main.add_command(dashboard)
