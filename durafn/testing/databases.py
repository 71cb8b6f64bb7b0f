"""A test's database, made cheap: a fresh copy of a migrated SQLite file at one path, and
one engine per database for the session, shared by each test's app.

The pytest plugin's ``durafn_app`` and durafn's own suite use both. SQLAlchemy keeps
compiled statements per engine: compiling them again in each test's new engine cost
durafn's in-process tests 11% of their CPU (134 and 141 s against 119 and 126 s, two
alternating pairs of runs on 2026-11-28), and the plugin's fixture 4-7 ms a test on
SQLite and 10-13 ms on PostgreSQL (``benchmarks.testkit``).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from .._app import App

_keepers: dict[tuple[str, int], App] = {}
"""Per database URL and connection limit, the app whose engine each test's app shares
(never closed: each test's ``aclose`` closes the connections, and the engine stays)."""


def fresh_copy(template: Path, path: Path) -> None:
    """A new file at ``path``, a copy of ``template``: the old one and its WAL unlinked
    first, so that a connection a test left open keeps the old file, never this one."""
    for end in ("", "-wal", "-shm"):
        path.with_name(f"{path.name}{end}").unlink(missing_ok=True)
    shutil.copyfile(template, path)


def share_engine(app: App) -> None:
    """Put ``app``, not yet used, on the session's engine for its database."""
    url = app._rt.driver.url.render_as_string(hide_password=False)
    key = (url, app._rt.connections)
    keeper = _keepers.get(key)
    if keeper is None:
        keeper = _keepers[key] = App(url, max_connections=app._rt.connections)
    app._share_engine(keeper)
