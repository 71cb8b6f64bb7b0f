"""One suite, two engines: every test that takes ``app`` runs on SQLite and PostgreSQL.

PostgreSQL tests skip with a visible reason when no server answers, except under CI
(``CI`` set), where a missing server fails the run: CI must never silently skip them.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import asyncpg
import pytest

import durafn
from durafn.testing import FakeClock
from durafn.testing.databases import fresh_copy, share_engine

from .support.models import Base

PG_ADMIN_DSN = os.environ.get(
    "DURAFN_TEST_PG_ADMIN", "postgresql://postgres@127.0.0.1:5432/postgres"
)
# Another database name lets two suites run at once on one server (each resets its schema);
# so does each of pytest-xdist's workers (``-n 2``, the default), with a database of its own.
# Every database the suite uses on the server is named from PG_BASE (tests/test_suite.py).
PG_BASE = os.environ.get("DURAFN_TEST_PG_DATABASE", "durafn_test")
PG_DATABASE = PG_BASE + (
    f"_{os.environ['PYTEST_XDIST_WORKER']}" if "PYTEST_XDIST_WORKER" in os.environ else ""
)
PG_URL = f"postgresql+asyncpg://postgres@127.0.0.1:5432/{PG_DATABASE}"
PG_DSN = f"postgresql://postgres@127.0.0.1:5432/{PG_DATABASE}"
# The tests that take a bare database (``db_url`` without ``app``, ``postgres_url``) get one
# of their own, so that the ``app`` tests' schema survives them: when they shared one,
# each bare test dropped the schema and the next ``app`` test migrated again (84 such
# set-ups of 0.2-0.6 s in one run, 27 s of the suite's 490 worker-seconds).
BARE_DATABASE = f"{PG_DATABASE}_bare"
BARE_URL = f"postgresql+asyncpg://postgres@127.0.0.1:5432/{BARE_DATABASE}"
BARE_DSN = f"postgresql://postgres@127.0.0.1:5432/{BARE_DATABASE}"
# The database the test kit's tests hand the pytest plugin (``--durafn-url``), which adds
# the pytest-xdist worker's suffix itself (``durafn_test_kit_gw0``): a third of its own,
# as the plugin empties durafn's tables and migrates as it sees fit.
KIT_URL = f"postgresql+asyncpg://postgres@127.0.0.1:5432/{PG_BASE}_kit"

_pg_problem: str | None = None
_pg_checked = False


def _check_postgres() -> str | None:
    """None if the test database is reachable (creating it if needed), else why not."""
    global _pg_checked, _pg_problem
    if _pg_checked:
        return _pg_problem
    _pg_checked = True

    async def _probe() -> None:
        conn = await asyncpg.connect(PG_ADMIN_DSN, timeout=5)
        try:
            for database in (PG_DATABASE, BARE_DATABASE):
                exists = await conn.fetchval(
                    "SELECT 1 FROM pg_database WHERE datname = $1", database
                )
                if not exists:
                    await conn.execute(f"CREATE DATABASE {database}")
                # Every statement runs under a generic plan from its first run, as it may
                # from its sixth on a long-lived connection (PostgreSQL's plan cache): a
                # statement that works only with its parameters known fails in every test,
                # not only in an app that has run for a while (tests/test_long_lived.py).
                await conn.execute(
                    f"ALTER DATABASE {database} SET plan_cache_mode = force_generic_plan"
                )
        finally:
            await conn.close()

    try:
        asyncio.run(_probe())
    except Exception as exc:
        _pg_problem = f"PostgreSQL is not reachable at {PG_ADMIN_DSN}: {exc}"
    return _pg_problem


def require_postgres() -> None:
    problem = _check_postgres()
    if problem is None:
        return
    if os.environ.get("CI"):
        pytest.fail(f"{problem} (CI is set, so PostgreSQL tests must not be skipped)")
    pytest.skip(problem)


def reset_postgres() -> None:
    """Empty the bare database (``BARE_URL``): the test may do anything to it."""

    async def _reset() -> None:
        conn = await asyncpg.connect(BARE_DSN)
        try:
            await conn.execute("DROP SCHEMA public CASCADE; CREATE SCHEMA public;")
        finally:
            await conn.close()

    asyncio.run(_reset())


_pg_intact = False
"""This worker's test database has the schema an ``app`` test needs, as far as it knows:
set by the ``app`` fixture once it has checked or made it. (A test may still change it:
the fast reset's DELETE failing, or the catalogue check, notices.)"""


def _expected_schema() -> tuple[set[str], set[str], int]:
    """The tables and indexes a migrated test database has, and the columns of the
    system table: what the fast reset checks before it keeps a schema."""
    tables = set(durafn.metadata.tables) | set(Base.metadata.tables)
    indexes = {
        str(i.name)
        for md in (durafn.metadata, Base.metadata)
        for t in md.tables.values()
        for i in t.indexes
    }
    return tables, indexes, len(durafn.scheduled_functions.columns)


def empty_postgres_keeping_schema() -> bool:
    """Delete every row but keep the tables when the schema is the one a migrated test
    database has (True); else drop it (False: migrate again). Run before each of some 400
    tests on PostgreSQL: when the schema is known intact, one DELETE per table in one
    round trip (0.7 ms; the TRUNCATE of every table it replaced took 24 ms, and 62 ms a
    test in the suite, where the tables held the last test's rows); a DELETE that fails (a
    test dropped a table) falls back to reading the catalogue."""
    global _pg_intact
    tables, indexes, columns = _expected_schema()

    async def _empty() -> bool:
        conn = await asyncpg.connect(PG_DSN)
        try:
            if _pg_intact:
                try:
                    await conn.execute(_DELETE_ALL)
                    return True
                except asyncpg.PostgresError:
                    pass
            found = {r[0] for r in await conn.fetch(_TABLES)}
            intact = (
                tables <= found
                and indexes <= {r[0] for r in await conn.fetch(_INDEXES)}
                and await conn.fetchval(_COLUMNS) == columns
                and await conn.fetchval("SELECT max(version) FROM _durafn_schema")
                == durafn.SCHEMA_VERSION
            )
            if intact:
                await conn.execute(_DELETE_ALL)
                return True
            await conn.execute("DROP SCHEMA public CASCADE; CREATE SCHEMA public;")
            return False
        finally:
            await conn.close()

    _pg_intact = asyncio.run(_empty())
    return _pg_intact


_TABLES = "SELECT tablename FROM pg_tables WHERE schemaname = 'public'"
# Every table's rows, children before their parents (foreign keys), the version kept.
_DELETE_ALL = "; ".join(
    f'DELETE FROM "{table.name}"'
    for metadata in (Base.metadata, durafn.metadata)
    for table in reversed(metadata.sorted_tables)
    if table.name != "_durafn_schema"
)
_INDEXES = "SELECT indexname FROM pg_indexes WHERE schemaname = 'public'"
_COLUMNS = (
    "SELECT count(*) FROM information_schema.columns "
    "WHERE table_schema = 'public' AND table_name = '_scheduled_functions'"
)

ENGINES = ["sqlite", "postgres"]


@pytest.fixture(params=ENGINES)
def engine_name(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def db_url(engine_name: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh, empty database of each engine: a new SQLite file, or an emptied PG schema
    (in a test that also has ``app``: the app's database, as it is)."""
    if "app_url" in request.fixturenames:  # ``app``, or a fixture like it
        yield request.getfixturevalue("app_url")[0]
        return
    if engine_name == "sqlite":
        yield f"sqlite+aiosqlite:///{tmp_path / 'test.sqlite3'}"
        return
    require_postgres()
    reset_postgres()
    yield BARE_URL


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A migrated SQLite file with the test models, made once: each test's database is a
    copy of it (a file copy, against some 40 ms to create the tables and indexes)."""
    path = tmp_path_factory.mktemp("template") / "template.sqlite3"

    async def _make() -> None:
        app = durafn.App(f"sqlite+aiosqlite:///{path}")
        await app.migrate()
        async with app.engine.begin() as conn:
            await conn.run_sync(Base.metadata.create_all)
        await app.aclose()

    asyncio.run(_make())
    # The last connection's close folds the WAL into the file; make sure, so that one
    # file is the whole database.
    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return path


@pytest.fixture(scope="session")
def sqlite_app_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where each ``app`` test's SQLite database is: one path for the session (so that one
    engine serves every test, ``share_engine``), a fresh copy of the template each test."""
    return tmp_path_factory.mktemp("apps") / "app.sqlite3"


@pytest.fixture
def app_url(engine_name: str, request: pytest.FixtureRequest) -> tuple[str, bool]:
    """A database for the ``app`` fixture: (URL, whether its tables exist already). On
    SQLite a fresh copy of the session's template, at the session's one path; on
    PostgreSQL the tables of the previous test are kept, emptied, when they are intact."""
    if engine_name == "sqlite":
        path: Path = request.getfixturevalue("sqlite_app_path")
        fresh_copy(request.getfixturevalue("sqlite_template"), path)
        return f"sqlite+aiosqlite:///{path}", True
    require_postgres()
    return PG_URL, empty_postgres_keeping_schema()


@pytest.fixture
def postgres_url() -> str:
    """For the few behaviours only PostgreSQL has (the test's marker says which)."""
    require_postgres()
    reset_postgres()
    return BARE_URL


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
async def app(app_url: tuple[str, bool], clock: FakeClock) -> AsyncIterator[durafn.App]:
    """An app on an empty database with the system tables and the test models created."""
    global _pg_intact
    url, ready = app_url
    application = durafn.App(url, clock=clock)
    share_engine(application)  # one engine per database for the session
    if not ready:
        await application.migrate()
        async with application.engine.begin() as conn:
            await conn.run_sync(Base.metadata.create_all)
        _pg_intact = url == PG_URL
    try:
        yield application
    finally:
        await application.aclose()


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
