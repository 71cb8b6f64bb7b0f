"""Schema creation is versioned, refuses a newer schema, and is exposed as MetaData."""

from __future__ import annotations

import anyio
import pytest
from sqlalchemy import delete, insert, inspect, select, text, update

import durafn
from durafn._clock import to_datetime
from durafn._store import schema_version
from durafn._store.postgres.driver import AUTOVACUUM
from durafn._store.schema import migrations as _migrations
from durafn._store.schema.migrations import failed_attempts
from durafn._store.schema.tables import sf
from durafn.testing import FakeClock

from .support.helpers import CEILING

pytestmark = pytest.mark.anyio


async def test_migrate_is_idempotent_and_versioned(db_url: str, clock: FakeClock) -> None:
    app = durafn.App(db_url, clock=clock)
    try:
        assert await app.migrate() == durafn.SCHEMA_VERSION
        assert await app.migrate() == durafn.SCHEMA_VERSION
        async with app.engine.connect() as conn:
            tables = await conn.run_sync(lambda c: set(inspect(c).get_table_names()))
            indexes = await conn.run_sync(
                lambda c: {i["name"] for i in inspect(c).get_indexes("_scheduled_functions")}
            )
        assert {"_scheduled_functions", "_durafn_schema"} <= tables
        assert {
            "ix_scheduled_functions_claim",
            "ix_scheduled_functions_claim_queued",
            "ix_scheduled_functions_queue",
            "ix_scheduled_functions_key",
            "ix_scheduled_functions_parent",
            "ix_scheduled_functions_completed",
            "ix_scheduled_functions_scheduled",
        } <= indexes
    finally:
        await app.aclose()


@pytest.mark.parametrize("already", [False, True])
async def test_version_10_moves_each_rows_failed_attempts_onto_it(
    db_url: str, clock: FakeClock, already: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A version 9 database kept failed runs in ``_durafn_failed_attempts``: version 10
    moves each row's into its ``errors``, in the order they were written, a chunk of rows
    at a time, and drops the table. ``already``: a row with entries of its own keeps
    them, after the older ones (one row a chunk, to cross chunks)."""
    if already:
        monkeypatch.setattr(_migrations, "_CHUNK", 1)
    app = durafn.App(db_url, clock=clock)

    @app.action
    async def act(ctx: durafn.ActionCtx) -> None:
        pass

    try:
        await app.migrate()
        first = await app.scheduler().run_after(60, act)
        second = await app.scheduler().run_after(60, act)
        t = 1_700_000_000.0
        async with app.engine.begin() as conn:  # back to what version 9 had
            if already:
                newer = [
                    {"attempt": 2, "at": t + 9, "worker": None, "type": "E", "message": "three"}
                    | {"traceback": None, "retry_at": None}
                ]
                await conn.execute(update(sf).where(sf.c.id == first).values(errors=newer))
            else:
                await conn.execute(text("ALTER TABLE _scheduled_functions DROP COLUMN errors"))
            await conn.run_sync(failed_attempts.create)
            await conn.execute(
                insert(failed_attempts),
                [
                    {
                        "function_id": second,
                        "attempt": 1,
                        "failed_at": t,
                        "worker_id": "w:1",
                        "error_type": "E",
                        "error_message": "one",
                        "error_traceback": None,
                        "retry_at": t + 5,
                    },
                    {
                        "function_id": first,
                        "attempt": 1,
                        "failed_at": t + 1,
                        "worker_id": None,
                        "error_type": "durafn.WorkerLostError",
                        "error_message": "lost",
                        "error_traceback": None,
                        "retry_at": None,
                    },
                    {
                        "function_id": second,
                        "attempt": 2,
                        "failed_at": t + 6,
                        "worker_id": "w:2",
                        "error_type": "E",
                        "error_message": "two",
                        "error_traceback": "tb",
                        "retry_at": None,
                    },
                ],
            )
            await conn.execute(delete(schema_version))
            await conn.execute(insert(schema_version).values(version=9, applied_at=0))
        await app.aclose()
        assert await app.migrate() == durafn.SCHEMA_VERSION
        rows = {i: await app.get(i) for i in (first, second)}
        async with app.engine.connect() as conn:
            tables = await conn.run_sync(lambda c: set(inspect(c).get_table_names()))
    finally:
        await app.aclose()
    assert "_durafn_failed_attempts" not in tables
    history = {
        i: [
            (h.attempt, h.failed_at.timestamp(), h.worker_id, h.error, h.retry_at)
            for h in row.history
        ]
        for i, row in rows.items()
        if row is not None
    }
    lost = durafn.ErrorInfo(type="durafn.WorkerLostError", message="lost")
    kept = [(2, t + 9, None, durafn.ErrorInfo(type="E", message="three"), None)]
    assert history == {
        first: [(1, t + 1, None, lost, None), *(kept if already else [])],
        second: [
            (1, t, "w:1", durafn.ErrorInfo(type="E", message="one"), to_datetime(t + 5)),
            (2, t + 6, "w:2", durafn.ErrorInfo(type="E", message="two", traceback="tb"), None),
        ],
    }


async def test_version_11_numbers_the_rows_in_the_order_they_were_written(
    db_url: str, clock: FakeClock
) -> None:
    """A version 10 database: its rows get ``seq`` in the order they lie in the table
    (as written), the claim indexes end with it instead of the id, the crons gain the
    operator's switch, and the rows run in the order they were written."""
    app = durafn.App(db_url, clock=clock)
    ran: list[int] = []

    @app.action(name="v11:act")
    async def act(ctx: durafn.ActionCtx, n: int) -> None:
        ran.append(n)

    ended_with_id = {
        "claim": ("kind, priority, available_at, id", "flow_key IS NULL AND queue_name IS NULL"),
        "claim_queued": (
            "kind, priority, available_at, id, queue_name",
            "flow_key IS NULL AND queue_name IS NOT NULL",
        ),
        "queue": (
            "queue_name, priority, available_at, id",
            "flow_key IS NULL AND queue_name IS NOT NULL",
        ),
        "key_head": ("flow_key, priority, available_at, id", "flow_key IS NOT NULL"),
    }
    try:
        await app.migrate()
        ids = [await app.scheduler().run_after(0, act, n) for n in range(3)]
        async with app.engine.begin() as conn:  # back to what version 10 had
            for name in (*ended_with_id, "batch", "batched"):  # and version 17's
                await conn.execute(text(f"DROP INDEX ix_scheduled_functions_{name}"))
            await conn.execute(text("ALTER TABLE _scheduled_functions DROP COLUMN batch_key"))
            await conn.execute(text("ALTER TABLE _scheduled_functions DROP COLUMN seq"))
            await conn.execute(text("ALTER TABLE _durafn_crons DROP COLUMN operator_enabled"))
            for name, (columns, where) in ended_with_id.items():
                await conn.execute(
                    text(
                        f"CREATE INDEX ix_scheduled_functions_{name} ON _scheduled_functions "
                        f"({columns}) WHERE state = 'Pending' AND {where}"
                    )
                )
            await conn.execute(delete(schema_version))
            await conn.execute(insert(schema_version).values(version=10, applied_at=0))
        await app.aclose()
        assert await app.migrate() == durafn.SCHEMA_VERSION
        async with app.engine.connect() as conn:
            numbered = await conn.execute(select(sf.c.id, sf.c.seq).order_by(sf.c.seq))
            order = [str(id) for id, _ in numbered]
            indexes = await conn.run_sync(
                lambda c: {i["name"]: i["column_names"] for i in inspect(c).get_indexes(sf.name)}
            )
            cron_columns = await conn.run_sync(
                lambda c: {col["name"] for col in inspect(c).get_columns("_durafn_crons")}
            )
        assert order == ids
        for name in ended_with_id:
            assert indexes[f"ix_scheduled_functions_{name}"][3] == "seq"
        assert "operator_enabled" in cron_columns
        ids.append(await app.scheduler().run_after(0, act, 3))  # after the numbered ones
        await app.executor(concurrency=1).run_until_idle()
        assert ran == [0, 1, 2, 3]
    finally:
        await app.aclose()


_VERSION_18_RELEASE = """
CREATE FUNCTION durafn_release(finished uuid[]) RETURNS integer
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    released integer;
BEGIN
    DELETE FROM _durafn_dependencies WHERE dep_id = ANY(finished);
    GET DIAGNOSTICS released = ROW_COUNT;
    IF released > 0 THEN
        PERFORM pg_notify('durafn_wakeup', 'action,mutation');
    END IF;
    RETURN released;
END
$$
"""


async def test_version_19_orders_a_row_s_edges_and_its_release_returns_the_rows_freed(
    db_url: str, engine_name: str, clock: FakeClock
) -> None:
    """A version 18 database: ``ix_durafn_dependencies_row`` on ``row_id`` alone and, on
    PostgreSQL, a ``durafn_release`` that returned a count and sent the NOTIFY itself, and
    no ``durafn_may_be_free``. Migrated, the index ends with ``dep_id``, both functions
    return rows, and a fan-in written before runs as it would have."""
    app = durafn.App(db_url, clock=clock)
    order: list[int | str] = []

    @app.mutation(name="v19:part")
    async def part(ctx: durafn.MutationCtx, n: int) -> None:
        order.append(n)

    @app.mutation(name="v19:join")
    async def join(ctx: durafn.MutationCtx) -> None:
        order.append("join")

    try:
        await app.migrate()
        sched = app.scheduler()
        parts = await sched.run_many([part.call(n) for n in range(3)])
        await sched.run_after(0, join.options(after=parts))
        async with app.engine.begin() as conn:  # back to what version 18 had
            await conn.execute(text("DROP INDEX ix_durafn_dependencies_row"))
            await conn.execute(
                text("CREATE INDEX ix_durafn_dependencies_row ON _durafn_dependencies (row_id)")
            )
            if engine_name == "postgres":
                await conn.execute(text("DROP FUNCTION durafn_release(uuid[])"))
                await conn.execute(text(_VERSION_18_RELEASE))
                await conn.execute(text("DROP FUNCTION durafn_may_be_free(uuid[])"))
            await conn.execute(delete(schema_version))
            await conn.execute(insert(schema_version).values(version=18, applied_at=0))
        await app.aclose()
        assert await app.migrate() == durafn.SCHEMA_VERSION
        async with app.engine.connect() as conn:
            indexes = await conn.run_sync(
                lambda c: {
                    i["name"]: i["column_names"]
                    for i in inspect(c).get_indexes("_durafn_dependencies")
                }
            )
            if engine_name == "postgres":
                for function in ("durafn_release", "durafn_may_be_free"):
                    returns = await conn.execute(
                        text(f"SELECT pg_get_function_result('{function}(uuid[])'::regprocedure)")
                    )
                    assert returns.scalar_one() == "uuid[]"
        assert indexes["ix_durafn_dependencies_row"] == ["row_id", "dep_id"]
        await app.executor().run_until_idle()
        assert order == [0, 1, 2, "join"]
    finally:
        await app.aclose()


@pytest.mark.postgres_only  # durafn.schedule is PostgreSQL's
async def test_version_20_makes_durafn_schedule_refuse_a_queue_name_workers_cannot_serve(
    postgres_url: str,
) -> None:
    """A version 19 database: its ``durafn.schedule`` (this one with the new check taken
    out) wrote a queue named ``a,b``. Migrated, the function refuses it, as Python does."""
    import asyncpg

    app = durafn.App(postgres_url)
    try:
        await app.migrate()
        async with app.engine.begin() as conn:
            current = (
                await conn.execute(
                    text(
                        "SELECT pg_get_functiondef('durafn.schedule(text,jsonb,timestamptz,jsonb)'"
                        "::regprocedure)"
                    )
                )
            ).scalar_one()
            check = "strpos(v_queue, ',') > 0"
            assert check in current
            await conn.execute(text(current.replace(check, "false")))  # back to version 19
            await conn.execute(delete(schema_version))
            await conn.execute(insert(schema_version).values(version=19, applied_at=0))
        raw = await asyncpg.connect(postgres_url.replace("+asyncpg", ""))
        try:
            call = "SELECT durafn.schedule('x', '{}', NULL, '{\"queue\": \"a,b\"}')"
            assert await raw.fetchval(call) is not None  # version 19 wrote it
            await app.aclose()
            assert await app.migrate() == durafn.SCHEMA_VERSION
            with pytest.raises(asyncpg.InvalidParameterValueError, match="has a comma"):
                await raw.fetchval(call)
        finally:
            await raw.close()
    finally:
        await app.aclose()


@pytest.mark.postgres_only  # durafn.schedule is PostgreSQL's
async def test_version_21_makes_durafn_schedule_take_null_options_as_none(
    postgres_url: str,
) -> None:
    """A version 20 database: its ``durafn.schedule`` (this one with NULL refused again,
    as it was) refuses ``options => NULL``. Migrated, the call writes a row without
    options."""
    import asyncpg

    app = durafn.App(postgres_url)
    try:
        await app.migrate()
        async with app.engine.begin() as conn:
            current = (
                await conn.execute(
                    text(
                        "SELECT pg_get_functiondef('durafn.schedule(text,jsonb,timestamptz,jsonb)'"
                        "::regprocedure)"
                    )
                )
            ).scalar_one()
            coalesced = "options := coalesce(options, '{}'::jsonb);"
            assert coalesced in current
            refused = (
                "IF options IS NULL THEN RAISE EXCEPTION 'durafn.schedule: options must be "
                "a JSON object, not NULL' USING ERRCODE = '22023'; END IF;"
            )
            await conn.execute(text(current.replace(coalesced, refused)))  # version 20's
            await conn.execute(delete(schema_version))
            await conn.execute(insert(schema_version).values(version=20, applied_at=0))
        raw = await asyncpg.connect(postgres_url.replace("+asyncpg", ""))
        try:
            call = "SELECT durafn.schedule('x', '{}', NULL, NULL)"
            with pytest.raises(asyncpg.InvalidParameterValueError, match="JSON object"):
                await raw.fetchval(call)
            await app.aclose()
            assert await app.migrate() == durafn.SCHEMA_VERSION
            assert await raw.fetchval(call) is not None
        finally:
            await raw.close()
    finally:
        await app.aclose()


async def test_a_version_1_database_is_upgraded_in_place(
    db_url: str, engine_name: str, clock: FakeClock
) -> None:
    """Version 2 added worker heartbeats, version 3 the traceback column, version 4 job
    options (flags, queues, the priority-first claim indexes), version 5 retry policies
    (retry, failures, the failed attempts' table), version 6 completion callbacks, 7 the
    cron registry, 8 flow control (the claim indexes redefined without keyed rows), 9
    debounce windows, 10 the failed attempts moved onto their rows (``errors``), 11 the
    order rows were written in (``seq``, which ends the claim indexes), 17 batched
    actions (``batch_key``, out of the claim index, into two of their own): an existing
    version 1 database keeps its rows, refuses to run until migrated (PostgreSQL), and
    gains the new tables, indexes and columns, one recorded step each."""
    app = durafn.App(db_url, clock=clock)

    @app.mutation
    async def noop(ctx: durafn.MutationCtx) -> None:
        pass

    try:
        await app.migrate()
        sid = await app.scheduler().run_after(60, noop)
        async with app.engine.begin() as conn:  # back to what version 1 created
            await conn.execute(text("DROP INDEX ix_scheduled_functions_running"))
            await conn.execute(text("DROP TABLE _durafn_workers"))
            await conn.execute(text("DROP TABLE _durafn_lost_workers"))
            await conn.execute(text("ALTER TABLE _scheduled_functions DROP COLUMN error_traceback"))
            for index in (
                *("claim", "claim_queued", "queued_due", "queue", "key"),
                *("keyed_due", "keys", "key_head", "key_running", "batch", "batched"),
            ):
                await conn.execute(text(f"DROP INDEX ix_scheduled_functions_{index}"))
            for column in ("flow_key", "flow", "flow_until"):
                await conn.execute(text(f"ALTER TABLE _scheduled_functions DROP COLUMN {column}"))
            await conn.execute(text("DROP TABLE _durafn_flow_keys"))
            await conn.execute(text("DROP TABLE _durafn_flow_windows"))
            await conn.execute(text("DROP TABLE _durafn_queues"))
            for table in ("workflows", "workflow_steps", "workflow_events"):  # version 27
                await conn.execute(text(f"DROP TABLE _durafn_{table}"))
            await conn.execute(text("ALTER TABLE _scheduled_functions DROP COLUMN flags"))
            for column in ("retry", "failures", "errors", "seq", "trace_context", "batch_key"):
                await conn.execute(text(f"ALTER TABLE _scheduled_functions DROP COLUMN {column}"))
            await conn.execute(text("ALTER TABLE _durafn_crons DROP COLUMN operator_enabled"))
            await conn.execute(
                text(
                    "CREATE INDEX ix_scheduled_functions_due ON _scheduled_functions "
                    "(kind, available_at, id) WHERE state = 'Pending'"
                )
            )
            await conn.execute(delete(schema_version))
            await conn.execute(insert(schema_version).values(version=1, applied_at=0))
        await app.aclose()
        if engine_name == "postgres":
            stale = durafn.App(db_url, clock=clock)
            needs = f"at version 1, this durafn needs {durafn.SCHEMA_VERSION}"
            with pytest.raises(durafn.SchemaError, match=needs):
                await stale.executor().run_until_idle()
            await stale.aclose()
        assert await app.migrate() == durafn.SCHEMA_VERSION
        async with app.engine.connect() as conn:
            tables = await conn.run_sync(lambda c: set(inspect(c).get_table_names()))
            indexes = await conn.run_sync(
                lambda c: {i["name"] for i in inspect(c).get_indexes("_scheduled_functions")}
            )
            versions = (await conn.execute(select(schema_version.c.version))).scalars().all()
            columns = await conn.run_sync(
                lambda c: {col["name"] for col in inspect(c).get_columns("_scheduled_functions")}
            )
        assert "_durafn_workers" in tables and "ix_scheduled_functions_running" in indexes
        assert {"error_traceback", "flags", "retry", "failures", "on_complete", "errors"} <= columns
        assert {"flow_key", "flow", "flow_until", "seq", "trace_context"} <= columns
        assert {
            "_durafn_queues",
            "_durafn_crons",
            "_durafn_leases",
            "_durafn_flow_keys",
            "_durafn_flow_windows",
            "_durafn_lost_workers",
            "_durafn_workflows",
            "_durafn_workflow_steps",
            "_durafn_workflow_events",
        } <= tables
        assert "_durafn_failed_attempts" not in tables  # version 5 made it, 10 dropped it
        assert "ix_scheduled_functions_due" not in indexes
        assert {"ix_scheduled_functions_claim", "ix_scheduled_functions_key"} <= indexes
        assert {"ix_scheduled_functions_keys", "ix_scheduled_functions_queued_due"} <= indexes
        assert sorted(versions) == list(range(1, durafn.SCHEMA_VERSION + 1))
        row = await app.get(sid)
        assert row is not None and row.state is durafn.State.PENDING
        async with app.run_executor() as executor:
            with anyio.fail_after(CEILING):  # the first heartbeat registers the worker
                while not await app.workers():  # noqa: ASYNC110 - polling the database
                    await anyio.sleep(0.005)
            assert [w.id for w in await app.workers()] == [executor.worker_id]
    finally:
        await app.aclose()


async def test_refuses_a_newer_schema(db_url: str, clock: FakeClock) -> None:
    app = durafn.App(db_url, clock=clock)
    try:
        await app.migrate()
        async with app.engine.begin() as conn:
            await conn.execute(
                insert(schema_version).values(version=durafn.SCHEMA_VERSION + 1, applied_at=0)
            )
        with pytest.raises(durafn.SchemaError, match="newer than this durafn"):
            await app.migrate()
        fresh = durafn.App(db_url, clock=clock, auto_migrate=False)

        @fresh.mutation
        async def noop(ctx: durafn.MutationCtx) -> None:
            pass

        try:
            with pytest.raises(durafn.SchemaError, match="newer"):
                await fresh.run_mutation(noop)
        finally:
            await fresh.aclose()
    finally:
        await app.aclose()


async def test_missing_tables_say_how_to_create_them(
    db_url: str, clock: FakeClock, engine_name: str
) -> None:
    app = durafn.App(db_url, clock=clock, auto_migrate=False)

    @app.mutation
    async def noop(ctx: durafn.MutationCtx) -> None:
        pass

    try:
        with pytest.raises(durafn.SchemaError, match="durafn migrate"):
            await app.scheduler().run_after(0, noop)
    finally:
        await app.aclose()
    if engine_name == "sqlite":
        auto = durafn.App(db_url, clock=clock)  # SQLite's default: create on first use
        auto.mutation(noop.fn)
        try:
            await auto.scheduler().run_after(0, noop.name)
            assert len((await auto.list()).items) == 1
        finally:
            await auto.aclose()


def test_metadata_is_exposed_for_alembic() -> None:
    assert "_scheduled_functions" in durafn.metadata.tables
    assert durafn.scheduled_functions is durafn.metadata.tables["_scheduled_functions"]


async def test_tables_created_from_the_metadata_are_used_as_they_are(
    db_url: str, clock: FakeClock
) -> None:
    """The Alembic route: the user's migrations create the tables from durafn.metadata
    (leaving the version table empty); durafn then runs on them without migrating."""
    app = durafn.App(db_url, clock=clock, auto_migrate=False)

    @app.mutation
    async def noop(ctx: durafn.MutationCtx) -> None:
        pass

    try:
        async with app.engine.begin() as conn:
            await conn.run_sync(durafn.metadata.create_all)
        sid = await app.scheduler().run_after(0, noop)
        await app.executor().run_until_idle()
        row = await app.get(sid)
        assert row is not None and row.state is durafn.State.SUCCESS
        assert await app.migrate() == durafn.SCHEMA_VERSION  # and migrate adopts them
    finally:
        await app.aclose()


async def test_an_incomplete_user_managed_schema_is_refused_then_completed(
    db_url: str, clock: FakeClock
) -> None:
    """Tables from an older durafn.metadata (no heartbeat table): a clear error rather
    than workers whose heartbeats fail forever; ``migrate`` adopts and completes them."""
    app = durafn.App(db_url, clock=clock, auto_migrate=False)
    try:
        async with app.engine.begin() as conn:
            await conn.run_sync(durafn.metadata.create_all)
            await conn.execute(text("DROP INDEX ix_scheduled_functions_running"))
            await conn.execute(text("DROP TABLE _durafn_workers"))
        with pytest.raises(durafn.SchemaError, match="missing _durafn_workers"):
            await app.executor().run_until_idle()
        assert await app.migrate() == durafn.SCHEMA_VERSION
        async with app.engine.connect() as conn:
            indexes = await conn.run_sync(
                lambda c: {i["name"] for i in inspect(c).get_indexes("_scheduled_functions")}
            )
        assert "ix_scheduled_functions_running" in indexes
        assert await app.workers() == []
    finally:
        await app.aclose()


async def test_scheduling_through_a_session_before_the_tables_exist(
    db_url: str, clock: FakeClock
) -> None:
    app = durafn.App(db_url, clock=clock)

    @app.mutation
    async def noop(ctx: durafn.MutationCtx) -> None:
        pass

    try:
        async with app.engine.connect() as conn:
            with pytest.raises(durafn.SchemaError, match="durafn migrate"):
                await app.scheduler(conn).run_after(0, noop)
    finally:
        await app.aclose()


TUNED = [f"{k}={v}" for k, v in AUTOVACUUM.items()]


async def _table_options(app: durafn.App) -> list[str] | None:
    async with app.engine.connect() as conn:
        found = await conn.execute(
            text("SELECT reloptions FROM pg_class WHERE relname = '_scheduled_functions'")
        )
        value = found.scalar_one()
        return None if value is None else sorted(value)


async def _back_to(app: durafn.App, version: int, reset: str) -> None:
    async with app.engine.begin() as conn:
        await conn.execute(text(f"ALTER TABLE _scheduled_functions RESET ({reset})"))
        await conn.execute(delete(schema_version))
        await conn.execute(insert(schema_version).values(version=version, applied_at=0))
    await app.aclose()


@pytest.mark.postgres_only  # fillfactor is PostgreSQL's storage setting; SQLite has none
async def test_the_hot_table_leaves_room_for_its_rows_new_versions(postgres_url: str) -> None:
    """A fresh database's ``_scheduled_functions`` has ``fillfactor = 50``; one at version
    22 (without it) gets it from its migration, and keeps its rows."""
    app = durafn.App(postgres_url)
    try:
        await app.migrate()
        assert await _table_options(app) == sorted(["fillfactor=50", *TUNED])
        await _back_to(app, 22, "fillfactor")
        assert await _table_options(app) == sorted(TUNED)
        assert await app.migrate() == durafn.SCHEMA_VERSION
        assert await _table_options(app) == sorted(["fillfactor=50", *TUNED])
    finally:
        await app.aclose()


@pytest.mark.postgres_only  # autovacuum is PostgreSQL's; SQLite has none
async def test_the_hot_table_is_vacuumed_at_thresholds_of_its_own(postgres_url: str) -> None:
    """A fresh database's ``_scheduled_functions`` has its own autovacuum thresholds; one
    at version 23 (without them) gets them from its migration, its fillfactor kept as an
    operator set it."""
    app = durafn.App(postgres_url)
    try:
        await app.migrate()
        assert set(TUNED) <= set(await _table_options(app) or [])
        await _back_to(app, 23, ", ".join(AUTOVACUUM))
        async with app.engine.begin() as conn:  # an operator's own choice, kept
            await conn.execute(text("ALTER TABLE _scheduled_functions SET (fillfactor = 70)"))
        assert await _table_options(app) == ["fillfactor=70"]
        await app.aclose()
        assert await app.migrate() == durafn.SCHEMA_VERSION
        assert await _table_options(app) == sorted(["fillfactor=70", *TUNED])
    finally:
        await app.aclose()
