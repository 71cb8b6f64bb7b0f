"""The first hour of a new user, with the README as the only guide: the command line in
the first app's folder, a function called as if it were a plain one, and a module-level
app tested with the fake clock."""

from __future__ import annotations

from pathlib import Path

import pytest

import durafn
from durafn import MutationCtx
from durafn.testing import FakeClock, advance

from .test_cli import invoke

pytestmark = pytest.mark.anyio


def test_without_a_database_the_command_says_which_to_pass(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # the first app's folder: commands run there
    nothing = invoke("stats")
    assert nothing.exit_code == 1
    assert "no database given: pass --url" in nothing.stderr
    assert "durafn.sqlite3" not in nothing.stderr
    (tmp_path / "durafn.sqlite3").touch()  # what App() made here
    for command in ("ls", "stats", "crons"):
        named = invoke(command)
        assert named.exit_code == 1
        assert (
            "a durafn.sqlite3 is here, an App()'s default database: --url "
            "sqlite:///durafn.sqlite3, or --app MODULE:APP for your app" in named.stderr
        )


async def test_calling_a_function_reference_says_how_to_run_it(app: durafn.App) -> None:
    @app.mutation(name="first:send")
    async def send(ctx: MutationCtx, to: str) -> None:
        pass

    with pytest.raises(durafn.CallError, match=r"app\.run_mutation\(send, \.\.\.\)") as caught:
        await send("ann")  # type: ignore[operator]
    assert isinstance(caught.value, TypeError)
    assert "ctx.scheduler.run_after(0, send, ...)" in str(caught.value)


async def test_a_module_level_app_is_tested_on_its_own_database_and_clock(
    app_url: tuple[str, bool],
) -> None:
    """The pattern the README shows: the app a module defines, ``using`` a test database
    and a fake clock, with its functions, crons and hooks."""
    from .apps import module_app  # an app defined at module level, as users define theirs

    url, _ = app_url
    clock = FakeClock()
    module_app.successes.clear()
    test_app = module_app.app.using(url, clock=clock)
    assert test_app.clock is clock and module_app.app.clock is not clock
    try:
        await test_app.migrate()
        id = await test_app.scheduler().run_after(60, module_app.digest, to="tests")
        await advance(test_app.executor(), clock, 120)  # not to its cron's 02:00
        row = await test_app.get(id)
        assert row is not None and row.state is durafn.State.SUCCESS
        assert row.result == "digest for tests at 2030-01-01T00:01:00+00:00"
        assert module_app.successes == ["module:digest"]  # the module's hooks, too
        assert [c.name for c in await test_app.crons()] == ["module-digest"]
    finally:
        await test_app.aclose()
    # Another App knows none of its functions, and says where they are.
    stranger = durafn.App(url, clock=clock)
    try:
        with pytest.raises(durafn.UnknownFunctionError) as caught:
            await stranger.scheduler().run_after(0, module_app.digest, to="x")
    finally:
        await stranger.aclose()
    message = str(caught.value)
    assert "is registered on another durafn.App (the one made at " in message
    assert "tests/apps/module_app.py:" in message and "app.using(url, clock=...)" in message
