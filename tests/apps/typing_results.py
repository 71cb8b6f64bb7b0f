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


@app.action(queue="mail", priority=-1)
async def send(ctx: durafn.ActionCtx, to: str, retries: int = 0) -> None:
    pass


async def schedules(sched: durafn.Scheduler) -> None:
    """Options keep the function's parameters: the arguments are still checked."""
    urgent = send.options(priority=-10, key="welcome:1", flags=["email"])
    same: durafn.ActionRef[[str, int], None] = urgent
    await sched.run_after(0, urgent, "a@example.com", retries=2)
    await sched.run_after(0, urgent, 5)  # type: ignore[call-overload]
    await sched.run_many([urgent.call("a@example.com"), post.call("hi").after(5)])
    send.call(to=3)  # type: ignore[arg-type]
    send.options(key_mode="overwrite")  # type: ignore[arg-type]
    print(same)


@app.mutation
async def sent(ctx: MutationCtx, completion: durafn.Completion) -> None:
    pass


@app.mutation
async def counted(ctx: MutationCtx, n: int) -> None:
    pass


async def completes(sched: durafn.Scheduler) -> None:
    """A completion callback must take what it will be given: one Completion."""
    await sched.run_after(0, send.options(on_complete=sent), "a@example.com")
    send.options(on_complete=counted)  # type: ignore[arg-type]
    send.options(on_complete=count_messages)  # type: ignore[arg-type]


@app.action(on_complete=sent)
async def notified(ctx: durafn.ActionCtx) -> None:
    pass


# A name durafn does not export is a type error, though the package loads its names on
# first use (a module-level __getattr__ typed Any would make it anything; mypy --strict
# reports an unneeded ignore below if so).
misspelt = durafn.Ap  # type: ignore[attr-defined]


@app.action(batch=durafn.Batch(max_size=100, max_wait=2.0))
async def notify_all(ctx: durafn.ActionCtx, user_ids: list[int]) -> list[str | durafn.ItemFailed]:
    return ["sent" for _ in user_ids]


async def batches(sched: durafn.Scheduler) -> None:
    """A batched action is scheduled one item at a time, of the item's type; its result
    per item is the function's, less ``ItemFailed``."""
    same: durafn.ActionRef[[int], str] = notify_all
    await sched.run_after(0, notify_all, 42)
    await sched.run_many([notify_all.call(1), notify_all.options(priority=1).call(2)])
    await sched.run_after(0, notify_all, "42")  # type: ignore[call-overload]
    await sched.run_after(0, notify_all, [1, 2])  # type: ignore[call-overload]
    print(same, await app.run_action(notify_all, 7))
