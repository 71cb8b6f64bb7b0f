"""A webhook that fails, is retried, is watched by hooks, and reports how it ended.

Run it with ``python -m examples.flaky_webhook [URL]`` (SQLite by default). The receiving
server refuses the first two deliveries; the action's retry policy tries it again after
its backoff; hooks count the errors and would page someone on a final failure; a
completion callback (``on_complete``), a mutation, is scheduled in the same transaction as
the delivery's final outcome. It prints the row's failed attempts and how it ended.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import anyio

import durafn
from durafn import ActionCtx, Completion, Exponential, HookEvent, MutationCtx, Retry
from durafn.testing import FakeClock


class Receiver:
    """Stands in for the other side's HTTP server: down for its first ``outage`` calls."""

    def __init__(self, outage: int) -> None:
        self.calls = 0
        self.outage = outage

    async def post(self, payload: dict[str, str]) -> int:
        self.calls += 1
        if self.calls <= self.outage:
            raise ConnectionError(f"connection refused (call {self.calls})")
        return 204


def build(
    url: str, receiver: Receiver, clock: durafn.Clock | None = None
) -> tuple[durafn.App, durafn.ActionRef[[str, str], int], list[str]]:
    app = durafn.App(url, clock=clock)
    seen: list[str] = []

    # At least once, at most 4 runs: 1 s, then 2 s between them (no jitter, for the demo).
    @app.action(name="webhooks:deliver", retry=Retry(4, backoff=Exponential(jitter=0)))
    async def deliver(ctx: ActionCtx, event: str, order: str) -> int:
        return await receiver.post({"event": event, "order": order})

    # Scheduled once the delivery has finished for good, whichever way (never lost, never
    # twice): here it only says how; a real one would update the order in its transaction.
    @app.mutation(name="webhooks:delivered")
    async def delivered(ctx: MutationCtx, c: Completion) -> str:
        return f"{c.name} {c.state.value}, result {c.result}"

    deliver_and_report = deliver.options(on_complete=delivered)

    @app.on("error")
    def count_errors(event: HookEvent) -> None:
        assert event.error is not None
        then = "retried" if event.retry_at is not None else "given up"
        seen.append(f"error hook: {event.name} {event.error.type} ({then})")

    @app.on("failure")
    async def page_someone(event: HookEvent) -> None:
        seen.append(f"failure hook: paging about {event.id}")

    return app, deliver_and_report, seen


async def main(url: str, out: list[str], clock: FakeClock | None = None) -> None:
    receiver = Receiver(outage=2)
    app, deliver, seen = build(url, receiver, clock)
    try:
        await app.migrate()
        sid = await app.scheduler().run_after(0, deliver, "order.paid", "A-1001")
        if clock is None:
            async with app.run_executor() as executor:
                row = await executor.wait_for(sid, timeout=30)
                [callback] = (await app.list(name="webhooks:delivered")).items
                await executor.wait_for(callback.id)
        else:  # driven by a fake clock (the tests): no waiting for the backoff
            executor = app.executor()
            for _ in range(3):
                await executor.run_until_idle()
                clock.advance(2)
            found = await app.get(sid)
            assert found is not None
            row = found
        for attempt in row.history:
            out.append(f"attempt {attempt.attempt}: {attempt.error.type}: {attempt.error.message}")
        out.extend(seen)
        out.append(f"{row.name} {row.state.value} after {row.attempts} runs -> {row.result}")
        [callback] = (await app.list(name="webhooks:delivered")).items
        out.append(f"on_complete: {callback.name} {callback.state.value} -> {callback.result}")
    finally:
        await app.aclose()


if __name__ == "__main__":
    lines: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        target = sys.argv[1] if len(sys.argv) > 1 else f"sqlite:///{Path(tmp) / 'demo.db'}"
        anyio.run(main, target, lines)
    print("\n".join(lines))
