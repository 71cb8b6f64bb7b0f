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
crons, cron check, enable, disable, remove, trigger; ``audit``; ``operations``: ls, show,
run, cancel; ``workflows``: ls, show, explain, cancel, resume), each a plain ``click.command`` (or
group) that ``main`` imports when it is invoked (``COMMANDS``). What they share:
``running`` (the app, the async body, errors), ``options`` and ``output``.
"""

from __future__ import annotations

import importlib

import click

from .. import _signals
from .running import CliError, load_app

__all__ = ["CliError", "load_app", "main"]


COMMANDS = {
    "worker": "worker:worker",
    "migrate": "database:migrate",
    "stats": "database:stats",
    "metrics": "metrics:metrics",
    "ls": "rows:list_rows",
    "show": "rows:show",
    "explain": "explain:explain",
    "cancel": "changes:cancel",
    "reschedule": "changes:reschedule",
    "retry": "changes:retry",
    "clear": "rows:clear",
    "cron": "cron:cron",
    "crons": "cron:list_crons",
    "queue": "queues:queue",
    "dashboard": "dashboard:dashboard",
    "audit": "audit:audit",
    "operations": "operations:operations",
    "workflows": "workflows:workflows",
}
"""Each command's module and attribute in this package. A command imports only its own
module: ``durafn worker`` starts without the tables' renderer (rich) and the other
commands (``import durafn.cli`` 131 -> 61 ms; a worker's imports 0.82 -> 0.79 s of CPU,
15 interleaved pairs on 2026-11-28)."""


class _Commands(click.Group):
    """``main``: a click group whose commands are imported when they are looked up (click's
    documented lazy-loading pattern)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        where = COMMANDS.get(cmd_name)
        if where is None:
            return None
        module, attribute = where.split(":")
        command = getattr(importlib.import_module(f"{__name__}.{module}"), attribute)
        assert isinstance(command, click.Command)
        return command


@click.group(cls=_Commands)
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
