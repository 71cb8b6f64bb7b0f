"""The suite's launcher (``tests/support/launcher.py``): a ``python -m`` command forked from it
sees what the same command sees started fresh, ends as it would, and ends with its test.
Each case runs the probe both ways, in one test, and compares."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from .support.helpers import CEILING, true, wait_until
from .support.launched import LaunchedProcess, launcher
from .support.processes import TOKEN, alive, carrying, owned, tagged

pytestmark = pytest.mark.anyio

PROBE = [sys.executable, "-m", "tests.apps.probe_main"]
ROOT = Path(__file__).resolve().parent.parent


def _seen(stdout: bytes) -> dict[str, object]:
    return dict(json.loads(stdout.splitlines()[0]))


async def _both(
    command: list[str], cwd: Path, **variables: str
) -> tuple[subprocess.CompletedProcess[bytes], subprocess.CompletedProcess[bytes]]:
    """``command`` run fresh, then forked by the launcher, with one environment."""
    async with owned() as owner:
        env = tagged(owner.token) | variables
        assert launcher().takes(command, env, {"cwd"})
        fresh = await anyio.run_process(command, env=env, cwd=cwd, check=False)
        launched = await owner.run(command, cwd=cwd, env=env)
    assert [type(p) for p in owner.started] == [LaunchedProcess]  # and it was forked
    return fresh, launched


async def test_a_module_is_found_from_the_working_directory_only(tmp_path: Path) -> None:
    """Nothing the launcher imported lends a child a module a fresh one would not find:
    the probe, in the ``tests`` package, is not importable from another directory."""
    fresh, launched = await _both([*PROBE, "exit", "0"], tmp_path)
    assert fresh.returncode == launched.returncode == 1
    for done in (fresh, launched):
        assert "No module named 'tests'" in done.stderr.decode()


async def test_pythonpath_is_on_the_path_as_in_a_fresh_interpreter(tmp_path: Path) -> None:
    """From another directory, with the project on PYTHONPATH (as the dashboard's tests
    start it), the probe is found, after the working directory, in both."""
    pythonpath = os.pathsep.join([str(ROOT), str(tmp_path / "nowhere")])
    fresh, launched = await _both([*PROBE, "exit", "0"], tmp_path, PYTHONPATH=pythonpath)
    assert fresh.returncode == launched.returncode == 0, launched.stderr
    seen = _seen(launched.stdout)
    assert seen == _seen(fresh.stdout)
    assert seen["path"] == [str(tmp_path), str(ROOT), str(tmp_path / "nowhere")]


@pytest.mark.parametrize(
    ("args", "code", "stderr"),
    [
        (["exit", "0"], 0, "to stderr\n"),
        (["exit", "3"], 3, "to stderr\n"),
        (["message"], 1, "to stderr\na message on stderr\n"),
        (["raise"], 1, "ValueError: the probe raised"),
    ],
)
async def test_a_launched_command_starts_and_ends_as_a_fresh_one(
    args: list[str], code: int, stderr: str
) -> None:
    fresh, launched = await _both([*PROBE, *args], ROOT)
    assert (launched.returncode, fresh.returncode) == (code, code)
    seen = _seen(launched.stdout)
    assert seen == _seen(fresh.stdout)
    assert seen["name"] == "__main__" and seen["argv"] == [
        str(ROOT / "tests/apps/probe_main.py"),
        *args,
    ]
    assert seen["cwd"] == str(ROOT) and seen["path"][0] == str(ROOT)  # type: ignore[index]
    assert seen["token"] == seen["child's token"] is not None
    assert seen["descriptors"] == [0, 1, 2, 3]  # 3: the listing's own; nothing leaked
    assert stderr in launched.stderr.decode() and stderr in fresh.stderr.decode()


async def test_a_signal_ends_a_launched_command_as_a_fresh_one() -> None:
    codes = []
    async with owned() as owner:
        for start in (anyio.open_process, owner.start):
            proc = await start([*PROBE, "sleep"], env=tagged(owner.token), cwd=ROOT)
            assert proc.stdout is not None
            with anyio.fail_after(CEILING):
                while b"started" not in await proc.stdout.receive():
                    pass
            proc.send_signal(signal.SIGTERM)
            with anyio.fail_after(CEILING):
                codes.append(await proc.wait())
            await proc.aclose()
        assert isinstance(proc, LaunchedProcess)
    assert codes == [-signal.SIGTERM, -signal.SIGTERM]


async def test_a_failing_test_ends_its_launched_process_and_that_ones_child() -> None:
    """As ``test_workers.py``'s test of a plain process tree: here the parent is a child
    of the launcher, which the token in ``/proc`` does not show, and its child (in a
    session of its own) does show it."""
    tree: set[int] = set()
    with pytest.raises(RuntimeError, match="the test failed"):
        async with owned() as owner:
            parent = await owner.start([*PROBE, "sleep"], cwd=ROOT)
            assert isinstance(parent, LaunchedProcess) and parent.stdout is not None
            with anyio.fail_after(CEILING):
                while b"started" not in await parent.stdout.receive():
                    pass
            # Its child, once /proc shows it (a loaded machine once showed none yet).
            await wait_until(lambda: true(bool(carrying(owner.token))), "the child is seen")
            children = set(carrying(owner.token))
            assert len(children) == 1 and parent.pid not in children
            tree = {parent.pid, *children}
            raise RuntimeError("the test failed")
    assert parent.returncode == -signal.SIGKILL

    async def all_ended() -> bool:
        return not any(map(alive, tree))

    await wait_until(all_ended, "every process ended")


def test_an_interpreter_variable_or_an_option_gets_a_real_exec() -> None:
    env = tagged("t")
    assert launcher().takes(PROBE, env, {"cwd", "stdout", "stderr", "start_new_session"})
    assert launcher().takes(PROBE, {**env, "PYTHONPATH": "/elsewhere"}, set())
    assert not launcher().takes(PROBE, {**env, "PYTHONHASHSEED": "1"}, set())
    assert not launcher().takes(PROBE, env, {"pass_fds"})
    assert not launcher().takes([sys.executable, "-c", "pass"], env, set())
    assert not launcher().takes([sys.executable, "-X", "importtime", "-m", "x"], env, set())
    assert TOKEN in env
