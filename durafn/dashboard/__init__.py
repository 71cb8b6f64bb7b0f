"""The operator's dashboard: pages to see and steer an app's scheduled functions, served
by ``durafn dashboard`` or mounted in a host application (``App.dashboard``).

An optional extra, ``durafn[dashboard]`` (Starlette, Jinja2, python-multipart for its
forms, uvicorn for the command): the core install does not carry it. This is its first
part: the overview, the scheduled functions with filters and cursor pages, a row with
cancel and retry; the access rules (a token or the host's auth, CSRF on every POST,
read-only mode) that every later page keeps.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._errors import DurafnError

if TYPE_CHECKING:
    from starlette.applications import Starlette

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
) -> Starlette:
    """The dashboard of ``app`` as an ASGI application (see ``App.dashboard``)."""
    try:
        from .access import Access
        from .server import Dashboard
    except ModuleNotFoundError as exc:
        raise DashboardUnavailable(
            f"the dashboard needs {exc.name!r}: install durafn[dashboard]"
        ) from exc
    return Dashboard(app, Access(token=token, auth=auth, read_only=read_only), hide_args).asgi


class DashboardUnavailable(DurafnError):
    """The dashboard's optional dependencies are not installed."""
