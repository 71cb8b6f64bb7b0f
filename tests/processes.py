"""Every process a test starts is ended by the test, whatever fails.

A worker supervisor's children run in sessions of their own (so that a terminal's Ctrl-C
reaches them once), out of reach of a kill of the supervisor's process group: a test that
timed out waiting for them once left a supervisor and both its children running for
twenty minutes after the suite had ended, burning a core. So each test's processes carry
a token in their environment, which every process they start inherits, and the end of
the test kills every process on the machine that carries it (``/proc``), however it was
started; the direct children are then reaped.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import anyio
import anyio.abc

from .helpers import CEILING

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
        self, command: Sequence[str], *, env: dict[str, str] | None = None, **kwargs: Any
    ) -> anyio.abc.Process:
        """``anyio.open_process``, tagged; ended with the test."""
        proc = await anyio.open_process(list(command), env=tagged(self.token, env), **kwargs)
        self.started.append(proc)
        return proc

    async def run(
        self,
        command: Sequence[str],
        *,
        env: dict[str, str] | None = None,
        timeout: float = CEILING,
        **kwargs: Any,
    ) -> subprocess.CompletedProcess[bytes]:
        """Run ``command`` to its end (a hang fails the test at ``timeout``)."""
        with anyio.fail_after(timeout):
            return await anyio.run_process(
                list(command), env=tagged(self.token, env), check=False, **kwargs
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
                with anyio.move_on_after(30):
                    await proc.wait()


@contextlib.contextmanager
def owned_sync() -> Iterator[str]:
    """A token for ``subprocess`` calls of a synchronous test (``tagged(token)``), whose
    processes, and theirs, are all killed when the block ends."""
    token = uuid.uuid4().hex
    try:
        yield token
    finally:
        kill_all(token)
