"""durafn's pytest plugin (the ``pytest11`` entry point ``durafn``): the fixtures
``fake_clock``, ``durafn_app`` and ``durafn`` (a ``durafn.testing.Harness``).

Which app: ``durafn_app = "pkg.module:app"`` under ``[tool.pytest.ini_options]``, or
``--durafn-app``, or a ``durafn_base_app`` fixture of your own; with none, each test gets
an empty ``App`` to register functions on. Which database: a copy of a migrated SQLite
file per test (made once a session), or the PostgreSQL database ``--durafn-url`` or
``DURAFN_TEST_URL`` names (one per pytest-xdist worker, made and migrated once a session;
durafn's tables emptied before each test, by a DELETE per table in one round trip).
Either way one URL serves the session, and one engine: each test's app shares it, so that
SQLAlchemy compiles each statement once a session, not once a test
(``durafn.testing.databases``); each test's end closes the connections.

Loaded by every pytest run where durafn is installed: a module of its own, outside
``durafn.testing``, so that it imports nothing of durafn's (nor SQLAlchemy) until a test
asks for one of its fixtures.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from ._app import App
    from .testing.clock import FakeClock
    from .testing.harness import Harness

URL_VARIABLE = "DURAFN_TEST_URL"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("durafn")
    group.addoption(
        "--durafn-url",
        default=None,
        help=f"PostgreSQL URL for durafn_app (default: ${URL_VARIABLE}, else SQLite files)",
    )
    group.addoption("--durafn-app", default=None, help="the app to test, as pkg.module:app")
    parser.addini("durafn_app", "the app durafn_app binds to a test database (pkg.module:app)")


@pytest.fixture
def fake_clock() -> FakeClock:
    """A ``FakeClock`` at 2030-01-01 00:00 UTC: it moves only when the test moves it."""
    from .testing.clock import FakeClock

    return FakeClock()


@pytest.fixture
def durafn_base_app(request: pytest.FixtureRequest) -> App | None:
    """The app under test, as ``--durafn-app`` or the ``durafn_app`` ini option names it
    (None: an empty app per test). Override this fixture to hand one over yourself."""
    ref = request.config.getoption("--durafn-app") or request.config.getini("durafn_app")
    if not ref:
        return None
    from .cli.running import load_app

    return load_app(str(ref))


@pytest.fixture(scope="session")
def _durafn_database(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> str:
    """A migrated database for the session: a SQLite template file, or the worker's
    PostgreSQL database."""
    url = request.config.getoption("--durafn-url") or os.environ.get(URL_VARIABLE)
    if url:
        return asyncio.run(_postgres_database(str(url)))
    path = tmp_path_factory.mktemp("durafn") / "template.sqlite3"
    asyncio.run(_migrate(f"sqlite+aiosqlite:///{path}"))
    # One file is the whole database: the WAL folded in, so that a copy is complete.
    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return str(path)


@pytest.fixture
async def durafn_app(
    _durafn_database: str, durafn_base_app: App | None, fake_clock: FakeClock
) -> AsyncIterator[App]:
    """``durafn_base_app`` on a throwaway, migrated database, on ``fake_clock``."""
    from ._app import App
    from .testing.databases import fresh_copy, share_engine

    if "://" in _durafn_database:
        url = _durafn_database
        fresh = False
    else:
        template = Path(_durafn_database)
        path = template.with_name("durafn.sqlite3")  # the session's one path
        fresh_copy(template, path)
        url, fresh = f"sqlite+aiosqlite:///{path}", True
    if durafn_base_app is None:
        app = App(url, clock=fake_clock)
    else:
        app = durafn_base_app.using(url, clock=fake_clock)
    share_engine(app)
    try:
        if not fresh:
            await _empty(app)
        yield app
    finally:
        await app.aclose()


@pytest.fixture
def durafn(durafn_app: App, fake_clock: FakeClock) -> Harness:
    """A ``Harness``: steps (``advance``, ``finish_all``, ``run_until_idle``,
    ``perform``) and assertions (``assert_scheduled``, ...) over ``durafn_app``."""
    from .testing.harness import Harness

    return Harness(durafn_app, fake_clock)


async def _migrate(url: str) -> None:
    from ._app import App

    app = App(url)
    try:
        await app.migrate()
    finally:
        await app.aclose()


async def _postgres_database(url: str) -> str:
    """The URL of this xdist worker's own database on that server (``NAME_gw0``...; the
    database named, without xdist), created if missing, and migrated."""
    import asyncpg
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if parsed.database and worker:
        parsed = parsed.set(database=f"{parsed.database}_{worker}")
    if parsed.database:
        admin = parsed.set(drivername="postgresql", database="postgres")
        conn = await asyncpg.connect(admin.render_as_string(hide_password=False))
        try:
            found = "SELECT 1 FROM pg_database WHERE datname = $1"
            if not await conn.fetchval(found, parsed.database):
                await conn.execute(f'CREATE DATABASE "{parsed.database}"')
        finally:
            await conn.close()
    own = parsed.render_as_string(hide_password=False)
    await _migrate(own)
    return own


async def _empty(app: App) -> None:
    """Delete every row of durafn's tables but the schema version, children first."""
    from ._store import metadata

    names = [t.name for t in reversed(metadata.sorted_tables) if t.name != "_durafn_schema"]
    async with app.engine.connect() as conn:
        raw = (await conn.get_raw_connection()).driver_connection
        assert raw is not None
        # One round trip: asyncpg runs a script of statements without parameters at once.
        await raw.execute("; ".join(f'DELETE FROM "{n}"' for n in names))
