"""The dashboard's defences through its ASGI app, on both engines: the host names it
answers to (against DNS rebinding), links and redirects that never come from ``Host``, a
session and a form token per visitor in every mode, and a cross-origin POST refused for
what it is. The same attack from a real browser is in ``test_dashboard_browser``."""

from __future__ import annotations

import re
from typing import Any

import httpx2
import pytest
from starlette.applications import Starlette
from starlette.routing import Mount

import durafn
from durafn import ArgumentError, State

from .support import dashboard_kit
from .support.dashboard_kit import XSS, client, csrf_of

pytestmark = pytest.mark.anyio
rows = dashboard_kit.rows

FOREIGN = "evil.example:8787"
COOKIE = "durafn_session"


async def _state(app: durafn.App, id: str) -> State:
    found = await app.get(id)
    assert found is not None
    return found.state


async def test_a_foreign_host_is_refused_before_any_page_is_built(
    app: durafn.App, rows: dict[str, str]
) -> None:
    pending = rows["pending"]
    dash = app.dashboard()
    async with client(dash) as web:
        token = csrf_of(await web.get(f"/rows/{pending}"))
        for path in (
            *("/", "/rows", f"/rows/{pending}", f"/rows/{pending}/args.json", "/crons"),
            *("/events/counts", f"/rows/{pending}/events", "/metrics", "/login"),
            *("/rows/live", "/charts", "/functions/mail:send", "/static/dashboard.css"),
        ):
            refused = await web.get(path, headers={"host": FOREIGN})
            assert refused.status_code == 400, path
            assert refused.text.startswith(
                "Host 'evil.example:8787' is not one this dashboard answers to (it answers "
                "localhost, 127.0.0.1, ::1)"
            )
            assert "durafn dashboard --allowed-host NAME" in refused.text
            assert XSS not in refused.text and "&lt;script" not in refused.text
        # The rebound page's POST, with the visitor's own cookie and token: refused too.
        posted = await web.post(
            f"/rows/{pending}/cancel",
            data={"csrf": token},
            headers={"host": FOREIGN, "origin": f"http://{FOREIGN}"},
        )
        assert posted.status_code == 400
        # The loopback names answer, with a port or without, in any case.
        for host in ("localhost", "localhost:8787", "127.0.0.1:8787", "[::1]:8787", "LOCALHOST."):
            assert (await web.get("/", headers={"host": host})).status_code == 200, host
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b""}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "GET", "path": "/", "headers": [], "query_string": b""}
    await dash(scope, receive, send)
    assert sent[0]["status"] == 400
    assert sent[1]["body"].startswith(b"a request without a Host header is not one")
    assert await _state(app, pending) is State.PENDING


async def test_allowed_hosts_add_names_a_suffix_adds_a_domain_and_a_star_any(
    app: durafn.App, rows: dict[str, str]
) -> None:
    named = app.dashboard(allowed_hosts=["Dash.Example.com", ".corp.example"])
    async with client(named) as web:
        for host in (
            "dash.example.com",
            "dash.example.com:443",
            "corp.example",
            "a.b.corp.example",
        ):
            assert (await web.get("/", headers={"host": host})).status_code == 200, host
        for host in ("example.com", "evilcorp.example", "dash.example.com.evil.example"):
            assert (await web.get("/", headers={"host": host})).status_code == 400, host
    async with client(app.dashboard(allowed_hosts=["*"])) as web:
        assert (await web.get("/", headers={"host": FOREIGN})).status_code == 200
    for bad in ("", " ", "http://dash.example.com", "dash.example.com/x", "a b", "ann@host"):
        with pytest.raises(ArgumentError, match="is not a host name"):
            app.dashboard(allowed_hosts=[bad])
    with pytest.raises(ArgumentError, match="a list of names, not the string"):
        app.dashboard(allowed_hosts="dash.example.com")


async def test_links_and_redirects_are_paths_under_the_mount_never_from_the_host(
    app: durafn.App, rows: dict[str, str]
) -> None:
    pending = rows["pending"]
    web_app = Starlette(routes=[Mount("/ops", app.dashboard(allowed_hosts=["*"]))])
    async with client(web_app, "http://evil.example") as web:
        page = await web.get(f"/ops/rows/{pending}")
        listing = await web.get("/ops/rows")
        confirm = await web.get(f"/ops/rows/{pending}/cancel")
        done = await web.post(f"/ops/rows/{pending}/cancel", data={"csrf": csrf_of(confirm)})
    for shown in (page, listing, confirm):
        assert shown.status_code == 200 and "evil.example" not in shown.text
        links = re.findall(r'(?:href|action|src|data-live)="([^"#]+)"', shown.text)
        links += re.findall(r'EventSource\("([^"]+)"\)', shown.text)
        assert links and all(link.startswith("/ops/") for link in links), links
    assert 'action="/ops/rows/' in confirm.text
    assert done.status_code == 303 and done.headers["location"].startswith(f"/ops/rows/{pending}?")
    assert "Path=/ops/" in page.headers["set-cookie"]
    async with client(Starlette(routes=[Mount("/ops", app.dashboard(token="t"))])) as web:
        assert (await web.get("/ops/rows")).headers["location"] == "/ops/login"


async def test_every_visitor_has_a_session_and_a_form_token_of_its_own(
    app: durafn.App, rows: dict[str, str]
) -> None:
    cancel = f"/rows/{rows['pending']}/cancel"
    dash = app.dashboard()
    async with client(dash) as ann, client(dash) as bob, client(dash) as nobody:
        a = await ann.get(cancel)
        b = await bob.get(cancel)
        cookie = a.headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/" in cookie
        assert ann.cookies[COOKIE] != bob.cookies[COOKIE]
        assert csrf_of(a) != csrf_of(b)
        again = await ann.get(cancel)
        assert "set-cookie" not in again.headers and csrf_of(again) == csrf_of(a)
        # Bob's token in Ann's session; Ann's token with no session; a made-up cookie.
        swapped = await ann.post(cancel, data={"csrf": csrf_of(b)})
        bare = await nobody.post(cancel, data={"csrf": csrf_of(a)})
        nobody.cookies.set(COOKIE, ann.cookies[COOKIE].rsplit(".", 1)[0] + "." + "0" * 64)
        made_up = await nobody.post(cancel, data={"csrf": csrf_of(a)})
        for refused in (swapped, bare, made_up):
            assert refused.status_code == 403 and "CSRF token" in refused.text
        assert await _state(app, rows["pending"]) is State.PENDING
        # Another dashboard (another process) signs with a key of its own.
        async with client(app.dashboard()) as elsewhere:
            elsewhere.cookies.set(COOKIE, ann.cookies[COOKIE])
            assert (await elsewhere.post(cancel, data={"csrf": csrf_of(a)})).status_code == 403
        done = await ann.post(cancel, data={"csrf": csrf_of(a)})
    assert done.status_code == 303
    assert await _state(app, rows["pending"]) is State.CANCELED


async def test_a_login_starts_a_session_of_its_own_that_a_new_token_voids(
    app: durafn.App, rows: dict[str, str]
) -> None:
    dash = app.dashboard(token="s3cret")
    async with client(dash) as ann, client(dash) as bob:
        await ann.get("/login")
        visitor = ann.cookies[COOKIE]
        assert (await ann.get("/rows")).status_code == 303  # a visitor's session: not in
        assert (await ann.post("/login", data={"token": "s3cret"})).status_code == 303
        assert (await bob.post("/login", data={"token": "s3cret"})).status_code == 303
        logged_in = ann.cookies[COOKIE]
        assert logged_in != visitor and logged_in != bob.cookies[COOKIE]
        assert (await ann.get("/rows")).status_code == 200
    # The key comes from the token: a restart keeps the sessions, a new token voids them.
    for token, status in (("s3cret", 200), ("new token", 303)):
        async with client(app.dashboard(token=token)) as restarted:
            restarted.cookies.set(COOKIE, logged_in)
            assert (await restarted.get("/rows")).status_code == status


async def test_a_cross_origin_post_is_refused_as_such(
    app: durafn.App, rows: dict[str, str]
) -> None:
    cancel = f"/rows/{rows['pending']}/cancel"
    async with client(app.dashboard()) as web:
        token = csrf_of(await web.get(cancel))
        for headers, why in (
            ({"origin": "http://evil.example"}, "it comes from http://evil.example"),
            ({"origin": "http://localhost:9999"}, "it comes from http://localhost:9999"),
            ({"origin": "null"}, "its Origin is null"),
            ({"sec-fetch-site": "cross-site"}, "the browser marks it cross-site"),
            ({"sec-fetch-site": "same-site"}, "the browser marks it same-site"),
        ):
            refused = await web.post(cancel, data={"csrf": token}, headers=headers)
            assert refused.status_code == 403
            assert f"a cross-origin request is refused ({why}" in refused.text
            assert "CSRF" not in refused.text
        logout = await web.post(
            "/logout", data={"csrf": token}, headers={"origin": "http://evil.example"}
        )
        assert logout.status_code == 403 and "cross-origin" in logout.text
        assert await _state(app, rows["pending"]) is State.PENDING
        same = {"origin": "http://localhost", "sec-fetch-site": "same-origin"}
        done = await web.post(cancel, data={"csrf": token}, headers=same)
    assert done.status_code == 303
    assert await _state(app, rows["pending"]) is State.CANCELED
    async with client(app.dashboard(token="s3cret")) as web:
        login = await web.post(
            "/login", data={"token": "s3cret"}, headers={"sec-fetch-site": "cross-site"}
        )
    assert login.status_code == 403 and "cross-origin" in login.text


def test_the_client_sends_the_host_it_is_given() -> None:
    """The tests above rely on httpx2 sending the ``host`` header they set."""
    request = httpx2.Request("GET", "http://localhost/", headers={"host": FOREIGN})
    assert request.headers["host"] == FOREIGN
