"""The dashboard's routes: server-rendered pages (Jinja2, every value escaped) over the
same ``App`` methods the command line calls, so no query, filter or action exists twice.

``GET``: the overview, the scheduled functions (filters, cursor pages), a row. ``POST``
(CSRF-checked; refused with 403 in read-only mode): cancel a row, retry a Failed row,
log in and out.
"""

from __future__ import annotations

import builtins
import json
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlencode

from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route

from .._clock import Clock, to_datetime
from .._errors import DurafnError
from .._explain import Explanation
from .._kinds import ScheduledFunctionId, State
from .._types import CancelResult, Page, QueueInfo, ScheduledFunction, Stats, WorkerInfo
from .access import SESSION_COOKIE, Access, Auth
from .audit import AuditLog


class App(Protocol):
    """What the dashboard asks of a ``durafn.App``: the methods the command line calls."""

    @property
    def clock(self) -> Clock: ...
    async def stats(self) -> Stats: ...
    async def queues(self) -> list[QueueInfo]: ...
    async def workers(self) -> list[WorkerInfo]: ...
    async def list(
        self,
        *,
        state: State | None = None,
        name: str | None = None,
        limit: int = 100,
        cursor: str | None = None,
        newest_first: bool = False,
        queue: str | None = None,
        key: str | None = None,
        flag: str | None = None,
    ) -> Page: ...
    async def get(self, id: ScheduledFunctionId | str) -> ScheduledFunction | None: ...
    async def explain(self, id: ScheduledFunctionId | str) -> Explanation: ...
    async def cancel(self, id: ScheduledFunctionId | str) -> CancelResult: ...
    async def retry(
        self, ids: Sequence[ScheduledFunctionId | str], *, run_at: datetime | None = None
    ) -> builtins.list[ScheduledFunctionId]: ...


PAGE_SIZE = 50
FILTERS = ("state", "name", "queue", "key", "flag")

_templates = Environment(
    loader=FileSystemLoader(Path(__file__).parent / "templates"),
    autoescape=select_autoescape(default=True, default_for_string=True),
)
# Arguments and results as JSON text, then escaped like every other value: Jinja's
# ``tojson`` writes ``<`` as ``\u003c``, safe in a script but unreadable on a page.
_templates.filters["as_json"] = lambda value, indent=None: json.dumps(
    value, indent=indent, ensure_ascii=False, default=str
)


class _Refused(Exception):
    """A request the dashboard answers with a message and a 4xx, never a traceback."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class Dashboard:
    """One app's dashboard (``App.dashboard``)."""

    def __init__(self, app: App, access: Access, hide_args: bool) -> None:
        self.app = app
        self.access = access
        self.hide_args = hide_args
        self.audit = AuditLog()
        self.asgi = Starlette(
            routes=[
                Route("/", self.overview),
                Route("/rows", self.rows),
                Route("/rows/{id}", self.row),
                Route("/rows/{id}/cancel", self.cancel, methods=["POST"]),
                Route("/rows/{id}/retry", self.retry, methods=["POST"]),
                Route("/login", self.login, methods=["GET", "POST"]),
                Route("/logout", self.logout, methods=["POST"]),
            ]
        )

    # -- pages ---------------------------------------------------------------------------

    async def overview(self, request: Request) -> Response:
        async def body(user: str) -> dict[str, Any]:
            return {
                "stats": await self.app.stats(),
                "queues": await self.app.queues(),
                "workers": await self.app.workers(),
                "audit": self.audit.recent(),
            }

        return await self._page(request, "overview.html", body)

    async def rows(self, request: Request) -> Response:
        async def body(user: str) -> dict[str, Any]:
            chosen = {k: request.query_params.get(k) or None for k in FILTERS}
            state = chosen.pop("state")
            if state is not None and state not in {s.value for s in State}:
                known = ", ".join(s.value for s in State)
                raise _Refused(400, f"unknown state {state!r}: one of {known}")
            try:
                page = await self.app.list(
                    state=State(state) if state else None,
                    limit=PAGE_SIZE,
                    cursor=request.query_params.get("cursor") or None,
                    newest_first=True,
                    name=chosen["name"],
                    queue=chosen["queue"],
                    key=chosen["key"],
                    flag=chosen["flag"],
                )
            except DurafnError as exc:  # a malformed cursor, a bad filter
                raise _Refused(400, str(exc)) from exc
            given = {k: v for k, v in request.query_params.items() if k != "cursor" and v}
            following = None
            if page.next_cursor is not None:
                following = "?" + urlencode({**given, "cursor": page.next_cursor})
            return {"page": page, "given": given, "states": list(State), "next": following}

        return await self._page(request, "rows.html", body)

    async def row(self, request: Request) -> Response:
        async def body(user: str) -> dict[str, Any]:
            found = await self.app.get(request.path_params["id"])
            if found is None:
                raise _Refused(404, f"no scheduled function {request.path_params['id']!r}")
            why = await self.app.explain(found.id) if found.state is State.PENDING else None
            return {"row": found, "explain": why}

        return await self._page(request, "row.html", body)

    # -- actions -------------------------------------------------------------------------

    async def cancel(self, request: Request) -> Response:
        async def act(user: str, id: str) -> str:
            result = await self.app.cancel(id)
            self._record(user, f"cancel {id}", int(result.canceled))
            if result.canceled:
                return f"canceled (it was {result.previous_state.value})"
            return f"not canceled: it had ended ({result.previous_state.value})"

        return await self._action(request, act)

    async def retry(self, request: Request) -> Response:
        async def act(user: str, id: str) -> str:
            moved = await self.app.retry([id])
            self._record(user, f"retry {id}", len(moved))
            return "retried" if moved else "not Failed: nothing to retry"

        return await self._action(request, act)

    async def login(self, request: Request) -> Response:
        if request.method == "GET" or not self.access.login_required:
            return self._render(request, "login.html", {"error": None, "user": None})
        form = await request.form()
        if not self.access.token_matches(str(form.get("token", ""))):
            page = self._render(request, "login.html", {"error": "wrong token", "user": None})
            page.status_code = 403
            return page
        done = RedirectResponse(str(request.url_for("overview")), status_code=303)
        done.set_cookie(
            SESSION_COOKIE, self.access.session_value(), httponly=True, samesite="strict"
        )
        return done

    async def logout(self, request: Request) -> Response:
        form = await request.form()
        if not self.access.csrf_ok(request, str(form.get("csrf", ""))):
            return self._refusal(request, 403, "a form without this page's CSRF token")
        done = RedirectResponse(str(request.url_for("login")), status_code=303)
        done.delete_cookie(SESSION_COOKIE)
        return done

    # -- shared --------------------------------------------------------------------------

    async def _page(self, request: Request, template: str, body: Any) -> Response:
        user = await self.access.user(request)
        if user is None:
            return self._not_in(request)
        try:
            context = await body(user)
        except _Refused as exc:
            return self._refusal(request, exc.status, str(exc))
        return self._render(request, template, {**context, "user": user})

    async def _action(self, request: Request, act: Any) -> Response:
        user = await self.access.user(request)
        if user is None:
            return self._not_in(request)
        if self.access.read_only:
            return self._refusal(request, 403, "this dashboard is read-only")
        form = await request.form()
        if not self.access.csrf_ok(request, str(form.get("csrf", ""))):
            return self._refusal(request, 403, "a form without this page's CSRF token")
        id = request.path_params["id"]
        if await self.app.get(id) is None:
            return self._refusal(request, 404, f"no scheduled function {id!r}")
        try:
            said = await act(user, id)
        except DurafnError as exc:
            return self._refusal(request, 400, str(exc))
        back = str(request.url_for("row", id=id)) + "?" + urlencode({"done": said})
        return RedirectResponse(back, status_code=303)

    def _record(self, user: str, what: str, rows: int) -> None:
        self.audit.record(to_datetime(self.app.clock.now()), user, what, rows)

    def _not_in(self, request: Request) -> Response:
        if self.access.login_required:
            return RedirectResponse(str(request.url_for("login")), status_code=303)
        return self._refusal(request, 403, "not allowed (the host application's auth refused)")

    def _refusal(self, request: Request, status: int, message: str) -> Response:
        page = self._render(request, "refused.html", {"message": message, "user": None})
        page.status_code = status
        return page

    def _render(self, request: Request, template: str, context: dict[str, Any]) -> HTMLResponse:
        html = _templates.get_template(template).render(
            request=request,
            csrf=self.access.csrf_token(request),
            read_only=self.access.read_only,
            hide_args=self.hide_args,
            root=str(request.url_for("overview")).rstrip("/"),
            **context,
        )
        return HTMLResponse(html)


def create(
    app: App,
    *,
    token: str | None = None,
    auth: Auth | None = None,
    read_only: bool = False,
    hide_args: bool = False,
) -> Starlette:
    """The dashboard of ``app`` as an ASGI app (``App.dashboard``)."""
    return Dashboard(app, Access(token=token, auth=auth, read_only=read_only), hide_args).asgi
