"""Operator utilities on both engines: reschedule and cancel by filter in batches (20,000
rows), and the CLI over them and over queues (``queue ls|pause|resume``, ``ls`` filters,
``stats`` by queue, ``worker --pool`` errors)."""

from __future__ import annotations

import json
import socket
from datetime import datetime, timedelta
from typing import Any

import anyio
import pytest
from click.testing import CliRunner, Result
from sqlalchemy import event, func, select

import durafn
from durafn import MutationCtx, State, cli, scheduled_functions
from durafn.testing import FakeClock

from .test_cli import assert_one_line_error

pytestmark = pytest.mark.anyio
CLEAN_ENV: dict[str, str | None] = dict.fromkeys(
    ["DURAFN_APP", "DURAFN_DATABASE_URL", "FORCE_COLOR", "NO_COLOR", "TTY_COMPATIBLE"]
)


def invoke(*args: str) -> Result:
    return CliRunner().invoke(cli.main, list(args), env=CLEAN_ENV, catch_exceptions=False)


def invoke_json(*args: str) -> Any:
    result = invoke(*args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


async def _states(app: durafn.App) -> dict[str, int]:
    sf = scheduled_functions
    async with app.engine.connect() as conn:
        rows = await conn.execute(select(sf.c.state, func.count()).group_by(sf.c.state))
        return {state: n for state, n in rows}


async def test_reschedule_and_cancel_20000_rows_in_batches(
    app: durafn.App, clock: FakeClock
) -> None:
    @app.mutation
    async def noop(ctx: MutationCtx, n: int) -> None:
        pass

    for start in range(0, 20_000, 10_000):
        await app.scheduler().run_many(
            [
                noop.options(queue=f"q{n % 2}").call(n).after(3600)
                for n in range(start, start + 10_000)
            ]
        )
    begun = 0

    def _begin(*_: object) -> None:
        nonlocal begun
        begun += 1

    event.listen(app.engine.sync_engine, "begin", _begin)  # removed below: engines are shared
    later = clock.now_datetime() + timedelta(days=1)
    assert await app.reschedule(queue="q0", run_at=later, priority=-3, batch_size=2000) == 10_000
    assert begun >= 10_000 // 2000  # one transaction per batch, never one for all
    moved = (await app.list(queue="q0", limit=1)).items[0]
    assert (moved.scheduled_time, moved.priority) == (later, -3)
    assert (await app.list(queue="q1", limit=1)).items[0].priority == 0
    begun = 0
    assert await app.cancel_where(queue="q1", batch_size=1600) == 10_000
    assert begun >= 10_000 // 1600
    event.remove(app.engine.sync_engine, "begin", _begin)
    assert await _states(app) == {"Pending": 10_000, "Canceled": 10_000}
    assert await app.cancel_where(queue="q1") == 0
    # Nothing due before the new time: the rescheduled rows wait for it.
    assert await app.executor().run_until_idle() == 0


async def test_reschedule_by_id_and_the_errors_of_bad_requests(
    app: durafn.App, clock: FakeClock
) -> None:
    @app.mutation
    async def noop(ctx: MutationCtx) -> None:
        pass

    ids = await app.scheduler().run_many([noop.call().after(60) for _ in range(3)])
    soon = clock.now_datetime()
    assert await app.reschedule(ids[:2], run_at=soon) == 2
    assert await app.executor().run_until_idle() == 2
    assert await app.reschedule(ids[:2], priority=1) == 0  # finished: left alone
    with pytest.raises(durafn.ArgumentError, match="run_at, priority and/or max_attempts"):
        await app.reschedule(ids)
    with pytest.raises(durafn.ArgumentError, match="needs a filter"):
        await app.cancel_where()
    with pytest.raises(durafn.ArgumentError, match="priority must be an integer"):
        await app.reschedule(ids, priority="high")  # type: ignore[arg-type]
    with pytest.raises(durafn.ArgumentError, match="ids must be a list"):
        await app.reschedule(ids[0], priority=1)


def test_the_cli_lists_pauses_resumes_and_filters_queues(db_url: str) -> None:
    """Sync: the CLI runs its own event loop."""
    app = durafn.App(db_url)

    @app.mutation(name="cli:note")
    async def note(ctx: MutationCtx, tag: str) -> None:
        pass

    async def _schedule() -> list[durafn.ScheduledFunctionId]:
        await app.migrate()
        try:
            return await app.scheduler().run_many(
                [
                    note.options(queue="mail", key="k1", flags=["x"]).call("a"),
                    note.options(queue="mail").call("b").after(60),
                    note.options(queue="reports", priority=-2).call("c"),
                ]
            )
        finally:
            await app.aclose()

    async def _run_and_read() -> durafn.ScheduledFunction | None:
        try:
            await app.executor().run_until_idle()
            return await app.get(ids[0])
        finally:
            await app.aclose()

    ids = anyio.run(_schedule)
    assert invoke_json("queue", "pause", "mail", "--url", db_url) == {
        "queues": ["mail"],
        "paused": 1,
    }
    queues = {q["name"]: q for q in invoke_json("queue", "ls", "--url", db_url)}
    assert (queues["mail"]["paused"], queues["mail"]["due"], queues["mail"]["pending"]) == (
        True,
        1,
        2,
    )
    # The longest-waiting due row of each queue: "mail"'s first (its second is not due).
    due = datetime.fromisoformat(invoke_json("show", ids[0], "--url", db_url)["due_time"])
    assert queues["mail"]["oldest_due_at"] == pytest.approx(due.timestamp())
    listing = invoke("queue", "ls", "--url", db_url).stdout
    assert "mail" in listing and "paused" in listing and "reports" in listing
    assert "waited" in listing
    stats = invoke_json("stats", "--url", db_url)
    assert {q["name"] for q in stats["queues"]} == {"mail", "reports"}
    assert "queues" in invoke("stats", "--url", db_url).stdout
    assert [r["id"] for r in invoke_json("ls", "--queue", "mail", "--url", db_url)["items"]] == (
        ids[:2]
    )
    assert [r["id"] for r in invoke_json("ls", "--key", "k1", "--url", db_url)["items"]] == ids[:1]
    assert [r["id"] for r in invoke_json("ls", "--flag", "x", "--url", db_url)["items"]] == ids[:1]
    row = invoke_json("show", ids[2], "--url", db_url)
    assert (row["queue"], row["priority"]) == ("reports", -2)
    assert "reports" in invoke("ls", "--wide", "--url", db_url).stdout
    first = anyio.run(_run_and_read)
    assert first is not None and first.state is State.PENDING  # its queue is paused
    assert invoke_json("queue", "resume", "mail", "--url", db_url)["resumed"] == 1
    assert invoke("queue", "resume", "mail", "--url", db_url).stdout == (
        "0 queues resumed (1 already resumed)\n"
    )
    # By filters, reschedule asks first, as cancel and retry do (it changed rows unasked).
    refused = invoke("reschedule", "--queue", "mail", "--priority", "5", "--url", db_url)
    assert refused.exit_code == 1 and "reschedule asks before changing rows" in refused.stderr
    assert invoke("reschedule", "--queue", "mail", "--url", db_url, "--yes").exit_code == 2
    again = ["reschedule", "--queue", "mail", "--priority", "5", "--yes", "--url", db_url]
    assert invoke_json(*again) == {"rescheduled": 2}
    refused = invoke("cancel", "--queue", "mail", "--url", db_url)  # no terminal to ask on
    assert refused.exit_code == 1 and "pass --yes" in refused.stderr
    assert invoke_json("cancel", "--queue", "mail", "--yes", "--url", db_url) == {"canceled": 2}
    assert invoke("cancel", "--url", db_url).exit_code == 2  # neither ids nor filters
    assert invoke("cancel", ids[2], "--queue", "x", "--url", db_url).exit_code == 2


def test_worker_pool_options_are_checked_before_anything_starts() -> None:
    url = "sqlite+aiosqlite:///never-created.sqlite3"
    for args, message in [
        (["--pool", "mail:0"], "must be 1 to 1000"),
        (["--pool", "mail", "-n", "2"], "leave out -n and --queues"),
        (["--pool", "mail", "--queues", "x"], "leave out -n and --queues"),
        (["--queues", "a,,b"], "queue names separated by commas"),
        (["--forbid-flag", "a b"], "is not a flag"),
        (["-n", "2", "--metrics-port", "65535"], "ports 65535 to 65536, and the last port"),
        (["--pool", "a:2", "--pool", "b", "--metrics-port", "65534"], "ports 65534 to 65536"),
    ]:
        result = invoke("worker", "--app", "tests.apps.cli_app:app", "--url", url, *args)
        assert result.exit_code == 2, result.output  # a bad option: one line, as click's
        assert result.stderr.startswith("error: ") and message in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_a_metrics_port_in_use_is_one_error_before_the_worker_starts(db_url: str) -> None:
    """A port another process holds (two workers given one --metrics-port): one line that
    names it, exit status 1, from a worker, a supervisor of several and `durafn metrics`;
    nothing ran."""
    assert invoke("migrate", "--url", db_url).exit_code == 0
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = str(held.getsockname()[1])
        app = ["--app", "tests.apps.cli_app:app", "--url", db_url]
        for args in (
            ["worker", *app, "--metrics-port", port, "--exit-on-complete"],
            ["worker", *app, "-n", "2", "--metrics-port", port, "--exit-on-complete"],
            ["metrics", "--url", db_url, "--port", port],
        ):
            result = invoke(*args)
            assert_one_line_error(
                result.exit_code, result.stderr, f"cannot serve metrics on 127.0.0.1:{port}"
            )
            assert "in use" in result.stderr
