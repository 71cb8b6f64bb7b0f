"""One suite, two engines: every test that takes ``app`` runs on SQLite and PostgreSQL.

PostgreSQL tests skip with a visible reason when no server answers, except under CI
(``CI`` set), where a missing server fails the run: CI must never silently skip them.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import asyncpg
import pytest

import durafn
from durafn.testing import FakeClock

from .models import Base

PG_ADMIN_DSN = os.environ.get(
    "DURAFN_TEST_PG_ADMIN", "postgresql://postgres@127.0.0.1:5432/postgres"
)
# Another database name lets two suites run at once on one server (each resets its schema).
PG_DATABASE = os.environ.get("DURAFN_TEST_PG_DATABASE", "durafn_test")
PG_URL = f"postgresql+asyncpg://postgres@127.0.0.1:5432/{PG_DATABASE}"
PG_DSN = f"postgresql://postgres@127.0.0.1:5432/{PG_DATABASE}"

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
            exists = await conn.fetchval(
                "SELECT 1 FROM pg_database WHERE datname = $1", PG_DATABASE
            )
            if not exists:
                await conn.execute(f"CREATE DATABASE {PG_DATABASE}")
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
    async def _reset() -> None:
        conn = await asyncpg.connect(PG_DSN)
        try:
            await conn.execute("DROP SCHEMA public CASCADE; CREATE SCHEMA public;")
        finally:
            await conn.close()

    asyncio.run(_reset())


ENGINES = ["sqlite", "postgres"]


@pytest.fixture(params=ENGINES)
def engine_name(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def db_url(engine_name: str, tmp_path: Path) -> Iterator[str]:
    """A fresh, empty database of each engine: a new SQLite file, or an emptied PG schema."""
    if engine_name == "sqlite":
        yield f"sqlite+aiosqlite:///{tmp_path / 'test.sqlite3'}"
        return
    require_postgres()
    reset_postgres()
    yield PG_URL


@pytest.fixture
def postgres_url() -> str:
    """For the few behaviours only PostgreSQL has (the test's marker says which)."""
    require_postgres()
    reset_postgres()
    return PG_URL


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
async def app(db_url: str, clock: FakeClock) -> AsyncIterator[durafn.App]:
    """An app on a fresh database with the system tables and the test models created."""
    application = durafn.App(db_url, clock=clock)
    await application.migrate()
    async with application.engine.begin() as conn:
        await conn.run_sync(Base.metadata.create_all)
    try:
        yield application
    finally:
        await application.aclose()


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
