"""``durafn dashboard``: serve the operator's dashboard with uvicorn."""

from __future__ import annotations

import ipaddress
import logging
import os
import sys
from pathlib import Path

import click

from .._errors import DurafnError
from ..dashboard.hosts import LOOPBACK, check_allowed_hosts
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
    "--allowed-host",
    "allowed_hosts",
    multiple=True,
    metavar="NAME",
    help="a host name it is served under besides the loopback names and --host "
    "(a proxy's, a DNS name; .example.com for a domain and its names), repeatable",
)
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
    allowed_hosts: tuple[str, ...],
    token_file: Path | None,
) -> None:
    """Serve the dashboard: the app's scheduled functions, to see and steer.

    On 127.0.0.1 by default. Another interface needs a token (from a file, or the
    environment: never the command line, where other users could read it), which the
    login page asks for. It answers only requests addressed to the loopback names, the
    address it binds and each --allowed-host: any other Host header is refused.
    Each action taken on it is printed on stderr and kept in the audit trail
    (durafn audit).
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
        names = [*check_allowed_hosts(allowed_hosts)]
    except DurafnError as exc:
        fail(f"--allowed-host: {exc}", status=2)
    names += [] if host in ("0.0.0.0", "::", "") else [host]
    try:
        app = open_app(app_ref, url)
        asgi = app.dashboard(
            token=token, read_only=read_only, hide_args=hide_args, allowed_hosts=names
        )
        import uvicorn
    except (DurafnError, ModuleNotFoundError) as exc:
        fail(str(exc) if isinstance(exc, DurafnError) else "install durafn[dashboard]")

    _print_actions()
    shown = f"[{host}]" if ":" in host else host
    mode = "a token asked for at login" if token else "local: no token, loopback only"
    if read_only:
        mode += ", read-only"
    click.echo(
        f"durafn dashboard: serving http://{shown}:{port}/ ({mode}); answering "
        f"{', '.join(sorted({*LOOPBACK, *names}))}",
        err=True,
    )
    uvicorn.run(asgi, host=host, port=port, log_level="warning")


def _print_actions() -> None:
    """Each action taken on the dashboard, a line on stderr as it is recorded."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("durafn dashboard: %(asctime)s %(message)s"))
    audit = logging.getLogger("durafn.audit")
    audit.addHandler(handler)
    audit.setLevel(logging.INFO)


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
