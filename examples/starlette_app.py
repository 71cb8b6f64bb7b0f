"""durafn inside an existing asyncio web app: a Starlette app whose lifespan runs the
executor for as long as the app serves, and stops it gracefully on shutdown.

    POST /messages {"author": "ann", "body": "hi", "delay": 0}
        -> 201 {"message_id": 1, "scheduled_id": "0190..."}
    GET  /scheduled/{id}             -> the ``_scheduled_functions`` row as JSON (404 if none)
    GET  /scheduled/{id}?wait=5      -> the same, once the row has finished (at most 5 s)

``POST /messages`` inserts the message and schedules ``messages:publish`` in one
transaction: both commit, or neither does.

``python examples/starlette_app.py [URL]`` runs it end to end with Starlette's
``TestClient`` (no server; a temporary SQLite file unless a URL is given). To serve it for
real, with uvicorn (not a durafn dependency: ``pip install uvicorn``), from the repository
root::

    DURAFN_DATABASE_URL=sqlite+aiosqlite:///app.sqlite3 uvicorn examples.starlette_app:web

Starlette is what FastAPI is built on: ``FastAPI(lifespan=lifespan)`` takes the same
lifespan. With several uvicorn workers each runs its own executor; they share the work
through the database.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, ValidationError
from sqlalchemy import String
from sqlalchemy.ext.asyncio import async_sessionmaker
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.testclient import TestClient

import durafn
from durafn import MutationCtx

MAX_WAIT = 30.0
"""Longest a ``GET /scheduled/{id}?wait=`` request is held open, in seconds."""


class Base(DeclarativeBase):
    pass


class Message(Base):
    __tablename__ = "messages"
    id: Mapped[int] = mapped_column(primary_key=True)
    author: Mapped[str] = mapped_column(String(100))
    body: Mapped[str] = mapped_column(String(500))
    published: Mapped[bool] = mapped_column(default=False)


class NewMessage(BaseModel):
    author: str = Field(min_length=1, max_length=100)
    body: str = Field(min_length=1, max_length=500)
    delay: float = Field(default=0.0, ge=0, le=86400)


def create_web(url: str) -> Starlette:
    """The web app and its durafn app, on the database at ``url``."""
    app = durafn.App(url)
    # expire_on_commit=False: the handler reads msg.id after the commit.
    sessions = async_sessionmaker(app.engine, expire_on_commit=False)

    @app.mutation(name="messages:publish")
    async def publish(ctx: MutationCtx, message_id: int) -> str:
        msg = await ctx.db.get(Message, message_id)
        if msg is None:
            return "deleted before it was published"
        msg.published = True
        return f"published {msg.author}: {msg.body}"

    @asynccontextmanager
    async def lifespan(web: Starlette) -> AsyncIterator[dict[str, Any]]:
        # Before the first request: app.scheduler(session) writes through the request's
        # own transaction, which cannot create the system tables.
        await app.migrate()
        async with app.engine.begin() as conn:
            await conn.run_sync(Base.metadata.create_all)
        try:
            # Leaving this block on shutdown lets running work finish (grace_period) and
            # records every outcome before the server exits.
            async with app.run_executor(concurrency=4) as executor:
                yield {"executor": executor}  # request.state.executor in handlers
        finally:
            await app.aclose()

    async def post_message(request: Request) -> Response:
        try:
            new = NewMessage.model_validate_json(await request.body())
        except ValidationError as exc:
            return Response(exc.json(), status_code=422, media_type="application/json")
        async with sessions.begin() as session:
            msg = Message(author=new.author, body=new.body)
            session.add(msg)
            await session.flush()  # the publish needs msg.id
            # Through the session, the scheduled row is part of this transaction: no
            # message without its publish, and no publish of a message that never was.
            scheduled_id = await app.scheduler(session).run_after(
                new.delay, publish, message_id=msg.id
            )
        return JSONResponse({"message_id": msg.id, "scheduled_id": scheduled_id}, 201)

    async def get_scheduled(request: Request) -> Response:
        id = str(request.path_params["id"])
        try:
            wait = min(float(request.query_params.get("wait", 0)), MAX_WAIT)
        except ValueError:
            return JSONResponse({"detail": "wait must be a number of seconds"}, 400)
        executor: durafn.Executor = request.state.executor
        row: durafn.ScheduledFunction | None
        try:
            row = await executor.wait_for(id, timeout=wait) if wait > 0 else await app.get(id)
        except TimeoutError:
            row = await app.get(id)  # not finished in time: the client sees where it is
        except durafn.NotFoundError:
            row = None
        if row is None:
            return JSONResponse({"detail": f"no scheduled function {id}"}, 404)
        return JSONResponse(row.model_dump(mode="json"))

    return Starlette(
        routes=[
            Route("/messages", post_message, methods=["POST"]),
            # The uuid convertor 404s malformed ids before they reach the database (a
            # PostgreSQL uuid column would reject them with an error).
            Route("/scheduled/{id:uuid}", get_scheduled, methods=["GET"]),
        ],
        lifespan=lifespan,
    )


# For `uvicorn examples.starlette_app:web`. Building it connects to nothing.
web = create_web(
    os.environ.get("DURAFN_DATABASE_URL")
    or f"sqlite+aiosqlite:///{Path(tempfile.gettempdir()) / 'durafn-starlette.sqlite3'}"
)


def run(url: str) -> dict[str, Any]:
    """Post a message, wait for its scheduled publish, and return the finished row."""
    # Entering the client runs the lifespan's startup (the executor starts); leaving it
    # runs the shutdown (the executor stops).
    with TestClient(create_web(url)) as client:
        posted = client.post("/messages", json={"author": "ann", "body": "hello"})
        posted.raise_for_status()
        scheduled_id = posted.json()["scheduled_id"]
        got = client.get(f"/scheduled/{scheduled_id}", params={"wait": 10})
        got.raise_for_status()
        row: dict[str, Any] = got.json()
    return row


def main() -> None:
    if len(sys.argv) > 1:
        row = run(sys.argv[1])
    else:
        with tempfile.TemporaryDirectory() as tmp:
            row = run(f"sqlite+aiosqlite:///{Path(tmp) / 'starlette.sqlite3'}")
    print(json.dumps(row, indent=2))
    if row["state"] != durafn.State.SUCCESS.value:
        sys.exit(f"the scheduled function ended {row['state']}, not Success")


if __name__ == "__main__":
    main()
