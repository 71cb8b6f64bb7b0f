"""Completion callbacks in the database: the row a finish schedules, in its transaction.

A row scheduled with ``on_complete=fn`` carries, as data, what to schedule when it finishes
for good (its ``on_complete`` column, written by ``durafn._completions.spec``): the
callback's name, the parameter that takes the ``Completion``, and its options, resolved
when the row was scheduled. Every statement that moves a row into Success, Failed or
Canceled is guarded by the state it expects; the rows such a statement moved, and only
those, get their callback row here, in the same transaction. A finish that commits has
its callback; one that is rolled back, or finds its row moved on by another process
(cancelled, rescued), has none. So a callback is never lost and never written twice,
whichever process finishes, cancels or rescues the row.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from sqlalchemy.ext.asyncio import AsyncConnection

from ..._kinds import FunctionKind, ScheduledFunctionId, State
from ..._options import RowOptions
from ..after_commit import note
from ..rows import NewRow, NewRowColumns, Outcome, new_id, new_row

_MUTATION = frozenset({FunctionKind.MUTATION})


def canceled(rows: Iterable[Sequence[Any]]) -> list[Outcome]:
    """Rows returned (id, name, on_complete) by a cancelling UPDATE, as outcomes."""
    return [
        Outcome(ScheduledFunctionId(str(id)), State.CANCELED, name=name, on_complete=spec)
        for id, name, spec in rows
        if spec is not None
    ]


def _completion_row(now: float, outcome: Outcome) -> tuple[NewRow, int | None]:
    """The callback row scheduled by ``outcome`` (which carries its ``on_complete``)."""
    assert outcome.on_complete is not None
    spec = json.loads(outcome.on_complete)
    error = None
    if outcome.state is State.FAILED:
        error = {"type": outcome.error_type or "", "message": outcome.error_message or ""}
    completion = {
        "id": outcome.id,
        "name": outcome.name,
        "state": outcome.state.value,
        "result": json.loads(outcome.result) if outcome.result is not None else None,
        "error": error,
    }
    row = new_row(
        id=new_id(now),
        name=spec["name"],
        kind=FunctionKind.MUTATION.value,
        args=json.dumps({spec["param"]: completion}, separators=(",", ":")),
        due=now,
        parent_id=None,
        options=RowOptions(
            priority=spec["priority"],
            queue=spec["queue"],
            key=None,
            key_mode="replace",
            flags=spec["flags"],
            retry=spec["retry"],
            max_attempts=spec["max_attempts"],
        ),
    )
    return row, spec["concurrency"]


class CompletionStatements:
    """The driver's part that writes completion callbacks (a part of ``Driver``)."""

    if TYPE_CHECKING:

        async def insert_rows(
            self,
            conn: AsyncConnection,
            rows: Sequence[NewRowColumns],
            notify: Collection[FunctionKind] = (),
        ) -> None: ...

        async def ensure_queues(
            self, conn: AsyncConnection, queues: dict[str, int | None], now: float
        ) -> None: ...

    async def write_completions(
        self, conn: AsyncConnection, now: float, finished: Sequence[Outcome]
    ) -> None:
        """Schedule the callbacks of rows this transaction finished for good (``finished``:
        only rows a guarded statement of this transaction moved; those without a callback
        are skipped). Executors are notified at commit."""
        made = [_completion_row(now, o) for o in finished if o.on_complete is not None]
        if not made:
            return
        rows = [row for row, _ in made]
        queues = {row["queue_name"]: c for row, c in made if row["queue_name"] is not None}
        if queues:
            await self.ensure_queues(conn, queues, now)
        await self.insert_rows(conn, rows, _MUTATION)
        notes = note(conn)
        notes.wake.add(FunctionKind.MUTATION)
        notes.written += rows
