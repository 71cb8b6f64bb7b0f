"""Checked by mypy --strict (``make test`` runs it over tests/), never run: a durable
workflow's steps and starts type-check against the functions they call, and a wrong
argument is an error. Each ``type: ignore`` below marks a call mypy must refuse: strict
mode's ``warn_unused_ignores`` fails the run if one of them were accepted."""

from __future__ import annotations

import durafn
from durafn import ActionCtx, MutationCtx, QueryCtx, WorkflowCtx

app = durafn.App("sqlite+aiosqlite:///typing-only.db")


@app.query
async def count(ctx: QueryCtx, table: str) -> int:
    return 0


@app.mutation
async def charge(ctx: MutationCtx, order_id: str, cents: int) -> int:
    return cents


@app.action
async def ship(ctx: ActionCtx, order_id: str) -> str:
    return order_id


@app.workflow
async def child(step: WorkflowCtx, n: int) -> str:
    return str(n)


@app.workflow
async def order(step: WorkflowCtx, order_id: str, cents: int) -> str:
    paid: int = await step.run_mutation(charge, order_id, cents)
    parcel: str = await step.run_action(ship.options(retry=durafn.Retry(3)), order_id)
    rows: int = await step.run_query(count, "orders")
    kid: str = await step.run_workflow(child, 1)
    await step.run_mutation(charge, order_id, "4200")  # type: ignore[arg-type]
    await step.run_action(ship, order_id, 2)  # type: ignore[call-arg]
    await step.run_query(count)  # type: ignore[call-arg]
    await step.run_workflow(child, "1")  # type: ignore[arg-type]
    await step.run_mutation(ship, order_id)  # type: ignore[arg-type]
    wrong: str = await step.run_mutation(charge, order_id, cents)  # type: ignore[arg-type]
    return f"{paid} {parcel} {rows} {kid} {wrong}"


async def starts(ctx: MutationCtx) -> None:
    first: str = await ctx.scheduler.start_workflow(order, "o-1", 4200)
    await ctx.scheduler.start_workflow(order, "o-1", "4200")  # type: ignore[arg-type]
    await app.start_workflow(order, "o-1")  # type: ignore[call-arg]
    sent: bool = await app.send_event(first, "review", {"stars": 5})
    print(first, sent)
