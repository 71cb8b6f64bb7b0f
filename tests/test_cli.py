"""The ``durafn`` command: most behaviour in-process through click's ``CliRunner`` (fast),
the error paths also as a real ``python -m durafn`` subprocess (exit status 1, one line on
stderr, no traceback), on SQLite and PostgreSQL."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import signal
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
import click
import pytest
from click.testing import CliRunner, Result
from sqlalchemy import inspect as sa_inspect
from sqlalchemy import update

import durafn
from durafn import State, cli
from durafn.cli import options
from durafn.cli.output import duration, iso
from durafn.testing import FakeClock

from .apps.cli_app import ADD, NOTIFY, make_app
from .conftest import PG_BASE
from .support.helpers import CEILING
from .support.processes import owned_sync, run_all, tagged

ROOT = Path(__file__).resolve().parent.parent
UNKNOWN_ID = "01900000-0000-7000-8000-000000000000"
ISO_MS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
# Neither the developer's environment nor one test may choose another test's app or database.
CLEAN_ENV: dict[str, str | None] = dict.fromkeys(
    ["DURAFN_APP", "DURAFN_DATABASE_URL", "FORCE_COLOR", "NO_COLOR", "TTY_COMPATIBLE"]
)


def invoke(*args: str, input: str | None = None, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(
        cli.main, list(args), input=input, env=CLEAN_ENV | (env or {}), catch_exceptions=False
    )


def invoke_json(*args: str) -> Any:
    result = invoke(*args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def assert_one_line_error(exit_code: int, stderr: str, message: str) -> None:
    assert exit_code == 1, stderr
    assert stderr.startswith("error: "), stderr
    assert len(stderr.strip().splitlines()) == 1, stderr
    assert message in stderr
    assert "Traceback" not in stderr


# -- a database with one row in each situation ------------------------------------------


@dataclass(frozen=True)
class Rows:
    """Ids of rows made through the Python API, in scheduled-time order."""

    url: str
    success: str  # cli:add(1, 2) -> 3
    failed: str  # cli:add(1, -1) raised ValueError
    action: str  # cli:notify(ann), succeeded
    running: str  # cli:notify(cy), InProgress on worker "w-1"
    due: str  # cli:add(0, 0), due but never run: the lag
    later: str  # cli:add(2, 2), due in an hour
    canceled: str  # cli:notify(bob), due in an hour, cancelled

    @property
    def in_order(self) -> list[str]:
        return [
            self.success,
            self.failed,
            self.action,
            self.running,
            self.due,
            self.later,
            self.canceled,
        ]

    @property
    def finished(self) -> set[str]:
        return {self.success, self.failed, self.action, self.canceled}


async def _populate(url: str) -> Rows:
    app = make_app(url)
    await app.migrate()
    try:
        run_after = app.scheduler().run_after
        success = await run_after(0, ADD, a=1, b=2)
        failed = await run_after(0, ADD, a=1, b=-1)
        action = await run_after(0, NOTIFY, to="ann")
        later = await run_after(3600, ADD, a=2, b=2)
        canceled = await run_after(3600, NOTIFY, to="bob")
        await app.executor().run_until_idle()
        await app.cancel(canceled)
        running = await run_after(0, NOTIFY, to="cy")
        await _claim_as_worker(app, "w-1")
        due = await run_after(0, ADD, a=0, b=0)
    finally:
        await app.aclose()
    return Rows(url, success, failed, action, running, due, later, canceled)


async def _claim_as_worker(app: durafn.App, worker_id: str) -> None:
    """What a worker process does before it runs an action: register, then claim it."""
    driver, now = app._rt.driver, app.clock.now()
    async with app.engine.begin() as conn:
        await driver.register_worker(conn, worker_id, "host-1", 4242, 4, now)
        assert len(await driver.claim_actions(conn, now, 10, worker_id)) == 1


@pytest.fixture
def rows(app_url: tuple[str, bool]) -> Rows:
    # The ``app`` tests' database (its schema kept between tests, emptied): migrating a
    # bare one for each of these tests cost 0.35 s a set-up on PostgreSQL.
    return anyio.run(_populate, app_url[0])


def states_by_id(url: str) -> dict[str, str]:
    page = invoke_json("ls", "--url", url, "--limit", "100")
    return {item["id"]: item["state"] for item in page["items"]}


def ids(*args: str) -> list[str]:
    return [item["id"] for item in invoke_json("ls", *args)["items"]]


# -- migrate ------------------------------------------------------------------------------


def test_migrate_creates_the_tables_and_is_idempotent(db_url: str) -> None:
    for _ in range(2):
        result = invoke("migrate", "--url", db_url)
        assert result.exit_code == 0, result.output
        assert f"durafn system tables are at version {durafn.SCHEMA_VERSION}\n" == result.stdout
    assert invoke_json("migrate", "--url", db_url) == {"schema_version": durafn.SCHEMA_VERSION}


# -- ls -------------------------------------------------------------------------------------


def test_ls_shows_every_row_in_scheduled_order(rows: Rows) -> None:
    items = invoke_json("ls", "--url", rows.url)["items"]
    assert [i["id"] for i in items] == rows.in_order
    result = invoke("ls", "--url", rows.url)
    assert result.exit_code == 0, result.output
    lines = {i["id"]: line for i in items for line in result.stdout.splitlines() if i["id"] in line}
    assert [result.stdout.index(i) for i in rows.in_order] == sorted(
        result.stdout.index(i) for i in rows.in_order
    )
    for item in items:
        cells = [c.strip() for c in re.split(r"[│|]", lines[item["id"]]) if c.strip()]
        assert cells[1:4] == [item["name"], item["kind"], item["state"]]
        scheduled = datetime.fromisoformat(item["scheduled_time"])
        assert cells[4] == iso(scheduled) and ISO_MS.match(cells[4])
    # The message is printed as text: "[got -1]" is not swallowed as rich markup.
    assert "ValueError: b must not be negative [got -1]" in lines[rows.failed]
    assert "next page" not in result.stdout
    assert "\x1b[" not in result.stdout  # not a terminal: no colour


def test_ls_colours_the_state_on_a_terminal(rows: Rows) -> None:
    terminal = {"FORCE_COLOR": "1", "TERM": "xterm", "COLUMNS": "250"}
    text = invoke("ls", "--url", rows.url, env=terminal).stdout
    for state, colour in [("Success", 32), ("Failed", 31), ("InProgress", 36), ("Canceled", 33)]:
        assert f"\x1b[{colour}m{state}" in text, state
    assert re.search(r"│ Pending +│", text)


ANSI = re.compile(r"\x1b\[[0-9;]*m")


def test_ls_is_readable_in_80_columns(rows: Rows) -> None:
    """On a narrow terminal: id (never cut), name, state, and when it is due or was
    completed; --wide shows every column anyway."""
    terminal = {"FORCE_COLOR": "1", "TERM": "xterm", "COLUMNS": "80"}
    result = invoke("ls", "--url", rows.url, env=terminal)
    assert result.exit_code == 0, result.output
    lines = ANSI.sub("", result.stdout).splitlines()
    assert max(map(len, lines)) <= 80
    assert lines[0].split() == ["id", "name", "state", "due", "/", "completed"]
    for row_id in rows.in_order:
        [line] = [line for line in lines if row_id in line]  # whole, copyable
        assert line.startswith(row_id)
    failed = next(line for line in lines if rows.failed in line)
    assert failed.split()[1:3] == [ADD, "Failed"]
    wide = ANSI.sub("", invoke("ls", "--url", rows.url, "--wide", env=terminal).stdout)
    assert re.search(r"┃ id +┃ name +┃ kind +┃ state +┃ scheduled", wide)
    assert all(f"│ {row_id} │" in wide for row_id in rows.in_order)


def test_ls_newest_first_and_its_pages(rows: Rows) -> None:
    url = ("--url", rows.url)
    newest = list(reversed(rows.in_order))
    later_first = [rows.later, rows.canceled]  # scheduled an hour ahead: latest of all
    assert set(ids(*url, "--newest")[:2]) == set(later_first)
    assert sorted(ids(*url, "--newest")) == sorted(newest)
    first = invoke_json("ls", *url, "--newest", "--limit", "3")
    rest = invoke_json("ls", *url, "--newest", "--cursor", first["next_cursor"])
    assert [i["id"] for i in first["items"] + rest["items"]] == ids(*url, "--newest")
    wrong_order = invoke("ls", *url, "--cursor", first["next_cursor"])
    assert wrong_order.exit_code == 2 and "other order" in wrong_order.stderr
    junk = invoke("ls", *url, "--cursor", "nonsense")
    assert junk.exit_code == 2 and "--cursor" in junk.stderr


def test_ls_filters_by_state_name_and_time(rows: Rows) -> None:
    url = ("--url", rows.url)
    assert ids(*url, "--state", "FAILED", "--state", "in-progress") == [rows.failed, rows.running]
    assert ids(*url, "--state", "inprogress") == [rows.running]
    assert ids(*url, "--state", "cancelled") == ids(*url, "--state", "Canceled") == [rows.canceled]
    assert ids(*url, "--state", "pending", "--name", ADD) == [rows.due, rows.later]
    assert ids(*url, "--name", NOTIFY) == [rows.action, rows.running, rows.canceled]
    assert ids(*url, "--name", "cli:nothing") == []
    # A minute before `later`: the due rows are an hour earlier. (Not `later`'s own time:
    # stored times have sub-microsecond digits that a datetime rounds away.)
    aware = datetime.fromisoformat(invoke_json("show", *url, rows.later)["scheduled_time"])
    aware -= timedelta(minutes=1)
    naive_utc = aware.replace(tzinfo=None).isoformat()
    assert ids(*url, "--after", aware.isoformat()) == rows.in_order[5:]
    assert ids(*url, "--after", naive_utc) == rows.in_order[5:]
    # A zone given is honoured: 30 minutes behind UTC puts this after every row.
    assert ids(*url, "--after", naive_utc.replace("T", " ") + "-00:30") == []
    assert ids(*url, "--before", naive_utc + "Z") == rows.in_order[:5]
    empty = invoke("ls", *url, "--name", "cli:nothing")
    assert empty.stdout == "no scheduled functions match\n"


def test_ls_pages_with_the_cursor(rows: Rows) -> None:
    seen: list[str] = []
    sizes: list[int] = []
    cursor: list[str] = []
    while True:
        page = invoke_json("ls", "--url", rows.url, "--limit", "3", *cursor)
        seen += [item["id"] for item in page["items"]]
        sizes.append(len(page["items"]))
        if page["next_cursor"] is None:
            break
        human = invoke("ls", "--url", rows.url, "--limit", "3", *cursor)
        assert human.stdout.splitlines()[-1] == f"next page: --cursor {page['next_cursor']}"
        cursor = ["--cursor", page["next_cursor"]]
    assert seen == rows.in_order
    assert sizes == [3, 3, 1]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["ls", "--state", "done"], "'done' is not one of 'pending', 'inprogress', 'success'"),
        (["ls", "--after", "yesterday"], "'yesterday' is not an ISO 8601 date-time"),
        (["ls", "--before", "2030-13-01"], "'2030-13-01' is not an ISO 8601 date-time"),
        (["ls", "--limit", "0"], "0 is not in the range 1<=x<=10000"),
        (["clear", "--state", "pending"], "'pending' is not one of 'success', 'failed'"),
        (["clear", "--older-than", "-1"], "-1.0 is not in the range x>=0"),
        (["clear", "--older-than", "nan"], "nan is not a finite number of seconds"),
        (["clear", "--older-than", "1e300"], "1e300 is not a finite number of seconds"),
        (["clear", "--older-than", "soon"], "'soon' is not a number of seconds"),
        (["worker", "--heartbeat-interval", "inf"], "inf is not a finite number of seconds"),
        (["worker", "--poll-interval", "0"], "0.0 is not in the range x>0"),
        (["worker", "--concurrency", str(10**30)], "is not in the range 1<=x<=100000"),
    ],
)
def test_bad_options_are_usage_errors(args: list[str], message: str) -> None:
    result = invoke(*args, "--url", "sqlite:///never-opened.db")
    assert result.exit_code == 2
    assert message in " ".join(result.stderr.split())
    assert not Path("never-opened.db").exists()


# -- show -------------------------------------------------------------------------------


def test_show_prints_every_field(rows: Rows) -> None:
    row = invoke_json("show", "--url", rows.url, rows.failed)
    assert row["id"] == rows.failed
    assert (row["state"], row["args"], row["error"]["type"]) == (
        "Failed",
        {"a": 1, "b": -1},
        "ValueError",
    )
    result = invoke("show", "--url", rows.url, rows.failed)
    assert result.exit_code == 0, result.output
    text = result.stdout
    for field in durafn.ScheduledFunction.model_fields:
        assert re.search(rf"^\W*{field}\b", text, re.MULTILINE), field
    assert "ValueError: b must not be negative [got -1]" in text
    assert "Traceback (most recent call last)" in text  # where it was raised, too
    assert '"a": 1,' in text and '"b": -1' in text
    assert iso(datetime.fromisoformat(row["completed_time"])) in text
    success = invoke_json("show", "--url", rows.url, rows.success)
    assert (success["state"], success["result"], success["error"]) == ("Success", 3, None)
    assert invoke_json("show", "--url", rows.url, rows.running)["state"] == "InProgress"


def test_explain_tells_a_finished_row_in_one_line(rows: Rows) -> None:
    """How it ended, when, and after how many runs: once, not its state twice."""
    told = {}
    for row_id in (rows.success, rows.failed, rows.canceled):
        result = invoke("explain", "--url", rows.url, row_id)
        assert result.exit_code == 0, result.output
        [told[row_id]] = result.stdout.splitlines()
        completed = datetime.fromisoformat(
            invoke_json("show", "--url", rows.url, row_id)["completed_time"]
        )
        assert completed.isoformat() in told[row_id]
    assert re.fullmatch(
        rf"{rows.success} is Success: it succeeded at \S+, after 1 run", told[rows.success]
    )
    assert re.fullmatch(
        rf"{rows.failed} is Failed: it failed at \S+, after 1 run: "
        r"ValueError: b must not be negative \[got -1\]",
        told[rows.failed],
    )
    assert re.fullmatch(
        rf"{rows.canceled} is Canceled: it was cancelled at \S+, after 0 runs", told[rows.canceled]
    )


@pytest.mark.parametrize(
    ("unknown", "message"),
    [
        (UNKNOWN_ID, f"no scheduled function has id {UNKNOWN_ID!r}"),
        ("not-a-uuid", "'not-a-uuid' is not a scheduled function id"),
    ],
)
def test_show_an_unknown_id_is_an_error(db_url: str, unknown: str, message: str) -> None:
    assert invoke("migrate", "--url", db_url).exit_code == 0
    result = invoke("show", "--url", db_url, unknown)
    assert_one_line_error(result.exit_code, result.stderr, message)
    assert result.stdout == ""


# -- cancel -----------------------------------------------------------------------------


def test_cancel_reports_each_id_and_fails_if_one_is_unknown(rows: Rows) -> None:
    result = invoke("cancel", "--url", rows.url, UNKNOWN_ID, rows.later, rows.success, rows.running)
    assert result.exit_code == 1
    assert result.stdout.splitlines() == [
        f"canceled {rows.later} (was Pending)",
        f"{rows.success} had already finished (Success); nothing to cancel",
        f"canceled {rows.running} (was InProgress)",
    ]
    assert_one_line_error(1, result.stderr, f"no scheduled function has id {UNKNOWN_ID!r}")
    states = states_by_id(rows.url)
    assert (states[rows.later], states[rows.success], states[rows.running]) == (
        "Canceled",
        "Success",
        "Canceled",
    )


def test_cancel_json(rows: Rows) -> None:
    assert invoke_json("cancel", "--url", rows.url, rows.due, rows.canceled) == [
        {"id": rows.due, "canceled": True, "previous_state": "Pending"},
        {"id": rows.canceled, "canceled": False, "previous_state": "Canceled"},
    ]
    result = invoke("cancel", "--url", rows.url, "--json", "nonsense")
    assert result.exit_code == 1 and json.loads(result.stdout) == []
    assert_one_line_error(1, result.stderr, "'nonsense' is not a scheduled function id")


# -- stats ------------------------------------------------------------------------------


def test_durations_read_as_people_say_them() -> None:
    cases = {0.04: "0.0 s", 12.34: "12.3 s", 725: "12 min 5 s", 7800: "2 h 10 min"}
    cases |= {273600: "3 d 4 h", -5: "-5.0 s", -725: "-12 min 5 s"}
    assert {s: duration(s) for s in cases} == cases


def test_every_command_is_found_by_the_name_it_is_listed_under() -> None:
    context = click.Context(cli.main)
    for name in cli.main.list_commands(context):
        command = cli.main.get_command(context, name)
        assert command is not None and command.name == name, name
    assert cli.main.get_command(context, "nosuch") is None
    unknown = invoke("nosuch")
    assert unknown.exit_code == 2 and "No such command 'nosuch'" in unknown.stderr


def test_a_worker_imports_neither_the_other_commands_nor_rich() -> None:
    # Every worker process starts through `durafn worker`: it loads its own command only.
    code = (
        "import sys, click; from durafn.cli import main; "
        "main.get_command(click.Context(main), 'worker'); "
        "print(' '.join(sorted(m for m in sys.modules "
        "if m.split('.')[0] == 'rich' or m.startswith('durafn.cli.'))))"
    )
    with owned_sync() as token:
        done = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            env=tagged(token),
            cwd=ROOT,
            timeout=CEILING,
            check=True,
        )
    assert done.stdout.split() == ["durafn.cli.options", "durafn.cli.running", "durafn.cli.worker"]


def test_stats_counts_lag_next_due_and_workers(rows: Rows) -> None:
    stats = invoke_json("stats", "--url", rows.url)
    assert stats["counts"] == {
        "Pending": 2,
        "InProgress": 1,
        "Success": 2,
        "Failed": 1,
        "Canceled": 1,
    }
    shown = {r: invoke_json("show", "--url", rows.url, r) for r in (rows.due, rows.later)}
    at, oldest = datetime.fromisoformat(stats["at"]), datetime.fromisoformat(stats["oldest_due"])
    assert oldest == datetime.fromisoformat(shown[rows.due]["scheduled_time"])
    assert stats["lag"] == pytest.approx((at - oldest).total_seconds(), abs=2e-6)
    assert 0 < stats["lag"] < 60
    assert stats["next_due"] == shown[rows.later]["scheduled_time"]
    [worker] = [w for w in stats["workers"] if w["id"] == "w-1"]
    assert (worker["hostname"], worker["pid"], worker["concurrency"], worker["running"]) == (
        "host-1",
        4242,
        4,
        1,
    )
    assert 0 <= worker["seconds_since_heartbeat"] < 60

    text = invoke("stats", "--url", rows.url).stdout
    for state, n in stats["counts"].items():
        assert re.search(rf"\b{state}\W+{n}\b", text), state
    assert f"(oldest due row: due at {iso(oldest)})" in text
    next_due = iso(datetime.fromisoformat(stats["next_due"]))
    assert re.search(rf"next due: {next_due} \(in (59 min \d+ s|1 h 0 min)\)", text), text
    assert re.search(r"w-1\W+host-1\W+4242\W+4\W+1\W+\d+\.\ds ago", text), text


def test_stats_of_an_empty_database(db_url: str) -> None:
    assert invoke("migrate", "--url", db_url).exit_code == 0
    stats = invoke_json("stats", "--url", db_url)
    assert stats["counts"] == dict.fromkeys(
        ["Pending", "InProgress", "Success", "Failed", "Canceled"], 0
    )
    assert (stats["lag"], stats["oldest_due"], stats["next_due"], stats["workers"]) == (
        0,
        None,
        None,
        [],
    )
    text = invoke("stats", "--url", db_url).stdout
    for line in (
        "lag: 0 s (nothing is due)",
        "next due: nothing is scheduled later",
        "workers: none registered",
    ):
        assert line in text


# -- clear --------------------------------------------------------------------------------


def test_clear_deletes_finished_rows_only(rows: Rows) -> None:
    result = invoke("clear", "--url", rows.url, "--yes")
    assert result.stdout == "deleted 4 finished rows\n"
    assert states_by_id(rows.url) == {
        rows.running: "InProgress",
        rows.due: "Pending",
        rows.later: "Pending",
    }
    assert invoke("clear", "--url", rows.url, "-y").stdout == "nothing to delete\n"


def test_clear_by_state_and_age(rows: Rows) -> None:
    anyio.run(_complete_hours_ago, rows.url, rows.failed, 2)
    assert invoke_json("clear", "--url", rows.url, "-y", "--older-than", "3600") == {"deleted": 1}
    assert invoke_json("clear", "--url", rows.url, "-y", "--state", "SUCCESS") == {"deleted": 2}
    assert set(states_by_id(rows.url)) == {rows.running, rows.due, rows.later, rows.canceled}


async def _complete_hours_ago(url: str, row_id: str, hours: float) -> None:
    app = durafn.App(url)
    async with app, app.engine.begin() as conn:
        sf = durafn.scheduled_functions
        await conn.execute(
            update(sf)
            .where(sf.c.id == row_id)
            .values(completed_time=sf.c.completed_time - hours * 3600)
        )


def test_clear_asks_first(rows: Rows, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(options, "stdin_is_terminal", lambda: True)
    declined = invoke("clear", "--url", rows.url, input="n\n")
    assert declined.exit_code == 1
    assert "Delete 4 finished rows? [y/N]" in declined.stderr and "Aborted" in declined.stderr
    assert rows.finished <= set(states_by_id(rows.url))
    accepted = invoke("clear", "--url", rows.url, "--state", "failed", input="y\n")
    assert accepted.exit_code == 0
    assert "Delete 1 finished row? [y/N]" in accepted.stderr
    assert accepted.stdout == "deleted 1 finished row\n"
    assert rows.failed not in states_by_id(rows.url)


# With click.confirm's input(), this failed about one run in three with two busy loops
# beside it (a SIGINT landing just before the read began); with the select on a wake-up
# pipe, none in 30 runs under the same load (20 alone, 10 in pytest-xdist workers).
def test_ctrl_c_at_the_clear_prompt_stops_it_at_once(rows: Rows) -> None:
    """The real command on a terminal: the first SIGINT at the prompt ends it (exit 1,
    "Aborted!", no traceback) and nothing is deleted."""
    primary, secondary = pty.openpty()
    env = {k: v for k, v in os.environ.items() if k not in CLEAN_ENV}
    with owned_sync() as token:
        proc = subprocess.Popen(
            [sys.executable, "-m", "_durafn_cli", "clear", "--url", rows.url],
            cwd=ROOT,
            env=tagged(token, env),
            stdin=secondary,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        try:
            assert proc.stderr is not None
            seen = b""
            while b"[y/N]" not in seen:
                ready, _, _ = select.select([proc.stderr], [], [], CEILING)
                assert ready, f"no prompt after {CEILING:g}s: {seen!r}"
                chunk = os.read(proc.stderr.fileno(), 4096)
                assert chunk, seen  # the prompt, not an early exit
                seen += chunk
            proc.send_signal(signal.SIGINT)
            _, rest = proc.communicate(timeout=CEILING)
        finally:
            os.close(primary)
            os.close(secondary)
    stderr = (seen + rest).decode()
    assert proc.returncode == 1, stderr
    assert "Aborted" in stderr and "Traceback" not in stderr
    assert rows.finished <= set(states_by_id(rows.url))


def test_cancelling_by_filter_says_how_many_and_asks_first(
    rows: Rows, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As clear does: ``durafn cancel --name X`` cancels every Pending row of X, so it
    says how many and asks (``--yes`` skips the question; with no terminal it is needed)."""
    monkeypatch.setattr(options, "stdin_is_terminal", lambda: True)
    declined = invoke("cancel", "--name", "cli:add", "--url", rows.url, input="n\n")
    assert declined.exit_code == 1
    assert "Cancel 2 Pending rows? [y/N]" in declined.stderr and "Aborted" in declined.stderr
    assert states_by_id(rows.url)[rows.due] == "Pending"
    accepted = invoke("cancel", "--name", "cli:add", "--url", rows.url, input="y\n")
    assert accepted.exit_code == 0 and accepted.stdout == "2 Pending rows canceled\n"
    assert states_by_id(rows.url)[rows.due] == "Canceled"
    none_left = invoke("cancel", "--name", "cli:add", "--url", rows.url)
    assert none_left.stdout == "no Pending row matches; nothing to cancel\n"


def test_retrying_by_filter_says_how_many_and_asks_first(
    rows: Rows, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``durafn retry --name X``: every Failed row of X back to Pending (``retry_where``),
    after the same question as cancel's; ids and filters together are refused."""
    monkeypatch.setattr(options, "stdin_is_terminal", lambda: True)
    declined = invoke("retry", "--name", ADD, "--url", rows.url, input="n\n")
    assert declined.exit_code == 1 and "Retry 1 Failed row? [y/N]" in declined.stderr
    assert states_by_id(rows.url)[rows.failed] == "Failed"
    both = invoke("retry", rows.failed, "--name", ADD, "--url", rows.url)
    assert both.exit_code == 2 and "give ids or filters, not both" in both.stderr
    nothing = invoke("retry", "--url", rows.url, "--yes")
    assert nothing.exit_code == 2 and "ids, or filters" in nothing.stderr
    accepted = invoke("retry", "--name", ADD, "--url", rows.url, "--yes", "--json")
    assert accepted.exit_code == 0 and json.loads(accepted.stdout) == {"retried": 1}
    assert states_by_id(rows.url)[rows.failed] == "Pending"
    none_left = invoke("retry", "--name", ADD, "--url", rows.url)
    assert none_left.stdout == "no Failed row matches; nothing to retry\n"


def test_clear_without_a_terminal_needs_yes(rows: Rows) -> None:
    result = invoke("clear", "--url", rows.url)
    assert_one_line_error(result.exit_code, result.stderr, "stdin is not a terminal; pass --yes")
    assert rows.finished <= set(states_by_id(rows.url))


@pytest.mark.anyio
async def test_delete_finished_goes_in_batches_and_never_deletes_unfinished(
    app: durafn.App, clock: FakeClock
) -> None:
    @app.mutation
    async def noop(ctx: durafn.MutationCtx) -> None:
        pass

    for _ in range(5):
        await app.scheduler().run_after(0, noop)
    pending = await app.scheduler().run_after(60, noop)
    await app.executor().run_until_idle()
    clock.advance(1)
    before = clock.now_datetime()
    assert await app.count_finished(completed_before=before) == 5
    with pytest.raises(durafn.ArgumentError, match="only finished rows"):
        await app.delete_finished(completed_before=before, states=[State.PENDING])
    assert await app.delete_finished(completed_before=before, batch_size=2) == 5
    assert [r.id for r in (await app.list()).items] == [pending]


# -- where the app and the database come from ------------------------------------------


def test_app_and_url_from_options_or_the_environment(rows: Rows) -> None:
    expected = rows.in_order
    assert ids("--app", "tests.apps.cli_app:app", "--url", rows.url) == expected
    env = {"DURAFN_APP": "tests.apps.cli_app", "DURAFN_DATABASE_URL": rows.url}
    result = invoke("ls", "--json", env=env)
    assert [i["id"] for i in json.loads(result.stdout)["items"]] == expected


@pytest.mark.parametrize(
    "command", [["ls"], ["show", UNKNOWN_ID], ["cancel", UNKNOWN_ID], ["stats"], ["clear", "-y"]]
)
def test_inspection_commands_create_nothing(
    db_url: str, engine_name: str, command: list[str]
) -> None:
    if engine_name == "sqlite":
        path = Path(db_url.partition(":///")[2])
        result = invoke(*command, "--url", db_url)
        assert_one_line_error(result.exit_code, result.stderr, f"{str(path)!r} does not exist")
        assert not path.exists()
        path.touch()  # an empty file: a database without the system tables
    result = invoke(*command, "--url", db_url)
    assert_one_line_error(result.exit_code, result.stderr, "run `durafn migrate")
    assert not anyio.run(_has_system_tables, db_url)


async def _has_system_tables(url: str) -> bool:
    async with durafn.App(url) as app, app.engine.connect() as conn:
        return bool(await conn.run_sync(lambda c: sa_inspect(c).has_table("_scheduled_functions")))


# -- the real command: exit status, one line on stderr, no traceback -------------------


def durafn_processes(*commands: Sequence[str | bytes]) -> list[tuple[int, str]]:
    """Run the ``durafn`` command once per command, all at once, each a real process
    (``tests/support/launcher.py``); (exit status, stderr) of each."""
    env = {k: v for k, v in os.environ.items() if k not in CLEAN_ENV}
    done = run_all(
        [[sys.executable, "-m", "_durafn_cli", *args] for args in commands], env=env, cwd=ROOT
    )
    return [(d.returncode, d.stderr.decode()) for d in done]


def test_bad_app_paths_are_one_line_errors() -> None:
    cases = {
        "nosuch.module:app": "cannot import 'nosuch.module'",
        "tests.support.models:Base": "'tests.support.models:Base' is a class, not a durafn.App",
        "tests.apps.cli_app:missing": "module 'tests.apps.cli_app' has no attribute 'missing'",
    }
    url = "sqlite:///never-opened.db"
    results = durafn_processes(*(["ls", "--app", ref, "--url", url] for ref in cases))
    for (code, stderr), message in zip(results, cases.values(), strict=True):
        assert_one_line_error(code, stderr, message)
    assert not (ROOT / "never-opened.db").exists()


def test_an_app_module_that_fails_to_import_says_so() -> None:
    result = invoke(
        "ls", "--app", "tests.apps.broken_app:app", "--url", "sqlite:///never-opened.db"
    )
    assert_one_line_error(
        result.exit_code,
        result.stderr,
        "importing 'tests.apps.broken_app' (from --app 'tests.apps.broken_app:app') failed: "
        "RuntimeError: the app's configuration is missing",
    )


def test_bad_urls_are_one_line_errors() -> None:
    missing = "sqlite:////nonexistent-dir/x.db"
    cases = {
        ("ls", "mysql://localhost/x"): "runs on SQLite or PostgreSQL, not 'mysql'",
        # migrate would create the file, but not the directory; ls would create nothing.
        ("migrate", missing): "the directory '/nonexistent-dir' does not exist",
        ("ls", missing): "the SQLite database '/nonexistent-dir/x.db' does not exist",
    }
    results = durafn_processes(*([command, "--url", url] for command, url in cases))
    for (code, stderr), message in zip(results, cases.values(), strict=True):
        assert_one_line_error(code, stderr, message)


@pytest.mark.postgres_only  # a server that answers, for a database it does not have
def test_an_unknown_postgres_database_is_a_one_line_error(postgres_url: str) -> None:
    # asyncpg raises this one past SQLAlchemy unwrapped: it must still be one line.
    missing = f"{PG_BASE}_no_such_db"  # named from the suite's, as every test database
    url = postgres_url.rsplit("/", 1)[0] + f"/{missing}"
    [(code, stderr)] = durafn_processes(["migrate", "--url", url])
    assert_one_line_error(code, stderr, f'database "{missing}" does not exist')


def _aiosqlite_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if "_connection_worker_thread" in t.name]


COMMANDS_ON_A_BAD_FILE = [
    ["migrate"],
    ["ls"],
    ["stats"],
    ["cancel", UNKNOWN_ID],
    ["worker", "--app", "tests.apps.cli_app:app", "--exit-on-complete"],
]


def test_a_file_that_is_no_database_is_one_line_and_leaves_no_thread(tmp_path: Path) -> None:
    """Every command closes its connections, threads and all, on every error path: a
    thread left running when the event loop closes prints a traceback after the error
    line (it did, about one run in three). In-process, looped; then as real processes."""
    path = tmp_path / "notes.db"
    path.write_text("these are my notes, not a database\n")
    url = f"sqlite:///{path}"
    for _ in range(3):
        for command in COMMANDS_ON_A_BAD_FILE:
            result = invoke(*command, "--url", url)
            assert_one_line_error(result.exit_code, result.stderr, "file is not a database")
            assert _aiosqlite_threads() == []
    for code, stderr in durafn_processes(*([*c, "--url", url] for c in COMMANDS_ON_A_BAD_FILE)):
        assert_one_line_error(code, stderr, "file is not a database")
        assert "Thread" not in stderr
    assert path.read_text() == "these are my notes, not a database\n"


def test_inspection_works_on_a_database_it_may_not_write(tmp_path: Path) -> None:
    """ls, show and stats on a SQLite file this process cannot write (a backup, another
    user's file; here in rollback-journal mode, as a copy made by the sqlite3 shell is).
    SQLite only: a file's permissions are a SQLite matter (PostgreSQL reads need no write
    either way: the schema check is a read there too)."""
    path = tmp_path / "backup.db"
    rows = anyio.run(_populate, f"sqlite:///{path}")
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA journal_mode=DELETE")
    with read_only_file(path):
        listed = invoke_json("ls", "--url", rows.url)
        assert [item["id"] for item in listed["items"]] == rows.in_order
        assert invoke_json("show", "--url", rows.url, rows.failed)["id"] == rows.failed
        assert invoke_json("stats", "--url", rows.url)["counts"]["Failed"] == 1
        result = invoke("cancel", "--url", rows.url, rows.later)
        assert_one_line_error(result.exit_code, result.stderr, "readonly database")


@contextmanager
def read_only_file(path: Path) -> Iterator[None]:
    """``path`` read-only even to root (the immutable attribute), or by mode otherwise."""
    if os.geteuid() != 0:
        path.chmod(0o444)
        try:
            yield
        finally:
            path.chmod(0o644)
        return
    if subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode != 0:
        pytest.skip("running as root, and this file system has no immutable attribute")
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", str(path)], check=True)


def test_arguments_that_are_not_utf8_are_one_line_errors(db_url: str) -> None:
    """Python hands such bytes over as lone surrogates, which no database stores."""
    assert invoke("migrate", "--url", db_url).exit_code == 0
    cases: dict[tuple[str | bytes, ...], str] = {
        ("show", b"\xff"): "is not a scheduled function id",
        ("cancel", b"\xff\xfe"): "is not a scheduled function id",
        ("ls", "--name", b"caf\xe9"): "name is not valid Unicode",
    }
    results = durafn_processes(*([*args, "--url", db_url] for args in cases))
    for (code, stderr), message in zip(results, cases.values(), strict=True):
        assert_one_line_error(code, stderr, message)


def test_unknown_ids_are_one_line_errors(db_url: str) -> None:
    assert invoke("migrate", "--url", db_url).exit_code == 0
    results = durafn_processes(
        *([command, "--url", db_url, UNKNOWN_ID] for command in ("show", "cancel"))
    )
    for code, stderr in results:
        assert_one_line_error(code, stderr, f"no scheduled function has id {UNKNOWN_ID!r}")


def test_a_command_from_another_thread_leaves_the_processs_signal_handlers_alone(
    tmp_path: Path,
) -> None:
    """Only the main thread may set signal handlers: a command invoked from another
    thread (an embedding; a test's worker thread) runs, and leaves the recorder a worker
    command left in this process as it was, rather than failing with ValueError."""
    from durafn import _signals

    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    _signals.record()  # as a worker command invoked in this process leaves them
    try:
        recorder = signal.getsignal(signal.SIGTERM)
        assert _signals.received() == []
        done: list[Result] = []
        url = f"sqlite+aiosqlite:///{tmp_path}/threads.db"
        thread = threading.Thread(target=lambda: done.append(invoke("migrate", "--url", url)))
        thread.start()
        thread.join()
        [result] = done
        assert result.exit_code == 0, result.output
        assert signal.getsignal(signal.SIGTERM) is recorder
    finally:
        signal.signal(signal.SIGTERM, before[0])
        signal.signal(signal.SIGINT, before[1])
