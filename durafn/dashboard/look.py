"""How the dashboard looks: its stylesheet and script (files of the package, served from
memory with a version in their URL, so a browser keeps them until durafn changes), and
the visitor's choice of colours (``POST /theme``: a cookie, so the choice works without
JavaScript; without one the system's ``prefers-color-scheme`` decides).

Nothing is fetched from elsewhere: no CDN, no web font, no build step."""

from __future__ import annotations

import hashlib
from pathlib import Path

from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response
from starlette.routing import Route

from .access import cross_origin

THEME_COOKIE = "durafn_theme"
THEMES = ("dark", "light")
"""A forced choice; anything else (``auto``) removes the cookie."""
_TYPES = {".css": "text/css; charset=utf-8", ".js": "text/javascript; charset=utf-8"}
_FILES = {
    p.name: (p.read_bytes(), _TYPES[p.suffix])
    for p in sorted((Path(__file__).parent / "static").iterdir())
    if p.suffix in _TYPES
}
VERSION = hashlib.sha256(b"".join(body for body, _ in _FILES.values())).hexdigest()[:12]
"""In the files' URLs (``?v=``): a new durafn's files are fetched again, once."""


def theme(request: Request) -> str | None:
    """The visitor's forced colours (``dark``, ``light``), or None: the system's."""
    chosen = request.cookies.get(THEME_COOKIE)
    return chosen if chosen in THEMES else None


def routes() -> list[Route]:
    async def static(request: Request) -> Response:
        found = _FILES.get(str(request.path_params["name"]))
        if found is None:
            return PlainTextResponse("no such file\n", status_code=404)
        body, media_type = found
        versioned = request.query_params.get("v")
        cache = "public, max-age=31536000, immutable" if versioned else "no-cache"
        return Response(body, media_type=media_type, headers={"cache-control": cache})

    async def set_theme(request: Request) -> Response:
        # Colours only: no CSRF token asked (a forged choice changes nothing but colours),
        # but never from another site's page.
        if why := cross_origin(request):
            return PlainTextResponse(f"a cross-origin request is refused ({why})\n", 403)
        form = await request.form()
        back = str(form.get("back") or "/")
        unsafe = back.startswith("//") or "\\" in back or any(ord(c) < 32 for c in back)
        if not back.startswith("/") or unsafe:
            back = "/"  # a path under the dashboard only: never a redirect elsewhere
        mount = str(request.scope.get("root_path") or "").rstrip("/")
        done = RedirectResponse(mount + back, status_code=303)
        chosen = str(form.get("theme", ""))
        if chosen in THEMES:
            done.set_cookie(
                THEME_COOKIE, chosen, max_age=365 * 86400, path=mount + "/", samesite="lax"
            )
        else:
            done.delete_cookie(THEME_COOKIE, path=mount + "/")
        return done

    return [
        Route("/static/{name}", static),
        Route("/theme", set_theme, methods=["POST"]),
    ]
