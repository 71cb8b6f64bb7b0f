"""Welcome emails for 250 sign-ups, sent a hundred at a time, with a report when all are done.

Run it with ``python -m examples.bulk_email [URL]`` (SQLite by default). Each sign-up
schedules one row of a batched action (``durafn.Batch``); a worker hands them to the mail
provider's bulk call 100 at a time, and the last 50 once the oldest has waited
``max_wait``. The provider refuses one address for good (that row alone fails, never
retried) and has a hiccup on another (that row alone is retried by its policy). A group
callback reports the counts once every row has finished for good. It prints each bulk
call's size and the report.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import anyio
from pydantic import BaseModel

import durafn
from durafn import ActionCtx, Batch, Fixed, ItemFailed, MutationCtx, NonRetryableError, Retry
from durafn.testing import FakeClock


class Welcome(BaseModel):
    to: str
    name: str


class Provider:
    """Stands in for a mail provider's bulk API: one request for many messages."""

    def __init__(self) -> None:
        self.requests: list[int] = []
        self.hiccup = "user-7@example.com"

    async def send_bulk(self, messages: list[Welcome]) -> list[str | Exception]:
        self.requests.append(len(messages))
        outcomes: list[str | Exception] = []
        for m in messages:
            if m.to.endswith("@nowhere.invalid"):
                outcomes.append(NonRetryableError(f"{m.to}: no such domain"))
            elif m.to == self.hiccup:
                self.hiccup = ""  # once
                outcomes.append(TimeoutError(f"{m.to}: try again later"))
            else:
                outcomes.append(f"queued for {m.to}")
        return outcomes


def build(
    url: str, provider: Provider, clock: durafn.Clock | None = None
) -> tuple[
    durafn.App,
    durafn.ActionRef[[Welcome], str],
    durafn.MutationRef[[durafn.GroupCompletion], None],
    list[str],
]:
    app = durafn.App(url, clock=clock)
    report: list[str] = []

    @app.action(
        name="email:welcome",
        batch=Batch(max_size=100, max_wait=5.0),
        retry=Retry(3, backoff=Fixed(10)),
    )
    async def welcome(ctx: ActionCtx, messages: list[Welcome]) -> list[str | ItemFailed]:
        sent = await provider.send_bulk(messages)
        return [ItemFailed(s) if isinstance(s, Exception) else s for s in sent]

    @app.mutation(name="email:report")
    async def reported(ctx: MutationCtx, group: durafn.GroupCompletion) -> None:
        report.append(
            f"{group.size} welcomes: {group.succeeded} sent, {group.failed} failed, "
            f"{group.canceled} canceled"
        )

    return app, welcome, reported, report


async def main(url: str, out: list[str], clock: FakeClock | None = None) -> None:
    provider = Provider()
    app, welcome, reported, report = build(url, provider, clock)
    try:
        await app.migrate()
        scheduler = app.scheduler()
        users = [f"user-{i}@example.com" for i in range(249)] + ["ghost@nowhere.invalid"]
        calls = [welcome.call(Welcome(to=to, name=to.split("@")[0])) for to in users]
        ids = await scheduler.run_many(calls)
        done = await scheduler.group(ids, on_complete=reported)
        if clock is None:
            async with app.run_executor() as executor:
                await executor.wait_for(done, timeout=60)
                [callback] = (await app.list(name="email:report")).items  # it scheduled
                await executor.wait_for(callback.id, timeout=60)
        else:  # driven by a fake clock (the tests): no waiting for max_wait nor the retry
            executor = app.executor()
            for _ in range(4):
                await executor.run_until_idle()
                clock.advance(5)
        out.append(f"bulk requests: {provider.requests}")
        out.extend(report)
    finally:
        await app.aclose()


if __name__ == "__main__":
    lines: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        target = sys.argv[1] if len(sys.argv) > 1 else f"sqlite:///{Path(tmp) / 'demo.db'}"
        anyio.run(main, target, lines)
    print("\n".join(lines))
