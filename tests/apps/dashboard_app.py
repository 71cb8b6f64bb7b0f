"""The app of the dashboard's browser tests: ``durafn dashboard --app tests.apps.dashboard_app``
serves it in a process of its own; the test seeds its rows through ``app.using(url)``."""

from __future__ import annotations

import durafn
from durafn import ActionCtx, MutationCtx

app = durafn.App()


@app.mutation(name="mail:send")
async def send(ctx: MutationCtx, to: str) -> str:
    return f"sent {to}"


@app.action(name="mail:broken")
async def broken(ctx: ActionCtx, to: str) -> None:
    raise ValueError(f"cannot reach {to}")


@app.mutation(name="reports:nightly")
async def nightly(ctx: MutationCtx) -> None:
    pass


app.cron("nightly", "0 2 * * *", nightly, timezone="Europe/Paris")
