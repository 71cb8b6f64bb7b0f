"""An app with a cron, for the command-line tests of crons: ``--app tests.apps.cron_app``."""

from __future__ import annotations

from datetime import timedelta

import durafn
from durafn import MutationCtx
from durafn.cron import daily, every


def make_app(url: str | None = None, clock: durafn.Clock | None = None) -> durafn.App:
    application = durafn.App(url, clock=clock)

    @application.mutation(name="cron:digest")
    async def digest(ctx: MutationCtx, to: str) -> str:
        return f"digest for {to}"

    application.cron(
        "nightly-digest", daily(hour=2), digest.call("ops"), description="the nightly digest"
    )
    return application


app = make_app()


def make_beats(url: str | None = None) -> durafn.App:
    """A cron every second (the real-process tests: a leader killed mid-run), whose missed
    ticks of the last minute are backfilled: whatever stalls a loaded machine has, each
    tick is written, once."""
    application = durafn.App(url)

    @application.mutation(name="cron:beat")
    async def beat(ctx: MutationCtx) -> None:
        pass

    application.cron("beat", every(seconds=1), beat, backfill=timedelta(minutes=1))
    return application


beats = make_beats()
