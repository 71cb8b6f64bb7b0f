"""The half of the driver that is about the engine rather than the rows: building it,
classifying its errors, read-only transactions, wake-ups across processes, and creating or
checking the schema. ``Driver`` (the statements on the rows) builds on it; ``SQLiteDriver``
and ``PostgresDriver`` override its hooks.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Collection, Sequence
from contextlib import asynccontextmanager
from typing import Any, ClassVar

from sqlalchemy import exc as sa_exc
from sqlalchemy import func, insert, select
from sqlalchemy import inspect as sa_inspect
from sqlalchemy.engine import URL, Connection, Engine
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from .._errors import DatabaseError, SchemaError
from .._kinds import FunctionKind
from .rows import NewRowColumns
from .schema.migrations import MIGRATIONS, install_functions
from .schema.tables import SCHEMA_VERSION, metadata, schema_version, sf
from .sql import missing_sql


class EngineDriver:
    """How durafn talks to one engine. Subclasses set the class attributes and override
    the hooks."""

    name: ClassVar[str]
    max_mutation_lanes: ClassVar[int]
    """How many mutation batches may usefully run at once (SQLite has one writer)."""
    default_poll_interval: ClassVar[float]
    """Fallback poll for work scheduled by other processes that no signal announced."""
    auto_migrate: ClassVar[bool]
    """Create the system tables on first use (an embedded database), or require
    ``durafn migrate`` (a shared server, whose schema changes deliberately)."""
    default_max_connections: ClassVar[int]
    """The most connections an app's pool opens at once unless ``App(max_connections=)``
    says otherwise."""

    lateral_claims: ClassVar[bool] = False
    """The engine has LATERAL joins: the claim's fast path reads every priority level."""
    dialect_insert: ClassVar[Callable[..., Any]]
    """The dialect's ``insert`` construct (it has the upsert clauses)."""
    read_only_options: ClassVar[dict[str, Any]] = {}
    """Execution options for a read-only transaction's connection: on SQLite, what makes
    its driver begin DEFERRED (``read_only`` then makes the transaction refuse writes)."""
    single_statement_options: ClassVar[dict[str, Any]] = {}
    """Execution options for a transaction that is one statement: on PostgreSQL,
    autocommit, which saves the BEGIN and COMMIT round trips."""

    def __init__(self, url: URL) -> None:
        self.url = url
        if lacking := self.lacks():
            raise DatabaseError(
                f"durafn cannot run on {url.get_backend_name()}: its driver "
                f"{type(self).__name__} lacks {', '.join(lacking)} (interface.Dialect "
                "lists what a dialect must provide)"
            )
        self.migrated_functions = False
        """The database has this version's SQL functions and triggers, made by
        ``migrate`` (found at this version, or migrated by this app). Tables created from
        ``durafn.metadata`` by the user's own migrations have none: the hot finish on
        PostgreSQL then leaves the release of dependents to the trigger, as it can."""

    def lacks(self) -> list[str]:
        """What this driver's dialect must provide and does not (``MUST_PROVIDE``, and
        SQL for every element of ``sql.py``)."""
        cls = type(self)
        missing = [
            name
            for name in MUST_PROVIDE
            if not hasattr(cls, name) or getattr(cls, name) is getattr(EngineDriver, name, None)
        ]
        return missing + [f"SQL for {e}" for e in missing_sql(self.url.get_backend_name())]

    async def try_lock(self, conn: AsyncConnection, name: str) -> bool:
        """Take the lock ``name`` for the rest of ``conn``'s transaction, unless another
        transaction holds it (then False, at once). SQLite's one writer holds them all."""
        return True

    async def insert_rows(
        self,
        conn: AsyncConnection,
        rows: Sequence[NewRowColumns],
        notify: Collection[FunctionKind] = (),
    ) -> None:
        """Insert rows (their keys are ``NEW_ROW_COLUMNS``), and ``notify`` executors of
        these kinds when this commits: each dialect's own one-statement form."""
        raise NotImplementedError

    # -- engine and errors ---------------------------------------------------------------

    def create_engine(self, max_connections: int) -> AsyncEngine:
        """The app's engine: a pool that opens at most ``max_connections`` at once."""
        raise NotImplementedError

    def create_sync_engine(self, max_connections: int) -> Engine:
        """``app.sync``'s engine on the same database, its driver a synchronous one, set up
        as ``create_engine``'s (``_sync_runtime.py``). A dialect may go without: its apps
        then schedule from async code only."""
        raise DatabaseError(
            f"durafn has no synchronous driver for {self.url.get_backend_name()}: "
            "schedule from async code (app.scheduler(...))"
        )

    def require_existing(self) -> None:
        """Raise SchemaError if connecting would create the database rather than open it."""

    def is_transient(self, exc: BaseException, *, raised_by_user: bool = False) -> bool:
        """True for faults that retrying the whole transaction can cure.

        ``raised_by_user``: the exception came out of a user's function, where a bare
        OSError is the user's own (a missing file), not a database fault.
        """
        if isinstance(exc, sa_exc.DBAPIError):
            return bool(exc.connection_invalidated) or self._transient_dbapi(exc)
        return not raised_by_user and isinstance(exc, OSError)

    def _transient_dbapi(self, exc: sa_exc.DBAPIError) -> bool:
        return False

    def is_driver_error(self, exc: BaseException) -> bool:
        """An error the database driver raised without SQLAlchemy wrapping it (some
        connect-time failures), so that it reaches users as a DatabaseError."""
        return False

    def is_disconnect(self, exc: BaseException) -> bool:
        """True if the fault means the database is unreachable (not merely busy)."""
        if isinstance(exc, sa_exc.DBAPIError):
            return bool(exc.connection_invalidated)
        return isinstance(exc, OSError)

    def commit_outcome_unknown(self, exc: BaseException) -> bool:
        """True if a COMMIT that raised ``exc`` may nonetheless have taken effect."""
        return False

    async def dispose(self, engine: AsyncEngine) -> None:
        """Close the engine's connections (and whatever the driver runs beside them)."""
        await engine.dispose()

    async def statement_handle(self, conn: AsyncConnection) -> Any:
        """What ``abandon`` needs to stop the statement ``conn`` runs, taken before user
        code runs: a cancelled await leaves ``conn`` invalidated, with no way back to the
        driver's connection, while the statement itself goes on (holding its locks)."""
        return None

    async def abandon(self, conn: AsyncConnection, handle: Any) -> None:
        """Stop the statement a timed-out mutation left running on ``conn`` (``handle``
        from ``statement_handle``), so that its transaction rolls back and its locks go
        now, not when the statement ends; then drop the connection."""
        await conn.invalidate()

    def translate(self, exc: BaseException) -> BaseException | None:
        """A durafn error for a driver error users could cause (writing in a query)."""
        return None

    def wrap(self, exc: BaseException, doing: str) -> DatabaseError:
        transient = self.is_transient(exc)
        detail = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0]
        return DatabaseError(
            f"database error while {doing} on {self.name}: {detail}", transient=transient
        )

    # -- transactions and wake-ups -------------------------------------------------------

    @asynccontextmanager
    async def read_only(self, conn: AsyncConnection) -> AsyncIterator[None]:
        """Make the transaction just begun on ``conn`` refuse writes."""
        yield

    async def notify(self, conn: AsyncConnection, kinds: Collection[FunctionKind]) -> None:
        """Tell executors in other processes, on commit, that rows of ``kinds`` were added."""

    async def wake_freed(self, conn: AsyncConnection, ids: Collection[str]) -> int:
        """After the commits that deleted edges of ``ids`` (rows waiting for others:
        ``AfterCommit.maybe_freed``), on a connection in autocommit: leave those with an
        edge nobody is deleting, wait for the finishes still deleting the others' edges,
        then tell every executor (NOTIFY) if any of them has none left; returns how many
        have none. Only PostgreSQL's finish notes such rows (``schema/dependencies.py``)."""
        return 0

    @asynccontextmanager
    async def listen(
        self,
        engine: AsyncEngine,
        on_wake: Callable[[Collection[FunctionKind]], None],
        on_cancel: Callable[[list[str]], None],
    ) -> AsyncIterator[bool]:
        """Deliver other processes' wake-ups to ``on_wake`` and the ids of rows they
        cancelled to ``on_cancel``; yields whether it can."""
        yield False

    # -- schema --------------------------------------------------------------------------

    async def _lock_schema(self, conn: AsyncConnection) -> None:
        """Serialise concurrent migrations."""

    async def migrate(self, conn: AsyncConnection, now: float) -> int:
        """Create or upgrade the system tables; returns the version now in place."""
        await self._lock_schema(conn)
        await conn.run_sync(lambda c: schema_version.create(c, checkfirst=True))
        current = await self._current_version(conn)
        if current is not None and current > SCHEMA_VERSION:
            raise _too_new(current)
        if current is None:
            await conn.run_sync(self._create_all)
            await conn.execute(
                insert(schema_version).values(version=SCHEMA_VERSION, applied_at=now)
            )
            self.migrated_functions = True
            return SCHEMA_VERSION
        for version in range(current + 1, SCHEMA_VERSION + 1):
            await conn.run_sync(MIGRATIONS[version], self)
            await conn.execute(insert(schema_version).values(version=version, applied_at=now))
        self.migrated_functions = True
        return SCHEMA_VERSION

    async def check_schema(self, conn: AsyncConnection) -> None:
        missing = SchemaError(
            "the durafn system tables do not exist in this database; run "
            "`durafn migrate --url ...` or `await app.migrate()` first"
        )
        try:
            current = await self._current_version(conn)
        except sa_exc.DBAPIError as exc:
            if self.is_transient(exc):
                raise
            raise missing from None
        if current is None:
            existing = await conn.run_sync(lambda c: set(sa_inspect(c).get_table_names()))
            if sf.name not in existing:
                raise missing
            # Created from durafn.metadata by the user's own migrations (Alembic): the
            # version table is there but empty; the schema is theirs to manage, but it
            # must be the whole of this version's (say, after upgrading durafn).
            if absent := sorted(set(metadata.tables) - existing):
                raise SchemaError(
                    f"the durafn system tables are incomplete for this durafn (missing "
                    f"{', '.join(absent)}): regenerate your migration from durafn.metadata, "
                    "or run `durafn migrate` to adopt and complete them"
                )
            return
        if current > SCHEMA_VERSION:
            raise _too_new(current)
        if current < SCHEMA_VERSION:
            raise SchemaError(
                f"the durafn system tables are at version {current}, this durafn needs "
                f"{SCHEMA_VERSION}; run `durafn migrate`"
            )
        self.migrated_functions = True

    def _create_all(self, conn: Connection) -> None:
        # Indexes too: tables a user created from an older durafn.metadata (Alembic) and
        # that ``migrate`` now adopts may lack this version's, and create_all skips
        # existing tables.
        metadata.create_all(conn, checkfirst=True)
        for table in metadata.tables.values():
            for index in table.indexes:
                index.create(conn, checkfirst=True)
        install_functions(conn, self)
        self.set_storage(conn)
        self.set_autovacuum(conn)

    # -- the schema's SQL each engine writes its own way (``migrations.SchemaDialect``) ----

    def install_release_trigger(self, conn: Connection) -> None:
        raise NotImplementedError

    def install_release_functions(self, conn: Connection) -> None:
        """The hot finish's functions (only PostgreSQL's finish has them)."""

    def install_schedule_function(self, conn: Connection) -> None:
        """``durafn.schedule`` in SQL (only PostgreSQL has it)."""

    def add_seq_column(self, conn: Connection) -> None:
        raise NotImplementedError

    def set_storage(self, conn: Connection) -> None:
        """The hot table's storage settings (PostgreSQL's fillfactor)."""

    def set_autovacuum(self, conn: Connection) -> None:
        """The hot table's autovacuum thresholds (PostgreSQL's)."""

    async def _current_version(self, conn: AsyncConnection) -> int | None:
        version = (await conn.execute(select(func.max(schema_version.c.version)))).scalar()
        return None if version is None else int(version)


MUST_PROVIDE = (
    "name",
    "max_mutation_lanes",
    "default_poll_interval",
    "auto_migrate",
    "default_max_connections",
    "dialect_insert",
    "create_engine",
    "insert_rows",
    "install_release_trigger",
    "add_seq_column",
)
"""What a dialect's driver must define (``interface.Dialect``: the rest it may)."""


def _too_new(version: int) -> SchemaError:
    return SchemaError(
        f"the durafn system tables are at version {version}, newer than this durafn "
        f"understands ({SCHEMA_VERSION}); upgrade durafn before running it on this database"
    )


def pool_arguments(max_connections: int) -> dict[str, int]:
    """A pool that keeps half of ``max_connections`` open when idle and opens the rest for
    bursts, closing them after. An executor's tasks (claims, finishes, heartbeats, lanes)
    check out up to ten at once when they start together, and a pool of 10 kept them all
    open for good: 11 server connections per worker with its LISTEN, 8 workers for the
    97 client connections of a server's default ``max_connections`` of 100. The drains
    need far fewer: no-op mutations and actions drained as fast through a pool of 2 (no
    overflow) as through one of 10 (PostgreSQL, interleaved runs: 14.5k against 15.1k /s
    and 10.4k against 10.1k /s, within this machine's noise)."""
    kept = (max_connections + 1) // 2
    return {"pool_size": kept, "max_overflow": max_connections - kept}
