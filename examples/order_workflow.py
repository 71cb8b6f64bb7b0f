"""An order as one durable workflow: charge (a mutation), ship (an action, retried),
wait two days, then wait for the customer's review (an event) for at most a week, and
thank them: each step journaled once, the whole resumed after any crash.

Run it with ``python -m examples.order_workflow [URL]`` (SQLite by default). It runs on a
fake clock, so the two days pass at once: it prints the workflow's journal as it goes.
"""

from __future__ import annotations

import sys
import tempfile
from datetime import timedelta
from pathlib import Path

import anyio
from sqlalchemy import String
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

import durafn
from durafn import ActionCtx, MutationCtx, Retry, WorkflowCtx
from durafn.testing import FakeClock, Harness


class Base(DeclarativeBase):
    pass


class Charge(Base):
    __tablename__ = "order_charges"
    order_id: Mapped[str] = mapped_column(String(50), primary_key=True)
    cents: Mapped[int]


class Parts:
    """The example's functions, registered on one app."""

    def __init__(self, app: durafn.App) -> None:
        @app.mutation(name="orders:charge")
        async def charge(ctx: MutationCtx, order_id: str, cents: int) -> int:
            ctx.db.add(Charge(order_id=order_id, cents=cents))
            return cents

        # ctx.run_id is the step's idempotency key: the same on every retry of it.
        @app.action(name="orders:ship", retry=Retry(5))
        async def ship(ctx: ActionCtx, order_id: str) -> str:
            return f"parcel-{order_id}-{str(ctx.run_id)[:8]}"

        @app.mutation(name="orders:thank")
        async def thank(ctx: MutationCtx, order_id: str, stars: int | None) -> str:
            return f"thanked for {stars} stars" if stars else "thanked, no review"

        @app.workflow(name="orders:fulfil")
        async def fulfil(step: WorkflowCtx, order_id: str, cents: int) -> str:
            charged = await step.run_mutation(charge, order_id, cents)
            parcel = await step.run_action(ship, order_id)
            await step.sleep(timedelta(days=2))
            try:
                review = await step.wait_for_event("review", timeout=timedelta(days=7))
                stars = int(review["stars"])
            except durafn.WorkflowTimeoutError:
                stars = None
            note = await step.run_mutation(thank, order_id, stars)
            return f"{charged} cents, {parcel}, {note}"

        self.fulfil = fulfil


def journal(wf: durafn.Workflow) -> list[str]:
    return [f"  {s.step_no} {s.kind:<8} {s.name:<14} {s.state}" for s in wf.steps]


async def main(url: str, out: list[str]) -> durafn.Workflow:
    clock = FakeClock()
    app = durafn.App(url, clock=clock)
    parts = Parts(app)
    try:
        await app.migrate()
        async with app.engine.begin() as conn:
            await conn.run_sync(Base.metadata.create_all)
        harness = Harness(app, clock)
        id = await app.start_workflow(parts.fulfil, "o-17", 4200)
        await harness.advance(timedelta(days=2))
        wf = await app.get_workflow(id)
        assert wf is not None
        out.append(f"after two days: {wf.state.value}, waiting for {wf.waiting}")
        out.extend(journal(wf))
        await harness.send_event(id, "review", {"stars": 5})
        done = await harness.finish_workflow(id)
        out.append(f"then: {done.state.value}: {done.result}")
        out.extend(journal(done))
        return done
    finally:
        await app.aclose()


if __name__ == "__main__":
    lines: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        default = f"sqlite+aiosqlite:///{Path(tmp) / 'orders.db'}"
        anyio.run(main, sys.argv[1] if len(sys.argv) > 1 else default, lines)
    print("\n".join(lines))
