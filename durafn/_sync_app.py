"""``app.sync``: durafn from synchronous code (Django, Flask, scripts, worker threads).

``app.sync.run_after(...)`` (and ``run_at``, ``run_many``, ``group``, ``cancel``) commit
each call on their own, as ``app.scheduler()`` does; ``app.sync.scheduler(within)``
writes in the caller's transaction (``_sync_targets.py``), as ``app.scheduler(session)``
does. ``get``, ``list`` and ``explain`` read as ``app.get``, ``app.list`` and
``app.explain``. Every call runs the async route's own code in the caller's thread
(``_sync_bridge``, ``_sync_runtime``): any thread, with or without an event loop.
"""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncConnection
from typing_extensions import Unpack

from ._context import ListFilters, SystemTable
from ._explain import Explanation
from ._kinds import ScheduledFunctionId
from ._models import Page, ScheduledFunction
from ._operator import Operator
from ._public import publish
from ._runtime import Runtime
from ._scheduler import Scheduler
from ._sync_bridge import run_now
from ._sync_runtime import SyncRuntime
from ._sync_scheduler import SyncScheduler
from ._sync_targets import joined
from ._writers import DirectWriter, JoinedWriter


class _Reads(Operator):
    def __init__(self, runtime: Runtime) -> None:
        self._rt = runtime


class SyncApp(SyncScheduler):
    """``app.sync``: the app's scheduling and reading for synchronous code. Its
    ``run_after``, ``run_at``, ``run_many``, ``group`` and ``cancel`` commit each call on
    its own (``app.scheduler()``); ``scheduler(within)`` writes in your transaction.

    It has a connection pool of its own (psycopg 3 on PostgreSQL: ``durafn[sync]``; the
    standard ``sqlite3`` on SQLite), opened on first use, closed by ``close()``."""

    def __init__(self, runtime: Runtime) -> None:
        self._srt = SyncRuntime.for_(runtime)
        super().__init__(Scheduler(self._srt, DirectWriter(self._srt, None), per_call=True))

    def scheduler(self, within: object) -> SyncScheduler:
        """A scheduler that writes in your transaction: a SQLAlchemy ``Session`` (or
        ``scoped_session``: Flask-SQLAlchemy's ``db.session``) or ``Connection``, or a
        Django connection (``django.db.connection``, inside ``transaction.atomic()``).

        The rows commit or roll back with your writes; on PostgreSQL the NOTIFY that wakes
        the workers is in the same transaction, so it is sent only if it commits. Limits
        count per scheduler object."""
        target = joined(within, self._srt.driver.url.get_backend_name())
        return SyncScheduler(Scheduler(self._srt, JoinedWriter(self._srt, target)))

    # -- reading -----------------------------------------------------------------------

    def get(self, id: ScheduledFunctionId | str) -> ScheduledFunction | None:
        """The ``_scheduled_functions`` row with this id, or None (``App.get``)."""
        return run_now(SystemTable(self._srt, None).get(id))

    def list(self, **filters: Unpack[ListFilters]) -> Page:
        """Rows in ``scheduled_time`` order, filtered and paginated: ``App.list``'s
        keywords (state, name, scheduled_after/before, limit, cursor, newest_first,
        queue, key, flag, parent, args, args_contain, scan)."""
        return run_now(SystemTable(self._srt, None).list(**filters))

    def explain(self, id: ScheduledFunctionId | str) -> Explanation:
        """Why this row is where it is (``App.explain``)."""
        return run_now(_Reads(self._srt).explain(id))

    # -- the schema and the pool -------------------------------------------------------

    def migrate(self) -> int:
        """Create or upgrade the system tables (``App.migrate``); returns the version."""

        async def _migrate(conn: AsyncConnection) -> int:
            return await self._srt.driver.migrate(conn, self._srt.clock.now())

        version = run_now(self._srt.transaction(_migrate, ready=False, doing="migrating"))
        self._srt.mark_ready()
        return version

    def close(self) -> None:
        """Close this pool's connections (it opens again on the next call)."""
        self._srt.dispose_sync()


publish(globals())
