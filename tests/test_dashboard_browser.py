"""The dashboard in a real browser (Playwright driving Debian's Chromium) against
``durafn dashboard`` in a process of its own, on both engines: the flows an operator
follows, the refusals, and text that must stay text. Each page's screenshot is written to
the test's folder (and to ``$DURAFN_SCREENSHOTS``, if set: how the docs' pictures are
made)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from durafn import App, State
from durafn.testing import FakeClock

from .apps import dashboard_app
from .support.helpers import CEILING, wait_until
from .support.processes import Owner, owned

pytestmark = pytest.mark.anyio

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
XSS = "<script>window.hacked = 1</script>"
TOKEN = "correct horse battery staple"
ROOT = str(Path(__file__).resolve().parent.parent)

try:
    from playwright.async_api import Browser, Page, async_playwright
except ModuleNotFoundError:  # pragma: no cover - dev installs carry it
    async_playwright = None  # type: ignore[assignment]


@dataclass
class Served:
    url: str
    seeded: dict[str, str]
    pictures: Path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _answers(url: str, path: str = "/login") -> bool:
    import httpx2

    try:
        async with httpx2.AsyncClient() as client:
            await client.get(url + path)
        return True
    except httpx2.TransportError:
        return False


async def _serve(
    owner: Owner, db_url: str, log: Path, *extra: str, token: str | None = None
) -> str:
    """``durafn dashboard`` in a process of its own, its output into ``log``: a pipe
    nobody reads fills up (uvicorn logs every request) and stops the server mid-test."""
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("DURAFN_")}
    if token is not None:
        env["DURAFN_DASHBOARD_TOKEN"] = token
    env["PYTHONPATH"] = ROOT
    command = [
        sys.executable,
        "-m",
        "_durafn_cli",
        "dashboard",
        "--app",
        "tests.apps.dashboard_app",
    ]
    with log.open("ab") as out:
        await owner.start(
            [*command, "--url", db_url, "--port", str(port), *extra],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    await wait_until(lambda: _answers(url), "the dashboard answers")
    return url


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    """One event loop for the module's tests, so that one Chromium serves them all."""
    return "asyncio"


@pytest.fixture(scope="module")
async def browser() -> AsyncIterator[Browser]:
    """Chromium, launched once for the module (0.7 to 1.7 s a launch); each test has a
    page of its own, and contexts of its own where it needs them."""
    if async_playwright is None or CHROMIUM is None:
        if os.environ.get("CI"):
            pytest.fail("Chromium and Playwright are needed (.ci/run installs them)")
        pytest.skip("no Chromium here (apt-get install chromium) or no Playwright")
    async with async_playwright() as p:
        launched = await p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            yield launched
        finally:
            await launched.close()


@pytest.fixture
async def seeded(db_url: str, tmp_path: Path) -> AsyncIterator[tuple[str, dict[str, str], App]]:
    """Rows on the test's database: Pending (its argument a script), Failed (its error
    the same script), Success; 12 Pending digests in a queue; and one due now, not run
    yet ("live"). With the app (on a fake clock) that wrote them."""
    # The fake clock starts at the real time: the dashboard's process reads the real one,
    # and its last hour is the rows' last hour then.
    app: App = dashboard_app.app.using(db_url, clock=FakeClock(time.time()))
    try:
        await app.migrate()
        sched = app.scheduler()
        pending = await sched.run_after(3600, dashboard_app.send, XSS)
        failed = await sched.run_after(0, dashboard_app.broken, XSS)
        done = await sched.run_after(0, dashboard_app.send, "ann")
        digests = dashboard_app.send.options(queue="digests")
        await sched.run_many([digests.call(f"user{n}").after(60) for n in range(12)])
        await app.executor().run_until_idle()  # and the cron reaches the registry
        live = await sched.run_after(0, dashboard_app.send, "live")
        yield db_url, {"pending": pending, "failed": failed, "done": done, "live": live}, app
    finally:
        await app.aclose()


async def _new_page(browser: Browser) -> Page:
    """A page whose waits (an element, a navigation) end only at the suite's ceiling: on
    a loaded machine a live update may take seconds, and only a hang should fail."""
    page = await browser.new_page()
    page.set_default_timeout(CEILING * 1000)
    return page


async def _shot(page: Page, folder: Path, name: str) -> None:
    """The guide's screenshot of this page, where ``DURAFN_SCREENSHOTS`` names a folder
    (``DURAFN_SCREENSHOTS=docs/images pytest tests/test_dashboard_browser.py``), else
    none: 16 full-page shots an engine were a tenth of these tests' time, for pictures
    no one looked at. (``folder``: the test's own, kept for a shot taken to debug.)"""
    if target := os.environ.get("DURAFN_SCREENSHOTS"):  # a folder that exists
        await page.screenshot(path=Path(target) / f"dashboard-{name}.png", full_page=True)


async def test_an_operator_filters_opens_cancels_retries_and_steers(
    browser: Browser, seeded: tuple[str, dict[str, str], App], tmp_path: Path
) -> None:
    db_url, rows, app = seeded
    async with owned() as owner:
        url = await _serve(owner, db_url, tmp_path / "dashboard.log")
        page = await _new_page(browser)
        page.on("dialog", lambda dialog: pytest.fail(f"a script ran: {dialog.message}"))
        # A row's page follows it live: Pending, then (its executor runs) Success; and
        # the overview's counts follow the table.
        overview = await _new_page(browser)
        await overview.goto(url + "/")
        assert await overview.text_content("#count-Success") == "1"
        await page.goto(f"{url}/rows/{rows['live']}")
        assert await page.text_content("#state") == "Pending"
        assert await app.executor().run_until_idle() == 1
        await page.wait_for_function("document.getElementById('state').textContent === 'Success'")
        assert "sent live" in (await page.text_content("#result") or "")
        await overview.wait_for_function(
            "document.getElementById('count-Success').textContent === '2'"
        )
        await page.goto(url + "/")
        await _shot(page, tmp_path, "overview")
        # Filter, open the Failed row: its argument and error show the script as text.
        await page.click("text=Scheduled functions")
        await page.select_option("select[name=state]", "Failed")
        await page.click("text=Filter")
        await _shot(page, tmp_path, "rows")
        await page.click(f"a[href$='/rows/{rows['failed']}']")
        assert XSS in (await page.text_content("#args") or "")
        assert f"ValueError: cannot reach {XSS}" in (await page.text_content("#error") or "")
        assert await page.evaluate("window.hacked") is None
        await _shot(page, tmp_path, "row")
        await page.click("#retry")
        assert await page.text_content("#done") == "retried"
        # Cancel the Pending row from its page, after the confirmation.
        await page.goto(f"{url}/rows/{rows['pending']}")
        await page.click("#cancel")
        assert "Cancel mail:send?" in (await page.text_content("h1") or "")
        await page.click("#confirm")
        assert "canceled (it was Pending)" in (await page.text_content("#done") or "")
        # A POST without the page's CSRF token (another site's form, say) is refused.
        status = await page.evaluate(
            """async (id) => (await fetch(`/rows/${id}/retry`, {method: "POST",
                body: new URLSearchParams({csrf: "forged"})})).status""",
            rows["failed"],
        )
        assert status == 403
        # Every Pending row of a queue rescheduled (a new priority), then cancelled, each
        # after the confirmation that counts them.
        await page.goto(f"{url}/rows?queue=digests")
        await page.click("#reschedule-matching")
        await page.fill("#priority", "-2")
        await page.click("#confirm")
        assert "rescheduled 12 Pending rows" in (await page.text_content("#done") or "")
        await page.click("#cancel-matching")
        assert "12" in (await page.text_content("#count") or "")
        await _shot(page, tmp_path, "confirm")
        await page.click("#confirm")
        assert "canceled 12 Pending rows" in (await page.text_content("#done") or "")
        # A cron: disabled, then triggered; a queue paused.
        await page.goto(url + "/crons")
        await _shot(page, tmp_path, "crons")
        await page.click("#cron-nightly button.disable")
        assert "cron nightly disabled" in (await page.text_content("#done") or "")
        await page.click("#cron-nightly button.trigger")
        assert "cron nightly triggered" in (await page.text_content("#done") or "")
        await page.goto(url + "/queues")
        await page.click("#queues button")
        assert "queue digests paused" in (await page.text_content("#done") or "")
        await _shot(page, tmp_path, "queues")
        await page.goto(url + "/workers")
        await _shot(page, tmp_path, "workers")
        await page.goto(url + "/")
        audit = await page.text_content("main") or ""  # goto waits for the page's load
    for done in (
        *("retry", "cancel", "reschedule every Pending row", "cancel every Pending row"),
        *("cron disable", "queue pause"),
    ):
        assert done in audit
    # The command said where it serves, and printed each action as it was taken.
    said = (tmp_path / "dashboard.log").read_text()
    assert f"durafn dashboard: serving {url}/ (local: no token, loopback only)" in said
    assert f"local via dashboard: cancel {rows['pending']} (1 rows): canceled" in said
    assert "local via dashboard: queue pause digests" in said
    check: App = dashboard_app.app.using(db_url)
    try:
        states = {str(r.id): r.state for r in (await check.list(limit=100)).items}
        assert states[rows["failed"]] is State.PENDING
        assert states[rows["pending"]] is State.CANCELED
        assert await check.count(state=State.CANCELED, queue="digests") == 12
        digests = (await check.list(queue="digests", limit=100)).items
        assert [r.priority for r in digests] == [-2] * 12
        assert [c.enabled for c in await check.crons()] == [False]
    finally:
        await check.aclose()


async def test_a_token_is_asked_for_and_read_only_refuses(
    browser: Browser, seeded: tuple[str, dict[str, str], App], tmp_path: Path
) -> None:
    db_url, rows, _ = seeded
    async with owned() as owner:
        url = await _serve(owner, db_url, tmp_path / "dashboard.log", "--read-only", token=TOKEN)
        page = await _new_page(browser)
        await page.goto(url + "/rows")
        assert page.url.endswith("/login")
        await _shot(page, tmp_path, "login")
        await page.fill("input[name=token]", "wrong")
        await page.click("#login")
        assert await page.text_content("#login-error") == "wrong token"
        await page.fill("input[name=token]", TOKEN)
        async with page.expect_navigation():
            await page.click("#login")
        await page.goto(f"{url}/rows/{rows['failed']}")
        assert "(read-only)" in (await page.text_content("header.top") or "")
        assert await page.query_selector("#retry") is None
        # A POST all the same (a form of another page, say) is refused: read-only, and
        # without this page's CSRF token.
        status = await page.evaluate(
            """async (id) => (await fetch(`/rows/${id}/cancel`, {method: "POST",
                body: new URLSearchParams({csrf: "x"})})).status""",
            rows["pending"],
        )
        assert status == 403
        # Another browser, no token: the login page, and nothing else.
        other = await (await browser.new_context()).new_page()
        other.set_default_timeout(CEILING * 1000)
        await other.goto(f"{url}/rows/{rows['pending']}")
        assert other.url.endswith("/login")
    check: App = dashboard_app.app.using(db_url)
    try:
        pending = await check.get(rows["pending"])
        assert pending is not None and pending.state is State.PENDING
    finally:
        await check.aclose()


ATTACK = """<!doctype html>
<title>a page of another site</title>
<form id="post" method="post" action="{dash}/rows/{id}/cancel">
<input type="hidden" name="csrf" value="guessed"><button id="submit">win a prize</button>
</form>
<script>
window.results = {{}};
(async () => {{
  try {{
    const read = await fetch("{dash}/rows/{id}");
    window.results.read = await read.text();
  }} catch (e) {{ window.results.read = "blocked: " + e; }}
  try {{
    const post = await fetch("{dash}/rows/{id}/cancel",
      {{method: "POST", mode: "no-cors", body: new URLSearchParams({{csrf: "guessed"}})}});
    window.results.post = post.type;
  }} catch (e) {{ window.results.post = "blocked: " + e; }}
  window.results.done = true;
}})();
</script>
"""


@pytest.fixture(scope="module")
async def rebinding_browser() -> AsyncIterator[Browser]:
    """Chromium whose resolver sends two names of "other sites" to this machine, as an
    attacker's DNS would once it rebinds them (``--host-resolver-rules``)."""
    if async_playwright is None or CHROMIUM is None:
        if os.environ.get("CI"):
            pytest.fail("Chromium and Playwright are needed (.ci/run installs them)")
        pytest.skip("no Chromium here (apt-get install chromium) or no Playwright")
    rules = "--host-resolver-rules=MAP evil.example 127.0.0.1, MAP attacker.example 127.0.0.1"
    async with async_playwright() as p:
        launched = await p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", rules])
        try:
            yield launched
        finally:
            await launched.close()


async def test_a_page_of_another_site_can_neither_read_nor_act(
    rebinding_browser: Browser, seeded: tuple[str, dict[str, str], App], tmp_path: Path
) -> None:
    """DNS rebinding and cross-site requests, in a real browser against ``durafn
    dashboard`` in its default local mode (no token): a page served from another origin
    tries to read a row and to cancel it, first across origins, then under its own name
    resolved to the dashboard. Every try fails, and the row stays Pending."""
    db_url, rows, app = seeded
    pending = rows["pending"]
    async with owned() as owner:
        url = await _serve(owner, db_url, tmp_path / "dashboard.log")
        port = url.rsplit(":", 1)[1]
        site = tmp_path / "site"
        site.mkdir()
        (site / "attack.html").write_text(ATTACK.format(dash=url, id=pending))
        attacker_port = _free_port()
        await owner.start(
            [sys.executable, "-m", "http.server", str(attacker_port), "--bind", "127.0.0.1"],
            cwd=site,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        attacker = f"http://attacker.example:{attacker_port}"
        other_site = f"http://127.0.0.1:{attacker_port}"
        await wait_until(lambda: _answers(other_site, "/attack.html"), "the other site answers")
        page = await _new_page(rebinding_browser)
        # 1. Across origins: the browser will not let it read the answer; the POST, sent
        #    all the same, is refused as cross-origin, not merely for its token.
        await page.goto(f"{attacker}/attack.html")
        await page.wait_for_function("window.results.done === true")
        results = await page.evaluate("window.results")
        assert results["read"].startswith("blocked: "), results["read"]
        assert XSS not in results["read"]
        async with page.expect_navigation():
            await page.click("#submit")
        text = await page.text_content("#refused") or ""
        assert "a cross-origin request is refused (the browser marks it cross-site)" in text
        # 2. Rebound: the other site's own name now reaches the dashboard, so the browser
        #    treats the dashboard as that site. Its Host is still the other site's name.
        rebound = f"http://evil.example:{port}"
        answer = await page.goto(f"{rebound}/rows/{pending}")
        assert answer is not None and answer.status == 400
        body = await page.text_content("body") or ""
        assert f"Host 'evil.example:{port}' is not one this dashboard answers to" in body
        assert XSS not in body
        tried = await page.evaluate(
            """async (id) => {
                const read = await fetch(`/rows/${id}`);
                const post = await fetch(`/rows/${id}/cancel`, {method: "POST",
                    body: new URLSearchParams({csrf: "guessed"})});
                return [read.status, await read.text(), post.status];
            }""",
            pending,
        )
        assert tried[0] == 400 and XSS not in tried[1] and tried[2] == 400
        await _shot(page, tmp_path, "rebinding-refused")
    row = await app.get(pending)
    assert row is not None and row.state is State.PENDING
    assert await app.audit_log() == []


async def test_a_failure_group_is_retried_and_an_operation_followed_and_canceled(
    browser: Browser, seeded: tuple[str, dict[str, str], App], tmp_path: Path
) -> None:
    """Failures grouped by error type, a group retried after its confirmation; then an
    operation too large for one page followed on its page, which reloads itself (no
    script) as a worker's page lands, and canceled from it."""
    db_url, rows, app = seeded
    bulk = dashboard_app.send.options(queue="bulk")
    await app.scheduler().run_many([bulk.call(f"u{n}").after(60) for n in range(1200)])
    op = await app.start_operation("cancel", who="test", queue="bulk")
    async with owned() as owner:
        url = await _serve(owner, db_url, tmp_path / "dashboard.log")
        page = await _new_page(browser)
        page.on("dialog", lambda dialog: pytest.fail(f"a script ran: {dialog.message}"))
        await page.goto(url + "/")
        await page.click("text=Failures")
        group = page.locator("tr.failure-group", has_text="mail:broken")
        assert "ValueError" in (await group.text_content() or "")
        assert XSS in (await group.locator("code").text_content() or "")  # text, not a script
        await _shot(page, tmp_path, "failures")
        await group.locator("a.retry-group").click()
        assert "Retry mail:broken failing with ValueError?" in (await page.text_content("h1") or "")
        await page.click("#confirm")
        said = await page.text_content("#done") or ""
        assert "put back to Pending: 1 Failed rows of mail:broken failing with ValueError" in said
        assert (await app.get(rows["failed"])).state is State.PENDING  # type: ignore[union-attr]
        # The operation's page: Running, nothing done; a worker's page lands and the page,
        # reloading itself, shows it; then it is canceled from there.
        await page.goto(f"{url}/operations/{op.id}")
        assert await page.text_content("#op-state") == "Running"
        assert await page.text_content("#op-done") == "0"
        # It follows with no script of its own (the dashboard's shared one only adds keys
        # and the rows list's updates: it reloads no page).
        others = "document.querySelectorAll(\"script:not([src*='/static/dashboard.js'])\").length"
        assert await page.evaluate(others) == 0
        assert await app.run_operations(pages=1) == 1
        await page.wait_for_function("document.getElementById('op-done').textContent === '500'")
        await _shot(page, tmp_path, "operation")
        await page.click("#cancel-operation")
        assert f"operation {op.id} canceled" in (await page.text_content("#done") or "")
        assert await page.text_content("#op-state") == "Canceled"
        await page.click("text=All operations")
        assert "Canceled" in (await page.text_content("#operations") or "")
    assert (await app.operation(op.id)).done == 500
    assert await app.count(state=State.CANCELED, queue="bulk") == 500


async def _ended_a_while_ago(app: App) -> None:
    """Rows that ended ten minutes ago (Success, and Failed with two error types' worth of
    messages), rolled up by a maintenance pass now: the charts' last hour holds them."""
    clock = app.clock
    assert isinstance(clock, FakeClock)
    now = clock.now()
    clock.set(now - 600)
    sched = app.scheduler()
    for n in range(6):
        await sched.run_after(0, dashboard_app.send, f"user{n}")
    for n in range(2):
        await sched.run_after(0, dashboard_app.broken, f"host{n}")
    await app.executor().run_until_idle()
    clock.set(now)
    await app.executor().run_maintenance()


async def test_charts_a_function_page_dark_mode_keys_and_the_live_list(
    browser: Browser, seeded: tuple[str, dict[str, str], App], tmp_path: Path
) -> None:
    db_url, _, app = seeded
    await _ended_a_while_ago(app)
    async with owned() as owner:
        url = await _serve(owner, db_url, tmp_path / "dashboard.log")
        page = await _new_page(browser)
        page.on("dialog", lambda dialog: pytest.fail(f"a script ran: {dialog.message}"))
        # Keyboard: the first Tab reaches the skip link, which moves to the content; the
        # focus ring shows; "g" then "a" opens the charts.
        await page.goto(url + "/")
        await page.keyboard.press("Tab")
        assert await page.evaluate("document.activeElement.className") == "skip"
        outline = await page.evaluate("getComputedStyle(document.activeElement).outlineStyle")
        assert outline == "solid"
        await page.keyboard.press("Enter")
        assert await page.evaluate("document.activeElement.id") == "main"
        async with page.expect_navigation():
            await page.keyboard.press("g")
            await page.keyboard.press("a")
        assert page.url.endswith("/charts")
        # The charts: axes, units, a legend; what ended ten minutes ago is drawn.
        for chart in ("#chart-ended", "#chart-lag", "#chart-failures"):
            assert await page.locator(f"{chart} .x-axis text").count() >= 3
            assert await page.locator(f"{chart} .y-axis text").count() >= 2
            assert await page.locator(f"{chart} ul.legend li").count() >= 1
        ended = await page.locator("#chart-ended rect.s-Success title").all_text_contents()
        assert any(t.endswith(": 6 Success") for t in ended), ended
        await _shot(page, tmp_path, "charts")
        # A function's page, from the table by function: its errors by type.
        async with page.expect_navigation():
            await page.click("#by-function a:text('mail:broken')")
        assert await page.text_content("#function-name") == "mail:broken"
        assert "ValueError" in (await page.text_content("#errors") or "")
        assert await page.locator("#chart-duration").count() == 1
        await _shot(page, tmp_path, "function")
        # Dark mode: the toggle is a form (no script needed); the colours follow.
        light = await page.evaluate("getComputedStyle(document.body).backgroundColor")
        async with page.expect_navigation():
            await page.click("#theme")
        assert await page.get_attribute("html", "data-theme") == "dark"
        dark = await page.evaluate("getComputedStyle(document.body).backgroundColor")
        assert dark != light
        # A phone's width: the page does not scroll sideways (a wide table scrolls in
        # its own box), on the function's page and the rows list.
        phone = await (await browser.new_context(viewport={"width": 390, "height": 800})).new_page()
        phone.set_default_timeout(CEILING * 1000)
        for path in (page.url, url + "/rows", url + "/"):
            await phone.goto(path)
            wide = "document.documentElement.scrollWidth - document.documentElement.clientWidth"
            assert await phone.evaluate(wide) <= 0, path
        await _shot(phone, tmp_path, "phone")
        # The system's preference alone (no cookie) gives dark too.
        other = await (await browser.new_context(color_scheme="dark")).new_page()
        other.set_default_timeout(CEILING * 1000)
        await other.goto(url + "/charts")
        assert await other.evaluate("getComputedStyle(document.body).backgroundColor") == dark
        await _shot(other, tmp_path, "charts-dark")
        # The rows list follows new rows live; held while the tab is hidden.
        await page.goto(url + "/rows?name=mail:send")
        await page.wait_for_function(
            "document.getElementById('live-status').textContent.startsWith('live')"
        )
        new = await app.scheduler().run_after(3600, dashboard_app.send, "fresh")
        await page.wait_for_selector(f"tr[data-id='{new}']")
        await page.evaluate(
            """() => {
                Object.defineProperty(
                    document, "visibilityState", {value: "hidden", configurable: true});
                document.dispatchEvent(new Event("visibilitychange"));
            }"""
        )
        held = await app.scheduler().run_after(3600, dashboard_app.send, "held")
        await page.wait_for_function(
            "document.getElementById('live-status').textContent.includes('1 new row')"
        )
        assert await page.locator(f"tr[data-id='{held}']").count() == 0
        await _shot(page, tmp_path, "rows-live")
        await page.click("#show-new")
        await page.wait_for_selector(f"tr[data-id='{held}']")
