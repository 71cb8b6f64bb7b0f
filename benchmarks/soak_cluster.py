"""A scratch PostgreSQL cluster for ``benchmarks.soak``: ``initdb`` in a temporary folder,
started with ``pg_ctl`` on a port of its own, autovacuum on (as deployments run it; the
machines that run the suite keep it off), stopped and removed at the end, also on
Ctrl-C or SIGTERM.

PostgreSQL refuses to run as root: as root, the cluster's files belong to the
``postgres`` user and its commands run as that user (``runuser``).
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path

SETTINGS: dict[str, str] = {
    "autovacuum": "on",
    # Each autovacuum run in the server's log, with what it removed and how long it took.
    "log_autovacuum_min_duration": "0",
    "listen_addresses": "127.0.0.1",
}
"""The server's settings beyond initdb's defaults; every autovacuum setting but the
switch is PostgreSQL's default (a minute's naptime, a 20% scale factor)."""


class ClusterError(Exception):
    """The scratch cluster could not be made or started (the message has its log)."""


def binaries() -> Path:
    """The newest installed PostgreSQL's bin directory (``initdb``, ``pg_ctl``)."""
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"),
        key=lambda p: int(Path(p).parent.parent.name),
    )
    if found:
        return Path(found[-1]).parent
    if (initdb := shutil.which("initdb")) is not None:
        return Path(initdb).parent
    raise ClusterError("initdb is not installed (postgresql-NN's bin directory)")


def _as_owner(command: list[str]) -> list[str]:
    if os.geteuid() != 0:
        return command
    return ["runuser", "-u", "postgres", "--", *command]


@contextlib.contextmanager
def scratch_cluster(
    port: int, settings: Mapping[str, str] | None = None, keep_log: Path | None = None
) -> Iterator[Path]:
    """A running cluster on ``127.0.0.1:port`` (user ``postgres``, trust), its data
    directory yielded; stopped (fast) and removed when the block ends, however it ends,
    its server log copied to ``keep_log`` first (each autovacuum run is in it)."""
    bin_dir = binaries()
    folder = Path(tempfile.mkdtemp(prefix="durafn-soak-"))
    data, log = folder / "data", folder / "server.log"
    if os.geteuid() == 0:
        owner = pwd.getpwnam("postgres")
        os.chown(folder, owner.pw_uid, owner.pw_gid)
    options = {**SETTINGS, **(settings or {}), "port": str(port)}
    options["unix_socket_directories"] = str(folder)
    started = False
    try:
        _run([str(bin_dir / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust"])
        flags = " ".join(f"-c {k}={v}" for k, v in options.items())
        # A session of its own: a Ctrl-C at the terminal reaches this process, which
        # stops the workers first and then the server, rather than the server at once.
        _run(
            [str(bin_dir / "pg_ctl"), "-D", str(data), "-l", str(log), "-o", flags, "-w", "start"],
            log,
        )
        started = True
        yield data
    finally:
        if started:
            with contextlib.suppress(ClusterError):
                _run([str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop"])
        if keep_log is not None and log.exists():
            shutil.copyfile(log, keep_log)
        shutil.rmtree(folder, ignore_errors=True)


def _run(command: list[str], log: Path | None = None) -> None:
    done = subprocess.run(
        _as_owner(command), capture_output=True, text=True, start_new_session=True, check=False
    )
    if done.returncode != 0:
        tail = ""
        if log is not None and log.exists():
            tail = log.read_text()[-2000:]
        raise ClusterError(
            f"{' '.join(command)} failed ({done.returncode}): {done.stderr.strip()}\n{tail}"
        )
