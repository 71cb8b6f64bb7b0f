"""A nightly sync: a cron starts it, a rate limit paces it, a throttle calms what it sets off.

Run it with ``python -m examples.nightly_sync [URL]`` (SQLite by default). A fake clock
walks through three simulated nights in a moment (``durafn.testing.advance``): each night
at 02:00 the cron's mutation schedules one action per page of each tenant; the pages share
the CRM's API budget, two calls a second (a flow key with a rate: rows over the budget
wait, Pending, and say why); every page asks for the dashboard to be refreshed, and the
throttle makes that once at the first ask and once more a minute later, with the last
ask's arguments. It prints what ran when.
"""

from __future__ import annotations

import sys
import tempfile
from datetime import datetime, timedelta
from pathlib import Path

import anyio

import durafn
from durafn import ActionCtx, Flow, MutationCtx, Rate, Throttle
from durafn.cron import daily
from durafn.testing import FakeClock, advance

TENANTS = {"acme": 2, "globex": 3, "initech": 1}
"""Pages to sync per tenant."""

CRM_API = Flow(key="crm-api", rate=Rate(2, per=1))
"""Every page's call to the CRM shares one budget: two a second, evenly spaced (a
``burst=`` would let an idle key start that many at once)."""


def build(url: str, clock: durafn.Clock) -> tuple[durafn.App, list[str]]:
    app = durafn.App(url, clock=clock)
    log: list[str] = []

    def at(when: datetime) -> str:
        return when.strftime("%d %H:%M:%S.%f")[:-5]

    @app.mutation(name="dashboard:refresh", flow=Flow(key="dashboard", throttle=Throttle(60)))
    async def refresh_dashboard(ctx: MutationCtx, reason: str) -> None:
        log.append(f"{at(ctx.now())} dashboard refreshed ({reason})")

    @app.action(name="sync:page", flow=CRM_API)
    async def sync_page(ctx: ActionCtx, tenant: str, page: int) -> None:
        log.append(f"{at(ctx.now())} synced {tenant} page {page}")
        await ctx.scheduler.run_after(0, refresh_dashboard, f"after {tenant} page {page}")

    @app.mutation(name="sync:start")
    async def start_sync(ctx: MutationCtx) -> None:
        pages = [sync_page.call(t, p) for t, n in TENANTS.items() for p in range(1, n + 1)]
        await ctx.scheduler.run_many(pages)

    app.cron("nightly-sync", daily(hour=2), start_sync, description="sync every tenant")
    return app, log


async def main(url: str, out: list[str], clock: FakeClock | None = None) -> None:
    clock = clock or FakeClock()  # 2030-01-01 00:00 UTC
    app, log = build(url, clock)
    try:
        await app.migrate()
        executor = app.executor()
        # One night, stopping where the first row waits for the budget: why does it wait?
        await advance(executor, clock, timedelta(hours=2))
        waiting = (await app.list(name="sync:page", state=durafn.State.PENDING)).items
        explained = await app.explain(waiting[0].id)
        # Driven by hand, no worker is registered: that comes first, then the budget.
        out.append(f"a page waits: {explained.message}; then: {'; '.join(explained.also)}")
        await advance(executor, clock, timedelta(days=3) - timedelta(hours=2))
        out.extend(log)
        cron = await app.get_cron("nightly-sync")
        assert cron is not None
        out.append(f"{cron.name}: {cron.run_count} runs, next {cron.next_run_at:%d %H:%M}")
    finally:
        await app.aclose()


if __name__ == "__main__":
    lines: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        target = sys.argv[1] if len(sys.argv) > 1 else f"sqlite:///{Path(tmp) / 'demo.db'}"
        anyio.run(main, target, lines)
    print("\n".join(lines))
