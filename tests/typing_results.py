"""Checked by mypy --strict (``make test`` runs it over tests/), never run: calls a user
writes that must type-check. Results are covariant: a function returning ``int`` may be
used where ``object`` is wanted (``print``, f-strings)."""

from __future__ import annotations

import durafn
from durafn import MutationCtx, QueryCtx

app = durafn.App("sqlite+aiosqlite:///typing-only.db")


@app.query
async def count_messages(ctx: QueryCtx) -> int:
    return 0


@app.mutation
async def post(ctx: MutationCtx, body: str) -> int:
    return len(body)


async def uses() -> None:
    print(await app.run_query(count_messages))
    print(f"{await app.run_mutation(post, 'hi')}")
    total: int = await app.run_query(count_messages) + await app.run_mutation(post, body="x")
    ref: durafn.QueryRef[[], object] = count_messages
    print(total, ref)
