"""The dashboard's handlers on both engines, through its ASGI app (httpx2's transport, in
the test's event loop): pages, actions, and every refusal (login, CSRF, read-only, bad
requests), with user text escaped. The browser tests of the pages are to come."""

from __future__ import annotations

import logging
import re
from datetime import UTC, datetime
from typing import Any

import anyio
import pytest

import durafn
from durafn import ActionCtx, MutationCtx, State
from durafn.testing import FakeClock

from .support import dashboard_kit
from .support.dashboard_kit import XSS, client, csrf_of
from .support.helpers import CEILING, wait_until


async def has_workers(app: durafn.App) -> bool:
    return bool(await app.workers())


pytestmark = pytest.mark.anyio

rows = dashboard_kit.rows


async def test_the_pages_show_rows_with_their_text_escaped(
    app: durafn.App, rows: dict[str, str]
) -> None:
    async with client(app.dashboard()) as web:
        overview = await web.get("/")
        assert overview.status_code == 200
        assert '>Pending</a></td><td id="count-Pending">1<' in overview.text
        # The last hour: a bar for the two rows that ended this minute (a Success on a
        # Failed), the failure.
        runs = re.search(r'<figure class="chart" id="runs">(.*?)</figure>', overview.text)
        assert runs is not None and ">rows / minute</text>" in runs.group(1)
        bars = re.findall(
            r'<rect class="s-(\w+)"[^>]*><title>[^<]*: 1 (\w+)</title>', runs.group(1)
        )
        assert bars == [("Success", "Success"), ("Failed", "Failed")]
        assert ">mail:broken</a></td><td>1<" in overview.text
        assert "From the 2 rows that ended last." in overview.text
        listing = await web.get("/rows", params={"state": "Failed"})
        assert listing.status_code == 200 and rows["failed"] in listing.text
        assert '<span id="count-Failed">1</span>' in listing.text  # live counts, bounded
        assert "<title>durafn: scheduled functions</title>" in listing.text
        assert rows["pending"] not in listing.text
        assert XSS not in listing.text and "&lt;script&gt;" in listing.text
        page = await web.get(f"/rows/{rows['failed']}")
        assert page.status_code == 200
        assert XSS not in page.text
        assert "ValueError: cannot reach &lt;script&gt;" in page.text
        assert "<title>durafn: mail:broken</title>" in page.text
        assert 'id="retry"' in page.text and 'id="cancel"' not in page.text
        assert "EventSource" not in page.text  # an ended row is not followed
        attempts = re.search(r'<table id="attempts">(.*?)</table>', page.text, re.DOTALL)
        assert attempts is not None and "not tried again" in attempts.group(1)
        assert "ValueError: cannot reach &lt;script&gt;" in attempts.group(1)
        assert f"durafn retry {rows['failed']}" in page.text
        pending = await web.get(f"/rows/{rows['pending']}")
        assert 'id="cancel"' in pending.text and 'id="explain"' in pending.text
        assert "<title>durafn: mail:send</title>" in pending.text
        assert pending.text.count("EventSource") == 1
        by_name = await web.get("/rows", params={"name": "mail:send"})
        assert rows["done"] in by_name.text and rows["failed"] not in by_name.text


async def test_cancel_and_retry_change_the_rows_and_are_audited(
    app: durafn.App, rows: dict[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="durafn.audit")
    async with client(app.dashboard()) as web:
        page = await web.get(f"/rows/{rows['pending']}")
        done = await web.post(f"/rows/{rows['pending']}/cancel", data={"csrf": csrf_of(page)})
        assert done.status_code == 303
        shown = await web.get(done.headers["location"])
        assert "canceled (it was Pending)" in shown.text
        page = await web.get(f"/rows/{rows['failed']}")
        again = await web.post(f"/rows/{rows['failed']}/retry", data={"csrf": csrf_of(page)})
        assert again.status_code == 303
        overview = await web.get("/")
    by_id = {str(r.id): r for r in (await app.list(limit=10)).items}
    assert by_id[rows["pending"]].state is State.CANCELED
    assert by_id[rows["failed"]].state is State.PENDING
    assert f"<td>local</td><td>dashboard</td><td>cancel</td><td>{rows['pending']}</td><td>1<" in (
        overview.text
    )
    assert f"<td>retry</td><td>{rows['failed']}</td><td>1</td><td>retried<" in overview.text
    said = [r.getMessage() for r in caplog.records]
    assert f"local via dashboard: cancel {rows['pending']} (1 rows): canceled (it was Pending)" in (
        said
    )
    # Kept in the database: another pool (as another process would) reads them.
    other = app.using()
    try:
        entries = await other.audit_log()
    finally:
        await other.aclose()
    assert [(e.action, e.target, e.rows, e.who, e.via) for e in entries] == [
        ("retry", rows["failed"], 1, "local", "dashboard"),
        ("cancel", rows["pending"], 1, "local", "dashboard"),
    ]


async def test_a_post_without_the_csrf_token_or_from_another_origin_is_refused(
    app: durafn.App, rows: dict[str, str]
) -> None:
    async with client(app.dashboard()) as web:
        page = await web.get(f"/rows/{rows['pending']}")
        missing = await web.post(f"/rows/{rows['pending']}/cancel", data={})
        forged = await web.post(f"/rows/{rows['pending']}/cancel", data={"csrf": "0" * 64})
        elsewhere = await web.post(
            f"/rows/{rows['pending']}/cancel",
            data={"csrf": csrf_of(page)},
            headers={"origin": "https://evil.example"},
        )
    for refused in (missing, forged):
        assert refused.status_code == 403 and "CSRF" in refused.text
    assert elsewhere.status_code == 403 and "cross-origin" in elsewhere.text
    assert "https://evil.example" in elsewhere.text and "CSRF" not in elsewhere.text
    assert (await app.get(rows["pending"])).state is State.PENDING  # type: ignore[union-attr]


async def test_read_only_hides_the_actions_and_refuses_every_post(
    app: durafn.App, rows: dict[str, str]
) -> None:
    async with client(app.dashboard(read_only=True)) as web:
        page = await web.get(f"/rows/{rows['failed']}")
        assert 'id="retry"' not in page.text and "(read-only)" in page.text
        refused = await web.post(f"/rows/{rows['failed']}/retry", data={"csrf": csrf_of(page)})
    assert refused.status_code == 403 and "read-only" in refused.text
    assert (await app.get(rows["failed"])).state is State.FAILED  # type: ignore[union-attr]


async def test_a_token_is_asked_for_once_and_kept_in_an_httponly_cookie(
    app: durafn.App, rows: dict[str, str]
) -> None:
    async with client(app.dashboard(token="s3cret")) as web:
        first = await web.get("/")
        assert first.status_code == 303 and first.headers["location"].endswith("/login")
        wrong = await web.post("/login", data={"token": "guess"})
        assert wrong.status_code == 403 and "wrong token" in wrong.text
        assert (await web.get("/rows")).status_code == 303
        right = await web.post("/login", data={"token": "s3cret"})
        assert right.status_code == 303
        cookie = right.headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "s3cret" not in cookie
        assert (await web.get("/rows")).status_code == 200
        # A CSRF token is tied to the session: one from before the login is refused.
        page = await web.get("/")
        logout = await web.post("/logout", data={"csrf": csrf_of(page)})
        assert logout.status_code == 303
        web.cookies.clear()
        assert (await web.get("/")).status_code == 303


async def test_the_host_applications_auth_decides(app: durafn.App, rows: dict[str, str]) -> None:
    def auth(request: Any) -> str | None:
        return "ann" if request.headers.get("x-user") == "ann" else None

    async with client(app.dashboard(auth=auth)) as web:
        assert (await web.get("/")).status_code == 403
        page = await web.get(f"/rows/{rows['pending']}", headers={"x-user": "ann"})
        assert page.status_code == 200 and ">ann<" in page.text
        done = await web.post(
            f"/rows/{rows['pending']}/cancel",
            data={"csrf": csrf_of(page)},
            headers={"x-user": "ann"},
        )
        overview = await web.get("/", headers={"x-user": "ann"})
    assert done.status_code == 303
    assert f"<td>ann</td><td>dashboard</td><td>cancel</td><td>{rows['pending']}</td>" in (
        overview.text
    )


async def test_bad_requests_get_a_message_and_a_4xx_and_write_nothing(
    app: durafn.App, rows: dict[str, str]
) -> None:
    async with client(app.dashboard()) as web:
        page = await web.get(f"/rows/{rows['pending']}")
        csrf = csrf_of(page)
        unknown = await web.get("/rows/not-an-id")
        bad_state = await web.get("/rows", params={"state": "Exploded"})
        bad_cursor = await web.get("/rows", params={"cursor": "garbage"})
        unfiltered = (await app.list(limit=1, newest_first=True)).next_cursor
        assert unfiltered is not None
        other_filter = await web.get("/rows", params={"state": "Failed", "cursor": unfiltered})
        gone = await web.post(
            "/rows/0191d3a8-0000-7000-8000-000000000000/cancel", data={"csrf": csrf}
        )
        not_failed = await web.post(f"/rows/{rows['pending']}/retry", data={"csrf": csrf})
        said = await web.get(not_failed.headers["location"])
        assert "not Failed: nothing to retry" in said.text
        # A message is shown by its key only: a link cannot put words on the page.
        spoof = await web.get(f"/rows/{rows['pending']}", params={"done": "enter your token"})
        assert "enter your token" not in spoof.text
    assert unknown.status_code == 404
    assert "no scheduled function &#39;not-an-id&#39;" in unknown.text  # quotes escaped too
    assert bad_state.status_code == 400 and "unknown state &#39;Exploded&#39;" in bad_state.text
    assert bad_cursor.status_code == 400 and "cursor" in bad_cursor.text
    assert other_filter.status_code == 400 and "other filters" in other_filter.text
    assert gone.status_code == 404
    assert not_failed.status_code == 303
    for page in (unknown, bad_state, bad_cursor, other_filter, gone):
        assert "Traceback" not in page.text
    assert (await app.get(rows["pending"])).state is State.PENDING  # type: ignore[union-attr]


async def test_hide_args_shows_no_arguments_or_results(
    app: durafn.App, rows: dict[str, str]
) -> None:
    async with client(app.dashboard(hide_args=True)) as web:
        listing = await web.get("/rows")
        page = await web.get(f"/rows/{rows['done']}")
    assert "ann" not in listing.text and "sent ann" not in page.text
    assert 'id="args"' not in page.text and 'id="result"' not in page.text


def test_the_command_refuses_another_interface_without_a_token(db_url: str) -> None:
    """``durafn dashboard`` binds 127.0.0.1; anything else needs a token first."""
    from click.testing import CliRunner

    from durafn.cli import main

    env = {"DURAFN_DASHBOARD_TOKEN": ""}
    for host in ("0.0.0.0", "192.0.2.7", "dash.example"):
        result = CliRunner().invoke(main, ["dashboard", "--url", db_url, "--host", host])
        assert result.exit_code == 1
        assert f"refusing to serve the dashboard on {host} without a token" in result.output
    empty = CliRunner().invoke(main, ["dashboard", "--url", db_url], env=env)
    assert empty.exit_code == 1 and "the dashboard token is empty" in empty.output


async def test_crons_show_their_next_fires_with_the_clock_changes_and_can_be_steered(
    app: durafn.App, clock: FakeClock
) -> None:
    @app.mutation(name="reports:nightly")
    async def nightly(ctx: MutationCtx) -> None:
        pass

    # Paris moves its clocks on at 02:00 on 2030-03-31: the 01:30 fire of the next night
    # is the first at UTC+02:00.
    clock.set(datetime(2030, 3, 29, 12, tzinfo=UTC))
    app.cron("nightly", "30 1 * * *", nightly, timezone="Europe/Paris")
    await app.executor().run_until_idle()  # the executor writes the declared crons
    async with client(app.dashboard()) as web:
        page = await web.get("/crons")
        assert page.status_code == 200
        assert "2030-03-31T01:30:00+01:00</td><td></td>" in page.text
        assert (
            "2030-04-01T01:30:00+02:00</td><td>DST: clocks changed since the previous fire "
            "(UTC+01:00 → UTC+02:00)" in page.text
        )
        csrf = csrf_of(page)
        disabled = await web.post("/crons/nightly/disable", data={"csrf": csrf})
        assert disabled.status_code == 303
        shown = await web.get(disabled.headers["location"])
        assert "cron nightly disabled" in shown.text
        assert "(disabled)" in shown.text and "next fire times" not in shown.text
        triggered = await web.post("/crons/nightly/trigger", data={"csrf": csrf})
        assert triggered.status_code == 303
        unknown = await web.post("/crons/hourly/trigger", data={"csrf": csrf})
        wrong = await web.post("/crons/nightly/explode", data={"csrf": csrf})
        removed = await web.post("/crons/nightly/remove", data={"csrf": csrf})
    assert unknown.status_code == 404 and "no cron &#39;hourly&#39;" in unknown.text
    assert wrong.status_code == 404 and "no cron action" in wrong.text
    assert removed.status_code == 303 and await app.crons() == []
    assert [r.name for r in (await app.list()).items] == ["reports:nightly"]  # the trigger


async def test_queues_pause_and_resume_and_workers_are_listed(
    app: durafn.App, rows: dict[str, str]
) -> None:
    @app.action(name="mail:queued")
    async def queued(ctx: ActionCtx) -> None:
        pass

    await app.scheduler().run_after(60, queued.options(queue="mail"))
    async with client(app.dashboard()) as web:
        page = await web.get("/queues")
        assert page.status_code == 200 and ">mail</a>" in page.text
        paused = await web.post("/queues/mail/pause", data={"csrf": csrf_of(page)})
        assert paused.status_code == 303
        assert [q.paused for q in await app.queues()] == [True]
        shown = await web.get(paused.headers["location"])
        assert "(paused)" in shown.text and "queue mail paused" in shown.text
        resumed = await web.post("/queues/mail/resume", data={"csrf": csrf_of(shown)})
        assert resumed.status_code == 303 and [q.paused for q in await app.queues()] == [False]
        unknown = await web.post("/queues/nope/pause", data={"csrf": csrf_of(shown)})
        assert unknown.status_code == 404
        async with app.run_executor():
            await wait_until(lambda: has_workers(app), "the worker registered")
            workers = await web.get("/workers")
    assert workers.status_code == 200 and 'id="workers"' in workers.text
    assert "No worker lost in the last 7 days." in workers.text


async def test_the_workers_page_shows_the_lost_ones_and_their_rescue(
    app: durafn.App, clock: FakeClock
) -> None:
    """A worker's loss as the rescue records it (the driver's own statement, on the real
    database; test_heartbeats and test_workers make real ones), its host name escaped."""
    rt = app._rt
    now = clock.now()

    async def lose(conn: Any) -> int:
        await rt.driver.register_worker(conn, "far:1:gone", XSS, 1, 4, now - 100)
        return await rt.driver.remove_lost_workers(
            conn, now, now - 10, "rescuer:2:x", {"far:1:gone": (2, 1)}
        )

    assert await rt.transaction(lose) == 1
    async with client(app.dashboard()) as web:
        page = await web.get("/workers")
    assert page.status_code == 200 and 'id="lost"' in page.text
    assert "<td>far:1:gone</td>" in page.text and "<td>rescuer:2:x</td>" in page.text
    assert 'state=Failed">2</a></td><td>1</td>' in page.text
    assert XSS not in page.text and "&lt;script&gt;" in page.text


async def test_every_pending_row_a_filter_matches_is_cancelled_after_a_confirmation(
    app: durafn.App, rows: dict[str, str]
) -> None:
    @app.mutation(name="mail:digest")
    async def digest(ctx: MutationCtx, user: int) -> None:
        pass

    sched = app.scheduler()
    await sched.run_many([digest.options(queue="digests").call(n).after(60) for n in range(30)])
    async with client(app.dashboard()) as web:
        listing = await web.get("/rows", params={"queue": "digests"})
        link = re.search(r'id="cancel-matching" href="([^"]+)"', listing.text)
        assert link is not None and link.group(1).endswith("/rows/cancel-matching?queue=digests")
        confirm = await web.get(link.group(1).replace("&amp;", "&"))
        assert confirm.status_code == 200
        assert "This changes <strong>30</strong> Pending rows" in confirm.text
        assert await app.count(state=State.CANCELED) == 0  # nothing before the POST
        done = await web.post(
            "/rows/cancel-matching", data={"csrf": csrf_of(confirm), "queue": "digests"}
        )
        said = await web.get(done.headers["location"])
        assert "canceled 30 Pending rows where queue=digests" in said.text
        unfiltered = await web.post("/rows/cancel-matching", data={"csrf": csrf_of(confirm)})
        no_filter = await web.get("/rows/cancel-matching")
    assert done.status_code == 303
    assert await app.count(state=State.CANCELED, queue="digests") == 30
    assert (await app.get(rows["pending"])).state is State.PENDING  # type: ignore[union-attr]
    for refused in (unfiltered, no_filter):
        assert refused.status_code == 400 and "needs a filter" in refused.text


async def test_a_row_streams_its_state_until_it_has_ended(
    app: durafn.App, rows: dict[str, str]
) -> None:
    """An ended row's stream says so and ends (a live one, and the overview's counts, are
    followed by the browser tests: this transport gives a body only once it has ended)."""
    async with client(app.dashboard()) as web:
        ended = await web.get(f"/rows/{rows['done']}/events")
        gone = await web.get("/rows/0191d3a8-0000-7000-8000-000000000000/events")
    assert ended.headers["content-type"].startswith("text/event-stream")
    assert ended.text == "event: state\ndata: Success\n\n"
    assert gone.text == "event: state\ndata: Gone\n\n"
    async with client(app.dashboard(token="t")) as web:
        assert (await web.get(f"/rows/{rows['done']}/events")).status_code == 403
        assert (await web.get("/events/counts")).status_code == 403
        assert (await web.get("/rows/live")).status_code == 403


async def test_a_row_shows_what_it_scheduled(app: durafn.App) -> None:
    @app.mutation(name="tree:leaf")
    async def leaf(ctx: MutationCtx, n: int) -> None:
        pass

    @app.mutation(name="tree:root")
    async def root(ctx: MutationCtx) -> None:
        await ctx.scheduler.run_many([leaf.call(n).after(60) for n in range(25)])

    top = await app.scheduler().run_after(0, root)
    await app.executor().run_until_idle()
    async with client(app.dashboard()) as web:
        page = await web.get(f"/rows/{top}")
        everything = await web.get("/rows", params={"parent": top})
        bad = await web.get("/rows", params={"parent": "nope"})
    assert page.text.count('<a href="/rows/') >= 20  # paths, never URLs built from Host
    assert f'/rows?parent={top}">All of them</a>' in page.text
    assert everything.text.count(">tree:leaf<") == 25
    assert bad.status_code == 400 and "parent must be" in bad.text


async def test_rows_filter_on_an_argument_and_then_offer_no_bulk_cancel(
    app: durafn.App, rows: dict[str, str]
) -> None:
    async with client(app.dashboard()) as web:
        by_arg = await web.get("/rows", params={"arg": "to=ann", "name": "mail:send"})
        containing = await web.get("/rows", params={"arg": "to~<script>"})
        bad = await web.get("/rows", params={"arg": "to"})
    assert rows["done"] in by_arg.text and rows["pending"] not in by_arg.text
    assert rows["pending"] in containing.text and rows["failed"] in containing.text
    assert rows["done"] not in containing.text
    assert 'id="cancel-matching"' not in by_arg.text  # it would cancel more than listed
    assert bad.status_code == 400 and "PATH=VALUE" in bad.text


async def test_every_failed_row_a_filter_matches_is_retried_after_a_confirmation(
    app: durafn.App, rows: dict[str, str]
) -> None:
    @app.action(name="mail:bounce")
    async def bounce(ctx: ActionCtx, n: int) -> None:
        raise ValueError("bounced")

    await app.scheduler().run_many([bounce.call(n) for n in range(5)])
    await app.executor().run_until_idle()
    assert await app.count(state=State.FAILED, name="mail:bounce") == 5
    with pytest.raises(durafn.ArgumentError, match="retry_where needs a filter"):
        await app.retry_where()
    async with client(app.dashboard()) as web:
        listing = await web.get("/rows", params={"name": "mail:bounce"})
        link = re.search(r'id="retry-matching" href="([^"]+)"', listing.text)
        assert link is not None
        confirm = await web.get(link.group(1).replace("&amp;", "&"))
        assert "This changes <strong>5</strong> Failed rows" in confirm.text
        done = await web.post(
            "/rows/retry-matching", data={"csrf": csrf_of(confirm), "name": "mail:bounce"}
        )
        said = await web.get(done.headers["location"])
        unknown = await web.get("/rows/explode-matching", params={"name": "x"})
    assert "put back to Pending: 5 Failed rows where name=mail:bounce" in said.text
    assert await app.count(state=State.PENDING, name="mail:bounce") == 5
    assert (await app.get(rows["failed"])).state is State.FAILED  # type: ignore[union-attr]
    assert unknown.status_code == 404 and "no bulk action" in unknown.text


async def test_a_rows_attempts_read_as_a_timeline(app: durafn.App, clock: FakeClock) -> None:
    calls = 0

    @app.action(name="hook:flaky", retry=durafn.Retry(3, backoff=durafn.Fixed(5)))
    async def flaky(ctx: ActionCtx) -> str:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise ConnectionError("refused")
        return "ok"

    id = await app.scheduler().run_after(0, flaky)
    await app.executor().run_until_idle()
    clock.advance(5)
    await app.executor().run_until_idle()
    async with client(app.dashboard()) as web:
        page = await web.get(f"/rows/{id}")
    attempts = re.search(r'<table id="attempts">(.*?)</table>', page.text, re.DOTALL)
    assert attempts is not None
    rows = attempts.group(1).split("</tr>")
    assert "ConnectionError: refused" in rows[1] and "tried again at 2030-01-01T00:00:05" in rows[1]
    assert 'class="state-Success">Success at 2030-01-01T00:00:05' in rows[2]


async def test_a_listing_page_reads_a_bounded_stretch_and_says_so(
    app: durafn.App, rows: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A page reads at most ``SCAN`` rows of the order (here 1): a filter's matches are
    found a stretch at a time, each page saying how far it searched, and following the
    links finds them all."""
    from durafn.dashboard import rows as listing

    monkeypatch.setattr(listing, "SCAN", 1)
    found: list[str] = []
    pages = 0
    async with client(app.dashboard()) as web:
        url: str | None = "/rows?name=mail:send"
        while url is not None:
            page = await web.get(url)
            assert page.status_code == 200
            pages += 1
            found += [i for i in rows.values() if f"/rows/{i}" in page.text]
            older = re.search(r'id="older" href="[^"]*(/rows\?[^"]+)"', page.text)
            if older is not None:
                assert 'id="partial">Searched 1 rows' in page.text
                assert "Search older rows" in page.text
            url = older.group(1).replace("&amp;", "&") if older else None
    assert sorted(found) == sorted([rows["pending"], rows["done"]])
    assert pages == 4  # one row per stretch (three rows), then the end


async def test_watch_wakes_at_a_write_and_on_postgresql_at_another_apps(
    app: durafn.App, app_url: tuple[str, bool], engine_name: str
) -> None:
    """``App.watch`` (what the live pages wait on): this process's writes wake it on both
    engines; on PostgreSQL another app's (another process's) NOTIFY does too. The poll is
    an hour here, so only a wake-up can end a wait."""

    @app.mutation(name="watch:job")
    async def job(ctx: MutationCtx) -> None:
        pass

    async def woken(watch: durafn.Watch, write: Any) -> None:
        async with anyio.create_task_group() as tg:
            done = anyio.Event()

            async def wait() -> None:
                await watch.changed()
                done.set()

            tg.start_soon(wait)
            await write()
            with anyio.fail_after(CEILING):
                await done.wait()

    async with app.watch(poll=3600, settle=0.001) as watch:
        assert watch.listening is (engine_name == "postgres")
        if watch.listening:  # the LISTEN's first wake-up: it is heard from here on
            with anyio.fail_after(CEILING):
                await watch.changed()
        await woken(watch, lambda: app.scheduler().run_after(60, job))
        if watch.listening:
            other = durafn.App(app_url[0])
            other.mutation(name="watch:job")(job.fn)
            try:
                await woken(watch, lambda: other.scheduler().run_after(60, "watch:job"))
            finally:
                await other.aclose()
    with pytest.raises(durafn.ArgumentError, match="settle"):
        async with app.watch(poll=1, settle=2):
            pass


async def test_every_pending_row_a_filter_matches_is_rescheduled_after_a_confirmation(
    app: durafn.App, clock: FakeClock
) -> None:
    @app.mutation(name="mail:later")
    async def later(ctx: MutationCtx, n: int) -> None:
        pass

    sched = app.scheduler()
    ids = await sched.run_many([later.options(queue="later").call(n).after(60) for n in range(3)])
    other = await sched.run_after(60, later, 9)
    async with client(app.dashboard()) as web:
        listing = await web.get("/rows", params={"queue": "later"})
        link = re.search(r'id="reschedule-matching" href="([^"]+)"', listing.text)
        assert link is not None
        confirm = await web.get(link.group(1).replace("&amp;", "&"))
        assert confirm.status_code == 200 and 'id="run_at"' in confirm.text
        assert "This changes <strong>3</strong> Pending rows" in confirm.text
        csrf = csrf_of(confirm)
        refused = [
            await web.post("/rows/reschedule-matching", data={"csrf": csrf, "queue": "later"}),
            await web.post(
                "/rows/reschedule-matching",
                data={"csrf": csrf, "queue": "later", "run_at": "next tuesday"},
            ),
            await web.post(
                "/rows/reschedule-matching",
                data={"csrf": csrf, "queue": "later", "priority": "high"},
            ),
        ]
        assert [r.status_code for r in refused] == [400, 400, 400]
        assert "needs a new time" in refused[0].text and "ISO 8601" in refused[1].text
        assert "not an integer" in refused[2].text
        done = await web.post(
            "/rows/reschedule-matching",
            data={
                "csrf": csrf,
                "queue": "later",
                "run_at": "2040-01-02T03:04:05",
                "priority": "-3",
            },
        )
        assert done.status_code == 303
        said = await web.get(done.headers["location"])
    assert "rescheduled 3 Pending rows where queue=later to run at 2040-01-02T03:04:05+00:00" in (
        said.text
    )
    when = datetime(2040, 1, 2, 3, 4, 5, tzinfo=UTC)
    for id in ids:
        row = await app.get(id)
        assert row is not None and (row.scheduled_time, row.priority) == (when, -3)
    untouched = await app.get(other)
    assert untouched is not None and untouched.scheduled_time != when
