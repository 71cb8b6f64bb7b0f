"""The app the worker tests run as ``durafn worker --app tests.apps.worker_app:app``.

Its database comes from ``DURAFN_DATABASE_URL`` (or ``--url``). Each function leaves a
trace that survives a killed process: mutations a row naming the process that applied it,
actions a line in a file, written before they do anything else.
"""

from __future__ import annotations

import os
import sys
import time
from typing import NamedTuple

import anyio
from sqlalchemy import String, UniqueConstraint
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

import durafn
from durafn import ActionCtx, MutationCtx


class Base(DeclarativeBase):
    pass


class Applied(Base):
    """One row per applied mutation; the unique key turns a double run into an error."""

    __tablename__ = "applied"
    __table_args__ = (UniqueConstraint("key"),)
    id: Mapped[int] = mapped_column(primary_key=True)
    key: Mapped[str] = mapped_column(String(50))
    pid: Mapped[int]


class Functions(NamedTuple):
    apply: durafn.MutationRef[[int, float], None]
    fan_out: durafn.MutationRef[[int, int, float], None]
    touch: durafn.ActionRef[[int, str, float], int]
    hang: durafn.ActionRef[[int, str], None]
    span: durafn.ActionRef[[int, str, float], None]
    hang_once: durafn.ActionRef[[int, str], None]
    completed: durafn.MutationRef[[durafn.Completion], None]
    until_cancelled: durafn.ActionRef[[int, str], None]
    interruptible: durafn.ActionRef[[int, str], None]
    note: durafn.MutationRef[[int, str], None]
    touch_many: durafn.ActionRef[[Touch], int]
    meet: durafn.ActionRef[[int, str, float, int, str], None]
    step: durafn.MutationRef[[int, str, float], None]
    on_cue: durafn.ActionRef[[int, str], int]


class Touch(NamedTuple):
    """An item of ``w:touch_many``: which, and the trace file its batch writes a line to."""

    n: int
    path: str


async def _span_line(path: str, what: str, n: int) -> None:
    """A span's start or end: the system-wide monotonic clock (comparable across
    processes), the process and the queues its worker serves."""
    serves = sys.argv[sys.argv.index("--queues") + 1] if "--queues" in sys.argv else "*"
    async with await anyio.open_file(path, "a") as f:
        await f.write(f"{what} {n} {time.monotonic()} {os.getpid()} {serves}\n")


async def _trace(path: str, n: int) -> None:
    async with await anyio.open_file(path, "a") as f:
        await f.write(f"{n} {os.getpid()}\n")


def register(app: durafn.App) -> Functions:
    """The functions, on ``app`` (the tests build their own app on their database)."""

    @app.mutation(name="w:apply")
    async def apply(ctx: MutationCtx, n: int, pause: float = 0.0) -> None:
        ctx.db.add(Applied(key=f"m{n}", pid=os.getpid()))
        if pause:
            await anyio.sleep(pause)  # stretch the batch so that other workers get claims in

    @app.mutation(name="w:fan_out")
    async def fan_out(ctx: MutationCtx, start: int, count: int, pause: float = 0.0) -> None:
        for n in range(start, start + count):
            await ctx.scheduler.run_after(0, apply, n, pause)

    @app.action(name="w:touch")
    async def touch(ctx: ActionCtx, n: int, path: str, seconds: float = 0.0) -> int:
        await _trace(path, n)
        await anyio.sleep(seconds)
        return n

    @app.action(name="w:hang")
    async def hang(ctx: ActionCtx, n: int, path: str) -> None:
        await _trace(path, n)
        await anyio.sleep_forever()

    @app.action(name="w:span")
    async def span(ctx: ActionCtx, n: int, path: str, seconds: float) -> None:
        """Records when it starts and ends (the system-wide monotonic clock, comparable
        across processes) and the queues its worker serves."""
        await _span_line(path, "start", n)
        await anyio.sleep(seconds)
        await _span_line(path, "end", n)

    @app.action(name="w:meet")
    async def meet(
        ctx: ActionCtx, n: int, path: str, seconds: float, at_once: int, group: str
    ) -> None:
        """``w:span``, which also stays running, after its start, until ``at_once`` rows
        of its ``group`` have been running together once (in any process), or a minute
        has passed: a limit's being reached then depends on the claims, not on whether a
        loaded machine happened to start two rows within ``seconds`` of each other."""
        await _span_line(path, "start", n)
        members = f"{path}.{group}"
        async with await anyio.open_file(members, "a") as f:
            await f.write(f"start {n}\n")
        give_up = time.monotonic() + 60
        while time.monotonic() < give_up:
            async with await anyio.open_file(members) as f:
                lines = (await f.read()).splitlines()
            if "met" in lines:
                break
            running = sum(1 if line.startswith("start") else -1 for line in lines)
            if running >= at_once:
                async with await anyio.open_file(members, "a") as f:
                    await f.write("met\n")
                break
            await anyio.sleep(0.01)
        await anyio.sleep(seconds)
        async with await anyio.open_file(members, "a") as f:
            await f.write(f"end {n}\n")
        await _span_line(path, "end", n)

    @app.action(name="w:hang_once", retry=durafn.Retry(2, backoff=durafn.Fixed(0)))
    async def hang_once(ctx: ActionCtx, n: int, path: str) -> None:
        """Hangs on its first run (until its worker is killed); returns on the next."""
        async with await anyio.open_file(path) as f:
            first = f"{n} " not in await f.read()
        await _trace(path, n)
        if first:
            await anyio.sleep_forever()

    @app.action(name="w:on_cue")
    async def on_cue(ctx: ActionCtx, n: int, path: str) -> int:
        """Starts (a trace line), waits until ``PATH.go`` exists (a minute at most), then
        writes ``PATH.done`` and returns ``n``: the test says when it ends."""
        await _trace(path, n)
        cue, give_up = anyio.Path(f"{path}.go"), time.monotonic() + 60
        while not await cue.exists() and time.monotonic() < give_up:  # noqa: ASYNC110
            await anyio.sleep(0.005)
        async with await anyio.open_file(f"{path}.done", "w") as f:
            await f.write(f"{n}\n")
        return n

    @app.mutation(name="w:completed")
    async def completed(ctx: MutationCtx, c: durafn.Completion) -> None:
        """A completion callback: the unique key makes a second completion of a row (in
        the same state) fail instead of applying twice."""
        ctx.db.add(Applied(key=f"{c.id} {c.state}", pid=os.getpid()))

    @app.action(name="w:until_cancelled")
    async def until_cancelled(ctx: ActionCtx, n: int, path: str) -> None:
        """Waits for its row's cancel (cooperative), then traces ``n + 1000``."""
        await _trace(path, n)
        await ctx.wait_for_cancel()
        assert ctx.cancel_requested
        await _trace(path, n + 1000)

    @app.action(name="w:interruptible", cancel="interrupt")
    async def interruptible(ctx: ActionCtx, n: int, path: str) -> None:
        """Hangs until its row's cancel interrupts it, then traces ``n + 1000``."""
        await _trace(path, n)
        try:
            await anyio.sleep_forever()
        finally:
            with anyio.CancelScope(shield=True):  # its scope is cancelled: shield the trace
                await _trace(path, n + 1000)

    @app.mutation(name="w:note")
    async def note(ctx: MutationCtx, n: int, path: str) -> None:
        """Records that it ran, as ``w:span`` does (its line is written before its
        transaction commits: a run rolled back would leave a line too)."""
        async with await anyio.open_file(path, "a") as f:
            await f.write(f"run {n} {time.monotonic()} {os.getpid()} *\n")

    @app.mutation(name="w:step")
    async def step(ctx: MutationCtx, n: int, path: str, pause: float) -> None:
        """Says that it starts (its process, the system-wide monotonic clock) before
        anything else, then applies ``s{n}`` and keeps its batch open for ``pause``."""
        async with await anyio.open_file(path, "a") as f:
            await f.write(f"{n} {os.getpid()} {time.monotonic()}\n")
        ctx.db.add(Applied(key=f"s{n}", pid=os.getpid()))
        await anyio.sleep(pause)

    @app.action(name="w:touch_many", batch=durafn.Batch(max_size=50, max_wait=60))
    async def touch_many(ctx: ActionCtx, items: list[Touch]) -> list[int]:
        """A batched action: one line per call, its items' numbers and its process."""
        async with await anyio.open_file(items[0].path, "a") as f:
            await f.write(f"{','.join(str(i.n) for i in items)} {os.getpid()}\n")
        return [i.n for i in items]

    return Functions(
        apply,
        fan_out,
        touch,
        hang,
        span,
        hang_once,
        completed,
        until_cancelled,
        interruptible,
        note,
        touch_many,
        meet,
        step,
        on_cue,
    )


QUEUES = {"limited": durafn.Queue(concurrency=3)}
"""The queue attributes the workers and the tests declare alike."""

app = durafn.App(queues=QUEUES)
register(app)
