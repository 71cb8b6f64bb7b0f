"""Writing rows that carry a job key, with Graphile Worker's semantics (``durafn.KeyMode``).

One upsert per key mode present, its conflict target the partial unique index
``ix_scheduled_functions_key`` (one holder per key among rows that are not Success):

* ``replace`` / ``preserve_run_at``: ``ON CONFLICT DO UPDATE ... WHERE state = 'Pending'``.
  A Pending holder takes the new values and its id is returned. A holder that is not
  Pending (InProgress, Failed, Canceled) is left as it is, so RETURNING omits that row:
  the holder then gives the key up (``job_key = NULL``) and the upsert runs again, now
  inserting (or, if a racing scheduler inserted a Pending holder meanwhile, updating it:
  racing schedulers end with one Pending row, since PostgreSQL's upsert waits for the
  other's uncommitted entry, and SQLite has one writer).
* ``unsafe_dedupe``: ``ON CONFLICT DO UPDATE SET job_key = job_key``: any holder is
  returned unchanged, whatever its state.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy import case, literal_column, update
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql.elements import ColumnElement

from ..._errors import DatabaseError
from ..._kinds import ScheduledFunctionId
from ..rows import NewRow, column_values
from ..schema.tables import KEY_HOLDER, sf
from ..sql import next_seq

_PENDING: ColumnElement[str] = literal_column("'Pending'")
# What a replace changes on the Pending holder (Graphile: queue, task, payload, run_at,
# max_attempts, priority and flags; attempts reset, last error cleared).
_REPLACED = (
    "name",
    "kind",
    "args",
    "parent_id",
    "priority",
    "queue_name",
    "flags",
    "retry",
    "max_attempts",
    "on_complete",
)


def _upsert(insert: Callable[..., Any], rows: Sequence[NewRow], mode: str) -> Any:
    stmt = insert(sf).values(
        [column_values(row) | {"seq": next_seq(n)} for n, row in enumerate(rows, 1)]
    )
    new = stmt.excluded
    if mode == "unsafe_dedupe":
        changes: dict[str, Any] = {"job_key": sf.c.job_key}
        where = None
    else:
        changes = {c: new[c] for c in _REPLACED}
        for column in ("scheduled_time", "available_at"):
            if mode == "preserve_run_at":  # kept while the holder was never attempted
                changes[column] = case((sf.c.attempts == 0, sf.c[column]), else_=new[column])
            else:
                changes[column] = new[column]
        changes.update(
            attempts=0, failures=0, error_type=None, error_message=None, error_traceback=None
        )
        where = sf.c.state == _PENDING
    return stmt.on_conflict_do_update(
        index_elements=[sf.c.job_key], index_where=KEY_HOLDER, set_=changes, where=where
    ).returning(sf.c.id, sf.c.job_key)


async def insert_keyed(
    conn: AsyncConnection, insert: Callable[..., Any], rows: Sequence[NewRow]
) -> list[ScheduledFunctionId]:
    """Write ``rows`` (each with a distinct ``job_key`` and its ``key_mode``); returns, per
    row, the id of the row that will run for it."""
    ids: dict[str, ScheduledFunctionId] = {}
    for mode in sorted({row["key_mode"] for row in rows}):
        waiting = [row for row in rows if row["key_mode"] == mode]
        for _ in range(3):  # an upsert, a give-up, an upsert; a third only after a race
            result = await conn.execute(_upsert(insert, waiting, mode))
            found = {key: ScheduledFunctionId(str(id)) for id, key in result}
            ids.update(found)
            waiting = [row for row in waiting if row["job_key"] not in found]
            if not waiting:
                break
            # Holders that are no longer Pending give their keys up to the new rows.
            await conn.execute(
                update(sf)
                .where(sf.c.job_key.in_([row["job_key"] for row in waiting]), KEY_HOLDER)
                .values(job_key=None)
            )
        if waiting:  # pragma: no cover - would take a holder re-created twice meanwhile
            raise DatabaseError(f"could not write the row of job key {waiting[0]['job_key']!r}")
    return [ids[str(row["job_key"])] for row in rows]  # every row here has a key
