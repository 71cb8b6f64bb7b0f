"""``durafn.schedule(...)``, the SQL schedule function (PostgreSQL only: SQLite has no
stored procedures; see the workflows guide): a trigger schedules in the user's own
transaction, validation errors are typed and write nothing, and the worker runs what
the function wrote like any row."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import text

import durafn
from durafn import ActionCtx, MutationCtx, State
from durafn.testing import FakeClock

from .support.helpers import row_of

# PostgreSQL only: SQLite has no stored procedures (the workflows guide says what to do).
pytestmark = [pytest.mark.anyio, pytest.mark.postgres_only]

_TRIGGER = [
    "CREATE TABLE orders (id serial PRIMARY KEY, email text NOT NULL)",
    """
CREATE FUNCTION orders_scheduled() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM durafn.schedule(
        'orders:confirm',
        jsonb_build_object('order_id', NEW.id, 'email', NEW.email),
        NULL,
        '{"kind": "action", "priority": -5, "queue": "mail", "flags": ["smtp", "eu"]}'
    );
    RETURN NEW;
END
$$""",
    """
CREATE TRIGGER orders_scheduled AFTER INSERT ON orders
    FOR EACH ROW EXECUTE FUNCTION orders_scheduled()""",
]


async def test_a_trigger_schedules_in_the_user_s_transaction(
    postgres_url: str, clock: FakeClock
) -> None:
    app = durafn.App(postgres_url, clock=clock)
    await app.migrate()
    sent: list[tuple[int, str]] = []

    @app.action(name="orders:confirm")
    async def confirm(ctx: ActionCtx, order_id: int, email: str) -> None:
        sent.append((order_id, email))

    try:
        async with app.engine.begin() as conn:
            for statement in _TRIGGER:
                await conn.execute(text(statement))
        # Rolled back: nothing is scheduled.
        async with app.engine.connect() as conn, conn.begin() as tx:
            await conn.execute(text("INSERT INTO orders (email) VALUES ('lost@example.com')"))
            await tx.rollback()
        assert (await app.list(limit=10)).items == []
        async with app.engine.begin() as conn:
            await conn.execute(text("INSERT INTO orders (email) VALUES ('ada@example.com')"))
        [row] = (await app.list(limit=10)).items
        assert (row.name, row.kind, row.state, row.args) == (
            "orders:confirm",
            durafn.FunctionKind.ACTION,
            State.PENDING,
            {"order_id": 2, "email": "ada@example.com"},
        )
        assert (row.priority, row.queue, row.flags) == (-5, "mail", ["eu", "smtp"])
        assert uuid.UUID(row.id).version == 7
        await app.executor().run_until_idle()
        assert sent == [(2, "ada@example.com")]
        assert (await row_of(app, row.id)).state is State.SUCCESS
    finally:
        async with app.engine.begin() as conn:
            await conn.execute(text("DROP TABLE IF EXISTS orders"))
            await conn.execute(text("DROP FUNCTION IF EXISTS orders_scheduled()"))
        await app.aclose()


def test_the_sql_functions_notify_the_executors_channel() -> None:
    from durafn._store.postgres import functions, schedule_function
    from durafn._store.postgres.multirow import CHANNEL

    assert f"pg_notify('{CHANNEL}'" in schedule_function.FUNCTION
    assert f"pg_notify('{CHANNEL}'" in functions.RELEASE_DEPENDENTS


async def test_bad_input_is_a_typed_sql_error_and_writes_nothing(
    postgres_url: str, clock: FakeClock
) -> None:
    app = durafn.App(postgres_url, clock=clock)
    await app.migrate()

    @app.mutation(name="jobs:tally")
    async def tally(ctx: MutationCtx, n: int = 1) -> int:
        return n

    import asyncpg

    conn = await asyncpg.connect(postgres_url.replace("+asyncpg", ""))
    try:
        cases = [
            ("''", "'{}'", "name must be a function's durable name"),
            ("'x'", "'[1]'", "args must be a JSON object"),
            ("'x'", "'{}', NULL, '{\"key\": \"k\"}'", r"unsupported option\(s\) key"),
            ("'x'", "'{}', NULL, '{\"kind\": \"query\"}'", 'kind must be "action" or "mutation"'),
            ("'x'", "'{}', NULL, '{\"priority\": 2147483648}'", "priority must be an integer"),
            ("'x'", "'{}', NULL, '{\"priority\": 1.5}'", "priority must be an integer"),
            ("'x'", "'{}', NULL, '{\"priority\": \"1\"}'", "priority must be an integer"),
            ("'x'", "'{}', NULL, '{\"queue\": \"\"}'", "queue must be a non-empty name"),
            ("'x'", "'{}', NULL, '{\"queue\": \"a,b\"}'", "has a comma or a space at an end"),
            ("'x'", "'{}', NULL, '{\"queue\": \"a \"}'", "has a comma or a space at an end"),
            ("'x'", "'{}', NULL, '{\"queue\": \"\\ta\"}'", "has a comma or a space at an end"),
            ("'x'", "'{}', NULL, '{\"flags\": \"a\"}'", "flags must be an array"),
            ("'x'", "'{}', NULL, '{\"flags\": [\"a b\"]}'", "is not a flag"),
        ]
        for name, rest, message in cases:
            with pytest.raises(asyncpg.InvalidParameterValueError, match=message):
                await conn.execute(f"SELECT durafn.schedule({name}, {rest})")
        # Both ends of the priority range; an unknown name is written (the worker fails it).
        low = await conn.fetchval(
            "SELECT durafn.schedule('jobs:tally', '{\"n\": 3}', NULL, "
            '\'{"kind": "mutation", "priority": -2147483648}\')'
        )
        await conn.fetchval(
            "SELECT durafn.schedule('jobs:nobody', '{}', now() + interval '1 hour', "
            "'{\"priority\": 2147483647}')"
        )
    finally:
        await conn.close()
    rows = (await app.list(limit=10)).items
    assert sorted(r.priority for r in rows) == [-(2**31), 2**31 - 1]
    await app.executor().run_until_idle()
    done = await row_of(app, str(low))
    assert (done.state, done.result) == (State.SUCCESS, 3)
    await app.aclose()


async def test_a_batched_action_scheduled_from_sql_runs_as_a_batch_of_one(
    postgres_url: str, clock: FakeClock
) -> None:
    """SQL cannot see the registry, so its row has no batch key: it runs alone, through
    the same function, as a list of one."""
    app = durafn.App(postgres_url, clock=clock)
    await app.migrate()
    calls: list[list[int]] = []

    @app.action(name="sql:batched", batch=durafn.Batch(max_size=10, max_wait=60))
    async def batched(ctx: ActionCtx, items: list[int]) -> list[int]:
        calls.append(items)
        return [i + 1 for i in items]

    try:
        async with app.engine.begin() as conn:
            await conn.execute(
                text("SELECT durafn.schedule('sql:batched', '{\"item\": 41}', NULL, '{}')")
            )
        await app.executor().run_until_idle()
        [row] = (await app.list(name="sql:batched")).items
        assert (calls, row.state, row.result) == ([[41]], State.SUCCESS, 42)
    finally:
        await app.aclose()


async def test_a_parameter_left_out_takes_its_default_and_null_options_are_none(
    postgres_url: str, clock: FakeClock
) -> None:
    """The issue's case: a row scheduled from SQL that left out ``loud`` failed with
    ``loud: Field required``, where ``run_after`` stored the default. And ``options =>
    NULL`` was refused as not a JSON object: it means no options, as ``'{}'`` does."""
    app = durafn.App(postgres_url, clock=clock)
    await app.migrate()
    heard: list[tuple[str, bool]] = []

    @app.action(name="r:greet")
    async def greet(ctx: ActionCtx, name: str, loud: bool = False) -> None:
        heard.append((name, loud))

    try:
        async with app.engine.begin() as conn:
            quiet = (
                await conn.execute(
                    text("SELECT durafn.schedule('r:greet', '{\"name\": \"ada\"}', NULL, NULL)")
                )
            ).scalar_one()
            await conn.execute(
                text(
                    "SELECT durafn.schedule(name => 'r:greet', "
                    'args => \'{"name": "bob", "loud": true}\', options => NULL)'
                )
            )
        row = await row_of(app, str(quiet))
        assert (row.kind, row.priority, row.queue, row.flags, row.args) == (
            durafn.FunctionKind.ACTION,
            0,
            None,
            [],
            {"name": "ada"},
        )
        await app.executor().run_until_idle()
        assert sorted(heard) == [("ada", False), ("bob", True)]
        assert (await row_of(app, str(quiet))).state is State.SUCCESS
    finally:
        await app.aclose()
