"""The examples run, on both engines, as part of the suite."""

from __future__ import annotations

import pytest

from examples import self_destruct, starlette_app

pytestmark = pytest.mark.anyio


async def test_self_destruct_example(db_url: str) -> None:
    out: list[str] = []
    await self_destruct.main(db_url, out)
    first, last = out
    assert "email:send                InProgress" in first
    assert "messages:destruct         Pending" in first
    assert "messages left = 0" in last
    for expected in (
        "email:send                Success     -> 'sent to ann'",
        "messages:post_empty       Failed      ValueError: bob tried to post an empty message",
        "messages:destruct         Success",
        "messages:destruct         Canceled",
    ):
        assert expected in last


def test_starlette_example(db_url: str) -> None:
    # Synchronous: TestClient runs the web app (and its lifespan) on its own event loop.
    row = starlette_app.run(db_url)
    assert row["name"] == "messages:publish"
    assert row["state"] == "Success"
    assert row["result"] == "published ann: hello"
