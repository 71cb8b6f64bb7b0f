"""The app of the durable-workflow crash tests, run as ``durafn worker --app
tests.apps.workflow_app:app``: a five-step workflow (a mutation, an action, a sleep, an
event, a mutation) whose mutations leave a row each (a unique key: a second application
fails) and whose action appends a line to a file before anything else.

``DURAFN_KILL_AFTER=k`` in a worker's environment: the worker ``kill -9``s itself right
after the k-th row it commits Success (a turn, the action, the action's completion),
that is, at a step boundary: every step before it committed, none after it begun
(``DURAFN_KILL_NAME``: counting only the rows of that function).

``cw:fan_out`` runs five ``cw:part`` actions at once (a retry policy: at least once):
part 3 fails for good; part 4 hangs on its first run (killed with its worker), and
returns at once on the next.
"""

from __future__ import annotations

import asyncio
import os
import signal
from datetime import timedelta
from typing import NamedTuple

import anyio
from sqlalchemy import String, UniqueConstraint
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

import durafn
from durafn import ActionCtx, MutationCtx, WorkflowCtx

KILL_AFTER = "DURAFN_KILL_AFTER"
KILL_NAME = "DURAFN_KILL_NAME"
SLEEP = 0.2
"""The workflow's sleep, in seconds of the workers' (real) clock."""


class Base(DeclarativeBase):
    pass


class Done(Base):
    """One row per applied mutation step; the unique key turns a double run into an error."""

    __tablename__ = "workflow_done"
    __table_args__ = (UniqueConstraint("key"),)
    id: Mapped[int] = mapped_column(primary_key=True)
    key: Mapped[str] = mapped_column(String(50))


class Functions(NamedTuple):
    record: durafn.MutationRef[[str], str]
    call_out: durafn.ActionRef[[str, str], str]
    five_steps: durafn.WorkflowRef[[str, str], str]
    part: durafn.ActionRef[[int, str], int]
    fan_out: durafn.WorkflowRef[[str], list[int | str]]


def register(app: durafn.App) -> Functions:
    @app.mutation(name="cw:record")
    async def record(ctx: MutationCtx, key: str) -> str:
        ctx.db.add(Done(key=key))
        return key

    # The flag lets a worker be kept from claiming it (``--forbid-flag calls-out``).
    @app.action(name="cw:call_out", flags=["calls-out"])
    async def call_out(ctx: ActionCtx, tag: str, path: str) -> str:
        # The line first: an action that ran at all is counted, even if killed after.
        async with await anyio.open_file(path, "a") as f:
            await f.write(f"{tag} {ctx.run_id}\n")
        return f"called {tag}"

    @app.workflow(name="cw:five_steps")
    async def five_steps(step: WorkflowCtx, tag: str, path: str) -> str:
        first = await step.run_mutation(record, f"{tag}:1")
        called = await step.run_action(call_out, tag, path)
        await step.sleep(timedelta(seconds=SLEEP))
        event = await step.wait_for_event("go")
        last = await step.run_mutation(record, f"{tag}:5")
        return f"{first} {called} {event} {last}"

    @app.action(name="cw:part", retry=durafn.Retry(3, backoff=durafn.Fixed(0.05)))
    async def part(ctx: ActionCtx, n: int, path: str) -> int:
        async with await anyio.open_file(path, "a") as f:
            await f.write(f"{n} {os.getpid()}\n")
        if n == 3:
            raise durafn.NonRetryableError("part 3 fails for good")
        marker = anyio.Path(f"{path}.4")
        if n == 4 and not await marker.exists():
            await marker.touch()
            await anyio.sleep(60)  # killed with its worker meanwhile
        return n * n

    @app.workflow(name="cw:fan_out")
    async def fan_out(step: WorkflowCtx, path: str) -> list[int | str]:
        parts = [step.run_action(part, n, path) for n in range(5)]
        done = await asyncio.gather(*parts, return_exceptions=True)
        return [r if isinstance(r, int) else "failed" for r in done]

    return Functions(record, call_out, five_steps, part, fan_out)


def _kill_at_boundary(event: durafn.HookEvent) -> None:
    """The ``success`` hook: runs once the row's Success has committed."""
    wanted = os.environ.get(KILL_AFTER)
    if wanted is None or os.environ.get(KILL_NAME, event.name) != event.name:
        return
    global _committed
    _committed += 1
    if _committed >= int(wanted):
        os.kill(os.getpid(), signal.SIGKILL)


_committed = 0

app = durafn.App()
register(app)
app.on("success")(_kill_at_boundary)
