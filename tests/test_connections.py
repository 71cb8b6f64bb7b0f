"""``App(max_connections=)`` and ``durafn worker --max-connections``: the most connections
an app's pool opens at once, so that many workers fit one server. An executor works
within a pool of one or two; the ends of the range and bad values. (A worker process
started with the option: ``test_workers.py``'s exit-on-complete test.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
from click.testing import CliRunner
from sqlalchemy import event, text

import durafn
from durafn import ActionCtx, MutationCtx, State, cli
from durafn.testing import all_rows

pytestmark = pytest.mark.anyio


class Peak:
    """The most connections checked out of an engine's pool at once."""

    def __init__(self, app: durafn.App) -> None:
        self.out = self.most = 0
        pool = app.engine.sync_engine
        event.listen(pool, "checkout", self._checkout)
        event.listen(pool, "checkin", self._checkin)

    def _checkout(self, *_: Any) -> None:
        self.out += 1
        self.most = max(self.most, self.out)

    def _checkin(self, *_: Any) -> None:
        self.out -= 1


@pytest.mark.parametrize("most", [1, 2])
async def test_an_executor_drains_within_a_pool_of_one_or_two(db_url: str, most: int) -> None:
    app = durafn.App(db_url, max_connections=most)

    @app.mutation(name="conn:note")
    async def note(ctx: MutationCtx, n: int) -> int:
        return n

    @app.action(name="conn:act")
    async def act(ctx: ActionCtx, n: int) -> int:
        await ctx.run_mutation(note, n)  # an action's own transaction, from the same pool
        return n

    await app.migrate()
    peak = Peak(app)
    sched = app.scheduler()
    await sched.run_many([note.call(n) for n in range(100)] + [act.call(n) for n in range(50)])
    async with app.run_executor(concurrency=8) as executor:
        await executor.run_until_idle()
    rows = await all_rows(app)
    assert len(rows) == 150
    assert {r.state for r in rows} == {State.SUCCESS}
    assert sorted(r.result for r in rows if r.name == "conn:act") == list(range(50))
    pool: Any = app.engine.pool
    assert (pool.size(), pool.size() + pool._max_overflow) == ((most + 1) // 2, most)
    assert 1 <= peak.most <= most  # what the pool so configured promises
    await app.aclose()


async def test_the_default_keeps_half_of_its_connections_open(db_url: str) -> None:
    app = durafn.App(db_url)
    default = 10 if app.dialect == "PostgreSQL" else 16
    pool: Any = app.engine.pool
    assert (pool.size(), pool._max_overflow) == (default // 2, default // 2)
    await app.aclose()
    top = durafn.App(db_url, max_connections=1000)
    assert top.engine.pool.size() == 500  # type: ignore[attr-defined]
    await top.aclose()


@pytest.mark.parametrize("bad", [0, -1, 1001, 2.5, "4", True])
def test_max_connections_out_of_range_is_an_argument_error(bad: Any) -> None:
    with pytest.raises(durafn.ArgumentError, match="max_connections"):
        durafn.App("sqlite+aiosqlite:///unused.sqlite3", max_connections=bad)


async def test_the_cli_limit_is_set_before_first_use_and_never_after(db_url: str) -> None:
    """``durafn worker --max-connections`` sets the app's limit after importing it; once
    the app has an engine, the limit cannot change (its pool is built)."""
    app = durafn.App(db_url)
    app._limit_connections(3)
    assert app.engine.pool.size() == 2  # type: ignore[attr-defined]
    with pytest.raises(durafn.ArgumentError, match="connection limit cannot change"):
        app._limit_connections(5)
    await app.aclose()


async def test_the_test_harness_shares_an_engine_across_apps_on_one_database(
    db_url: str, tmp_path: Path
) -> None:
    """``App._share_engine``, as the ``app`` fixture and the pytest plugin use it: each
    test's app on the engine of one kept app, whose compiled statements outlive a test;
    each app's ``aclose`` closes the connections and leaves the engine usable."""
    keeper = durafn.App(db_url)
    await keeper.migrate()
    for n in (1, 2):
        app = durafn.App(db_url)
        app._share_engine(keeper)
        assert app.engine is keeper.engine

        @app.mutation(name="conn:twice")
        async def twice(ctx: MutationCtx, x: int) -> int:
            return 2 * x

        assert await app.run_mutation(twice, n) == 2 * n
        await app.aclose()
        assert keeper.engine.pool.checkedout() == 0  # type: ignore[attr-defined]
    cache = keeper.engine.sync_engine._compiled_cache
    assert cache is not None and len(cache) > 0

    other = durafn.App(f"sqlite+aiosqlite:///{tmp_path / 'other.sqlite3'}")
    with pytest.raises(durafn.ArgumentError, match="cannot share the engine of an app on"):
        other._share_engine(keeper)
    smaller = durafn.App(db_url, max_connections=2)
    with pytest.raises(durafn.ArgumentError, match=r"max_connections=\d+: this app has 2"):
        smaller._share_engine(keeper)
    used = durafn.App(db_url)
    _ = used.engine
    with pytest.raises(durafn.ArgumentError, match="engine cannot change once it is in use"):
        used._share_engine(keeper)
    await used.aclose()
    await keeper.aclose()


@pytest.mark.parametrize("bad", ["0", "1001", "two"])
def test_a_bad_max_connections_option_is_a_usage_error(bad: str) -> None:
    result = CliRunner().invoke(
        cli.main,
        ["worker", "--app", "tests.apps.cli_app:app", "--max-connections", bad],
        catch_exceptions=False,
    )
    assert result.exit_code == 2, result.output
    assert "--max-connections" in result.stderr


@pytest.mark.postgres_only  # the backend stopped is PostgreSQL's
async def test_a_timed_out_mutation_is_stopped_on_the_server_with_a_pool_of_one(
    postgres_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A mutation past its limit between two statements (its transaction open, a row
    locked) has its backend terminated from a connection outside the pool: a pool of
    one has no other, and the checkout waited 5 s, gave up, and left the server to find
    the dropped socket."""
    app = durafn.App(postgres_url, max_connections=1, mutation_timeout=0.2)

    @app.mutation(name="conn:holds")
    async def holds(ctx: MutationCtx) -> None:
        await ctx.db.execute(text("SELECT 1"))
        await anyio.Event().wait()  # past its limit, in the user's code, not a statement

    await app.migrate()
    sid = await app.scheduler().run_after(0, holds)
    await app.executor().run_until_idle()
    row = await app.get(sid)
    assert row is not None and row.state is State.FAILED
    assert row.error is not None and row.error.type == "durafn.FunctionTimeoutError"
    assert not [r for r in caplog.records if "could not stop" in r.getMessage()]
    await app.aclose()


async def test_a_first_connection_that_fails_names_where_it_went() -> None:
    """A server that is down (here: a port nothing listens on) read "lost the connection
    ... while running a transaction", naming neither the start nor the server. The
    password stays out of the message."""
    import socket

    with socket.socket() as s:  # a port that was free a moment ago
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    app = durafn.App(f"postgresql+asyncpg://app:secret@127.0.0.1:{port}/nowhere", direct_retries=0)

    @app.mutation(name="conn:noop")
    async def noop(ctx: MutationCtx) -> None:
        pass

    try:
        with pytest.raises(durafn.DatabaseError) as raised:
            await app.scheduler().run_after(0, noop)
    finally:
        await app.aclose()
    message = str(raised.value)
    assert f"first connecting to postgresql+asyncpg://app:***@127.0.0.1:{port}/nowhere" in message
    assert "secret" not in message and raised.value.transient
