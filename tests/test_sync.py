"""``app.sync``: scheduling from synchronous code, in the caller's own transaction (a
SQLAlchemy ``Session`` or ``Connection`` on psycopg 3 or the standard ``sqlite3``) or on
its own, and reading; from threads with no event loop. Both engines. (Django's and
Flask's routes: ``test_sync_frameworks.py``.)"""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import anyio
import anyio.to_thread
import asyncpg
import pytest
from sqlalchemy import create_engine, insert, select
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session, scoped_session, sessionmaker

import durafn
from durafn import ActionCtx, MutationCtx, State
from durafn.testing import FakeClock

from .conftest import PG_DATABASE, require_postgres
from .support.helpers import CEILING
from .support.models import Effect
from .support.processes import owned

pytestmark = pytest.mark.anyio

T = TypeVar("T")


def sync_url(app: durafn.App) -> str:
    """The app's database, as a synchronous driver reaches it."""
    url = app._rt.driver.url
    driver = "sqlite+pysqlite" if url.get_backend_name() == "sqlite" else "postgresql+psycopg"
    return url.set(drivername=driver).render_as_string(hide_password=False)


@pytest.fixture
def user_engine(app: durafn.App) -> Iterator[Engine]:
    """The user's own synchronous engine on the app's database."""
    engine = create_engine(sync_url(app), connect_args=_busy(app))
    yield engine
    engine.dispose()


def _busy(app: durafn.App) -> dict[str, Any]:
    return {"timeout": 30} if app.dialect == "SQLite" else {}


async def in_thread(fn: Callable[[], T]) -> T:
    """``fn()`` in a worker thread, which has no event loop (as a WSGI server's)."""
    return await anyio.to_thread.run_sync(fn)


def _register(app: durafn.App) -> tuple[durafn.MutationRef[[int], int], Any]:
    @app.mutation(name="sync:double")
    async def double(ctx: MutationCtx, n: int) -> int:
        return 2 * n

    @app.action(name="sync:note")
    async def note(ctx: ActionCtx, text: str, count: int = 1) -> str:
        return text * count

    return double, note


async def _effects(app: durafn.App) -> list[str]:
    async with app.engine.connect() as conn:
        return sorted((await conn.execute(select(Effect.key))).scalars())


async def test_a_session_commit_writes_the_row_with_the_users_writes(
    app: durafn.App, user_engine: Engine
) -> None:
    double, _ = _register(app)

    def request() -> durafn.ScheduledFunctionId:
        with Session(user_engine) as session, session.begin():
            session.add(Effect(key="order-1"))
            return app.sync.scheduler(session).run_after(0, double, 21)

    sid = await in_thread(request)
    row = await app.get(sid)
    assert row is not None and row.state is State.PENDING and row.args == {"n": 21}
    assert await _effects(app) == ["order-1"]
    assert await app.executor().run_until_idle() == 1
    assert (await app.get(sid)).result == 42  # type: ignore[union-attr]


async def test_a_session_rollback_writes_nothing(app: durafn.App, user_engine: Engine) -> None:
    double, _ = _register(app)
    ids: list[durafn.ScheduledFunctionId] = []

    def request() -> None:
        with Session(user_engine) as session, session.begin():
            session.add(Effect(key="order-2"))
            ids.append(app.sync.scheduler(session).run_after(0, double, 1))
            raise LookupError("the view failed")

    with pytest.raises(LookupError):
        await in_thread(request)
    assert await app.get(ids[0]) is None
    assert await _effects(app) == []
    assert await app.executor().run_until_idle() == 0


async def test_a_connection_commits_and_rolls_back_its_rows(
    app: durafn.App, user_engine: Engine
) -> None:
    double, _ = _register(app)

    def request(fail: bool) -> durafn.ScheduledFunctionId:
        with user_engine.connect() as conn:
            conn.execute(insert(Effect).values(key=f"c-{fail}"))
            sid = app.sync.scheduler(conn).run_at(datetime.now(UTC), double, 3)
            if fail:
                conn.rollback()
            else:
                conn.commit()
            return sid

    kept, dropped = await in_thread(lambda: request(False)), await in_thread(lambda: request(True))
    assert (await app.get(kept)) is not None
    assert await app.get(dropped) is None
    assert await _effects(app) == ["c-False"]


async def test_a_scoped_session_is_looked_up_at_each_call(
    app: durafn.App, user_engine: Engine
) -> None:
    """Flask-SQLAlchemy's ``db.session`` is a ``scoped_session``: a scheduler made from it
    once writes through the session of the current scope (here, the thread)."""
    double, _ = _register(app)
    sessions = scoped_session(sessionmaker(user_engine))
    scheduler = app.sync.scheduler(sessions)

    def request(n: int) -> durafn.ScheduledFunctionId:
        try:
            sessions.add(Effect(key=f"s-{n}"))
            sid = scheduler.run_after(0, double, n)
            sessions.commit()
            return sid
        finally:
            sessions.remove()

    first, second = await in_thread(lambda: request(1)), await in_thread(lambda: request(2))
    assert {r.id for r in (await app.list()).items} == {first, second}
    assert await _effects(app) == ["s-1", "s-2"]


async def test_the_sync_scheduler_checks_as_the_async_one_does(
    app: durafn.App, user_engine: Engine
) -> None:
    """The same validation (pydantic at schedule time), options and errors."""
    double, note = _register(app)

    def attempts() -> list[str]:
        seen = []
        with Session(user_engine) as session, session.begin():
            scheduler = app.sync.scheduler(session)
            for bad in (
                lambda: scheduler.run_after(0, double, "not a number"),  # type: ignore[call-overload]
                lambda: scheduler.run_after(-1, double, 1),
                lambda: scheduler.run_at(datetime(2030, 1, 1), double, 1),
                lambda: scheduler.run_after(0, "no:such", 1),
                lambda: scheduler.run_many([double.call(1), double.call(1)][0]),  # type: ignore[arg-type]
                lambda: scheduler.cancel("not-an-id"),
            ):
                try:
                    bad()
                except durafn.DurafnError as exc:
                    seen.append(type(exc).__name__)
            ids = scheduler.run_many(
                [
                    note.call("a", count=2),
                    note.options(priority=5, key="k-1").call("b").after(timedelta(minutes=1)),
                ]
            )
            seen.append(str(len(ids)))
        return seen

    assert await in_thread(attempts) == [
        "ArgumentError",
        "SchedulingError",
        "SchedulingError",
        "UnknownFunctionError",
        "SchedulingError",
        "NotFoundError",
        "2",
    ]
    rows = {r.name: r for r in (await app.list(name="sync:note")).items}
    assert len((await app.list()).items) == 2
    keyed = [r for r in rows.values() if r.key == "k-1"]
    assert keyed and keyed[0].priority == 5


async def test_a_sync_cancel_commits_with_the_transaction(
    app: durafn.App, user_engine: Engine
) -> None:
    double, _ = _register(app)
    sid = await app.scheduler().run_after(60, double, 1)

    def cancel(commit: bool) -> durafn.CancelResult:
        with Session(user_engine) as session:
            result = app.sync.scheduler(session).cancel(sid)
            if commit:
                session.commit()
            else:
                session.rollback()
            return result

    assert (await in_thread(lambda: cancel(False))).canceled
    assert (await app.get(sid)).state is State.PENDING  # type: ignore[union-attr]
    assert (await in_thread(lambda: cancel(True))).canceled
    assert (await app.get(sid)).state is State.CANCELED  # type: ignore[union-attr]


async def test_direct_calls_commit_on_their_own_and_read(app: durafn.App, clock: FakeClock) -> None:
    """``app.sync.run_after`` and the reads, from a thread with no event loop."""
    double, _ = _register(app)

    def work() -> tuple[Any, ...]:
        sid = app.sync.run_after(30, double, 4)
        found = app.sync.get(sid)
        page = app.sync.list(name="sync:double")
        why = app.sync.explain(sid)
        many = app.sync.run_many([double.call(5), double.call(6).after(10)])
        canceled = app.sync.cancel(many[1])
        return sid, found, page, why, many, canceled

    sid, found, page, why, many, canceled = await in_thread(work)
    assert found is not None and found.state is State.PENDING and found.args == {"n": 4}
    assert [r.id for r in page.items] == [sid]
    assert why.reason == "not_due"
    assert canceled.canceled and canceled.previous_state is State.PENDING
    assert (await app.get(many[0])).state is State.PENDING  # type: ignore[union-attr]
    with pytest.raises(durafn.NotFoundError):
        await in_thread(lambda: app.sync.explain("01a236e0-bdcf-7000-8000-005729ed3e6c"))
    clock.advance(30)
    assert await app.executor().run_until_idle() == 2


async def test_a_commit_wakes_the_executor_of_the_process(
    app: durafn.App, user_engine: Engine
) -> None:
    """An executor that would not poll for an hour runs the row at once: the commit
    wakes it (on its event loop, from the request's thread)."""
    double, _ = _register(app)

    def request() -> durafn.ScheduledFunctionId:
        with Session(user_engine) as session, session.begin():
            return app.sync.scheduler(session).run_after(0, double, 5)

    async with app.run_executor(poll_interval=3600) as executor:
        sid = await in_thread(request)
        row = await executor.wait_for(sid, timeout=CEILING)
    assert row.state is State.SUCCESS and row.result == 10


async def test_a_session_on_another_engine_is_refused(app: durafn.App, tmp_path: Any) -> None:
    other = create_engine(
        f"sqlite+pysqlite:///{tmp_path / 'other.db'}"
        if app.dialect == "PostgreSQL"
        else f"postgresql+psycopg://postgres@127.0.0.1:5432/{PG_DATABASE}"
    )
    double, _ = _register(app)
    if app.dialect == "SQLite":
        require_postgres()  # the other engine's server
    with Session(other) as session, pytest.raises(durafn.ArgumentError, match="must be written"):
        app.sync.scheduler(session).run_after(0, double, 1)
    with pytest.raises(durafn.ArgumentError, match=r"from async code use app\.scheduler"):
        app.sync.scheduler(app.engine.connect())
    other.dispose()


@pytest.mark.postgres_only  # LISTEN/NOTIFY exists only on PostgreSQL; SQLite polls
@pytest.mark.parametrize("engine_name", ["postgres"])
async def test_the_notify_is_in_the_users_transaction(app: durafn.App, user_engine: Engine) -> None:
    """PostgreSQL: the NOTIFY that wakes other processes' workers is sent by the commit
    of the user's transaction, never by a rollback. (Notifications arrive in commit
    order: the marker sent after both says that nothing else came.)"""
    double, _ = _register(app)
    received: list[str] = []
    marker = anyio.Event()
    dsn = app._rt.driver.url.set(drivername="postgresql")
    listener = await asyncpg.connect(dsn.render_as_string(hide_password=False))

    def heard(_c: Any, _pid: int, _channel: str, payload: str) -> None:
        received.append(payload)
        if payload == "marker":
            marker.set()

    await listener.add_listener("durafn_wakeup", heard)
    try:

        def request(fail: bool) -> None:
            with Session(user_engine) as session, session.begin():
                app.sync.scheduler(session).run_after(0, double, 1)
                if fail:
                    raise LookupError

        with pytest.raises(LookupError):
            await in_thread(lambda: request(True))
        await in_thread(lambda: request(False))
        await listener.execute("SELECT pg_notify('durafn_wakeup', 'marker')")
        with anyio.fail_after(CEILING):
            await marker.wait()
        assert received == ["mutation", "marker"]
    finally:
        await listener.close()


@pytest.mark.parametrize("then", ["hold", "commit"])
async def test_a_kill_9_before_the_commit_leaves_nothing_after_it_the_row(
    app: durafn.App, then: str
) -> None:
    """The process dies (SIGKILL) in the request's thread: before its commit, neither the
    effect nor the row exists; after it, both do, and a worker runs the row. There is no
    moment between the two."""
    _register(app)
    url = app._rt.driver.url.render_as_string(hide_password=False)
    async with owned() as owner:
        proc = await owner.start(
            [sys.executable, "-m", "tests.apps.sync_request", url, sync_url(app), then],
            stdout=subprocess.PIPE,
        )
        assert proc.stdout is not None
        line = b""
        with anyio.fail_after(CEILING):
            while not line.endswith(b"\n"):
                line += await proc.stdout.receive()
        said, sid = line.decode().split()
        assert said == then
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
    row = await app.get(sid)
    if then == "hold":
        assert row is None and await _effects(app) == []
        return
    assert row is not None and row.state is State.PENDING
    assert await _effects(app) == ["killed-commit"]
    assert await app.executor().run_until_idle() == 1
    assert (await app.get(sid)).result == 14  # type: ignore[union-attr]
