"""The charts page and a function's page, on both engines, through the dashboard's ASGI
app: their figures come from the rollups (written by the executor's maintenance for the
closed minutes), drawn as SVG with axes, units and a legend; a function's last errors
grouped by type; every user string escaped; and the look: the stylesheet served from the
package, the theme chosen by a POST without JavaScript."""

from __future__ import annotations

import re

import pytest

import durafn
from durafn import ActionCtx, MutationCtx
from durafn.testing import FakeClock

from .support import dashboard_kit
from .support.dashboard_kit import XSS, client

pytestmark = pytest.mark.anyio

rows = dashboard_kit.rows


async def _rolled_up(app: durafn.App, clock: FakeClock) -> None:
    """The rows' minute closed, and the maintenance pass run."""
    clock.advance(180)
    await app.executor().run_maintenance()


async def test_the_charts_page_draws_what_ended_with_axes_units_and_a_legend(
    app: durafn.App, clock: FakeClock, rows: dict[str, str]
) -> None:
    await _rolled_up(app, clock)
    async with client(app.dashboard()) as web:
        page = await web.get("/charts")
        assert page.status_code == 200 and 'id="empty"' not in page.text
        for chart in ("chart-ended", "chart-lag", "chart-failures"):
            figure = re.search(rf'<figure class="chart" id="{chart}">(.*?)</figure>', page.text)
            assert figure is not None, chart
            assert 'class="axis y-axis"' in figure.group(1)
            assert 'class="axis x-axis"' in figure.group(1)
            assert 'class="legend"' in figure.group(1)
        ended = re.search(r'id="chart-ended">(.*?)</figure>', page.text)
        assert ended is not None
        assert ">rows / minute</text>" in ended.group(1)  # the unit
        assert ": 1 Success</title></rect>" in ended.group(1)
        assert ": 1 Failed</title></rect>" in ended.group(1)
        for label in ("Success", "Failed", "Canceled"):
            assert f'<span class="swatch s-{label}"></span>{label}</li>' in ended.group(1)
        assert "seconds (log scale)" in page.text
        assert '<a href="/functions/mail%3Abroken?range=hour">mail:broken</a>' in page.text
        # A day and a week by hour; one function; a range that is none refused.
        for chosen in ("day", "week"):
            longer = await web.get("/charts", params={"range": chosen})
            assert ">rows / hour</text>" in longer.text
            assert ": 1 Failed</title></rect>" in longer.text
        one = await web.get("/charts", params={"name": "mail:send"})
        assert ": 1 Success</title></rect>" in one.text and ": 1 Failed" not in one.text
        assert (await web.get("/charts", params={"range": "year"})).status_code == 400


async def test_a_function_page_shows_its_figures_errors_crons_and_queues(
    app: durafn.App, clock: FakeClock, rows: dict[str, str]
) -> None:
    @app.action(name="mail:worse")
    async def worse(ctx: ActionCtx, to: str) -> None:
        if to == "key":
            raise KeyError(to)
        raise ValueError(f"cannot reach {to}")

    @app.mutation(name="mail:digest")
    async def digest(ctx: MutationCtx) -> None:
        pass

    app.cron("nightly-digest", "0 3 * * *", digest)
    sched = app.scheduler()
    for to in ("a", "b", "key"):
        await sched.run_after(0, worse, to)
    await sched.run_after(0, digest.options(queue="digests"))
    await app.executor().run_until_idle()
    await _rolled_up(app, clock)
    async with client(app.dashboard()) as web:
        page = await web.get("/functions/mail:worse")
        assert page.status_code == 200
        errors = re.search(r'<table id="errors">(.*?)</table>', page.text, re.DOTALL)
        assert errors is not None
        groups = re.findall(
            r"<td><code>(\w+)</code></td><td class=\"num\">(\d+)</td>", errors.group(1)
        )
        assert groups == [("ValueError", "2"), ("KeyError", "1")]
        assert 'id="chart-duration"' in page.text and 'id="chart-lag"' in page.text
        assert "100.0 %" in page.text  # every run failed
        assert 'id="run-it" href="/functions#function-mail:worse"' in page.text  # its form
        crons = await web.get("/functions/mail:digest")
        assert "nightly-digest" in crons.text
        queues = re.search(r'<table id="function-queues">(.*?)</table>', crons.text, re.DOTALL)
        assert queues is not None and ">digests</a>" in queues.group(1)
        # Linked from the rows list and a row's page; its name escaped.
        listing = await web.get("/rows")
        assert 'href="/functions/mail%3Aworse"' in listing.text
        row = await web.get(f"/rows/{rows['failed']}")
        assert 'href="/functions/mail%3Abroken"' in row.text
        odd = await web.get("/functions/" + XSS)
        assert XSS not in odd.text and "&lt;script&gt;" in odd.text


async def test_the_look_is_served_from_the_package_and_the_theme_is_a_form(
    app: durafn.App,
) -> None:
    async with client(app.dashboard()) as web:
        empty = await web.get("/charts")  # nothing ended, nothing rolled up: it says so
        assert 'id="empty"' in empty.text and "no executor has rolled it up yet" in empty.text
        page = await web.get("/")
        found = re.search(r'href="(/static/dashboard\.css\?v=\w+)"', page.text)
        assert found is not None
        css = await web.get(found.group(1))
        assert css.status_code == 200 and css.headers["content-type"].startswith("text/css")
        assert (
            "prefers-color-scheme: dark" in css.text and "immutable" in css.headers["cache-control"]
        )
        assert (await web.get("/static/nothing.css")).status_code == 404
        assert '<a class="skip" href="#main">Skip to content</a>' in page.text
        assert '<html lang="en">' in page.text  # no theme chosen: the system's
        chosen = await web.post("/theme", data={"theme": "dark", "back": "/rows?state=Failed"})
        assert chosen.status_code == 303 and chosen.headers["location"] == "/rows?state=Failed"
        dark = await web.get("/rows")
        assert '<html lang="en" data-theme="dark">' in dark.text
        away = await web.post("/theme", data={"theme": "auto", "back": "//evil.example/"})
        assert away.headers["location"] == "/"  # never a redirect elsewhere
        tab = await web.post("/theme", data={"theme": "auto", "back": "/\t/evil.example/"})
        assert tab.headers["location"] == "/"  # a browser drops the tab: "//evil..."
        assert '<html lang="en">' in (await web.get("/")).text
        other_site = await web.post(
            "/theme", data={"theme": "dark"}, headers={"sec-fetch-site": "cross-site"}
        )
        assert other_site.status_code == 403
