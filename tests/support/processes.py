"""Every process a test starts is ended by the test, whatever fails.

A worker supervisor's children run in sessions of their own (so that a terminal's Ctrl-C
reaches them once), out of reach of a kill of the supervisor's process group: a test that
timed out waiting for them once left a supervisor and both its children running for
twenty minutes after the suite had ended, burning a core. So each test's processes carry
a token in their environment, which every process they start inherits, and the end of
the test kills every process on the machine that carries it (``/proc``), however it was
started; the direct children are then reaped.

A ``python -m`` command is forked from the launcher (``tests/support/launcher.py``), already
imported. Such a child shows the launcher's environment in ``/proc``, not the token, so
the end of the test also kills every process it started by pid.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import anyio.abc

from .helpers import CEILING
from .launched import launcher

TOKEN = "DURAFN_TEST_OWNER"
"""The environment variable that marks a test's processes."""


def tagged(token: str, env: dict[str, str] | None = None) -> dict[str, str]:
    """``env`` (default: this process's) with the owner's token."""
    return {**(os.environ if env is None else env), TOKEN: token}


def carrying(token: str) -> list[int]:
    """Every live process whose environment carries ``token``."""
    needle = f"\0{TOKEN}={token}\0".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                environ = b"\0" + f.read()
        except OSError:  # gone already, or not ours to read
            continue
        if needle in environ + b"\0":
            found.append(int(entry))
    return found


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie has ended)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def kill_all(token: str) -> list[int]:
    """SIGKILL every process that carries ``token``; returns their pids."""
    killed = carrying(token)
    for pid in killed:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return killed


class Owner:
    """Starts a test's processes, each tagged with one token (``owned``)."""

    def __init__(self) -> None:
        self.token = uuid.uuid4().hex
        self.started: list[anyio.abc.Process] = []

    async def start(
        self, command: Sequence[str | bytes], *, env: dict[str, str] | None = None, **kwargs: Any
    ) -> anyio.abc.Process:
        """``anyio.open_process``, tagged; ended with the test. A ``python -m`` command
        is forked already imported (``tests/support/launcher.py``)."""
        environment = tagged(self.token, env)
        proc: anyio.abc.Process
        if launcher().takes(command, environment, set(kwargs)):
            proc = await launcher().start(command, env=environment, **kwargs)
        else:
            proc = await anyio.open_process(list(command), env=environment, **kwargs)
        self.started.append(proc)
        return proc

    async def run(
        self,
        command: Sequence[str | bytes],
        *,
        env: dict[str, str] | None = None,
        timeout: float = CEILING,
        **kwargs: Any,
    ) -> subprocess.CompletedProcess[bytes]:
        """Run ``command`` to its end (a hang fails the test at ``timeout``)."""
        environment = tagged(self.token, env)
        with anyio.fail_after(timeout):
            # A forked run's output is read below, from pipes: asked-for streams exec.
            streams = kwargs.keys() & {"stdin", "stdout", "stderr"}
            if streams or not launcher().takes(command, environment, set(kwargs)):
                return await anyio.run_process(
                    list(command), env=environment, check=False, **kwargs
                )
            proc = await self.start(command, env=environment, stdin=None, **kwargs)
            outputs = {1: bytearray(), 2: bytearray()}

            async def read(number: int, stream: anyio.abc.ByteReceiveStream | None) -> None:
                assert stream is not None
                async for chunk in stream:
                    outputs[number] += chunk

            async with anyio.create_task_group() as tg:
                tg.start_soon(read, 1, proc.stdout)
                tg.start_soon(read, 2, proc.stderr)
            code = await proc.wait()
        return subprocess.CompletedProcess(
            list(command), code, bytes(outputs[1]), bytes(outputs[2])
        )


@asynccontextmanager
async def owned() -> AsyncIterator[Owner]:
    """An ``Owner`` whose processes, and theirs, are all killed when the block ends."""
    owner = Owner()
    try:
        yield owner
    finally:
        with anyio.CancelScope(shield=True):
            kill_all(owner.token)
            for proc in owner.started:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()  # a launcher's child does not show the token in /proc
                with anyio.move_on_after(30):
                    await proc.aclose()


def run_all(
    commands: Sequence[Sequence[str | bytes]], *, env: dict[str, str] | None = None, cwd: Path
) -> list[subprocess.CompletedProcess[bytes]]:
    """Run ``commands`` all at once to their ends, from a synchronous test, as ``owned``
    runs each."""

    async def run() -> list[subprocess.CompletedProcess[bytes]]:
        done: dict[int, subprocess.CompletedProcess[bytes]] = {}

        async def one(number: int, command: Sequence[str | bytes]) -> None:
            done[number] = await owner.run(command, env=env, cwd=cwd)

        async with owned() as owner, anyio.create_task_group() as tg:
            for number, command in enumerate(commands):
                tg.start_soon(one, number, command)
        return [done[number] for number in range(len(commands))]

    return anyio.run(run)


@contextlib.contextmanager
def owned_sync() -> Iterator[str]:
    """A token for ``subprocess`` calls of a synchronous test (``tagged(token)``), whose
    processes, and theirs, are all killed when the block ends."""
    token = uuid.uuid4().hex
    try:
        yield token
    finally:
        kill_all(token)
