"""The examples run, on both engines, as part of the suite."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from durafn import State
from durafn.testing import FakeClock, Harness
from examples import bulk_email, flaky_webhook, nightly_sync, self_destruct, starlette_app

from .support.helpers import CEILING
from .support.processes import owned_sync, run_all, tagged

pytestmark = pytest.mark.anyio


async def test_self_destruct_example(db_url: str) -> None:
    out: list[str] = []
    await self_destruct.main(db_url, out)
    first, last = out
    # The action waits for the test's release: InProgress. The destruct is due 0.3 s
    # after it was scheduled, by the real clock: Pending, unless the machine was so busy
    # that 0.3 s passed before the listing (an order, not a timing, is what holds).
    assert "email:send                InProgress" in first
    assert re.search(r"messages:destruct         (Pending|Success)", first)
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


async def test_flaky_webhook_under_the_test_kit(db_url: str) -> None:
    """The example's app tested as a user tests theirs, with ``durafn.testing.Harness``
    (what the plugin's ``durafn`` fixture is), on both engines."""
    clock = FakeClock()
    app, deliver, seen = flaky_webhook.build(db_url, flaky_webhook.Receiver(outage=2), clock)
    kit = Harness(app, clock)
    try:
        await app.migrate()
        await app.scheduler().run_after(0, deliver, "order.paid", "A-1001")
        row = await kit.assert_scheduled(deliver, args={"order": "A-1001"}, within=0)
        assert await kit.run_until_idle() == 1  # the first attempt fails; the retry waits 1 s
        await kit.assert_scheduled(deliver, within=1)
        with pytest.raises(AssertionError, match=r"due within 0\.5s"):
            await kit.assert_scheduled(deliver, within=0.5)
        assert await kit.advance(3) == 3  # the two retries, then the completion callback
        await kit.assert_not_scheduled(deliver, state=None, args={"order": "B-1"})
        done = await kit.scheduled(deliver, state=State.SUCCESS)
        assert [r.id for r in done] == [row.id] and done[0].attempts == 3
        assert await kit.perform(deliver, "order.paid", "A-1002") == 204  # now, not scheduled
        assert len(await kit.scheduled(deliver, state=None)) == 1
        assert len(seen) == 2
    finally:
        await app.aclose()


async def test_nightly_sync_example(db_url: str) -> None:
    out: list[str] = []
    await nightly_sync.main(db_url, out, FakeClock())
    night = [
        "02:00:00.0 synced acme page 1",  # two a second, evenly spaced
        "02:00:00.0 dashboard refreshed (after acme page 1)",  # the first ask: at once
        "02:00:00.5 synced acme page 2",
        "02:00:01.0 synced globex page 1",
        "02:00:01.5 synced globex page 2",
        "02:00:02.0 synced globex page 3",
        "02:00:02.5 synced initech page 1",
        "02:01:00.0 dashboard refreshed (after initech page 1)",  # the rest: one, the last
    ]
    assert out[0] == (
        "a page waits: no live worker serves it: start one (durafn worker); then: its flow "
        "key 'crm-api' has spent its rate budget (2 per 1s); next start at "
        "2030-01-01T02:00:00.500000+00:00"
    )
    assert out[1:-1] == [f"0{day} {line}" for day in (1, 2, 3) for line in night]
    assert out[-1] == "nightly-sync: 3 runs, next 04 02:00"


def test_starlette_example(db_url: str) -> None:
    # Synchronous: TestClient runs the web app (and its lifespan) on its own event loop.
    row = starlette_app.run(db_url)
    assert row["name"] == "messages:publish"
    assert row["state"] == "Success"
    assert row["result"] == "published ann: hello"


ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"


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
    with owned_sync() as token:
        done = subprocess.run(
            [sys.executable, "first.py"],
            cwd=tmp_path,
            env=tagged(token, env),
            capture_output=True,
            text=True,
            timeout=CEILING,
        )
    assert done.returncode == 0, done.stderr
    scheduled, ran = done.stdout.splitlines()
    assert "name='messages:destruct'" in scheduled and "'Pending'" in scheduled
    assert ran == "messages:destruct Success"
    assert "Warning" not in done.stderr  # the functions are named: no __main__ warning
    # A worker's app too: ``durafn ls/worker --app first:app`` import it without running
    # it (its ``asyncio.run`` is guarded) and use the database it names.
    listed = _durafn(tmp_path, "ls", "--app", "first:app", env=env)
    assert listed.returncode == 0, listed.stderr
    assert "messages:destruct" in listed.stdout and "Success" in listed.stdout
    worker = _durafn(tmp_path, "worker", "--app", "first:app", "--exit-on-complete", env=env)
    assert worker.returncode == 0, worker.stderr


def _durafn(folder: Path, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """The ``durafn`` command, run from ``folder`` as a user runs it there."""
    command = [sys.executable, "-m", "_durafn_cli", *args]
    [done] = run_all([command], env=env | {"PYTHONPATH": str(ROOT)}, cwd=folder)
    return subprocess.CompletedProcess(
        done.args, done.returncode, done.stdout.decode(), done.stderr.decode()
    )


async def test_bulk_email_example(db_url: str) -> None:
    out: list[str] = []
    await bulk_email.main(db_url, out, FakeClock())
    assert out == [
        # Two full batches at once, the other 50 at max_wait, then the hiccup's retry.
        "bulk requests: [100, 100, 50, 1]",
        "250 welcomes: 249 sent, 1 failed, 0 canceled",
    ]
