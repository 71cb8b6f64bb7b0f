"""Calling functions directly and from actions: each call is its own transaction, the
values and errors come back as the function produced them, and time limits hold."""

from __future__ import annotations

import anyio
import pytest

import durafn
from durafn import ActionCtx, MutationCtx, QueryCtx

from .support.helpers import count
from .support.models import Message

pytestmark = pytest.mark.anyio


async def test_an_action_calls_queries_mutations_and_actions(app: durafn.App) -> None:
    @app.query
    async def messages(ctx: QueryCtx) -> int:
        return len((await ctx.db.execute(Message.__table__.select())).all())

    @app.mutation
    async def post(ctx: MutationCtx, body: str) -> int:
        msg = Message(body=body, author="action")
        ctx.db.add(msg)
        await ctx.db.flush()
        return msg.id

    @app.mutation
    async def fail(ctx: MutationCtx) -> None:
        ctx.db.add(Message(body="never", author="action"))
        raise LookupError("rolled back")

    @app.action
    async def shout(ctx: ActionCtx, text: str) -> str:
        return text.upper()

    @app.action
    async def orchestrate(ctx: ActionCtx) -> tuple[int, int, str]:
        first = await ctx.run_mutation(post, "one")
        with pytest.raises(LookupError, match="rolled back"):
            await ctx.run_mutation(fail)
        seen = await ctx.run_query(messages)  # the first mutation has committed
        return first, seen, await ctx.run_action(shout, "done")

    message_id, seen, shouted = await app.run_action(orchestrate)
    assert (seen, shouted) == (1, "DONE")
    assert isinstance(message_id, int)
    assert await count(app, Message) == 1
    with pytest.raises(durafn.ArgumentError):
        await app.run_action(shout, 5)  # type: ignore[arg-type]


async def test_direct_calls_have_time_limits(db_url: str) -> None:
    app = durafn.App(db_url, mutation_timeout=0.05, action_timeout=0.05, query_timeout=0.05)
    await app.migrate()
    async with app.engine.begin() as conn:
        await conn.run_sync(Message.metadata.create_all)

    @app.mutation
    async def slow_mutation(ctx: MutationCtx) -> None:
        ctx.db.add(Message(body="late", author="slow"))
        await ctx.db.flush()
        await anyio.sleep(5)

    @app.action
    async def slow_action(ctx: ActionCtx) -> None:
        await anyio.sleep(5)

    @app.query
    async def slow_query(ctx: QueryCtx) -> None:
        await anyio.sleep(5)

    try:
        with pytest.raises(durafn.FunctionTimeoutError, match="slow_mutation"):
            await app.run_mutation(slow_mutation)
        with pytest.raises(durafn.FunctionTimeoutError, match="slow_action"):
            await app.run_action(slow_action)
        with pytest.raises(durafn.FunctionTimeoutError, match="slow_query"):
            await app.run_query(slow_query)
        assert await count(app, Message) == 0  # the mutation was rolled back
    finally:
        await app.aclose()
