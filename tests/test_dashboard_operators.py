"""What operators rely on, through the dashboard's ASGI app and the command line, on both
engines: the audit trail kept in the database (paged, pruned with the retention period,
read by ``durafn audit``; the command line's changes in it too), a confirmation before a
row's cancel and a cron's removal, values of any size shown bounded (a one-line preview
in lists, a folded view and a download on a row's page, ``durafn show`` cut unless
``--full``), and the crons' last runs."""

from __future__ import annotations

import getpass
import json
import re
import socket
from datetime import UTC, datetime

import anyio
import pytest
from click.testing import CliRunner, Result

import durafn
from durafn import MutationCtx, State
from durafn.cli import main
from durafn.testing import FakeClock

from .support import dashboard_kit
from .support.dashboard_kit import client, csrf_of

pytestmark = pytest.mark.anyio


async def invoke(*args: str) -> Result:
    """The command line, in a thread of its own (it runs an event loop of its own)."""
    runner = CliRunner()
    return await anyio.to_thread.run_sync(
        lambda: runner.invoke(main, list(args), env=CLEAN_ENV, catch_exceptions=False)
    )


rows = dashboard_kit.rows

CLEAN_ENV: dict[str, str | None] = dict.fromkeys(["DURAFN_APP", "DURAFN_DATABASE_URL"])
HUGE = 7_500_000
"""Characters of an argument near the top of what a row accepts (8 MB)."""


async def test_the_audit_trail_is_kept_paged_and_pruned_with_the_retention_period(
    app: durafn.App, clock: FakeClock, rows: dict[str, str], db_url: str
) -> None:
    for n in range(25):
        await app.record_action(
            who="ann", via="api", action="note", target=f"t{n}", rows=n, outcome="ok"
        )
    async with client(app.dashboard()) as web:
        first = await web.get("/")
        older = re.search(r'id="audit-older" href="([^"]+)"', first.text)
        assert older is not None
        second = await web.get(older.group(1).replace("&amp;", "&"))
        bad = await web.get("/", params={"audit_before": "x"})
    shown = re.findall(r"<td>note</td><td>(t\d+)</td>", first.text)
    assert shown == [f"t{n}" for n in range(24, 4, -1)]  # the newest 20
    assert re.findall(r"<td>note</td><td>(t\d+)</td>", second.text) == [
        f"t{n}" for n in range(4, -1, -1)
    ]
    assert 'id="audit-older"' not in second.text
    assert bad.status_code == 400 and "audit_before" in bad.text
    # durafn audit reads the same trail from another process's point of view.
    listed = await invoke("audit", "--url", db_url, "--json", "--limit", "3")
    assert listed.exit_code == 0, listed.output
    assert [e["target"] for e in json.loads(listed.output)] == ["t24", "t23", "t22"]
    table = await invoke("audit", "--url", db_url, "--limit", "2")
    assert table.exit_code == 0 and "older entries: durafn audit --before" in table.output
    # Kept as long as the executor's longest retention period, then removed.
    retention = durafn.Retention(success=86400, failed=3 * 86400, canceled=3600)
    clock.advance(2 * 86400)
    await app.record_action(who="bob", via="api", action="note", target="late", rows=0, outcome="")
    await app.executor(retention=retention).run_maintenance()
    assert len(await app.audit_log()) == 26
    clock.advance(2 * 86400)
    await app.executor(retention=retention).run_maintenance()
    assert [e.target for e in await app.audit_log()] == ["late"]
    with pytest.raises(durafn.ArgumentError, match="via must be one of"):
        await app.record_action(who="x", via="mail", action="a", target="t", rows=0, outcome="")


async def test_a_rows_cancel_and_a_crons_removal_ask_first(
    app: durafn.App, clock: FakeClock, rows: dict[str, str]
) -> None:
    @app.mutation(name="reports:nightly")
    async def nightly(ctx: MutationCtx) -> None:
        pass

    app.cron("nightly", "30 1 * * *", nightly)
    await app.executor().run_until_idle()
    pending = rows["pending"]
    async with client(app.dashboard()) as web:
        row = await web.get(f"/rows/{pending}")
        link = re.search(r'id="cancel" class="button" href="([^"]+)"', row.text)
        assert link is not None and link.group(1) == f"/rows/{pending}/cancel"
        confirm = await web.get(link.group(1))
        assert confirm.status_code == 200 and "Cancel mail:send?" in confirm.text
        assert f'action="/rows/{pending}/cancel"' in confirm.text
        assert (await app.get(pending)).state is State.PENDING  # type: ignore[union-attr]
        crons = await web.get("/crons")
        remove = re.search(r'class="remove button" href="([^"]+)"', crons.text)
        assert remove is not None
        asked = await web.get(remove.group(1))
        assert asked.status_code == 200 and "Remove the cron nightly?" in asked.text
        assert [c.name for c in await app.crons()] == ["nightly"]
        not_asked = await web.get("/crons/nightly/trigger")
        assert not_asked.status_code == 405
        canceled = await web.post(f"/rows/{pending}/cancel", data={"csrf": csrf_of(confirm)})
        removed = await web.post("/crons/nightly/remove", data={"csrf": csrf_of(asked)})
    assert canceled.status_code == 303 and removed.status_code == 303
    assert (await app.get(pending)).state is State.CANCELED  # type: ignore[union-attr]
    assert await app.crons() == []
    actions = [(e.action, e.target) for e in await app.audit_log()]
    assert actions == [("cron remove", "nightly"), ("cancel", pending)]


async def test_a_huge_argument_is_a_preview_in_lists_and_bounded_on_its_page(
    app: durafn.App, db_url: str
) -> None:
    @app.mutation(name="big:load")
    async def load(ctx: MutationCtx, blob: str, ids: list[str]) -> int:
        return len(blob)

    blob = "x" * HUGE
    ids = [f"0191d3a8-0000-7000-8000-{n:012d}" for n in range(400)]  # a group callback's
    big = await app.scheduler().run_after(60, load, blob, ids)
    small = await app.scheduler().run_after(60, load, "tiny", [])
    async with client(app.dashboard()) as web:
        listing = await web.get("/rows")
        page = await web.get(f"/rows/{big}")
        small_page = await web.get(f"/rows/{small}")
        download = await web.get(f"/rows/{big}/args.json")
        no_result = await web.get(f"/rows/{big}/nothing.json")
    async with client(app.dashboard(hide_args=True)) as web:
        hidden = await web.get(f"/rows/{big}/args.json")
    assert len(listing.text) < 20_000  # was the whole argument: 7.5 MB
    preview = re.search(rf'href="/rows/{big}"><code>(.*?)</code>', listing.text)
    assert preview is not None
    assert preview.group(1).endswith("… (7.5 million characters in all)")
    assert len(preview.group(1)) < 200
    assert len(page.text) < 40_000
    assert 'id="args-folded"' in page.text and "the first 20,000 shown" in page.text
    assert f'id="args-download" href="/rows/{big}/args.json"' in page.text
    assert 'id="args-folded"' not in small_page.text and "args-download" not in small_page.text
    assert download.status_code == 200
    assert download.headers["content-disposition"] == f'attachment; filename="{big}-args.json"'
    assert json.loads(download.text) == {"blob": blob, "ids": ids}
    assert no_result.status_code == 404 and hidden.status_code == 403
    # durafn show cuts each field unless --full; --json prints the whole row.
    cut = await invoke("show", big, "--url", db_url)
    assert cut.exit_code == 0 and len(cut.output) < 100_000  # 7.5 MB whole
    assert "more characters: --full shows them all)" in cut.output
    whole = await invoke("show", big, "--url", db_url, "--full")
    assert whole.exit_code == 0 and whole.output.count("x") >= HUGE
    as_json = await invoke("show", big, "--url", db_url, "--json")
    assert json.loads(as_json.output)["args"]["blob"] == blob


async def test_the_crons_page_shows_the_last_run_its_outcome_and_its_rows(
    app: durafn.App, clock: FakeClock
) -> None:
    @app.mutation(name="reports:flaky")
    async def flaky(ctx: MutationCtx) -> None:
        raise ValueError("the report's source is down")

    clock.set(datetime(2030, 1, 1, 0, 59, tzinfo=UTC))
    app.cron("hourly", "0 * * * *", flaky)
    async with client(app.dashboard()) as web:
        await app.executor().run_until_idle()
        before = await web.get("/crons")
        clock.advance(120)
        await app.executor().run_until_idle()
        after = await web.get("/crons")
    assert "Not run yet." in before.text
    last = await app.crons()
    assert last[0].last_row_id is not None
    assert "Last run: 2030-01-01T01:00:00+00:00" in after.text
    assert f'<a href="/rows/{last[0].last_row_id}" class="state-Failed">Failed</a>' in after.text
    assert "(ValueError: the report&#39;s source is down)" in after.text
    assert 'class="cron-rows" href="/rows?name=reports%3Aflaky"' in after.text


async def test_the_command_lines_changes_are_in_the_audit_trail(
    app: durafn.App, rows: dict[str, str], db_url: str
) -> None:
    @app.mutation(name="reports:nightly")
    async def nightly(ctx: MutationCtx) -> None:
        pass

    @app.mutation(name="mail:queued")
    async def queued(ctx: MutationCtx) -> None:
        pass

    app.cron("nightly", "30 1 * * *", nightly)
    await app.executor().run_until_idle()
    await app.scheduler().run_after(60, queued.options(queue="mail"))
    for command in (
        ("cancel", rows["pending"]),
        ("retry", "--name", "mail:broken", "--yes"),
        ("queue", "pause", "mail"),
        ("cron", "disable", "nightly"),
    ):
        done = await invoke(*command, "--url", db_url)
        assert done.exit_code == 0, done.output
    who = f"{getpass.getuser()}@{socket.gethostname()}"
    entries = await app.audit_log()
    assert {(e.who, e.via) for e in entries} == {(who, "cli")}
    assert [(e.action, e.target, e.rows, e.outcome) for e in reversed(entries)] == [
        ("cancel", rows["pending"], 1, f"canceled {rows['pending']} (was Pending)"),
        ("retry every Failed row", "name=mail:broken", 1, "1 Failed row put back to Pending"),
        ("queue pause", "mail", 1, "1 queue paused"),
        ("cron disable", "nightly", 0, "cron nightly disabled"),
    ]
