"""The dashboard's core: who may see it (``access``; the host names it answers to,
``hosts``), how a page and an action are answered, and the routes of its parts
(``rows``: the scheduled functions and a row; ``live_rows``: the list kept live;
``bulk``: every row a filter matches; ``failures``: failures by function and error type;
``operations``: the tracked bulk changes; ``functions``: run one from a form;
``function_page``: what a function did; ``charts``: what ended, drawn by ``svg``;
``search``: the header's box; ``crons``; ``queues``: queues, flow keys and workers;
``look``: the stylesheet, the script and the theme). Pages are server-rendered (Jinja2,
every value escaped) over the same ``App`` methods the command line calls
(``surface.App``).

Every request's ``Host`` is checked first (``hosts.HostCheck``). Every action is a POST,
checked in this order: a visitor (``access``), not read-only (403), not cross-origin
(403), the session's CSRF token (403), then the action; it answers with a redirect to a
page that says what was done, and goes into the audit trail (``app.record_action``).
Links and redirects are paths under the dashboard's root, never built from ``Host``.
"""

from __future__ import annotations

import secrets
from collections import OrderedDict
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route

from .._errors import DurafnError
from . import (
    activity,
    bulk,
    charts,
    crons,
    failures,
    function_page,
    functions,
    live,
    live_rows,
    look,
    operations,
    queues,
    rows,
    search,
    values,
    workflows,
)
from .access import LOGGED_IN, SESSION_COOKIE, Access, cross_origin
from .hosts import HostCheck
from .surface import COUNT_BOUND, Act, App, Body, Refused

_templates = Environment(
    loader=FileSystemLoader(Path(__file__).parent / "templates"),
    autoescape=select_autoescape(default=True, default_for_string=True),
)
_templates.filters["bounded"] = lambda n: f"{n:,}+" if n >= COUNT_BOUND else f"{n:,}"
_templates.filters["preview"] = values.preview
_templates.filters["shown"] = values.shown
_templates.filters["size"] = values.size


SAID_KEPT = 1000
"""Messages of actions kept for the page their redirect shows (the oldest go first)."""
AUDIT_SHOWN = 20
"""Entries of the audit trail the overview shows a page."""


class Dashboard:
    """One app's dashboard (``App.dashboard``)."""

    def __init__(
        self, app: App, access: Access, hide_args: bool, allowed_hosts: tuple[str, ...]
    ) -> None:
        self.app = app
        self.access = access
        self.hide_args = hide_args
        self._said: OrderedDict[str, str] = OrderedDict()
        routes = Starlette(
            routes=[
                Route("/", self.overview),
                *bulk.routes(self),  # before rows': /rows/cancel-matching is not a row
                *live_rows.routes(self),  # and /rows/live
                *rows.routes(self),
                *crons.routes(self),
                *failures.routes(self),
                *operations.routes(self),
                *functions.routes(self),  # /functions and its POSTs, before a function's page
                *function_page.routes(self),
                *charts.routes(self),
                *search.routes(self),
                *queues.routes(self),
                *workflows.routes(self),
                *live.routes(self),
                *look.routes(),
                Route("/metrics", self.metrics),
                Route("/login", self.login, methods=["GET", "POST"]),
                Route("/logout", self.logout, methods=["POST"]),
            ]
        )
        self.asgi = HostCheck(routes, allowed_hosts)

    async def overview(self, request: Request) -> Response:
        async def body(user: str) -> dict[str, Any]:
            recent = await self.app.finished(within=activity.WINDOW, limit=activity.SAMPLE)
            before = request.query_params.get("audit_before") or None
            if before is not None and not before.isdigit():
                raise Refused(400, f"audit_before {before!r} is not an entry's id")
            audit = await self.app.audit_log(
                limit=AUDIT_SHOWN + 1, before=None if before is None else int(before)
            )
            now = self.app.clock.now()
            lately = activity.summarize(recent, now)
            return {
                "activity": lately,
                "activity_chart": activity.chart(lately, now),
                "stats": await self.app.stats(bound=COUNT_BOUND),
                "queues": await self.app.queues(bound=COUNT_BOUND),
                "workers": await self.app.workers(),
                "audit": audit[:AUDIT_SHOWN],
                "audit_older": audit[AUDIT_SHOWN - 1].id if len(audit) > AUDIT_SHOWN else None,
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
        if why := cross_origin(request):
            return self.refusal(request, 403, _cross_origin_said(why))
        form = await request.form()
        if not self.access.token_matches(str(form.get("token", ""))):
            return self.render(request, "login.html", {"error": "wrong token", "user": None}, 403)
        done = RedirectResponse(root(request) + "/", status_code=303)
        # A new session at login: one a page of the dashboard handed out before (whoever
        # may have seen its id) never becomes a logged-in one.
        self.access.set_cookie(done, request, self.access.new_session(LOGGED_IN))
        return done

    async def logout(self, request: Request) -> Response:
        form = await request.form()
        if why := cross_origin(request):
            return self.refusal(request, 403, _cross_origin_said(why))
        if not self.access.csrf_ok(request, str(form.get("csrf", ""))):
            return self.refusal(request, 403, CSRF_SAID)
        done = RedirectResponse(root(request) + "/login", status_code=303)
        done.delete_cookie(SESSION_COOKIE, path=root(request) + "/")
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
        if why := cross_origin(request):
            return self.refusal(request, 403, _cross_origin_said(why))
        form = await request.form()
        if not self.access.csrf_ok(request, str(form.get("csrf", ""))):
            return self.refusal(request, 403, CSRF_SAID)
        try:
            done = await act(user, form)
        except Refused as exc:
            return self.refusal(request, exc.status, str(exc))
        except DurafnError as exc:
            return self.refusal(request, 400, str(exc))
        await self.app.record_action(
            who=user,
            via="dashboard",
            action=done.action,
            target=done.target,
            rows=done.rows,
            outcome=done.said,
        )
        # What was done is kept here and named in the URL by a random key: a message in
        # the URL itself would let any link show any text on the dashboard's page.
        key = secrets.token_urlsafe(12)
        self._said[key] = done.said
        while len(self._said) > SAID_KEPT:
            self._said.popitem(last=False)
        separator = "&" if "?" in done.back else "?"
        return RedirectResponse(f"{root(request)}{done.back}{separator}done={key}", 303)

    def render(
        self, request: Request, template: str, context: dict[str, Any], status: int = 200
    ) -> HTMLResponse:
        session = self.access.session(request)
        html = _templates.get_template(template).render(
            request=request,
            done=self._said.get(request.query_params.get("done", "")),
            csrf=self.access.csrf_token(session),
            read_only=self.access.read_only,
            hide_args=self.hide_args,
            bound=COUNT_BOUND,
            root=root(request),
            theme=look.theme(request),
            static_version=look.VERSION,
            **context,
        )
        response = HTMLResponse(html, status_code=status)
        if session.fresh:
            self.access.set_cookie(response, request, session)
        return response

    def refusal(self, request: Request, status: int, message: str) -> Response:
        return self.render(request, "refused.html", {"message": message, "user": None}, status)

    def _not_in(self, request: Request) -> Response:
        if self.access.login_required:
            return RedirectResponse(root(request) + "/login", status_code=303)
        return self.refusal(request, 403, "not allowed (the host application's auth refused)")


CSRF_SAID = (
    "a form without this page's CSRF token, or from another session: reload the page and try again"
)


def _cross_origin_said(why: str) -> str:
    return (
        f"a cross-origin request is refused ({why}): the dashboard's actions are taken "
        "from its own pages only"
    )


def root(request: Request) -> str:
    """Where the dashboard is mounted (the ASGI ``root_path``): every link and redirect
    is a path under it, never a URL built from the request's ``Host``."""
    return str(request.scope.get("root_path") or "").rstrip("/")


class _Delegate(Response):
    """A response made by another ASGI app (the metrics endpoint)."""

    def __init__(self, asgi: Any) -> None:
        super().__init__()
        self._asgi = asgi

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await self._asgi(scope, receive, send)
