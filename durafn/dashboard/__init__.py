"""The operator's dashboard: pages to see and steer an app's scheduled functions, served
by ``durafn dashboard`` or mounted in a host application (``App.dashboard``).

An optional extra, ``durafn[dashboard]`` (Starlette, Jinja2, python-multipart for its
forms, uvicorn for the command): the core install does not carry it. The overview, the
scheduled functions with filters and cursor pages, a row with cancel and retry, crons,
queues and workers; the access rules every page keeps: the host names it answers to, a
token or the host's auth, a session per visitor with CSRF on every POST, read-only mode.
Charts of what ended (from the rollups, ``app.activity``) and a page per function; a
stylesheet of its own with a dark mode, and the keyboard (``look``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from .._errors import DurafnError

if TYPE_CHECKING:
    from .access import Auth
    from .surface import App

__all__ = ["create"]


def create(
    app: App,
    *,
    token: str | None = None,
    auth: Auth | None = None,
    read_only: bool = False,
    hide_args: bool = False,
    allowed_hosts: Iterable[str] = (),
) -> Any:
    """The dashboard of ``app`` as an ASGI application (see ``App.dashboard``)."""
    try:
        from .access import Access
        from .hosts import LOOPBACK, check_allowed_hosts
        from .server import Dashboard
    except ModuleNotFoundError as exc:
        raise DashboardUnavailable(
            f"the dashboard needs {exc.name!r}: install durafn[dashboard]"
        ) from exc
    names = check_allowed_hosts([*LOOPBACK, *check_allowed_hosts(allowed_hosts)])
    access = Access(token=token, auth=auth, read_only=read_only)
    return Dashboard(app, access, hide_args, names).asgi


class DashboardUnavailable(DurafnError):
    """The dashboard's optional dependencies are not installed."""
