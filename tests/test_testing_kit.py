"""The test kit as its users meet it: a project with an app module and a test file that
uses the plugin's fixtures, run by pytest (in this process, ``pytester``) on each engine:
SQLite by default, PostgreSQL with ``--durafn-url``."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from .conftest import KIT_URL, require_postgres

pytest_plugins = ["pytester"]

APP = """
from datetime import timedelta

from durafn import ActionCtx, App, MutationCtx, QueryCtx, State

app = App()
sent: list[str] = []


@app.action(name="mail:welcome")
async def send_welcome(ctx: ActionCtx, email: str) -> None:
    sent.append(email)


@app.mutation(name="users:signup")
async def signup(ctx: MutationCtx, email: str) -> str:
    await ctx.scheduler.run_after(timedelta(minutes=5), send_welcome, email)
    return email.upper()


@app.query(name="mail:pending")
async def pending_mail(ctx: QueryCtx) -> int:
    page = await ctx.system.list(name="mail:welcome", state=State.PENDING)
    return len(page.items)

"""

TESTS = """
from datetime import UTC, datetime, timedelta

import pytest

from durafn import State
from myapp import app, pending_mail, send_welcome, sent, signup

pytestmark = pytest.mark.anyio


async def test_perform_and_assert_scheduled(durafn):
    assert durafn.app is not app  # the same functions, on a database of the test's own
    assert await durafn.perform(signup, "ann@example.com") == "ANN@EXAMPLE.COM"
    row = await durafn.assert_scheduled(
        send_welcome, args={"email": "ann@example.com"}, within=timedelta(minutes=5)
    )
    assert row.scheduled_time == datetime(2030, 1, 1, 0, 5, tzinfo=UTC)
    with pytest.raises(AssertionError, match="due within 0:04:59; what there is: mail:welcome"):
        await durafn.assert_scheduled(send_welcome, within=timedelta(minutes=4, seconds=59))
    with pytest.raises(AssertionError, match="nothing scheduled as mail:welcome Pending with"):
        await durafn.assert_scheduled(send_welcome, args={"email": "bob@example.com"})
    await durafn.assert_not_scheduled(send_welcome, args={"email": "bob@example.com"})
    with pytest.raises(AssertionError, match="mail:welcome is scheduled: "):
        await durafn.assert_not_scheduled(send_welcome)


async def test_advance_runs_what_falls_due(durafn):
    await durafn.perform(signup, "ann@example.com")
    assert await durafn.advance(timedelta(minutes=4)) == 0
    assert await durafn.advance(timedelta(minutes=1)) == 1
    assert sent[-1] == "ann@example.com"
    [row] = await durafn.scheduled(send_welcome, state=State.SUCCESS)
    assert (await durafn.app.get(row.id)).state is State.SUCCESS
    await durafn.assert_not_scheduled(send_welcome)


async def test_finish_all_and_run_until_idle(durafn):
    await durafn.perform(signup, "a@example.com")
    await durafn.perform(signup, "b@example.com")
    assert await durafn.run_until_idle() == 0  # not due yet: the clock does not move
    assert len(await durafn.scheduled(send_welcome)) == 2
    assert await durafn.finish_all() == 2
    assert durafn.clock.now_datetime() == datetime(2030, 1, 1, 0, 5, tzinfo=UTC)


async def test_each_test_starts_empty(durafn, fake_clock):
    assert await durafn.scheduled() == []
    assert fake_clock is durafn.clock and fake_clock.now_datetime().year == 2030


async def test_a_query(durafn):
    await durafn.perform(signup, "ann@example.com")
    assert await durafn.perform(pending_mail) == 1
"""


CRON_APP = """
from durafn import App, MutationCtx

app = App()
ticks: list[str] = []


@app.mutation(name="reports:nightly")
async def nightly(ctx: MutationCtx) -> None:
    ticks.append(ctx.now().isoformat())


@app.mutation(name="users:remind")
async def remind(ctx: MutationCtx, who: str) -> None:
    ticks.append(f"remind {who} {ctx.now().isoformat()}")


app.cron("nightly", "0 2 * * *", nightly, timezone="Europe/Paris")
"""

CRON_TESTS = """
from datetime import UTC, datetime, timedelta

import pytest

import mycrons

pytestmark = pytest.mark.anyio


@pytest.fixture
def durafn_base_app():
    return mycrons.app  # this file's app, over the ini option's


async def test_crons(durafn):
    paris_two = [datetime(2030, 1, 1, 1, tzinfo=UTC), datetime(2030, 1, 2, 1, tzinfo=UTC)]
    await durafn.assert_cron_fires("nightly", at=paris_two)
    wrong = r"'nightly' \\(0 2 \\* \\* \\*\\) fires at 2030-01-01T02:00"
    with pytest.raises(AssertionError, match=wrong):
        await durafn.assert_cron_fires("nightly", at=[datetime(2030, 1, 1, 2, tzinfo=UTC)])
    with pytest.raises(AssertionError, match=r"no cron 'hourly'; the crons: \\['nightly'\\]"):
        await durafn.assert_cron_fires("hourly", at=[])
    assert await durafn.advance(timedelta(days=2)) == 2
    assert mycrons.ticks[-2:] == ["2030-01-01T01:00:00+00:00", "2030-01-02T01:00:00+00:00"]


async def test_finish_all_with_a_cron(durafn):
    # The clock goes to the reminder's time, not to the cron's next tick, and the ticks
    # it passes on the way run at their own times.
    await durafn.app.scheduler().run_after(timedelta(days=1, hours=12), mycrons.remind, "ann")
    before = len(mycrons.ticks)
    assert await durafn.finish_all() == 3
    assert mycrons.ticks[before:] == [
        "2030-01-01T01:00:00+00:00",
        "2030-01-02T01:00:00+00:00",
        "remind ann 2030-01-02T12:00:00+00:00",
    ]
    assert durafn.clock.now_datetime() == datetime(2030, 1, 2, 12, tzinfo=UTC)
"""


@pytest.fixture
def project(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makepyfile(myapp=APP, test_myapp=TESTS, mycrons=CRON_APP, test_crons=CRON_TESTS)
    pytester.makeini("[pytest]\ndurafn_app = myapp:app\n")
    return pytester


def test_the_kit_on_sqlite(project: pytest.Pytester) -> None:
    result = project.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=7)


def test_the_kit_on_postgres(project: pytest.Pytester) -> None:
    require_postgres()
    result = project.runpytest("-p", "no:cacheprovider", f"--durafn-url={KIT_URL}")
    result.assert_outcomes(passed=7)


# -- the pages that teach the kit run, as written, with the plugin ------------------------

DOCS = Path(__file__).resolve().parent.parent / "docs"
README = DOCS.parent / "README.md"


def _python_blocks(page: Path) -> list[tuple[str, str]]:
    """(the HTML comment on the line before the fence, or "", code) of each block."""
    found = re.finditer(r"(?:<!-- (.*?) -->\n)?```python\n(.*?)```", page.read_text(), re.DOTALL)
    return [(m.group(1) or "", m.group(2)) for m in found]


def _guide_projects() -> dict[str, tuple[dict[str, str], str, int]]:
    """name -> (files, the ini's durafn_app or "", tests expected to pass)."""
    guide = _python_blocks(DOCS / "guides" / "testing.md")
    [tasks] = [code for marker, code in guide if marker == "file: myapp/tasks.py"]
    tests = [code for _, code in guide if "async def test_" in code]
    named = [code for code in tests if "@durafn.app." not in code]
    bare = [code for code in tests if "@durafn.app." in code]
    [first_app] = [code for _, code in _python_blocks(README) if "DESTRUCT_AFTER" in code]
    [first_test] = [
        code
        for _, code in _python_blocks(DOCS / "get-started" / "first-test.md")
        if "durafn: Harness" in code
    ]
    app_files = {"myapp/__init__.py": "", "myapp/tasks.py": tasks}
    return {
        "testing guide, its app named": (
            app_files | {f"test_named_{i}.py": code for i, code in enumerate(named)},
            "myapp.tasks:app",
            sum(code.count("async def test_") for code in named),
        ),
        "testing guide, no app named": (
            {f"test_bare_{i}.py": code for i, code in enumerate(bare)},
            "",
            sum(code.count("async def test_") for code in bare),
        ),
        "the first test": ({"first.py": first_app, "test_first.py": first_test}, "first:app", 1),
    }


@pytest.mark.parametrize("engine", ["sqlite", "postgres"])
@pytest.mark.parametrize("project_name", list(_guide_projects()))
def test_the_pages_on_the_kit_run_as_written(
    pytester: pytest.Pytester, project_name: str, engine: str
) -> None:
    files, app, passing = _guide_projects()[project_name]
    assert passing >= 1
    for name, code in files.items():
        path = pytester.path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(code)
    pytester.makeini(f"[pytest]\ndurafn_app = {app}\n" if app else "[pytest]\n")
    args = ["-p", "no:cacheprovider"]
    if engine == "postgres":
        require_postgres()
        args.append(f"--durafn-url={KIT_URL}")
    pytester.runpytest(*args).assert_outcomes(passed=passing)
