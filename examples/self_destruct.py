"""The self-destructing message from Convex's scheduling guide, on durafn.

Run it with ``make demo`` (SQLite, no server) or ``python examples/self_destruct.py URL``.
It prints the ``_scheduled_functions`` rows as they move through their states:
Pending -> InProgress -> Success, Failed with the error, and Canceled.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import anyio
from sqlalchemy import String, func, select
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

import durafn
from durafn import ActionCtx, MutationCtx, QueryCtx


class Base(DeclarativeBase):
    pass


class Message(Base):
    __tablename__ = "messages"
    id: Mapped[int] = mapped_column(primary_key=True)
    body: Mapped[str] = mapped_column(String(500))
    author: Mapped[str] = mapped_column(String(100))


class Demo:
    """The app and its functions, built for one database URL."""

    def __init__(self, url: str, clock: durafn.Clock | None = None) -> None:
        app = self.app = durafn.App(url, clock=clock)
        self.email_started = anyio.Event()
        self.email_release = anyio.Event()

        @app.mutation(name="messages:send_expiring")
        async def send_expiring_message(ctx: MutationCtx, body: str, author: str) -> int:
            msg = Message(body=body, author=author)
            ctx.db.add(msg)
            await ctx.db.flush()
            # Atomic with the insert: if this mutation failed, no destruct would be scheduled.
            await ctx.scheduler.run_after(0.3, destruct, message_id=msg.id)
            await ctx.scheduler.run_after(0, send_email, to=author, subject=f"you wrote {body!r}")
            return msg.id

        @app.mutation(name="messages:destruct")
        async def destruct(ctx: MutationCtx, message_id: int) -> None:
            msg = await ctx.db.get(Message, message_id)
            if msg is not None:
                await ctx.db.delete(msg)

        @app.action(name="email:send")
        async def send_email(ctx: ActionCtx, to: str, subject: str) -> str:
            self.email_started.set()
            await self.email_release.wait()  # stands in for a slow HTTP call
            return f"sent to {to}"

        @app.mutation(name="messages:post_empty")
        async def post_empty(ctx: MutationCtx, author: str) -> None:
            raise ValueError(f"{author} tried to post an empty message")

        @app.query(name="messages:count")
        async def count_messages(ctx: QueryCtx) -> int:
            return (await ctx.db.execute(select(func.count()).select_from(Message))).scalar_one()

        self.send_expiring_message = send_expiring_message
        self.destruct = destruct
        self.send_email = send_email
        self.post_empty = post_empty
        self.count_messages = count_messages

    async def create_tables(self) -> None:
        await self.app.migrate()
        async with self.app.engine.begin() as conn:
            await conn.run_sync(Base.metadata.create_all)


async def print_rows(app: durafn.App, title: str, out: list[str] | None = None) -> None:
    page = await app.list(limit=50)
    lines = [f"\n== {title}", f"{'name':<26}{'state':<12}{'detail'}"]
    for row in page.items:
        detail = ""
        if row.error is not None:
            detail = f"{row.error.type}: {row.error.message}"
        elif row.result is not None:
            detail = f"-> {row.result!r}"
        elif row.state is durafn.State.PENDING:
            detail = f"args {row.args}"
        lines.append(f"{row.name:<26}{row.state.value:<12}{detail}")
    text = "\n".join(lines)
    if out is not None:
        out.append(text)
    print(text)


async def main(url: str, out: list[str] | None = None) -> Demo:
    demo = Demo(url)
    app = demo.app
    await demo.create_tables()
    async with app.run_executor(concurrency=4) as executor:
        msg_id = await app.run_mutation(demo.send_expiring_message, "hello", author="ann")
        await demo.email_started.wait()
        await print_rows(
            app, "scheduled: destruct is Pending, the e-mail action is InProgress", out
        )
        demo.email_release.set()

        failing = await app.scheduler().run_after(0, demo.post_empty, author="bob")
        doomed = await app.scheduler().run_after(60, demo.destruct, message_id=msg_id)
        await app.cancel(doomed)
        await executor.wait_for(failing)
        # Every row still to finish: the destruct due in 0.3 s, and the e-mail action,
        # released above (its outcome is written after it returns, not at the release).
        for name in ("messages:destruct", "email:send"):
            page = await app.list(name=name, state=[durafn.State.PENDING, durafn.State.IN_PROGRESS])
            for row in page.items:
                await executor.wait_for(row.id)
        left = await app.run_query(demo.count_messages)
        await print_rows(app, f"after 0.3s: messages left = {left}", out)
    await app.aclose()
    return demo


def cli() -> None:
    if len(sys.argv) > 1:
        anyio.run(main, sys.argv[1])
        return
    with tempfile.TemporaryDirectory() as tmp:
        anyio.run(main, f"sqlite+aiosqlite:///{Path(tmp) / 'demo.sqlite3'}")


if __name__ == "__main__":
    cli()
