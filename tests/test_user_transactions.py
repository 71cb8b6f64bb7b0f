"""What user code may do to ``ctx.db`` and its own errors, inside a batch of mutations and
in direct calls: the mutation's own fate is decided, its neighbours keep theirs, and
nothing is applied twice."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from sqlalchemy import insert, select
from sqlalchemy.exc import IntegrityError

import durafn
from durafn import MutationCtx, State
from durafn.testing import all_rows

from .support.helpers import count
from .support.models import Effect

pytestmark = pytest.mark.anyio


async def _effect_keys(app: durafn.App) -> list[str]:
    async with app.engine.connect() as conn:
        return sorted((await conn.execute(select(Effect.key))).scalars())


async def _take_key(app: durafn.App, key: str) -> None:
    """Insert an effect up front, so that a mutation inserting the same key fails."""
    async with app.engine.begin() as conn:
        await conn.execute(insert(Effect).values(key=key))


async def _run_batch(
    app: durafn.App, fn: durafn.MutationRef[[int], Any], n: int
) -> list[durafn.ScheduledFunctionId]:
    ids = [await app.scheduler().run_after(0, fn, i) for i in range(n)]
    assert await app.executor(batch_size=64).run_until_idle() == n
    return ids


async def test_a_caught_failed_flush_fails_only_that_mutation(app: durafn.App) -> None:
    """Catching an IntegrityError leaves SQLAlchemy's transaction rolled back: the mutation
    cannot succeed (its earlier writes are gone), so it is Failed with TransactionError;
    the rest of its batch commits, each effect once."""
    await _take_key(app, "taken")

    @app.mutation
    async def write(ctx: MutationCtx, n: int) -> str:
        ctx.db.add(Effect(key=f"e{n}"))
        await ctx.db.flush()
        if n == 2:
            ctx.db.add(Effect(key="taken"))
            try:
                await ctx.db.flush()
            except IntegrityError:
                return "swallowed"
        return "ok"

    ids = await _run_batch(app, write, 5)
    rows = {r.id: r for r in await all_rows(app)}
    assert rows[ids[2]].state is State.FAILED
    error = rows[ids[2]].error
    assert error is not None
    assert error.type == "durafn.TransactionError"
    assert "rolled back or committed its own transaction" in error.message
    assert [rows[i].state for i in ids if i != ids[2]] == [State.SUCCESS] * 4
    assert await _effect_keys(app) == ["e0", "e1", "e3", "e4", "taken"]


async def test_a_savepoint_lets_a_mutation_recover_from_its_own_error(app: durafn.App) -> None:
    """The supported way to try a write: ``ctx.db.begin_nested()`` rolls back only it."""
    await _take_key(app, "taken")

    @app.mutation
    async def write(ctx: MutationCtx, n: int) -> str:
        ctx.db.add(Effect(key=f"e{n}"))
        await ctx.db.flush()
        try:
            async with ctx.db.begin_nested():
                ctx.db.add(Effect(key="taken"))
        except IntegrityError:
            return "recovered"
        return "inserted"

    ids = await _run_batch(app, write, 3)
    rows = {r.id: r for r in await all_rows(app)}
    assert [(rows[i].state, rows[i].result) for i in ids] == [(State.SUCCESS, "recovered")] * 3
    assert await _effect_keys(app) == ["e0", "e1", "e2", "taken"]


async def test_ctx_db_rollback_fails_the_mutation_not_its_batch(app: durafn.App) -> None:
    @app.mutation
    async def write(ctx: MutationCtx, n: int) -> None:
        ctx.db.add(Effect(key=f"e{n}"))
        await ctx.db.flush()
        if n == 1:
            await ctx.db.rollback()

    ids = await _run_batch(app, write, 3)
    states = {r.id: r.state for r in await all_rows(app)}
    assert [states[i] for i in ids] == [State.SUCCESS, State.FAILED, State.SUCCESS]
    assert await _effect_keys(app) == ["e0", "e2"]
    with pytest.raises(durafn.TransactionError, match="raise an exception to abort"):
        await app.run_mutation(write, n=1)
    assert await _effect_keys(app) == ["e0", "e2"]


async def test_ctx_db_commit_does_not_commit_early(app: durafn.App) -> None:
    """The mutation's writes still commit with its row, or not at all."""

    @app.mutation
    async def commit_then_fail(ctx: MutationCtx, n: int) -> None:
        ctx.db.add(Effect(key=f"e{n}"))
        await ctx.db.commit()
        if n % 2:
            raise ValueError("after commit")

    ids = await _run_batch(app, commit_then_fail, 4)
    states = {r.id: r.state for r in await all_rows(app)}
    assert [states[i] for i in ids] == [State.SUCCESS, State.FAILED] * 2
    assert await _effect_keys(app) == ["e0", "e2"]
    with pytest.raises(ValueError, match="after commit"):
        await app.run_mutation(commit_then_fail, n=9)
    assert await count(app, Effect) == 2


async def test_a_nul_byte_in_an_error_message_is_recorded(app: durafn.App) -> None:
    """PostgreSQL text cannot hold NUL; the failure is still recorded, its neighbours too."""

    @app.mutation
    async def fail(ctx: MutationCtx, n: int) -> None:
        ctx.db.add(Effect(key=f"e{n}"))
        if n == 1:
            raise ValueError("bad\x00byte")

    ids = await _run_batch(app, fail, 3)
    rows = {r.id: r for r in await all_rows(app)}
    assert [rows[i].state for i in ids] == [State.SUCCESS, State.FAILED, State.SUCCESS]
    error = rows[ids[1]].error
    assert error is not None and (error.type, error.message) == ("ValueError", "bad\\x00byte")
    assert error.traceback is not None and "\x00" not in error.traceback  # PostgreSQL text


@pytest.mark.parametrize("error", [TimeoutError("mine"), OSError("mine too")], ids=repr)
async def test_a_users_own_errors_are_raised_unchanged_and_not_retried(
    app: durafn.App, error: Exception
) -> None:
    """Errors that look like a lost connection, raised by the user's code, are the
    user's: not retried (which would run the mutation again) and not wrapped."""
    calls = 0

    @app.mutation
    async def raises(ctx: MutationCtx, n: int) -> None:
        nonlocal calls
        calls += 1
        ctx.db.add(Effect(key=f"e{n}"))
        raise error

    with pytest.raises(type(error)) as caught:
        await app.run_mutation(raises, n=0)
    assert caught.value is error
    assert calls == 1
    assert await count(app, Effect) == 0


async def test_a_users_own_fail_after_is_not_a_durafn_timeout(app: durafn.App) -> None:
    @app.mutation
    async def impatient(ctx: MutationCtx) -> None:
        with anyio.fail_after(0):
            await anyio.sleep(1)

    with pytest.raises(TimeoutError) as caught:
        await app.run_mutation(impatient)
    assert not isinstance(caught.value, durafn.FunctionTimeoutError)


@pytest.mark.parametrize("with_failure", [False, True], ids=["optimistic", "savepoints"])
async def test_a_savepoint_left_open_fails_only_that_mutation(
    app: durafn.App, with_failure: bool
) -> None:
    """An unclosed begin_nested() would swallow the writes that follow it: the mutation
    that left it open is Failed, and its neighbours' writes all commit."""

    @app.mutation
    async def write(ctx: MutationCtx, n: int) -> None:
        ctx.db.add(Effect(key=f"e{n}"))
        await ctx.db.flush()
        if n == 0 and with_failure:
            raise ValueError("forces the savepoint mode")
        if n == 1:
            await ctx.db.begin_nested()

    ids = await _run_batch(app, write, 4)
    rows = {r.id: r for r in await all_rows(app)}
    error = rows[ids[1]].error
    assert error is not None and error.type == "durafn.TransactionError"
    assert [rows[i].state for i in ids[2:]] == [State.SUCCESS] * 2
    assert await _effect_keys(app) == (["e2", "e3"] if with_failure else ["e0", "e2", "e3"])
