"""A launcher that starts the suite's ``python -m ...`` processes already imported.

Each ``durafn`` worker or command the tests start as a real process spent most of its life
importing: SQLAlchemy, pydantic, asyncpg and durafn, about 0.6 s of CPU of a worker's
1.1 s (``python -X importtime``, 2026-11-28), over some 100 such processes a run. So each
pytest process starts this file once (``python tests/support/launcher.py SOCKET``, as a file: a
``tests`` package imported here would be importable in every child, from any directory;
``tests/support/launched.py`` is the pytest process's side). It imports those libraries and every
durafn module, and then forks a child for each command it is sent, as Python's own
``forkserver`` does for ``multiprocessing``. The child takes the command's standard
streams, working directory, environment and arguments, and runs its module as ``python
-m`` would (``runpy``), then ends as the interpreter ends (non-daemon threads joined,
``atexit`` handlers run).

A command that is not exactly ``[sys.executable, "-m", module, ...]`` (a ``-c`` script, a
``-X importtime`` run), or whose environment changes a ``PYTHON...`` variable the
interpreter reads at start-up (other than ``PYTHONPATH``, which the child puts on its
``sys.path`` as the interpreter would), still gets a real ``exec``: the tests of an
interpreter's start-up (the window before the imports in which ``_durafn_cli`` catches
signals, what a fresh interpreter imports) are written that way.

A request is one message on the launcher's Unix socket: a 4-byte length, then JSON, with
the child's stdin, stdout and stderr passed alongside (``SCM_RIGHTS``). The launcher
answers one JSON line with the child's pid, then one with its exit status
(``subprocess``'s convention: ``-N`` for a signal). Closing the connection early kills the
child: a test that ended, however, leaves nothing running. The children it forks do not
carry a test's token in ``/proc/PID/environ`` (that shows the launcher's start-up
environment), so ``tests/support/processes.py`` kills them by pid (the launcher reaps a child
only once it has ended, so its pid is not reused before); every process they start in
turn carries the token as before.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import json
import os
import pkgutil
import runpy
import select
import signal
import socket
import struct
import sys
import threading
import traceback
from typing import Any

HEADER = struct.Struct("!I")
"""A request's length, before its JSON."""

PRELOAD = (
    "asyncpg",
    "aiosqlite",
    "pydantic",
    "anyio",
    "click",
    "rich.console",
    "rich.table",
    "sqlalchemy",
    "sqlalchemy.ext.asyncio",
    "sqlalchemy.orm",
    "sqlalchemy.dialects.postgresql.asyncpg",
    "sqlalchemy.dialects.sqlite.aiosqlite",
)
"""Imported before every durafn module; durafn's own are found by walking the package."""

_NOT_PRELOADED = ("durafn.__main__", "durafn.testing", "durafn.pytest_plugin", "durafn.dashboard")
"""``__main__`` runs the command line; the test kit imports pytest; the dashboard,
Starlette and uvicorn, which only its own command needs."""


def preload() -> None:
    import durafn

    for name in PRELOAD:
        importlib.import_module(name)
    for module in pkgutil.walk_packages(durafn.__path__, "durafn."):
        if not module.name.startswith(_NOT_PRELOADED):
            importlib.import_module(module.name)
    assert "tests" not in sys.modules
    # A fork copies only the thread that calls it: a thread started by an import would be
    # missing from every child, holding whatever lock it held.
    if threading.active_count() != 1:
        raise RuntimeError(f"an import started a thread: {threading.enumerate()}")


def _exit_code(exc: SystemExit) -> int:
    """The status an interpreter ends with on ``exc``, as ``Py_Exit`` decides it."""
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    print(exc.code, file=sys.stderr)
    return 1


def _entries(pythonpath: str | None) -> list[str]:
    return [entry for entry in (pythonpath or "").split(os.pathsep) if entry]


def _child(request: dict[str, Any], fds: list[int]) -> int:
    """Become the requested ``python -m`` process; returns its exit status."""
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    if request["new_session"]:
        os.setsid()
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
    keep = {0, 1, 2}
    for entry in os.listdir("/proc/self/fd"):
        if int(entry) not in keep:
            with contextlib.suppress(OSError):  # the listing's own, closed already
                os.close(int(entry))
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])  # putenv too: the processes this one starts see it
    sys.argv = [request["module"], *request["args"]]
    # As ``python -m`` starts its path: the working directory, then PYTHONPATH's entries.
    ours = _entries(request["launcher_pythonpath"])
    sys.path[: 1 + len(ours)] = [os.getcwd(), *_entries(request["env"].get("PYTHONPATH"))]
    try:
        runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as exc:
        code = _exit_code(exc)
    except KeyboardInterrupt:
        # As the interpreter does: end by the signal, so the parent sees -SIGINT.
        sys.stderr.flush()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
        code = 1
    except BaseException:
        traceback.print_exc()
        code = 1
    threading._shutdown()  # type: ignore[attr-defined]  # as Py_FinalizeEx: non-daemon threads
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed pipe, ignored as at exit
            stream.flush()
    return code


def _read_request(conn: socket.socket) -> tuple[dict[str, Any], list[int]] | None:
    """One request and its descriptors, or None when the client has gone."""
    data, fds, _, _ = socket.recv_fds(conn, 1 << 16, 3)
    if not data:
        return None
    while len(data) < HEADER.size or len(data) < HEADER.size + HEADER.unpack_from(data)[0]:
        more = conn.recv(1 << 16)
        if not more:
            return None
        data += more
    return json.loads(data[HEADER.size :]), fds


def _send(conn: socket.socket, message: dict[str, int]) -> None:
    with contextlib.suppress(OSError):  # the client has gone; its child ends all the same
        conn.sendall(json.dumps(message).encode() + b"\n")


def serve(path: str) -> None:
    """Fork a child per request until stdin closes (the pytest process has ended)."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)
    child_of: dict[socket.socket, int] = {}  # each connection's child, until reaped
    conn_of: dict[int, socket.socket] = {}
    clients: list[socket.socket] = []
    print("ready", flush=True)
    while True:
        readable, _, _ = select.select([sys.stdin, listener, wake_r, *clients], [], [])
        if sys.stdin in readable and not os.read(sys.stdin.fileno(), 1 << 10):
            for pid in conn_of:
                os.kill(pid, signal.SIGKILL)
            return
        if listener in readable:
            clients.append(listener.accept()[0])
        if wake_r in readable:
            os.read(wake_r, 1 << 10)
            while conn_of:
                pid, status = os.waitpid(-1, os.WNOHANG)
                if pid == 0:
                    break
                conn = conn_of.pop(pid)
                child_of.pop(conn, None)
                _send(conn, {"exit": os.waitstatus_to_exitcode(status)})
        for conn in [c for c in clients if c in readable]:
            request = _read_request(conn)
            if request is None:  # the test is over: what it started ends with it
                clients.remove(conn)
                if conn in child_of:
                    os.kill(child_of.pop(conn), signal.SIGKILL)
                conn.close()
                continue
            message, fds = request
            pid = os.fork()
            if pid == 0:
                code = 1
                try:
                    code = _child(message, fds)
                finally:
                    os._exit(code)
            for fd in fds:
                os.close(fd)
            child_of[conn] = pid
            conn_of[pid] = conn
            _send(conn, {"pid": pid})


if __name__ == "__main__":
    preload()
    serve(sys.argv[1])
