"""The operators' tools' part of the store's seam (``OperatorStore``, a base of
``interface.Store``): the audit trail, operations, a row's links, search, and the
rollups, one line each on what it does and the index it reads. Nothing here runs on a
job's path."""

from __future__ import annotations

import builtins
from collections.abc import Sequence
from typing import Any, Protocol

from sqlalchemy.ext.asyncio import AsyncConnection as Conn

from .._kinds import ScheduledFunctionId
from .._models import AuditEntry, FailureGroup, LinkedRow, Operation, ScheduledFunction
from .filters import RowFilter
from .operations import WindowRow
from .rollups import RollupRow

Ids = Sequence[ScheduledFunctionId]


class OperatorStore(Protocol):
    """What the operators' tools ask of the database. ``conn`` is the caller's
    transaction."""

    # -- the audit trail (audit.py) -------------------------------------------------------
    async def record_audit(
        self,
        conn: Conn,
        *,
        at: float,
        who: str,
        via: str,
        action: str,
        target: str,
        rows: int,
        outcome: str,
    ) -> int: ...
    async def list_audit(
        self, conn: Conn, *, limit: int, before: int | None
    ) -> builtins.list[AuditEntry]: ...  # newest first (primary key)
    # Entries older than the retention period (ix_durafn_audit_at).
    async def delete_audit(self, conn: Conn, *, older_than: float, limit: int) -> int: ...

    # -- operations (operations.py; durafn/_operations.py runs them) ----------------------
    async def insert_operation(
        self,
        conn: Conn,
        *,
        kind: str,
        filter: dict[str, Any],
        change: dict[str, Any],
        who: str,
        now: float,
        total: int,
    ) -> int: ...
    async def get_operation(
        self, conn: Conn, id: int, bound: int
    ) -> tuple[Operation, str] | None: ...  # and its cursor (primary key)
    async def list_operations(
        self, conn: Conn, *, limit: int, before: int | None, bound: int
    ) -> builtins.list[Operation]: ...  # newest first (primary key)
    # The oldest Running ones (ix_durafn_operations_running).
    async def running_operations(self, conn: Conn, limit: int) -> builtins.list[int]: ...
    async def operation_window(
        self, conn: Conn, where: RowFilter, after: str | None, scan: int
    ) -> builtins.list[WindowRow]: ...  # a page's range of the primary key, each row matched
    async def advance_operation(
        self, conn: Conn, id: int, *, expected: str, cursor: str, scanned: int, now: float
    ) -> bool: ...  # take a page: guarded by the cursor expected
    async def count_operation(self, conn: Conn, id: int, changed: int) -> None: ...
    async def end_operation(
        self, conn: Conn, id: int, state: str, now: float, error: str | None = ...
    ) -> bool: ...  # Running -> state
    # Ended before the retention period (ix_durafn_operations_finished).
    async def delete_operations(self, conn: Conn, *, older_than: float, limit: int) -> int: ...
    async def count_up_to(self, conn: Conn, where: RowFilter, bound: int) -> int: ...
    # -- a row's links (read/row_links.py) -------------------------------------------
    # What it still waits for (ix_durafn_dependencies_row); what waits for it (primary key).
    async def waits_for(
        self, conn: Conn, id: ScheduledFunctionId, limit: int
    ) -> builtins.list[LinkedRow]: ...
    async def waited_by(
        self, conn: Conn, id: ScheduledFunctionId, limit: int
    ) -> builtins.list[LinkedRow]: ...
    async def nodes(self, conn: Conn, ids: Ids) -> builtins.list[LinkedRow]: ...  # (pk)
    async def batch_key_of(self, conn: Conn, id: ScheduledFunctionId) -> str | None: ...
    # A batch key's waiting rows (ix_scheduled_functions_batch).
    async def batch_waiting(
        self, conn: Conn, name: str, key: str, limit: int
    ) -> builtins.list[LinkedRow]: ...
    # -- search (read/search.py) ---------------------------------------------------------
    # The row holding a job key (ix_scheduled_functions_key).
    async def key_holder(self, conn: Conn, key: str) -> ScheduledFunction | None: ...
    # Among the newest ``scan`` rows (ix_scheduled_functions_scheduled): a key, an argument.
    async def with_key(
        self, conn: Conn, key: str, scan: int, limit: int
    ) -> builtins.list[ScheduledFunction]: ...
    async def with_argument(
        self, conn: Conn, tokens: Sequence[str], scan: int, limit: int
    ) -> builtins.list[ScheduledFunction]: ...
    # Failed rows among the last that ended, grouped (ix_scheduled_functions_completed).
    async def failure_groups(
        self, conn: Conn, *, scan: int, limit: int
    ) -> builtins.list[FailureGroup]: ...

    # -- the rollups (rollups.py; _durafn_rollups' primary key unless named) ----------------
    async def roll_up_minutes(
        self, conn: Conn, start: int, end: int
    ) -> int: ...  # INSERT ... SELECT ... GROUP BY (ix_scheduled_functions_completed)
    async def roll_up_hours(self, conn: Conn, start: int, end: int) -> int: ...  # from minutes
    # Up to when minutes and hours are rolled up (_durafn_rollup_marks), and its advance.
    async def rollup_marks(self, conn: Conn) -> tuple[int | None, int | None]: ...
    async def advance_rollup_mark(self, conn: Conn, span: int, until: int) -> bool: ...
    async def oldest_rollup(
        self, conn: Conn, span: int, since: int | None = None
    ) -> int | None: ...  # (pk)
    async def oldest_finished(
        self, conn: Conn, since: float | None = None
    ) -> float | None: ...  # (ix_scheduled_functions_completed's first from since)
    async def delete_rollups(self, conn: Conn, span: int, start: int, end: int) -> int: ...
    async def read_rollups(
        self,
        conn: Conn,
        span: int,
        start: int,
        end: int,
        *,
        name: str | None,
        queue: str | None,
    ) -> builtins.list[RollupRow]: ...  # per start and state, with the histograms
    async def rollup_functions(
        self, conn: Conn, span: int, start: int, end: int
    ) -> builtins.list[RollupRow]: ...  # per function, queue and state: counts only
