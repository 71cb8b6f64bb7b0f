"""The names the dashboard answers to: every other ``Host`` is refused with a 400 before
any page is built, in every mode.

Without this, a page of any site its operator visits could rebind its own name to
127.0.0.1 (DNS rebinding): the browser would then treat the local dashboard as that
site's own, send it requests and read the answers. A rebound request still names the
attacker's host in its ``Host`` header, and that is what is checked here.

By default the loopback names (``localhost``, ``127.0.0.1``, ``::1``); ``durafn
dashboard`` adds the address it binds, and ``--allowed-host`` (``App.dashboard(
allowed_hosts=...)``) the names a proxy or a DNS name serves it under: a name, a
``.example.com`` suffix (the domain and every name under it) or ``*`` (any: a host
application that checks ``Host`` itself, as Django's ``ALLOWED_HOSTS`` does).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from .._errors import ArgumentError

LOOPBACK = ("localhost", "127.0.0.1", "::1")

ASGIApp = Any


def check_allowed_hosts(names: Iterable[str]) -> tuple[str, ...]:
    """The allowed names, lower-cased; each a host name or address without a port."""
    if isinstance(names, str):
        raise ArgumentError(f"allowed_hosts is a list of names, not the string {names!r}")
    checked = []
    for name in names:
        if not isinstance(name, str) or not name.strip() or any(c in name for c in " /@"):
            raise ArgumentError(
                f"allowed host {name!r} is not a host name: give a name or address without "
                "a scheme or port (dash.example.com, 10.0.0.5), a suffix (.example.com) or *"
            )
        checked.append(name.strip().lower().rstrip(".").removeprefix("[").removesuffix("]"))
    return tuple(dict.fromkeys(checked))


def host_name(header: str) -> str:
    """The name of a ``Host`` header: without its port, brackets, case or final dot."""
    header = header.strip().lower()
    if header.startswith("["):  # [::1]:8787
        return header[1:].partition("]")[0]
    if header.count(":") == 1:
        header = header.partition(":")[0]
    return header.rstrip(".")


def allowed(name: str, names: tuple[str, ...]) -> bool:
    for pattern in names:
        if pattern == "*" or name == pattern:
            return True
        if pattern.startswith(".") and (name == pattern[1:] or name.endswith(pattern)):
            return True
    return False


class HostCheck:
    """ASGI middleware: a request whose ``Host`` is not allowed gets a 400 naming it and
    saying how to allow it; the app behind never sees it."""

    def __init__(self, app: ASGIApp, names: tuple[str, ...]) -> None:
        self.app = app
        self.names = names

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        header = next((v.decode("latin-1") for k, v in scope["headers"] if k == b"host"), "")
        if header and allowed(host_name(header), self.names):
            await self.app(scope, receive, send)
            return
        said = f"Host {header!r}" if header else "a request without a Host header"
        message = (
            f"{said} is not one this dashboard answers to (it answers "
            f"{', '.join(self.names)}): a page of another site that reaches it under its own "
            "name is refused. Serving it under another name? Allow that name: "
            "durafn dashboard --allowed-host NAME, or app.dashboard(allowed_hosts=[...]).\n"
        )
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        body = message.encode()
        await send(
            {
                "type": "http.response.start",
                "status": 400,
                "headers": [
                    (b"content-type", b"text/plain; charset=utf-8"),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
