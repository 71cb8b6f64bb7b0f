"""What the dashboard's handler tests share: a client of its ASGI app, a page's CSRF
token, and an app with a Pending, a Failed and a Success row (``rows``)."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from typing import Any

import httpx2
import pytest

import durafn
from durafn import ActionCtx, MutationCtx
from durafn.testing import FakeClock

XSS = "<script>alert(1)</script>"
BASE = "http://localhost"


def client(asgi: Any, base: str = BASE) -> httpx2.AsyncClient:
    return httpx2.AsyncClient(transport=httpx2.ASGITransport(app=asgi), base_url=base)


def csrf_of(page: httpx2.Response) -> str:
    found = re.search(r'name="csrf" value="([0-9a-f]+)"', page.text)
    assert found is not None, page.text
    return found.group(1)


@pytest.fixture
async def rows(app: durafn.App, clock: FakeClock) -> AsyncIterator[dict[str, str]]:
    """A Pending row, a Failed one (its error holding a script), a Success one."""

    @app.mutation(name="mail:send")
    async def send(ctx: MutationCtx, to: str) -> str:
        return f"sent {to}"

    @app.action(name="mail:broken")
    async def broken(ctx: ActionCtx, to: str) -> None:
        raise ValueError(f"cannot reach {to}")

    sched = app.scheduler()
    pending = await sched.run_after(3600, send, XSS)
    failed = await sched.run_after(0, broken, XSS)
    done = await sched.run_after(0, send, "ann")
    await app.executor().run_until_idle()
    yield {"pending": pending, "failed": failed, "done": done}
