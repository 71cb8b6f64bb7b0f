"""The cron loop: one leader at a time writes each due tick as an ordinary row.

Every executor of an app that declares crons reconciles the declarations with the
registry when it starts (added, changed and removed ones are logged) and runs this loop.
The loop takes or renews the cron lease (a third of the worker timeout, renewed three
times per lease, so another executor takes over within one lease of the leader's death);
while it holds it, it writes the due ticks and sleeps until the earliest next run (read
from the registry's index), the lease's renewal, or the stop. Ticks are written once whatever
happens (``_store/_crons.py``): a tick's row has an id made from the cron and the tick,
and the registry moves on only from the next run it was read with.

After downtime, ``catch_up="latest"`` runs the latest missed tick once and goes on from
now; ``"none"`` skips ticks more than ``LATE`` seconds old; a backfill window (stored as
``fill:<seconds>``) runs every missed tick inside it, oldest first. While the cron's previous
run is Pending or InProgress, ``overlap="skip"`` records a tick as skipped,
``"cancel_previous"`` cancels that run in the tick's transaction, ``"enqueue"`` lets the
new run wait in the cron's serial queue (a warning once more than two wait).
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Callable
from datetime import datetime
from typing import Any

import anyio
from sqlalchemy.ext.asyncio import AsyncConnection

from .._clock import to_datetime
from .._crons import first_run, schedule_of, tick_parameter
from .._errors import DatabaseError
from .._hooks import HookEvent
from .._options import RowOptions
from .._registry import SchedulableRef
from .._runtime import Runtime
from .._store import CRON_LEASE, DECLARED, new_row, tick_id
from .._types import CronTick, FunctionKind, ScheduledFunctionId, State
from .._writers import write
from .tasks import first_of

logger = logging.getLogger("durafn.cron")

LEASE_SHARE = 3
"""The cron leader's lease lasts a third of the worker timeout (10 s by default), and is
renewed every third of that: a dead leader is replaced in well under a worker timeout."""
LATE = 60.0
"""A tick older than this when the loop reaches it was missed (downtime)."""
DUE_BATCH = 1000
"""Due crons handled per tick."""
MAX_TICKS = 100_000
"""Ticks stepped through to find the latest missed one (a second-by-second cron down for
more than a day catches up on the latest it finds)."""


class _MovedOn(Exception):
    """Another leader handled this cron's tick meanwhile: roll this attempt back."""


class CronLoop:
    """Reconciles the app's crons and writes their ticks while it leads."""

    def __init__(self, runtime: Runtime, worker_id: Callable[[], str], lease: float) -> None:
        self._rt = runtime
        self._worker_id = worker_id
        self._lease = lease
        self._reconciled = False

    @property
    def active(self) -> bool:
        """Whether the app declares crons (an app without any runs no cron loop)."""
        return bool(self._rt.crons)

    async def reconcile(self) -> None:
        """Make the registry's code crons the app's declarations (once per executor)."""
        if self._reconciled or not self.active:
            return
        rt = self._rt
        declared = rt.crons

        async def _reconcile(conn: AsyncConnection) -> list[str]:
            now = rt.clock.now()
            stored = {row["name"]: row for row in await rt.driver.stored_crons(conn)}
            changes = []
            for name, row in declared.items():
                found = stored.get(name)
                if found is None:
                    await rt.driver.add_cron(conn, row, now, first_run(row, now))
                    changes.append(f"added {name}")
                elif found["source"] in DECLARED and row.differs(found):
                    timing = row.timing_differs(found)
                    await rt.driver.change_cron(conn, row, now, first_run(row, now), timing)
                    changes.append(f"changed {name}")
            gone = [n for n, r in stored.items() if r["source"] in DECLARED and n not in declared]
            if gone:
                await rt.driver.remove_crons(conn, gone)
                changes += [f"removed {name}" for name in gone]
            return changes

        for change in await rt.transaction(_reconcile, doing="reconciling the crons"):
            logger.info("cron %s", change)
        self._reconciled = True

    async def tick(self) -> tuple[int, float | None]:
        """If this executor leads (or can take the lease), write the due ticks; returns how
        many rows it wrote and the earliest next run (None: no enabled cron)."""
        rt = self._rt
        holder = self._worker_id()

        async def _lead(conn: AsyncConnection) -> bool:
            now = rt.clock.now()
            return await rt.driver.take_lease(conn, CRON_LEASE, holder, now, now + self._lease)

        if not await rt.transaction(_lead, doing="taking the cron lease"):
            return 0, None

        async def _due(conn: AsyncConnection) -> list[dict[str, Any]]:
            return await rt.driver.due_crons(conn, rt.clock.now(), DUE_BATCH)

        # One read per tick: crons still due after it (more than DUE_BATCH) are the next
        # tick's, at once (the loop does not sleep while a next run is past).
        written = 0
        for cron in await rt.transaction(_due, read_only=True, doing="reading due crons"):
            try:
                events = await rt.transaction(
                    functools.partial(self._fire, cron), doing=f"writing cron {cron['name']}"
                )
            except _MovedOn:
                continue
            except DatabaseError:
                raise
            except Exception as exc:  # this cron cannot be evaluated: disable it, go on
                await self._disable(cron["name"], exc)
                continue
            written += sum(e.hook == "cron.triggered" for e in events)
            await self._tell(events)
        if written:
            rt.wake((FunctionKind.MUTATION, FunctionKind.ACTION))

        async def _next(conn: AsyncConnection) -> float | None:
            return await rt.driver.next_cron(conn)

        return written, await rt.transaction(_next, read_only=True, doing="reading crons")

    async def _disable(self, name: str, exc: Exception) -> None:
        """A cron whose tick cannot be written (a schedule, a function's arguments or
        options this version cannot read): disabled, with the reason, rather than
        retried without end."""
        rt = self._rt
        reason = f"error: {type(exc).__name__}: {exc}"[:500]
        logger.error("cron %s disabled: its tick could not be written (%s)", name, reason)

        async def _write(conn: AsyncConnection) -> None:
            now = rt.clock.now()
            await rt.driver.set_cron(
                conn,
                name,
                {
                    "enabled": False,
                    "next_run_at": None,
                    "last_skip_at": now,
                    "last_skip_reason": reason,
                    "updated_at": now,
                },
            )

        await rt.transaction(_write, doing=f"disabling cron {name}")

    async def _tell(self, events: list[HookEvent]) -> None:
        """Log a committed tick's events and give them to the hooks."""
        for event in events:
            when = event.scheduled_at.isoformat() if event.scheduled_at else "?"
            if event.hook == "cron.skipped":
                logger.info("cron %s: tick %s skipped (%s)", event.cron, when, event.reason)
            else:
                logger.info("cron %s: tick %s written, row %s", event.cron, when, event.id)
            if self._rt.hooks.active:
                await self._rt.hooks.fire(event)

    async def _fire(self, cron: dict[str, Any], conn: AsyncConnection) -> list[HookEvent]:
        """One due cron: its tick written (or skipped; with ``backfill``, each missed tick
        in the window), its next run set; returns what happened, as hook events."""
        rt = self._rt
        now = rt.clock.now()
        schedule = schedule_of(cron["schedule"], cron["timezone"], cron["source"])
        expected = float(cron["next_run_at"])
        missed, following = [expected], None
        for n, t in enumerate(schedule.iter_after(to_datetime(expected))):
            if t.timestamp() > now or n >= MAX_TICKS:
                following = t
                break
            missed.append(t.timestamp())
        if following is not None and following.timestamp() <= now:
            following = schedule.next_after(to_datetime(now))
        latest = missed[-1]
        catch_up: str = cron["catch_up"]
        if catch_up == "latest":
            ticks = [latest]
        elif catch_up == "none":
            ticks = [latest] if now - latest <= LATE else []
        else:  # "fill:<seconds>": every missed tick of the window, oldest first
            ticks = [t for t in missed if t >= now - int(catch_up.removeprefix("fill:"))]
        values: dict[str, Any] = {"next_run_at": _stamp(following)}
        skip = None
        if not ticks:
            skip = "missed"
        elif cron["overlap"] in ("skip", "cancel_previous") and cron["last_row_id"]:
            previous = await rt.driver.state(conn, cron["last_row_id"])
            if previous in (State.PENDING, State.IN_PROGRESS):
                if cron["overlap"] == "skip":
                    skip = "overlap_skip"
                else:  # cancelled with this tick's commit (a running action is told)
                    await rt.driver.cancel(conn, cron["last_row_id"], now)
        events: list[HookEvent] = []
        kind = FunctionKind(cron["kind"])
        if skip is not None:
            values.update(last_skip_at=latest, last_skip_reason=skip)
            active = ScheduledFunctionId(cron["last_row_id"] or "")
            events.append(
                HookEvent(
                    "cron.skipped",
                    active,
                    cron["function"],
                    kind,
                    cron=cron["name"],
                    scheduled_at=to_datetime(latest),
                    reason=skip,
                )
            )
        else:
            for n, tick in enumerate(ticks, start=1):
                if await self._write_tick(conn, cron, tick, tick != latest):
                    events.append(
                        HookEvent(
                            "cron.triggered",
                            tick_id(cron["name"], tick),
                            cron["function"],
                            kind,
                            state=State.PENDING,
                            cron=cron["name"],
                            scheduled_at=to_datetime(tick),
                            run_count=cron["run_count"] + n,
                        )
                    )
            values.update(
                last_run_at=ticks[-1],
                last_row_id=tick_id(cron["name"], ticks[-1]),
                run_count=cron["run_count"] + len(ticks),
            )
        if not await rt.driver.advance_cron(conn, cron["name"], expected, values):
            raise _MovedOn(cron["name"])
        if skip is None and cron["overlap"] == "enqueue":
            waiting = await rt.driver.pending_in_queue(conn, f"cron:{cron['name']}")
            if waiting > 2:
                logger.warning(
                    "cron %s: %d runs wait for the one before them (overlap='enqueue'): its "
                    "runs take longer than its schedule's interval",
                    cron["name"],
                    waiting,
                )
        return events

    async def _write_tick(
        self, conn: AsyncConnection, cron: dict[str, Any], tick: float, backfilled: bool
    ) -> int:
        """The row of one tick, unless another leader wrote it already (its id is the
        tick's); a function that takes a ``CronTick`` is given one. Returns 0 or 1."""
        rt = self._rt
        id = tick_id(cron["name"], tick)
        if await rt.driver.state(conn, id) is not None:
            return 0
        args = cron["args"]
        ref = rt.registry.find(cron["function"])
        if isinstance(ref, SchedulableRef) and (param := tick_parameter(ref)) is not None:
            given = CronTick(ts=to_datetime(tick), backfilled=backfilled)
            args = json.dumps(json.loads(args) | {param: given.model_dump(mode="json")})
        options = RowOptions(**json.loads(cron["options"]))
        row = new_row(id, cron["function"], cron["kind"], args, tick, None, options)
        await write(rt, conn, [row], None)
        return 1

    async def loop(self, stopping: anyio.Event) -> None:
        """Lead when possible, write ticks, sleep until the next one; until stopped."""
        rt = self._rt
        while not stopping.is_set():
            try:
                _, next_run = await self.tick()
            except DatabaseError as exc:
                rt.health.fault(exc, "evaluating crons")
                next_run = None
            wake = rt.clock.now() + self._lease / LEASE_SHARE
            if next_run is not None:
                wake = min(wake, next_run)
            await first_of(stopping.wait, functools.partial(rt.clock.sleep_until, wake))


def _stamp(t: datetime | None) -> float | None:
    return t.timestamp() if t is not None else None
