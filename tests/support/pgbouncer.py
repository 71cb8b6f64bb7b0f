"""PgBouncer in transaction mode, in front of the test server: a configuration in a
directory of its own, the command that runs it, and the wait for it to take connections.
Used by tests/test_pooler.py and ``python -m benchmarks.scale --pooler``.

Debian's ``pgbouncer`` package (``.ci/run`` installs it where missing); it refuses to run
as root, so as root it is told to drop to ``nobody`` (the files are read before).
"""

from __future__ import annotations

import os
import shutil
import socket
from pathlib import Path

import anyio
import asyncpg

SERVER = ("127.0.0.1", 5432)
"""The PostgreSQL server every database of the pooler's goes to."""


def binary() -> str | None:
    """The ``pgbouncer`` executable, or None where it is not installed."""
    return shutil.which("pgbouncer") or next(
        (p for p in ("/usr/sbin/pgbouncer", "/usr/bin/pgbouncer") if os.access(p, os.X_OK)),
        None,
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PgBouncer:
    """A pooler in transaction mode on a free port, configured in ``directory``:
    ``pool_size`` server connections per database and user, at most ``max_clients``
    client connections; ``log_connections``: a line on its stderr for each client's
    connection and disconnection."""

    def __init__(
        self,
        directory: Path,
        *,
        pool_size: int,
        max_clients: int = 200,
        user: str = "postgres",
        log_connections: bool = True,
    ) -> None:
        self.directory = directory
        self.port = free_port()
        self.pool_size = pool_size
        directory.mkdir(parents=True, exist_ok=True)
        users = directory / "users.txt"
        users.write_text(f'"{user}" ""\n')  # auth_type=trust still needs the name listed
        host, port = SERVER
        (directory / "pgbouncer.ini").write_text(
            f"""[databases]
* = host={host} port={port}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {self.port}
unix_socket_dir =
auth_type = trust
auth_file = {users}
pool_mode = transaction
default_pool_size = {pool_size}
max_db_connections = {pool_size}
max_client_conn = {max_clients}
log_connections = {int(log_connections)}
log_disconnections = {int(log_connections)}
admin_users = {user}
"""
        )

    def command(self, executable: str) -> list[str]:
        """The command that runs it in the foreground, logging to its stderr."""
        drop = ["-u", "nobody"] if os.geteuid() == 0 else []
        return [executable, *drop, str(self.directory / "pgbouncer.ini")]

    def url(self, database: str, *, listen: str | None = "127.0.0.1:5432") -> str:
        """A durafn URL of ``database`` through the pooler; LISTEN at ``listen``
        (None: the option left out)."""
        options = "pooler=transaction" + (f"&listen={listen}" if listen is not None else "")
        return f"postgresql+asyncpg://postgres@127.0.0.1:{self.port}/{database}?{options}"

    async def ready(self, database: str, timeout: float) -> None:
        """Wait until a query through the pooler to ``database`` is answered."""
        dsn = f"postgresql://postgres@127.0.0.1:{self.port}/{database}"
        with anyio.fail_after(timeout):
            while True:
                try:
                    conn = await asyncpg.connect(dsn, statement_cache_size=0, timeout=5)
                except (OSError, asyncpg.PostgresError):
                    await anyio.sleep(0.02)
                    continue
                try:
                    await conn.fetchval("SELECT 1")
                    return
                finally:
                    await conn.close()

    async def close_server_connections(self, database: str) -> None:
        """Close PgBouncer's server connections to ``database`` (its admin console's
        ``KILL``): otherwise it keeps them, idle, for ``server_idle_timeout`` (10 min)."""
        dsn = f"postgresql://postgres@127.0.0.1:{self.port}/pgbouncer"
        conn = await asyncpg.connect(dsn, statement_cache_size=0)
        try:
            await conn.execute(f'KILL "{database}"')  # the simple protocol: no parameters
        finally:
            await conn.close()
