"""The examples run, on both engines, as part of the suite."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from durafn.testing import FakeClock
from examples import flaky_webhook, self_destruct, starlette_app

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


async def test_flaky_webhook_example(db_url: str) -> None:
    out: list[str] = []
    await flaky_webhook.main(db_url, out, FakeClock())
    assert out == [
        "attempt 1: ConnectionError: connection refused (call 1)",
        "attempt 2: ConnectionError: connection refused (call 2)",
        "error hook: webhooks:deliver ConnectionError (retried)",
        "error hook: webhooks:deliver ConnectionError (retried)",
        "webhooks:deliver Success after 3 runs -> 204",
        "on_complete: webhooks:delivered Success -> webhooks:deliver Success, result 204",
    ]


def test_starlette_example(db_url: str) -> None:
    # Synchronous: TestClient runs the web app (and its lifespan) on its own event loop.
    row = starlette_app.run(db_url)
    assert row["name"] == "messages:publish"
    assert row["state"] == "Success"
    assert row["result"] == "published ann: hello"


README = Path(__file__).resolve().parent.parent / "README.md"


def test_the_readme_first_app_runs_as_written(db_url: str, tmp_path: Path) -> None:
    """The code block under "A first app", pasted into a file and run with ``python``, on
    both engines. One change: the 5 s delay becomes 0.2 s, so the suite does not wait."""
    section = README.read_text().split("## A first app", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert match is not None
    code = match.group(1)
    assert "DESTRUCT_AFTER = 5.0" in code
    (tmp_path / "first.py").write_text(code.replace("DESTRUCT_AFTER = 5.0", "DESTRUCT_AFTER = 0.2"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("DURAFN_")}
    env["DURAFN_DATABASE_URL"] = db_url
    done = subprocess.run(
        [sys.executable, "first.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    scheduled, ran = done.stdout.splitlines()
    assert "name='messages:destruct'" in scheduled and "'Pending'" in scheduled
    assert ran == "messages:destruct Success"
    assert "Warning" not in done.stderr  # the functions are named: no __main__ warning
