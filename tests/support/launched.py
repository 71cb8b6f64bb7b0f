"""The pytest process's side of the launcher (``tests/support/launcher.py``): starting it, sending
it a command, and the process it forks, as ``anyio.open_process`` returns one."""

from __future__ import annotations

import atexit
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

import anyio
import anyio.abc
from anyio.streams.buffered import BufferedByteReceiveStream

from . import launcher as server
from .helpers import CEILING

Stream = int | IO[Any] | None
"""A standard stream as ``anyio.open_process`` takes it."""


class _PipeReader(anyio.abc.ByteReceiveStream):
    """The reading end of a child's stdout or stderr pipe."""

    def __init__(self, fd: int) -> None:
        os.set_blocking(fd, False)
        self._fd = fd

    async def receive(self, max_bytes: int = 1 << 16) -> bytes:
        while True:
            try:
                data = os.read(self._fd, max_bytes)
            except BlockingIOError:
                await anyio.wait_readable(self._fd)
                continue
            if not data:
                raise anyio.EndOfStream
            return data

    async def aclose(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class LaunchedProcess(anyio.abc.Process):
    """A child of the launcher, as ``anyio.open_process`` returns a process."""

    def __init__(
        self,
        connection: anyio.abc.SocketStream,
        replies: BufferedByteReceiveStream,
        pid: int,
        outputs: dict[int, _PipeReader],
        held: list[int],
    ) -> None:
        self._connection = connection
        self._replies = replies
        self._pid = pid
        self._outputs = outputs
        self._held = held  # our end of a stdin pipe: nothing arrives, as with a real PIPE
        self._returncode: int | None = None
        self._waiting = anyio.Lock()

    async def wait(self) -> int:
        async with self._waiting:
            if self._returncode is None:
                reply = await self._replies.receive_until(b"\n", 1 << 10)
                self._returncode = int(json.loads(reply)["exit"])
        return self._returncode

    def send_signal(self, signal: int) -> None:
        # The launcher reaps its children only when they have exited, and a pid is not
        # reused before it reaps them: while no exit is known, the pid is this process.
        if self._returncode is None:
            os.kill(self._pid, signal)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    async def aclose(self) -> None:
        for fd in self._held:
            os.close(fd)
        self._held = []
        for output in self._outputs.values():
            await output.aclose()
        try:
            await self.wait()
        finally:
            await self._connection.aclose()  # the launcher kills a child still running

    @property
    def pid(self) -> int:
        return self._pid

    @property
    def returncode(self) -> int | None:
        return self._returncode

    @property
    def stdin(self) -> None:
        return None

    @property
    def stdout(self) -> _PipeReader | None:
        return self._outputs.get(1)

    @property
    def stderr(self) -> _PipeReader | None:
        return self._outputs.get(2)


class Launcher:
    """One launcher process, started on first use, ended with the pytest process."""

    def __init__(self) -> None:
        self._folder = tempfile.mkdtemp(prefix="durafn-launcher-")
        self.path = os.path.join(self._folder, "socket")
        self.environment = dict(os.environ)
        # As a file, not ``-m tests.support.launcher``: a ``tests`` package imported here would
        # be importable in every child, from any directory.
        self._server = subprocess.Popen(
            [sys.executable, server.__file__, self.path],
            stdin=subprocess.PIPE,  # its end tells the launcher that this process ended
            stdout=subprocess.PIPE,
        )
        assert self._server.stdout is not None
        ready, _, _ = select.select([self._server.stdout], [], [], CEILING)
        if not ready or self._server.stdout.readline() != b"ready\n":
            self._server.kill()
            raise RuntimeError(f"the launcher did not start: {self._server.wait()}")
        atexit.register(self.close)

    def close(self) -> None:
        if self._server.poll() is None:
            assert self._server.stdin is not None
            self._server.stdin.close()
            self._server.wait()
        Path(self.path).unlink(missing_ok=True)
        os.rmdir(self._folder)

    def takes(
        self, command: Sequence[str | bytes], env: Mapping[str, str], options: set[str]
    ) -> bool:
        """Whether ``command`` can be forked from here: ``python -m``, no other option
        than the standard streams, the directory and a session, and the interpreter's own
        variables (but ``PYTHONPATH``) as the launcher started with them."""

        def interpreters(env: Mapping[str, str]) -> dict[str, str]:
            return {k: v for k, v in env.items() if k.startswith("PYTHON") and k != "PYTHONPATH"}

        return (
            len(command) >= 3
            and command[0] == sys.executable
            and command[1] == "-m"
            and options <= {"stdin", "stdout", "stderr", "cwd", "start_new_session"}
            and interpreters(env) == interpreters(self.environment)
        )

    async def start(
        self,
        command: Sequence[str | bytes],
        *,
        env: Mapping[str, str],
        cwd: str | os.PathLike[str] | None = None,
        stdin: Stream = subprocess.PIPE,
        stdout: Stream = subprocess.PIPE,
        stderr: Stream = subprocess.PIPE,
        start_new_session: bool = False,
    ) -> LaunchedProcess:
        """Start ``command`` (``python -m module args...``) as ``anyio.open_process`` would."""
        sent: list[int] = []  # the child's ends
        ours: dict[int, _PipeReader] = {}
        held: list[int] = []
        closing: list[int] = []  # the descriptors made here for the child, closed once sent
        for number, spec in enumerate((stdin, stdout, stderr)):
            if spec == subprocess.PIPE:
                read, write = os.pipe()
                if number == 0:
                    held.append(write)
                    sent.append(read)
                    closing.append(read)
                else:
                    ours[number] = _PipeReader(read)
                    sent.append(write)
                    closing.append(write)
            elif spec == subprocess.STDOUT:
                sent.append(sent[1])
            elif spec == subprocess.DEVNULL:
                sent.append(os.open(os.devnull, os.O_RDWR))
                closing.append(sent[-1])
            elif spec is None:
                sent.append(number)  # inherited: this process's own
            elif isinstance(spec, int):
                sent.append(spec)
            else:
                sent.append(spec.fileno())
        request = {
            "module": os.fsdecode(command[2]),
            "args": [os.fsdecode(arg) for arg in command[3:]],  # as the child's sys.argv reads
            "env": dict(env),
            "cwd": os.fspath(cwd) if cwd is not None else os.getcwd(),
            "launcher_pythonpath": self.environment.get("PYTHONPATH"),
            "new_session": start_new_session,
        }
        payload = json.dumps(request).encode()
        connection: anyio.abc.SocketStream | None = None
        try:
            try:
                connection = await anyio.connect_unix(self.path)
                await connection.send_fds(server.HEADER.pack(len(payload)) + payload, sent)
            finally:
                for fd in closing:
                    os.close(fd)
            replies = BufferedByteReceiveStream(connection)
            pid = int(json.loads(await replies.receive_until(b"\n", 1 << 10))["pid"])
        except BaseException:
            with anyio.CancelScope(shield=True):
                for fd in held:
                    os.close(fd)
                for output in ours.values():
                    await output.aclose()
                if connection is not None:  # the launcher kills a child it has started
                    await connection.aclose()
            raise
        return LaunchedProcess(connection, replies, pid, ours, held)


_launcher: Launcher | None = None


def launcher() -> Launcher:
    """This pytest process's launcher, started on first use (about a second)."""
    global _launcher
    if _launcher is None:
        _launcher = Launcher()
    return _launcher
