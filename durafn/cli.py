"""The ``durafn`` command line.

Built on click (well kept, typed, the CLI library most Python tools already depend on).
This first version has ``migrate``; the worker and inspection commands come with the
worker-process issue.
"""

from __future__ import annotations

import sys

import anyio
import click

from ._app import App
from ._errors import DurafnError

URL_HELP = "Database URL (sqlite:///file.db or postgresql://...); default $DURAFN_DATABASE_URL."


@click.group()
@click.version_option(package_name="durafn")
def main() -> None:
    """durafn: durable scheduled functions."""


@main.command()
@click.option("--url", envvar="DURAFN_DATABASE_URL", required=True, help=URL_HELP)
def migrate(url: str) -> None:
    """Create or upgrade durafn's system tables."""

    async def _run() -> int:
        app = App(url, auto_migrate=False)
        try:
            return await app.migrate()
        finally:
            await app.aclose()

    try:
        version = anyio.run(_run)
    except DurafnError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(1)
    click.echo(f"durafn system tables are at version {version}")


if __name__ == "__main__":
    main()
