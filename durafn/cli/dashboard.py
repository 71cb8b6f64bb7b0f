"""``durafn dashboard``: serve the operator's dashboard with uvicorn."""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path

import click

from .._errors import DurafnError
from .options import app_options
from .running import fail, open_app

TOKEN_VARIABLE = "DURAFN_DASHBOARD_TOKEN"


@click.command()
@app_options
@click.option("--host", default="127.0.0.1", show_default=True, help="interface to bind")
@click.option("--port", default=8787, show_default=True, type=click.IntRange(1, 65535))
@click.option("--read-only", is_flag=True, help="show everything, change nothing")
@click.option("--hide-args", is_flag=True, help="never show arguments and results")
@click.option(
    "--token-file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help=f"the login token, read from this file (or ${TOKEN_VARIABLE})",
)
def dashboard(
    app_ref: str | None,
    url: str | None,
    host: str,
    port: int,
    read_only: bool,
    hide_args: bool,
    token_file: Path | None,
) -> None:
    """Serve the dashboard: the app's scheduled functions, to see and steer.

    On 127.0.0.1 by default. Another interface needs a token (from a file, or the
    environment: never the command line, where other users could read it), which the
    login page asks for.
    """
    token = token_file.read_text().strip() if token_file else os.environ.get(TOKEN_VARIABLE)
    if token is not None and not token:
        fail("the dashboard token is empty")
    if not _loopback(host) and token is None:
        fail(
            f"refusing to serve the dashboard on {host} without a token: anyone who "
            f"reaches it could cancel your work; set ${TOKEN_VARIABLE} or --token-file, "
            "or bind 127.0.0.1"
        )
    try:
        app = open_app(app_ref, url)
        asgi = app.dashboard(token=token, read_only=read_only, hide_args=hide_args)
        import uvicorn
    except (DurafnError, ModuleNotFoundError) as exc:
        fail(str(exc) if isinstance(exc, DurafnError) else "install durafn[dashboard]")

    uvicorn.run(asgi, host=host, port=port, log_level="warning")


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
