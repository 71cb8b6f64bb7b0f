"""The cron loop: one leader at a time writes each due tick as an ordinary row.

Every executor reconciles its app's declarations with the registry when it starts (added,
changed and removed ones are logged) and runs this loop (an app that declares none looks
for crons registered at run time).
The loop takes or renews the cron lease (a third of the worker timeout, renewed three
times per lease, so another executor takes over within one lease of the leader's death);
while it holds it, it writes the due ticks and sleeps until the earliest next run (read
from the registry's index), the lease's renewal, or the stop. Ticks are written once whatever
happens (``_store/crons.py``): a tick's row has an id made from the cron and the tick,
and the registry moves on only from the next run it was read with.

What each due cron's ticks are (catch-up after downtime, backfill windows, the limits,
daylight saving's gaps) and the rows they write is decided in ``_cron_rules.py``
(``plan_ticks``), with no I/O; this loop reads the due crons, judges each plan against
its cron's previous run and writes it. While that run is Pending or InProgress,
``overlap="skip"`` records a tick as skipped, ``"cancel_previous"`` cancels that run in
the tick's transaction, ``"enqueue"`` lets the new run wait in the cron's serial queue (a
warning once more than two wait).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable

import anyio
from sqlalchemy.ext.asyncio import AsyncConnection

from .._cron_rules import MAX_FILL, TickPlan, changes, count_failed, first_run, plan_ticks
from .._errors import DatabaseError
from .._hooks import HookEvent
from .._kinds import FunctionKind, State
from .._runtime import Runtime
from .._store import CRON_LEASE, DECLARED, NewCron, StoredCron
from .._writers import write
from .tasks import first_of

logger = logging.getLogger("durafn.cron")

LEASE_SHARE = 3
"""The cron leader's lease lasts a third of the worker timeout (10 s by default), and is
renewed every third of that: a dead leader is replaced in well under a worker timeout."""
DUE_BATCH = 1000
"""Due crons handled per tick."""


class _MovedOn(Exception):
    """Another leader handled this cron's tick meanwhile: roll this attempt back."""


class CronLoop:
    """Reconciles the app's crons and writes their ticks while it leads."""

    def __init__(self, runtime: Runtime, worker_id: Callable[[], str], lease: float) -> None:
        self._rt = runtime
        self._worker_id = worker_id
        self._lease = lease
        self._held: tuple[float, float] | None = None
        """When this loop last took the lease, and when it renews it (a third on)."""
        self._reconciled = False
        self._registered = False
        self.looked = False
        """Whether ``look`` ran (``run_until_idle`` looks once per executor)."""

    @property
    def active(self) -> bool:
        """Whether there are crons to evaluate: the app declares some, or the registry
        had some (registered at run time) when last looked at (``look``)."""
        return bool(self._rt.crons) or self._registered

    async def look(self) -> bool:
        """Reconcile the app's declarations (once per executor) or, for an app that
        declares none, look whether the registry holds any; returns ``active``."""
        if self._rt.crons:
            await self.reconcile()
        elif not self._registered:
            rt = self._rt

            async def _any(conn: AsyncConnection) -> bool:
                return await rt.driver.next_cron(conn) is not None

            self._registered = await rt.transaction(_any, read_only=True, doing="reading crons")
        self.looked = True
        return self.active

    async def reconcile(self) -> None:
        """Make the registry's code crons the app's declarations (once per executor)."""
        if self._reconciled or not self._rt.crons:
            return
        rt = self._rt
        declared = rt.crons

        async def _reconcile(conn: AsyncConnection) -> list[str]:
            now = rt.clock.now()
            stored = {row.name: row for row in await rt.driver.stored_crons(conn)}
            changed, added = [], []
            for name, row in declared.items():
                found = stored.get(name)
                if found is None:
                    added.append(NewCron(row=row, next_run_at=first_run(row, now)))
                    changed.append(f"added {name}")
                elif found.source in DECLARED and (values := changes(row, found, now)):
                    await rt.driver.set_cron(conn, name, **values)
                    changed.append(f"changed {name}")
            await rt.driver.add_crons(conn, added, now=now)
            gone = [n for n, r in stored.items() if r.source in DECLARED and n not in declared]
            if gone:
                await rt.driver.remove_crons(conn, gone)
                changed += [f"removed {name}" for name in gone]
            return changed

        for change in await rt.transaction(_reconcile, doing="reconciling the crons"):
            logger.info("cron %s", change)
        self._reconciled = True

    async def tick(self) -> tuple[int, float | None]:
        """If this executor leads (or can take the lease), write the due ticks; returns how
        many rows it wrote and the earliest next run (None: no enabled cron)."""
        rt = self._rt
        if not await self._lead():
            return 0, None

        async def _due(conn: AsyncConnection) -> tuple[list[StoredCron], float | None]:
            found = await rt.driver.due_crons(conn, rt.clock.now(), DUE_BATCH)
            return found, None if found else await rt.driver.next_cron(conn)

        # One read per tick (crons still due after it are the next tick's, at once: the
        # loop does not sleep while a next run is past), and one transaction for all the
        # due crons' ticks: one transaction per cron cost 2.8 ms of CPU per tick on SQLite
        # and 1.5 ms on PostgreSQL (benchmarks/crons.py), too slow for 1,000 a second.
        # The next run is read with them, or after the ticks in their transaction.
        due, next_run = await rt.transaction(_due, read_only=True, doing="reading due crons")
        now = rt.clock.now()
        plans = []
        for cron in due:
            try:
                found = plan_ticks(
                    cron, now, registry=rt.registry, tracing=bool(rt.telemetry.tracing)
                )
            except Exception as exc:  # this cron cannot be evaluated: disable it, go on
                await self._disable(cron.name, exc)
                continue
            if found.overfull is not None:  # a window declared before the bound (declare)
                logger.warning(
                    "cron %s: its backfill window holds more than %d ticks; the rest "
                    "up to %s are skipped",
                    cron.name,
                    MAX_FILL,
                    found.overfull.isoformat(),
                )
            plans.append(found)
        written = 0
        if due:

            async def _write(conn: AsyncConnection) -> tuple[list[HookEvent], float | None]:
                events = await self._write_all(plans, now, conn) if plans else []
                return events, await rt.driver.next_cron(conn)

            try:
                events, next_run = await rt.transaction(_write, doing="writing cron ticks")
            except _MovedOn:  # another leader is writing these ticks: let it
                events, next_run = [], None
            written = sum(e.hook == "cron.triggered" for e in events)
            await self._tell(events)
        if written:
            rt.wake((FunctionKind.MUTATION, FunctionKind.ACTION))
        return written, next_run

    async def _lead(self) -> bool:
        """Whether this loop leads: it takes the lease, or renews it once a third of it
        has passed (renewing on every tick was a write transaction per tick, a quarter of
        ``run_until_idle``'s statements while it steps through a schedule)."""
        rt, now = self._rt, self._rt.clock.now()
        if self._held is not None and self._held[0] <= now < self._held[1]:
            return True  # (a clock stepped back before the taking retakes it)
        holder = self._worker_id()

        async def _take(conn: AsyncConnection) -> bool:
            return await rt.driver.take_lease(
                conn, CRON_LEASE, holder=holder, now=now, until=now + self._lease
            )

        taken = await rt.transaction(_take, doing="taking the cron lease")
        self._held = (now, now + self._lease / LEASE_SHARE) if taken else None
        return taken

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
                enabled=False,
                next_run_at=None,
                last_skip_at=now,
                last_skip_reason=reason,
                updated_at=now,
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
            await self._rt.hooks.fire(event)  # the hooks, and the ticks' metrics

    async def _write_all(
        self, plans: list[TickPlan], now: float, conn: AsyncConnection
    ) -> list[HookEvent]:
        """The due crons' ticks in one transaction: their overlaps judged, their rows
        written (but those another leader wrote already: a tick's id is the tick's), each
        cron moved on from the next run it was read with; returns the events."""
        rt = self._rt
        judged = [id for p in plans if (id := p.judged) is not None]
        ids = [row["id"] for p in plans for row in p.rows]
        states = await rt.driver.row_states(conn, judged + ids)
        rows, events, moves = [], [], []
        for plan in plans:
            cron = plan.cron
            for gap in plan.gaps:
                events.append(plan.event("cron.skipped", "", scheduled_at=gap, reason="dst_skip"))
            previous = states.get(cron.last_row_id) if cron.last_row_id else None
            paused = await self._count_failed(conn, cron, previous)
            skip = plan.skip_reason(previous, paused=paused)
            if skip is not None:
                moves.append(plan.skipped(skip))
                events.append(plan.event("cron.skipped", cron.last_row_id or "", reason=skip))
                continue
            if (cancel := plan.to_cancel(previous)) is not None:
                await rt.driver.cancel(conn, cancel, now)  # with these ticks' commit
            for n, row in enumerate(plan.rows, start=1):
                if row["id"] in states:  # written by another leader already
                    continue
                rows.append(row)
                events.append(
                    plan.event(
                        "cron.triggered",
                        row["id"],
                        scheduled_at=row["scheduled_time"],
                        run_count=cron.run_count + n,
                    )
                )
            moves.append(plan.moved())
        if await rt.driver.advance_crons(conn, moves) != len(moves):
            raise _MovedOn()
        if rows:
            await write(rt, conn, rows, None)
        for plan in plans:
            if plan.cron.overlap == "enqueue" and plan.rows:
                name = plan.cron.name
                waiting = await rt.driver.pending_in_queue(conn, f"cron:{name}")
                if waiting > 2:
                    logger.warning(
                        "cron %s: %d runs wait for the one before them (overlap='enqueue'): "
                        "its runs take longer than its schedule's interval",
                        name,
                        waiting,
                    )
        return events

    async def _count_failed(
        self, conn: AsyncConnection, cron: StoredCron, previous: State | None
    ) -> bool:
        """Count the cron's previous run among its failed ticks (``count_failed``); True
        when they reach ``pause_after``: the cron is paused, this tick skipped."""
        failed = count_failed(cron, previous)
        if failed is None:
            return False
        if failed.paused:
            logger.warning(
                "cron %s paused: its last %d ticks failed (pause_after=%d); "
                "enable_cron / durafn cron enable resumes it",
                cron.name,
                failed.count,
                failed.limit,
            )
        await self._rt.driver.set_cron(conn, cron.name, **failed.values(cron))
        return failed.paused

    async def loop(self, stopping: anyio.Event) -> None:
        """Lead when possible, write ticks, sleep until the next one; until stopped. With
        no cron anywhere, it only looks for one every third of a lease (crons registered
        at run time, by any process)."""
        rt = self._rt
        while not stopping.is_set():
            try:
                next_run = None
                if await self.look():
                    _, next_run = await self.tick()
            except DatabaseError as exc:
                rt.health.fault(exc, "evaluating crons")
                next_run = None
            wake = rt.clock.now() + self._lease / LEASE_SHARE
            if next_run is not None:
                wake = min(wake, next_run)
            await first_of(stopping.wait, functools.partial(rt.clock.sleep_until, wake))
