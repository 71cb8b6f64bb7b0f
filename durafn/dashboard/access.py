"""Who may use the dashboard, and proof that a POST comes from its own pages.

Three ways in: a **token** (from the environment or a file, never a URL) asked for once
on a login form, which sets an HttpOnly, SameSite=Strict cookie holding an HMAC of the
token (never the token itself); an **auth** callable of the host application (a mounted
dashboard: the host's own login applies), which returns the user's name or None; or
neither, for a dashboard bound to the loopback interface only (the command line refuses
another bind without a token).

Every POST carries a CSRF token: an HMAC, under a key made when the dashboard is built,
of the visitor's session; and its ``Origin``, when the browser sends one, must be the
dashboard's own.
"""

from __future__ import annotations

import hashlib
import hmac
import inspect
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from starlette.requests import Request

SESSION_COOKIE = "durafn_session"

Auth = Callable[[Request], "str | Awaitable[str | None] | None"]
"""The host application's check: the user's name, or None to refuse."""


def _mac(key: bytes, message: str) -> str:
    return hmac.new(key, message.encode(), hashlib.sha256).hexdigest()


@dataclass
class Access:
    token: str | None = None
    auth: Auth | None = None
    read_only: bool = False
    _key: bytes = field(default_factory=lambda: secrets.token_bytes(32))

    @property
    def login_required(self) -> bool:
        """A token is set: visitors log in with it."""
        return self.token is not None and self.auth is None

    def session_value(self) -> str:
        """The cookie a correct token earns (an HMAC of the token: the cookie never
        holds the token, and a new token voids old cookies)."""
        assert self.token is not None
        return _mac(self.token.encode(), "durafn dashboard session")

    def token_matches(self, given: str) -> bool:
        return self.token is not None and hmac.compare_digest(given.encode(), self.token.encode())

    async def user(self, request: Request) -> str | None:
        """Who this request is from, or None if it may not see the dashboard."""
        if self.auth is not None:
            found: Any = self.auth(request)
            if inspect.isawaitable(found):
                found = await found
            return str(found) if found else None
        if self.token is None:
            return "local"
        # A scraper (Prometheus's ``authorization: {credentials: ...}``) sends the token
        # as a bearer token: it keeps no cookie.
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() == "bearer" and given:
            return "bearer" if self.token_matches(given) else None
        cookie = request.cookies.get(SESSION_COOKIE, "")
        return "token" if hmac.compare_digest(cookie, self.session_value()) else None

    def csrf_token(self, request: Request) -> str:
        """The token this visitor's forms carry (tied to its session cookie)."""
        return _mac(self._key, request.cookies.get(SESSION_COOKIE, "-"))

    def csrf_ok(self, request: Request, given: str) -> bool:
        origin = request.headers.get("origin")
        # The host only: behind a proxy that ends TLS the page is https and the request
        # the app sees is http, the same site.
        if origin is not None and urlsplit(origin).netloc != request.url.netloc:
            return False
        return hmac.compare_digest(given, self.csrf_token(request))
