"""The dashboard's core: who may see it (``access``), how a page and an action are
answered, and the routes of its parts (``rows``: the scheduled functions; ``operations``:
crons, queues and flow keys, workers). Pages are server-rendered (Jinja2, every value
escaped) over the same ``App`` methods the command line calls (``surface.App``).

Every action is a POST, checked in this order: a visitor (``access``), not read-only
(403), the CSRF token and ``Origin`` (403), then the action; it answers with a redirect
to a page that says what was done, and goes into the audit log.
"""

from __future__ import annotations

import json
import secrets
from collections import OrderedDict
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route

from .._clock import to_datetime
from .._errors import DurafnError
from . import activity, live, operations, rows
from .access import SESSION_COOKIE, Access
from .audit import AuditLog
from .surface import COUNT_BOUND, Act, App, Body, Refused

_templates = Environment(
    loader=FileSystemLoader(Path(__file__).parent / "templates"),
    autoescape=select_autoescape(default=True, default_for_string=True),
)
# Arguments and results as JSON text, then escaped like every other value: Jinja's
# ``tojson`` writes ``<`` as ``\\u003c``, safe in a script but unreadable on a page.
_templates.filters["bounded"] = lambda n: f"{n:,}+" if n >= COUNT_BOUND else f"{n:,}"
_templates.filters["as_json"] = lambda value, indent=None: json.dumps(
    value, indent=indent, ensure_ascii=False, default=str
)


SAID_KEPT = 1000
"""Messages of actions kept for the page their redirect shows (the oldest go first)."""


class Dashboard:
    """One app's dashboard (``App.dashboard``)."""

    def __init__(self, app: App, access: Access, hide_args: bool) -> None:
        self.app = app
        self.access = access
        self.hide_args = hide_args
        self.audit = AuditLog()
        self._said: OrderedDict[str, str] = OrderedDict()
        self.asgi = Starlette(
            routes=[
                Route("/", self.overview),
                *rows.routes(self),
                *operations.routes(self),
                *live.routes(self),
                Route("/metrics", self.metrics),
                Route("/login", self.login, methods=["GET", "POST"]),
                Route("/logout", self.logout, methods=["POST"]),
            ]
        )

    async def overview(self, request: Request) -> Response:
        async def body(user: str) -> dict[str, Any]:
            recent = await self.app.finished(within=activity.WINDOW, limit=activity.SAMPLE)
            return {
                "activity": activity.summarize(recent, self.app.clock.now()),
                "stats": await self.app.stats(bound=COUNT_BOUND),
                "queues": await self.app.queues(bound=COUNT_BOUND),
                "workers": await self.app.workers(),
                "audit": self.audit.recent(),
            }

        return await self.page(request, "overview.html", body)

    async def metrics(self, request: Request) -> Response:
        """The app's metrics as Prometheus text (``app.metrics_app()``), for a visitor:
        a scraper sends the dashboard's token as a bearer token."""
        if await self.access.user(request) is None:
            return Response("not allowed\n", status_code=403, media_type="text/plain")
        try:
            asgi = self.app.metrics_app()
        except DurafnError as exc:
            return Response(f"{exc}\n", status_code=404, media_type="text/plain")
        return _Delegate(asgi)

    async def login(self, request: Request) -> Response:
        if request.method == "GET" or not self.access.login_required:
            return self.render(request, "login.html", {"error": None, "user": None})
        form = await request.form()
        if not self.access.token_matches(str(form.get("token", ""))):
            return self.render(request, "login.html", {"error": "wrong token", "user": None}, 403)
        done = RedirectResponse(str(request.url_for("overview")), status_code=303)
        done.set_cookie(
            SESSION_COOKIE, self.access.session_value(), httponly=True, samesite="strict"
        )
        return done

    async def logout(self, request: Request) -> Response:
        form = await request.form()
        if not self.access.csrf_ok(request, str(form.get("csrf", ""))):
            return self.refusal(request, 403, "a form without this page's CSRF token")
        done = RedirectResponse(str(request.url_for("login")), status_code=303)
        done.delete_cookie(SESSION_COOKIE)
        return done

    # -- what every page and action shares -----------------------------------------------

    async def visitor(self, request: Request) -> str | None:
        """Who this request is from, or None if it may not see the dashboard."""
        return await self.access.user(request)

    async def page(self, request: Request, template: str, body: Body) -> Response:
        user = await self.access.user(request)
        if user is None:
            return self._not_in(request)
        try:
            context = await body(user)
        except Refused as exc:
            return self.refusal(request, exc.status, str(exc))
        except DurafnError as exc:  # a filter or a cursor the app refused
            return self.refusal(request, 400, str(exc))
        return self.render(request, template, {**context, "user": user})

    async def act(self, request: Request, act: Act) -> Response:
        user = await self.access.user(request)
        if user is None:
            return self._not_in(request)
        if self.access.read_only:
            return self.refusal(request, 403, "this dashboard is read-only")
        form = await request.form()
        if not self.access.csrf_ok(request, str(form.get("csrf", ""))):
            return self.refusal(request, 403, "a form without this page's CSRF token")
        try:
            said, back = await act(user, form)
        except Refused as exc:
            return self.refusal(request, exc.status, str(exc))
        except DurafnError as exc:
            return self.refusal(request, 400, str(exc))
        # What was done is kept here and named in the URL by a random key: a message in
        # the URL itself would let any link show any text on the dashboard's page.
        key = secrets.token_urlsafe(12)
        self._said[key] = said
        while len(self._said) > SAID_KEPT:
            self._said.popitem(last=False)
        separator = "&" if "?" in back else "?"
        return RedirectResponse(f"{back}{separator}done={key}", status_code=303)

    def record(self, user: str, what: str, rows: int) -> None:
        self.audit.record(to_datetime(self.app.clock.now()), user, what, rows)

    def render(
        self, request: Request, template: str, context: dict[str, Any], status: int = 200
    ) -> HTMLResponse:
        html = _templates.get_template(template).render(
            request=request,
            done=self._said.get(request.query_params.get("done", "")),
            csrf=self.access.csrf_token(request),
            read_only=self.access.read_only,
            hide_args=self.hide_args,
            bound=COUNT_BOUND,
            root=str(request.url_for("overview")).rstrip("/"),
            **context,
        )
        return HTMLResponse(html, status_code=status)

    def refusal(self, request: Request, status: int, message: str) -> Response:
        return self.render(request, "refused.html", {"message": message, "user": None}, status)

    def _not_in(self, request: Request) -> Response:
        if self.access.login_required:
            return RedirectResponse(str(request.url_for("login")), status_code=303)
        return self.refusal(request, 403, "not allowed (the host application's auth refused)")


class _Delegate(Response):
    """A response made by another ASGI app (the metrics endpoint)."""

    def __init__(self, asgi: Any) -> None:
        super().__init__()
        self._asgi = asgi

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await self._asgi(scope, receive, send)
