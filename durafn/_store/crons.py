"""The cron registry in the database: declarations reconciled, due crons read, a tick
written once, and the lease that makes one executor the cron leader.

Exactly one row per tick, whatever runs: a tick's row id is made from the cron's name and
the tick's time (``tick_id``), so a second writer of the same tick (two leaders for a
moment, a retry after an unseen commit) finds it there and writes nothing; and the
registry row moves on only from the ``next_run_at`` it was read with (a guarded UPDATE).

What crosses this seam is typed, a field per column: a declaration in (``CronRow``, with
its first run as a ``NewCron``), a stored cron out (``StoredCron``, made by ``_stored``
alone), and the two updates: the loop's guarded move (``CronMove``) and a change of named
columns (``CronChange``, ``set_cron``'s keywords).
"""

from __future__ import annotations

import builtins
import hashlib
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, ClassVar, TypedDict

from sqlalchemy import (
    CursorResult,
    Double,
    Integer,
    Row,
    Text,
    bindparam,
    delete,
    func,
    select,
    update,
)
from sqlalchemy.ext.asyncio import AsyncConnection
from typing_extensions import Unpack

from .._kinds import ScheduledFunctionId, State
from .schema.tables import crons, leases, sf

DECLARED = ("code", "crontab")
"""The sources of crons declared in code: an executor's start reconciles them."""
CRON_LEASE = "cron"
"""The lease the cron leader holds."""


@dataclass(frozen=True, slots=True)
class CronRow:
    """What a cron is, as declared (the registry adds its state: times, counts, skips)."""

    name: str
    schedule: str
    timezone: str
    function: str
    kind: str
    args: str
    options: str
    """The tick rows' options, resolved when declared (``RowOptions`` as JSON)."""
    overlap: str
    catch_up: str
    enabled: bool
    description: str | None
    source: str = "code"
    """``code`` (``app.cron``), ``crontab`` (``app.crontab``: Graphile's day rule) or
    ``api``."""
    limits: str | None = None
    """The operator's extras, as JSON (``_cron_rules.CronLimits``): ``jitter``, ``max_runs``,
    ``until``, ``pause_after``; None: none."""

    def columns(self) -> CronChange:
        """What it declares, as the columns it sets in its stored cron (``set_cron``)."""
        return {
            "schedule": self.schedule,
            "timezone": self.timezone,
            "function": self.function,
            "kind": self.kind,
            "args": self.args,
            "options": self.options,
            "overlap": self.overlap,
            "catch_up": self.catch_up,
            "enabled": self.enabled,
            "description": self.description,
            "source": self.source,
            "limits": self.limits,
        }

    def differs(self, stored: StoredCron) -> bool:
        return any(getattr(stored, k) != v for k, v in asdict(self).items())

    def timing_differs(self, stored: StoredCron) -> bool:
        return any(getattr(stored, k) != getattr(self, k) for k in _TIMING)


_TIMING = ("schedule", "timezone", "enabled")


class CronChange(TypedDict, total=False):
    """The columns of a stored cron that ``set_cron`` sets (those left out keep theirs)."""

    schedule: str
    timezone: str
    function: str
    kind: str
    args: str
    options: str
    overlap: str
    catch_up: str
    enabled: bool
    description: str | None
    source: str
    limits: str | None
    updated_at: float
    next_run_at: float | None
    last_skip_at: float | None
    last_skip_reason: str | None
    operator_enabled: bool | None
    failed_ticks: int
    failed_row: ScheduledFunctionId | None


@dataclass(frozen=True, slots=True, kw_only=True)
class NewCron:
    """A cron to add to the registry (``add_crons``): its declaration, and its first run
    (None: disabled)."""

    row: CronRow
    next_run_at: float | None


@dataclass(frozen=True, slots=True, kw_only=True)
class StoredCron:
    """A cron as the registry holds it: a row of ``_durafn_crons``, a field per column
    (made by ``_stored`` alone). Its declaration (``CronRow``'s fields) and its state."""

    name: str
    schedule: str
    timezone: str
    function: str
    kind: str
    args: str
    options: str
    overlap: str
    catch_up: str
    enabled: bool
    """As declared (or registered); ``operator_enabled``, where set, wins."""
    description: str | None
    source: str
    created_at: float
    updated_at: float
    last_run_at: float | None
    next_run_at: float | None
    """None while disabled, or once its course is run (``until``, ``max_runs``)."""
    run_count: int
    last_row_id: ScheduledFunctionId | None
    last_skip_at: float | None
    last_skip_reason: str | None
    operator_enabled: bool | None
    """An operator's switch where it differs from ``enabled``; None: as declared."""
    limits: str | None
    failed_ticks: int
    """Consecutive ticks whose rows ended Failed (``pause_after``)..."""
    failed_row: str | None
    """...the last row counted among them (each row once)."""


def _stored(row: Row[Any]) -> StoredCron:
    return StoredCron(**row._mapping)


def tick_id(name: str, tick: float) -> ScheduledFunctionId:
    """The id of cron ``name``'s row for ``tick``: a UUIDv7 (time-ordered like every other
    id) whose milliseconds are the tick's and whose other bits come from the name and the
    exact tick, so that every writer of that tick makes the same id."""
    digest = hashlib.sha256(f"{name}\0{tick!r}".encode()).digest()
    rest = int.from_bytes(digest[:10], "big") & ((1 << 74) - 1)
    ms = int(tick * 1000) & ((1 << 48) - 1)
    value = (ms << 80) | (0x7 << 76) | ((rest >> 62) << 64) | (0x2 << 62) | (rest & ((1 << 62) - 1))
    h = f"{value:032x}"
    return ScheduledFunctionId(f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}")


@dataclass(frozen=True, slots=True, kw_only=True)
class CronMove:
    """How a due cron moves on (``advance_crons``): its next run, from the one it was read
    with, and its last tick or its last skip (left out: left as it was)."""

    name: str
    expected: float
    """Its next run as read: it moves only while that is still its next run."""
    next_run_at: float | None
    last_run_at: float | None = None
    last_row_id: str | None = None
    runs: int = 0
    """Added to its ``run_count``."""
    last_skip_at: float | None = None
    last_skip_reason: str | None = None


# By primary key, guarded by the next run it was read with.
_ADVANCE = (
    update(crons)
    .where(crons.c.name == bindparam("b_name"), crons.c.next_run_at == bindparam("b_expected"))
    .values(
        next_run_at=bindparam("b_next", type_=Double),
        last_run_at=func.coalesce(bindparam("b_last_run", type_=Double), crons.c.last_run_at),
        last_row_id=func.coalesce(bindparam("b_row", type_=Text), crons.c.last_row_id),
        run_count=crons.c.run_count + bindparam("b_runs", type_=Integer),
        last_skip_at=func.coalesce(bindparam("b_skip_at", type_=Double), crons.c.last_skip_at),
        last_skip_reason=func.coalesce(
            bindparam("b_skip_reason", type_=Text), crons.c.last_skip_reason
        ),
    )
)


def _advance_params(m: CronMove) -> dict[str, Any]:
    """A move's bind parameters (named apart from the columns they set, as SQLAlchemy
    requires of an UPDATE's)."""
    return {
        "b_name": m.name,
        "b_expected": m.expected,
        "b_next": m.next_run_at,
        "b_last_run": m.last_run_at,
        "b_row": m.last_row_id,
        "b_runs": m.runs,
        "b_skip_at": m.last_skip_at,
        "b_skip_reason": m.last_skip_reason,
    }


class CronStatements:
    """The driver's statements on the cron registry and the leases (a part of ``Driver``)."""

    dialect_insert: ClassVar[Callable[..., Any]]

    async def stored_crons(self, conn: AsyncConnection) -> builtins.list[StoredCron]:
        """Every registered cron, by name."""
        rows = await conn.execute(select(crons).order_by(crons.c.name))
        return [_stored(row) for row in rows]

    async def add_crons(
        self, conn: AsyncConnection, added: Sequence[NewCron], *, now: float
    ) -> None:
        """New crons (with their first runs), a name already there left as it is. One
        statement for them all (one per cron: 0.9 ms each, 9 s to start a worker that
        declares 10,000)."""
        if not added:
            return
        stamps = {"created_at": now, "updated_at": now, "run_count": 0}
        values = [asdict(c.row) | stamps | {"next_run_at": c.next_run_at} for c in added]
        stmt = self.dialect_insert(crons).on_conflict_do_nothing(index_elements=[crons.c.name])
        await conn.execute(stmt, values)

    async def stored_cron(
        self, conn: AsyncConnection, name: str, *, lock: bool = False
    ) -> StoredCron | None:
        """One registered cron (by primary key); ``lock``: until the transaction ends."""
        stmt = select(crons).where(crons.c.name == name)
        row = (await conn.execute(stmt.with_for_update() if lock else stmt)).first()
        return None if row is None else _stored(row)

    async def set_cron(
        self, conn: AsyncConnection, name: str, **values: Unpack[CronChange]
    ) -> None:
        """Set these columns of cron ``name`` (by primary key)."""
        await conn.execute(update(crons).where(crons.c.name == name).values(**values))

    async def count_cron_run(self, conn: AsyncConnection, name: str, row_id: str) -> int:
        """A run of the cron outside its schedule (``trigger_cron``): its last row, one run
        more; returns its run count."""
        stmt = (
            update(crons)
            .where(crons.c.name == name)
            .values(last_row_id=row_id, run_count=crons.c.run_count + 1)
            .returning(crons.c.run_count)
        )
        return int((await conn.execute(stmt)).scalar_one())

    async def remove_crons(self, conn: AsyncConnection, names: Sequence[str]) -> int:
        result = await conn.execute(delete(crons).where(crons.c.name.in_(names)))
        assert isinstance(result, CursorResult)
        return result.rowcount

    async def due_crons(
        self, conn: AsyncConnection, now: float, limit: int
    ) -> builtins.list[StoredCron]:
        """Enabled crons whose next run is due by ``now``, earliest first (ix_durafn_crons_next)."""
        rows = await conn.execute(
            select(crons)
            .where(crons.c.next_run_at.is_not(None), crons.c.next_run_at <= now)
            .order_by(crons.c.next_run_at)
            .limit(limit)
        )
        return [_stored(row) for row in rows]

    async def next_cron(self, conn: AsyncConnection) -> float | None:
        """The earliest next run of any enabled cron (ix_durafn_crons_next)."""
        value = (await conn.execute(select(func.min(crons.c.next_run_at)))).scalar()
        return float(value) if value is not None else None

    async def advance_crons(self, conn: AsyncConnection, moves: Sequence[CronMove]) -> int:
        """Move each cron on from the next run it was read with (``expected``), if it is
        still that (its ticks not handled by another leader meanwhile); returns how many
        moved. One statement, built once (building one per cron cost ~0.3 ms of CPU)."""
        result = await conn.execute(_ADVANCE, [_advance_params(m) for m in moves])
        assert isinstance(result, CursorResult)
        return result.rowcount

    async def row_states(self, conn: AsyncConnection, ids: Sequence[str]) -> dict[str, State]:
        """The states of those of these rows that exist (by primary key)."""
        found: dict[str, State] = {}
        for start in range(0, len(ids), 500):  # SQLite's limit on bound parameters
            chunk = ids[start : start + 500]
            rows = await conn.execute(select(sf.c.id, sf.c.state).where(sf.c.id.in_(chunk)))
            found.update((str(id), State(state)) for id, state in rows)
        return found

    async def pending_in_queue(self, conn: AsyncConnection, queue: str) -> int:
        """Pending rows of a named queue (ix_scheduled_functions_claim_queued)."""
        stmt = select(func.count()).where(sf.c.state == "Pending", sf.c.queue_name == queue)
        return int((await conn.execute(stmt)).scalar_one())

    async def take_lease(
        self, conn: AsyncConnection, name: str, *, holder: str, now: float, until: float
    ) -> bool:
        """Take or renew lease ``name`` for ``holder`` until ``until``: it is free, expired
        by ``now``, or already ``holder``'s. Returns whether ``holder`` has it."""
        stmt = self.dialect_insert(leases).values(name=name, holder=holder, expires_at=until)
        stmt = stmt.on_conflict_do_update(
            index_elements=[leases.c.name],
            set_={"holder": stmt.excluded.holder, "expires_at": stmt.excluded.expires_at},
            where=(leases.c.holder == holder) | (leases.c.expires_at < now),
        ).returning(leases.c.holder)
        return (await conn.execute(stmt)).first() is not None
