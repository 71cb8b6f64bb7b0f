"""Who may use the dashboard, and proof that a POST comes from its own pages.

Three ways in: a **token** (from the environment or a file, never a URL) asked for once
on a login form; an **auth** callable of the host application (a mounted dashboard: the
host's own login applies), which returns the user's name or None; or neither, for a
dashboard bound to the loopback interface only (the command line refuses another bind
without a token).

Every visitor has a **session** of its own, in every mode: a random id in an HttpOnly,
SameSite=Strict cookie, signed (an HMAC) so that it cannot be made up. In token mode the
signing key is derived from the token (a new token voids every old cookie; a restart
keeps them) and a login starts a new session marked as logged in; otherwise the key is
made when the dashboard starts. A form's CSRF token is an HMAC of its visitor's session
id: one visitor's token is worthless in another's session.

Every POST must come from the dashboard's own pages: a request the browser marks as
cross-site (``Sec-Fetch-Site``) or whose ``Origin`` is not the host it was sent to is
refused as cross-origin, before its CSRF token is looked at. The host itself was checked
against the allowed names before any of this ran (``hosts.py``), so a page of another
site reaching the dashboard under its own name (DNS rebinding) never gets this far.
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
from starlette.responses import Response

SESSION_COOKIE = "durafn_session"

Auth = Callable[[Request], "str | Awaitable[str | None] | None"]
"""The host application's check: the user's name, or None to refuse."""

VISITOR, LOGGED_IN = "v", "t"
"""A session's level: any visitor (forms, local mode, a host's auth), or logged in with
the token."""


def _mac(key: bytes, message: str) -> str:
    return hmac.new(key, message.encode(), hashlib.sha256).hexdigest()


@dataclass(frozen=True)
class Session:
    """A visitor's session: its id, its level, and whether this request made it (its
    response then sets the cookie)."""

    id: str
    level: str
    fresh: bool


@dataclass
class Access:
    token: str | None = None
    auth: Auth | None = None
    read_only: bool = False
    _random_key: bytes = field(default_factory=lambda: secrets.token_bytes(32))

    @property
    def login_required(self) -> bool:
        """A token is set: visitors log in with it."""
        return self.token is not None and self.auth is None

    @property
    def _key(self) -> bytes:
        if self.token is None:
            return self._random_key
        return hmac.new(self.token.encode(), b"durafn dashboard session", "sha256").digest()

    def token_matches(self, given: str) -> bool:
        return self.token is not None and hmac.compare_digest(given.encode(), self.token.encode())

    # -- sessions ------------------------------------------------------------------------

    def session(self, request: Request) -> Session:
        """The visitor's session from its cookie, or a new one if it has none (or one
        this dashboard did not sign)."""
        found = self._signed(request.cookies.get(SESSION_COOKIE, ""))
        return found if found is not None else self.new_session(VISITOR)

    def new_session(self, level: str) -> Session:
        return Session(secrets.token_urlsafe(18), level, fresh=True)

    def _signed(self, cookie: str) -> Session | None:
        id, _, rest = cookie.partition(".")
        level, _, mac = rest.partition(".")
        if not id or level not in (VISITOR, LOGGED_IN):
            return None
        if not hmac.compare_digest(mac, _mac(self._key, f"session {id}.{level}")):
            return None
        return Session(id, level, fresh=False)

    def set_cookie(self, response: Response, request: Request, session: Session) -> None:
        signed = f"{session.id}.{session.level}"
        value = f"{signed}.{_mac(self._key, f'session {signed}')}"
        response.set_cookie(
            SESSION_COOKIE,
            value,
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
            path=(request.scope.get("root_path") or "") + "/",
        )

    # -- who -----------------------------------------------------------------------------

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
        session = self._signed(request.cookies.get(SESSION_COOKIE, ""))
        return "token" if session is not None and session.level == LOGGED_IN else None

    # -- proof that a POST comes from the dashboard's own pages ---------------------------

    def csrf_token(self, session: Session) -> str:
        """The token the forms of this visitor's pages carry."""
        return _mac(self._key, f"csrf {session.id}")

    def csrf_ok(self, request: Request, given: str) -> bool:
        """The form's token is its visitor's: the session's cookie came with it, signed
        here, and the token was made for that session."""
        session = self._signed(request.cookies.get(SESSION_COOKIE, ""))
        return session is not None and hmac.compare_digest(given, self.csrf_token(session))


def cross_origin(request: Request) -> str | None:
    """Why this request comes from another site's page, or None if it does not.

    ``Sec-Fetch-Site`` is set by the browser itself (a page cannot forge it); an
    ``Origin`` must name the host the request was sent to, which the host check has
    already matched against the allowed names. Either header may be missing (an older
    browser, a command-line client): those requests still need the session's CSRF token.
    Behind a proxy that ends TLS the page is https and the request the app sees is http:
    the host is compared, not the scheme."""
    site = request.headers.get("sec-fetch-site")
    if site is not None and site not in ("same-origin", "none"):
        return f"the browser marks it {site}"
    origin = request.headers.get("origin")
    if origin is None:
        return None
    if origin == "null":
        return "its Origin is null (a sandboxed page or a redirect from another site)"
    if urlsplit(origin).netloc.lower() != request.headers.get("host", "").lower():
        return f"it comes from {origin}"
    return None
