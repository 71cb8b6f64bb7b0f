"""The dashboard's failure groups and operations, through its ASGI app on both engines:
failures grouped by function and error type, a group retried and its retries canceled
after a confirmation (audited); a bulk change larger than a request's pages goes on as an
operation with a progress page (reloading while it runs, canceled from it); and the
refusals of the new POSTs (CSRF, read-only, unknown groups and operations)."""

from __future__ import annotations

import re
from datetime import UTC, datetime

import httpx2
import pytest

import durafn
from durafn import ActionCtx, MutationCtx, State
from durafn.dashboard import operations as operations_pages
from durafn.testing import FakeClock

from .support.dashboard_kit import client, csrf_of

pytestmark = pytest.mark.anyio


async def failing(app: durafn.App) -> None:
    """Six rows of ops:fetch Failed with TimeoutError, three with KeyError, and two of
    ops:flaky Pending after a first ValueError (its retry a minute away)."""

    @app.action(name="ops:fetch")
    async def fetch(ctx: ActionCtx, n: int) -> None:
        if n % 3:
            raise TimeoutError(f"slow <b>{n}</b>")
        raise KeyError(n)

    @app.action(name="ops:flaky", retry=durafn.Retry(5, backoff=durafn.Fixed(60)))
    async def flaky(ctx: ActionCtx, n: int) -> None:
        raise ValueError("down")

    await app.scheduler().run_many([fetch.call(n) for n in range(9)])
    await app.scheduler().run_many([flaky.call(n) for n in range(2)])
    await app.executor().run_until_idle()


async def test_failures_are_grouped_and_a_group_is_retried_after_a_confirmation(
    app: durafn.App,
) -> None:
    await failing(app)
    async with client(app.dashboard()) as web:
        page = await web.get("/failures")
        groups = re.findall(
            r'<tr class="failure-group">\s*<td><a[^>]*>([^<]+)</a></td>\s*<td>(\w+)</td><td>(\d+)<',
            page.text,
        )
        assert groups == [("ops:fetch", "TimeoutError", "6"), ("ops:fetch", "KeyError", "3")]
        assert "slow &lt;b&gt;" in page.text and "<b>" not in page.text
        link = re.search(r'class="button retry-group" href="([^"]+KeyError)"', page.text)
        assert link is not None
        confirm = await web.get(link.group(1).replace("&amp;", "&"))
        assert confirm.status_code == 200 and "Retry ops:fetch failing with KeyError?" in (
            confirm.text
        )
        assert "3 of them among the 10,000 rows that ended last" in confirm.text
        assert "Every Failed row of ops:fetch whose error is KeyError goes back" in confirm.text
        assert await app.count(state=State.PENDING, name="ops:fetch") == 0  # nothing yet
        done = await web.post(
            "/failures/retry",
            data={"csrf": csrf_of(confirm), "name": "ops:fetch", "error_type": "KeyError"},
        )
        assert done.status_code == 303 and done.headers["location"].startswith("/failures?")
        said = await web.get(done.headers["location"])
    assert "put back to Pending: 3 Failed rows of ops:fetch failing with KeyError" in said.text
    assert await app.count(state=State.PENDING, name="ops:fetch") == 3
    assert await app.count(state=State.FAILED, name="ops:fetch") == 6
    entry = (await app.audit_log())[0]
    assert (entry.action, entry.target, entry.rows) == (
        "retry failure group",
        "name=ops:fetch, error_type=KeyError",
        3,
    )
    assert [(o.kind, o.state, o.done) for o in await app.operations()] == [("retry", "Done", 3)]


async def test_a_groups_retries_waiting_are_canceled(app: durafn.App) -> None:
    await failing(app)
    assert await app.count(state=State.PENDING, name="ops:flaky") == 2
    async with client(app.dashboard()) as web:
        confirm = await web.get(
            "/failures/cancel", params={"name": "ops:flaky", "error_type": "ValueError"}
        )
        assert "Cancel the retries of ops:flaky failing with ValueError?" in confirm.text
        done = await web.post(
            "/failures/cancel",
            data={"csrf": csrf_of(confirm), "name": "ops:flaky", "error_type": "ValueError"},
        )
        said = await web.get(done.headers["location"])
    assert "canceled 2 Pending rows of ops:flaky retrying after ValueError" in said.text
    assert await app.count(state=State.CANCELED, name="ops:flaky") == 2


async def test_a_bulk_change_larger_than_a_request_goes_on_as_an_operation_with_its_page(
    app: durafn.App, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(operations_pages, "INLINE_PAGES", 1)  # one page in the request

    @app.mutation(name="ops:later")
    async def later(ctx: MutationCtx, n: int) -> None:
        pass

    rows = 1200
    calls = [later.options(queue="big").call(n).after(60) for n in range(rows)]
    await app.scheduler().run_many(calls)
    async with client(app.dashboard()) as web:
        confirm = await web.get("/rows/cancel-matching", params={"queue": "big"})
        done = await web.post(
            "/rows/cancel-matching", data={"csrf": csrf_of(confirm), "queue": "big"}
        )
        where = done.headers["location"]
        assert done.status_code == 303 and re.match(r"/operations/\d+\?done=", where)
        progress = await web.get(where)
        assert progress.headers["refresh"] == "2"  # it follows itself, no script
        assert 'id="op-state" class="op-state op-Running">Running<' in progress.text
        assert 'Changed <strong id="op-done">500</strong> of <span id="op-total">1,200<' in (
            progress.text
        )
        assert re.search(r"operation \d+ started: 500 of 1,200 rows so far", progress.text)
        assert await app.run_operations(pages=1) == 1  # a worker's page
        again = await web.get(where.split("?")[0])
        assert '<strong id="op-done">1,000</strong>' in again.text
        stop = await web.post(where.split("?")[0] + "/cancel", data={"csrf": csrf_of(again)})
        stopped = await web.get(stop.headers["location"])
        listing = await web.get("/operations")
    assert "op-Canceled" in stopped.text and "refresh" not in stopped.headers
    assert 'id="cancel-operation"' not in stopped.text
    assert await app.count(state=State.CANCELED, queue="big") == 1000  # the rest not
    assert listing.text.count('<td class="op-state op-Canceled">') == 1
    actions = [(e.action, e.rows) for e in await app.audit_log()]
    assert actions == [("cancel operation", 0), ("cancel every Pending row", 500)]


async def test_the_new_posts_are_refused_without_csrf_read_only_or_for_unknown_targets(
    app: durafn.App,
) -> None:
    await failing(app)
    form = {"name": "ops:fetch", "error_type": "KeyError"}
    op = await app.start_operation("cancel", who="ann", name="ops:flaky")
    async with client(app.dashboard()) as web:
        page = await web.get("/failures")
        csrf = csrf_of(page)
        no_csrf = [
            await web.post("/failures/retry", data=form),
            await web.post(f"/operations/{op.id}/cancel", data={}),
        ]
        unknown = [
            await web.get("/failures/explode", params=form),
            await web.post("/failures/explode", data={**form, "csrf": csrf}),
            await web.get("/operations/999999"),
            await web.get("/operations/abc"),
            await web.post("/operations/999999/cancel", data={"csrf": csrf}),
        ]
        half = await web.post("/failures/retry", data={"name": "ops:fetch", "csrf": csrf})
        bad_page = await web.get("/operations", params={"before": "x"})
    async with client(app.dashboard(read_only=True)) as web:
        page = await web.get("/failures")
        assert "retry-group" not in page.text
        shown = await web.get(f"/operations/{op.id}")
        assert 'id="cancel-operation"' not in shown.text
        read_only = [
            await web.post("/failures/retry", data={**form, "csrf": csrf_of(page)}),
            await web.post(f"/operations/{op.id}/cancel", data={"csrf": csrf_of(page)}),
        ]
    for refused in no_csrf:
        assert refused.status_code == 403 and "CSRF" in refused.text
    for refused in read_only:
        assert refused.status_code == 403 and "read-only" in refused.text
    assert [r.status_code for r in unknown] == [404, 404, 404, 404, 404]
    assert "no failure group action" in unknown[0].text
    assert "no operation &#39;999999&#39;" in unknown[2].text
    assert half.status_code == 400 and "give both" in half.text
    assert bad_page.status_code == 400
    assert await app.count(state=State.PENDING, name="ops:fetch") == 0
    assert (await app.operation(op.id)).state == "Running"
    assert await app.audit_log() == []


async def test_a_function_is_run_from_its_form_with_its_arguments_validated(
    app: durafn.App, clock: FakeClock
) -> None:
    @app.mutation(name="mail:welcome")
    async def welcome(ctx: MutationCtx, user_id: int, note: str = "hi") -> None:
        """Greet a new user."""

    @app.query(name="mail:count")
    async def count(ctx: durafn.QueryCtx) -> int:
        return 0

    assert app.function("mail:welcome") is welcome
    with pytest.raises(durafn.UnknownFunctionError):
        app.function("mail:nope")
    async with client(app.dashboard()) as web:
        page = await web.get("/functions")
        assert "mail:welcome(user_id: int, note: str = &#39;hi&#39;)" in page.text
        assert "Greet a new user." in page.text and "mail:count" not in page.text  # a query
        assert "{&#34;user_id&#34;: null}" in page.text  # the required ones, to fill in
        csrf = csrf_of(page)
        run = "/functions/mail:welcome/run"
        refused = [
            await web.post(run, data={"csrf": csrf, "args": '{"user_id": "ann"}'}),
            await web.post(run, data={"csrf": csrf, "args": "{}"}),
            await web.post(run, data={"csrf": csrf, "args": '{"user_id": 1, "x": 2}'}),
            await web.post(run, data={"csrf": csrf, "args": "[1]"}),
            await web.post(run, data={"csrf": csrf, "args": "{user_id: 1}"}),
            await web.post(run, data={"csrf": csrf, "args": '{"user_id": 1}', "delay": "soon"}),
            await web.post("/functions/mail:count/run", data={"csrf": csrf, "args": "{}"}),
        ]
        assert [r.status_code for r in refused] == [400] * 6 + [404]
        assert "user_id: Input should be a valid integer" in refused[0].text
        assert "(got &#39;ann&#39;)" in refused[0].text
        assert "nothing was scheduled" in refused[0].text
        assert "missing a required argument: &#39;user_id&#39;" in refused[1].text
        assert "unexpected keyword argument &#39;x&#39;" in refused[2].text
        assert "one JSON object naming the parameters" in refused[3].text
        assert "not JSON" in refused[4].text and "not a number" in refused[5].text
        assert (await app.list(name="mail:welcome")).items == []
        done = await web.post(run, data={"csrf": csrf, "args": '{"user_id": "7"}', "delay": "30"})
        assert done.status_code == 303
        shown = await web.get(done.headers["location"])
    row = (await app.list(name="mail:welcome")).items[0]
    assert done.headers["location"].startswith(f"/rows/{row.id}?")
    assert row.args == {"user_id": 7, "note": "hi"}  # as from Python: lax, defaults filled
    assert row.scheduled_time.timestamp() == pytest.approx(clock.now() + 30)
    assert f"scheduled mail:welcome to run in 30 s: row {row.id}" in shown.text
    entry = (await app.audit_log())[0]
    assert (entry.action, entry.target, entry.rows) == ("run", "mail:welcome", 1)
    async with client(app.dashboard(read_only=True)) as web:
        page = await web.get("/functions")
        assert "mail:welcome(" in page.text and 'class="run"' not in page.text
        no = await web.post(run, data={"csrf": csrf_of(page), "args": '{"user_id": 1}'})
    assert no.status_code == 403 and "read-only" in no.text
    async with client(app.dashboard()) as web:
        no_csrf = await web.post(run, data={"args": '{"user_id": 1}'})
    assert no_csrf.status_code == 403 and len((await app.list(name="mail:welcome")).items) == 1


async def test_a_rows_page_draws_its_workflow_bounded(app: durafn.App) -> None:
    @app.mutation(name="flow:step")
    async def step(ctx: MutationCtx, n: int) -> None:
        pass

    @app.mutation(name="flow:done")
    async def summary(ctx: MutationCtx, group: durafn.GroupCompletion) -> None:
        pass

    @app.action(name="flow:send", batch=durafn.Batch(max_size=50, max_wait=60, key=lambda n: "all"))
    async def send(ctx: ActionCtx, items: list[int]) -> list[None]:
        return [None for _ in items]

    sched = app.scheduler()
    first = await sched.run_many([step.call(n).after(60) for n in range(25)])
    joined = await sched.run_after(0, step.options(after=first[:3]), 99)
    group = await sched.group(first, on_complete=summary)
    mailed = await sched.run_many([send.call(n).after(60) for n in range(3)])
    flow = await app.row_links(first[0], limit=5)
    assert [(n.id, n.name) for n in flow.waited_by] == sorted(
        [(joined, "flow:step"), (group, "durafn:group_complete")]
    )
    assert flow.waits_for == [] and flow.batch_key is None and not flow.waited_by_more
    async with client(app.dashboard()) as web:
        waiting = await web.get(f"/rows/{joined}")
        completes = await web.get(f"/rows/{group}")
        dependency = await web.get(f"/rows/{first[0]}")
        batched = await web.get(f"/rows/{mailed[0]}")
        alone = await web.get(f"/rows/{first[5]}")
    waits = re.search(r'<ul id="waits-for">(.*?)</ul>', waiting.text, re.DOTALL)
    assert waits is not None and waits.group(1).count("state-Pending") == 3
    assert all(f'href="/rows/{i}"' in waits.group(1) for i in first[:3])
    members = re.search(r'<ul id="group">(.*?)</ul>', completes.text, re.DOTALL)
    assert members is not None and members.group(1).count("<li><a") == 20  # bounded
    assert "and 5 more" in members.group(1) and "The group it completes (25 rows)" in (
        completes.text
    )
    assert f'href="/rows/{joined}"' in dependency.text and 'id="waited-by"' in dependency.text
    batch = re.search(r'<ul id="batch">(.*?)</ul>', batched.text, re.DOTALL)
    assert batch is not None and batch.group(1).count(">flow:send</a>") == 3
    assert "by key <code>all</code>" in batched.text
    assert 'id="links"' in alone.text  # waited for by the group's row
    with pytest.raises(durafn.NotFoundError):
        await app.row_links("0191d3a8-0000-7000-8000-000000000000")


async def test_a_cron_fire_in_the_hour_the_clocks_skip_is_marked_skipped(
    app: durafn.App, clock: FakeClock
) -> None:
    @app.mutation(name="reports:early")
    async def early(ctx: MutationCtx) -> None:
        pass

    # Paris jumps from 02:00 to 03:00 on 2030-03-31: that night has no 02:30.
    clock.set(datetime(2030, 3, 29, 12, tzinfo=UTC))
    app.cron("early", "30 2 * * *", early, timezone="Europe/Paris")
    await app.executor().run_until_idle()
    async with client(app.dashboard()) as web:
        page = await web.get("/crons")
    assert "2030-03-30T02:30:00+01:00</td><td></td>" in page.text
    assert "2030-03-31T02:30" not in page.text
    assert (
        "2030-04-01T02:30:00+02:00</td><td>DST: clocks changed since the previous fire "
        "(UTC+01:00 → UTC+02:00); the 02:30 of 2030-03-31 did not exist (clocks went from "
        "02:00 to 03:00): skipped</td>" in page.text
    )


async def test_one_search_box_finds_a_row_by_id_job_key_or_argument_value(
    app: durafn.App,
) -> None:
    @app.mutation(name="shop:order")
    async def order(ctx: MutationCtx, customer: dict[str, object], total: int) -> None:
        pass

    sched = app.scheduler()
    keyed = await sched.run_after(60, order.options(key="order-77"), {"name": "Ann"}, 1250)
    other = await sched.run_after(60, order, {"name": "Bob", "tags": ["vip"]}, 77)
    done = await sched.run_after(0, order.options(key="order-77-old"), {"name": "Cy"}, 5)
    await app.executor().run_until_idle()  # done: Success, out of the key's index
    async with client(app.dashboard()) as web:
        page = await web.get("/")
        assert 'action="/search"' in page.text
        by_id = await web.get("/search", params={"q": other})
        by_key = await web.get("/search", params={"q": "order-77"})
        old_key = await web.get("/search", params={"q": "order-77-old"})
        by_name = await web.get("/search", params={"q": "Ann"})
        by_number = await web.get("/search", params={"q": "77"})
        by_tag = await web.get("/search", params={"q": "vip"})
        nothing = await web.get("/search", params={"q": "<nobody>"})
        empty = await web.get("/search", params={"q": " "})
    assert by_id.status_code == 303 and by_id.headers["location"] == f"/rows/{other}"

    def section(response: httpx2.Response, id: str) -> str:
        found = re.search(rf'<section id="{id}">(.*?)</section>', response.text, re.DOTALL)
        assert found is not None
        return found.group(1)

    assert f"/rows/{keyed}" in section(by_key, "by-key")
    assert f"/rows/{done}" in section(old_key, "by-key")  # a Success row, among the newest
    assert f"/rows/{keyed}" in section(by_name, "by-argument")
    assert f"/rows/{other}" not in section(by_name, "by-argument")
    assert f"/rows/{other}" in section(by_number, "by-argument")  # total 77, not 1250
    assert f"/rows/{keyed}" not in section(by_number, "by-argument")
    assert f"/rows/{other}" in section(by_tag, "by-argument")  # an array's element
    assert "among the newest 10,000 rows" in by_key.text
    assert "None." in section(nothing, "by-key") and "&lt;nobody&gt;" in nothing.text
    assert empty.status_code == 400
    result = await app.search("order-77", limit=5)
    assert [r.id for r in result.by_key] == [keyed] and result.scanned == 10_000
