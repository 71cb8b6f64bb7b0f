"""The cron registry at run time: crons registered by API, listed, switched on and off,
removed and triggered by hand (``app.register_cron``, ``crons``, ``get_cron``,
``enable_cron``, ``disable_cron``, ``remove_cron``, ``trigger_cron``; ``durafn crons`` and
``durafn cron ...``). Declarations in code are ``_cron_declarations.py``'s; the loop that
writes the ticks is ``_executor/crons.py``'s; the rules they follow, ``_cron_rules.py``'s.

**Switched by hand.** A cron's ``enabled`` column is its declaration's (or registration's);
``enable_cron`` and ``disable_cron`` record the operator's switch beside it
(``operator_enabled``) when it differs from the declaration, and the switch wins. An
executor that starts again with the same declaration leaves the switch as it is (a cron
disabled during an incident stays disabled until someone enables it); a declaration whose
``enabled`` changes is a new decision of the code, and clears it.
"""

from __future__ import annotations

import json
import logging
from datetime import datetime
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection
from typing_extensions import Unpack

from ._clock import to_datetime
from ._cron_declarations import CronSettings, check_settings, declare
from ._cron_rules import BUSY, CronLimits, changes, first_run, schedule_of, tick_rows
from ._errors import ArgumentError, CronSyntaxError, RegistrationError, SchedulingError
from ._hooks import HookEvent
from ._kinds import FunctionKind, ScheduledFunctionId, State
from ._models import CronInfo
from ._registry import Call, SchedulableRef
from ._runtime import Runtime
from ._store import CronChange, NewCron, StoredCron
from ._writers import write

logger = logging.getLogger("durafn.cron")


class CronRegistry:
    """The registry's API (a base class of ``App``)."""

    _rt: Runtime

    async def register_cron(
        self,
        name: str,
        schedule: str,
        call: Call | SchedulableRef[[], Any],
        **settings: Unpack[CronSettings],
    ) -> CronInfo:
        """Register a cron at run time (OJS's register: an upsert by name), with the
        parameters of ``cron``. It is kept when executors reconcile their declarations
        (``source`` ``api``); a name declared in code is refused. The cron leader, any
        executor, writes its ticks (one of an app without crons of its own looks for
        registered ones every third of its lease)."""
        rt = self._rt
        if name in rt.crons:
            raise RegistrationError(f"cron {name!r} is declared in code; give another name")
        check_settings(settings, "register_cron")
        row = declare(rt, name, schedule, call, source="api", **settings)

        async def _write(conn: AsyncConnection) -> None:
            now = rt.clock.now()
            found = await rt.driver.stored_cron(conn, name, lock=True)
            if found is None:
                await rt.driver.add_crons(
                    conn, [NewCron(row=row, next_run_at=first_run(row, now))], now=now
                )
            elif found.source != "api":
                raise RegistrationError(f"cron {name!r} is declared in code; give another name")
            elif (values := changes(row, found, now)) is not None:
                await rt.driver.set_cron(conn, name, **values)

        await rt.transaction(_write, doing="registering a cron")
        info = await self.get_cron(name)
        assert info is not None
        return info

    async def crons(self, *, enabled: bool | None = None) -> list[CronInfo]:
        """The registry's crons, by name (``enabled``: only those, or only the others)."""
        rt = self._rt

        async def _read(conn: AsyncConnection) -> list[StoredCron]:
            return await rt.driver.stored_crons(conn)

        rows = await rt.transaction(_read, read_only=True, doing="listing crons")
        found = [_info(row) for row in rows]
        return [c for c in found if enabled is None or c.enabled is enabled]

    async def get_cron(self, name: str) -> CronInfo | None:
        """One cron of the registry, or None."""
        rt = self._rt

        async def _read(conn: AsyncConnection) -> StoredCron | None:
            return await rt.driver.stored_cron(conn, name)

        row = await rt.transaction(_read, read_only=True, doing="reading a cron")
        return None if row is None else _info(row)

    async def enable_cron(self, name: str) -> None:
        """Let the cron run again, from its next tick after now; it stays enabled across
        restarts until someone disables it (or its declaration's ``enabled`` changes)."""
        await self._switch(name, True)

    async def disable_cron(self, name: str) -> None:
        """Stop the cron (its ``next_run_at`` becomes None) without removing it. It stays
        disabled across restarts and deploys until someone enables it (``enable_cron``,
        ``durafn cron enable``), or its declaration's ``enabled`` changes."""
        await self._switch(name, False)

    async def _switch(self, name: str, enabled: bool) -> None:
        rt = self._rt

        async def _write(conn: AsyncConnection) -> bool:
            row = await rt.driver.stored_cron(conn, name)
            if row is None:
                return False
            now = rt.clock.now()
            schedule = schedule_of(row.schedule, row.timezone, row.source)
            following = schedule.next_after(to_datetime(now)) if enabled else None
            values: CronChange = {
                # Only where it differs from the declaration (which then decides again).
                "operator_enabled": None if enabled == row.enabled else enabled,
                "next_run_at": following.timestamp() if following is not None else None,
                "updated_at": now,
            }
            if enabled:  # resumed: its failed ticks count again from none (``pause_after``)
                values["failed_ticks"] = 0
            await rt.driver.set_cron(conn, name, **values)
            return True

        # The leader sees it at its next look (every third of its lease at most).
        if not await rt.transaction(_write, doing="enabling or disabling a cron"):
            raise ArgumentError(f"no cron named {name!r} (app.crons() and durafn crons list them)")

    async def skip_next_tick(self, name: str) -> datetime:
        """Skip the cron's next tick (Temporal's and Oban Web's "skip next run"): its next
        run becomes the one after, and the skip is recorded (``last_skip_reason``
        ``skipped_by_operator``). Returns the tick skipped. ``ArgumentError`` for an unknown
        cron, or one with no next tick (disabled, or its course run)."""
        rt = self._rt

        async def _write(conn: AsyncConnection) -> float:
            row = await rt.driver.stored_cron(conn, name, lock=True)
            if row is None:
                raise ArgumentError(
                    f"no cron named {name!r} (app.crons() and durafn crons list them)"
                )
            skipped = row.next_run_at
            if skipped is None:
                raise ArgumentError(
                    f"cron {name!r} has no next tick to skip (it is disabled, or has run its "
                    "course: until / max_runs)"
                )
            schedule = schedule_of(row.schedule, row.timezone, row.source)
            following = schedule.next_after(to_datetime(float(skipped)))
            await rt.driver.set_cron(
                conn,
                name,
                next_run_at=following.timestamp() if following is not None else None,
                last_skip_at=skipped,
                last_skip_reason="skipped_by_operator",
                updated_at=rt.clock.now(),
            )
            return float(skipped)

        return to_datetime(await rt.transaction(_write, doing="skipping a cron's next tick"))

    async def remove_cron(self, name: str) -> bool:
        """Remove a cron from the registry (rows it wrote stay); False if there was none.
        A cron declared in code comes back when an executor of that code starts."""
        rt = self._rt

        async def _write(conn: AsyncConnection) -> int:
            return await rt.driver.remove_crons(conn, [name])

        return bool(await rt.transaction(_write, doing="removing a cron"))

    async def trigger_cron(self, name: str) -> ScheduledFunctionId:
        """Run the cron's function now, once, outside its schedule (its ticks go on), as a
        tick at this moment would run: the cron's arguments and options (queue, priority,
        retry, job key, flags, flow key; ``overlap="enqueue"``'s queue), a ``CronTick``
        with ``triggered=True`` for a function that takes one, and the cron's overlap
        policy judged against its previous run: ``skip`` refuses the run while that one
        is Pending or InProgress (a ``SchedulingError`` naming it), ``cancel_previous``
        cancels it. It counts as a run of the cron (``run_count``, ``last_row_id``, the
        ``cron.triggered`` hook with reason ``triggered``). Returns the row's id (a job key
        that replaced a waiting row: that row's). Needs the app that has the function."""
        rt = self._rt

        async def _write(conn: AsyncConnection) -> tuple[ScheduledFunctionId, int]:
            cron = await rt.driver.stored_cron(conn, name, lock=True)
            if cron is None:
                raise ArgumentError(
                    f"no cron named {name!r} (app.crons() and durafn crons list them)"
                )
            if not isinstance(rt.registry.find(cron.function), SchedulableRef):
                raise ArgumentError(
                    f"cron {name!r} runs {cron.function!r}, which this app does not have: "
                    "trigger it with the app that declares it (durafn cron trigger --app ...)"
                )
            now = rt.clock.now()
            [row] = tick_rows(
                cron,
                [now],
                latest=now,
                registry=rt.registry,
                tracing=bool(rt.telemetry.tracing),
                triggered=True,
            )
            previous = cron.last_row_id
            states = await rt.driver.row_states(conn, [previous]) if previous else {}
            if previous is not None and states.get(previous) in BUSY:  # as the loop judges
                if cron.overlap == "skip":
                    raise SchedulingError(
                        f"cron {name!r}: its previous run {previous} is still "
                        f"{states[previous].value}, and its overlap policy 'skip' keeps two "
                        "runs from overlapping; trigger it once that run ends, or cancel it"
                    )
                if cron.overlap == "cancel_previous":
                    await rt.driver.cancel(conn, previous, now)
            _, [id] = await write(rt, conn, [row], None)
            runs = await rt.driver.count_cron_run(conn, name, id)
            return id, runs

        id, runs = await rt.transaction(_write, doing=f"triggering cron {name}")
        rt.wake((FunctionKind.MUTATION, FunctionKind.ACTION))
        logger.info("cron %s: triggered by hand, row %s", name, id)
        if rt.hooks.counting:  # the hooks, or the metrics (a tick, and its row scheduled)
            cron = await self.get_cron(name)
            now = to_datetime(rt.clock.now())
            event = HookEvent(
                "cron.triggered",
                id,
                cron.function if cron is not None else "",
                cron.kind if cron is not None else FunctionKind.MUTATION,
                state=State.PENDING,
                cron=name,
                scheduled_at=now,
                actual_at=now,
                run_count=runs,
                reason="triggered",
            )
            await rt.hooks.fire(event)
        return id


def _describe(row: StoredCron) -> str:
    try:
        return schedule_of(row.schedule, row.timezone, row.source).describe()
    except CronSyntaxError as exc:  # stored by another version: listed all the same
        return f"cannot be read: {exc}"


def _info(row: StoredCron) -> CronInfo:
    def at(value: float | None) -> datetime | None:
        return to_datetime(value) if value is not None else None

    switched = row.operator_enabled
    limits = CronLimits.of(row.limits)
    return CronInfo(
        name=row.name,
        schedule=row.schedule,
        timezone=row.timezone,
        describe=_describe(row),
        function=row.function,
        kind=FunctionKind(row.kind),
        args=json.loads(row.args),
        overlap=row.overlap,
        catch_up=row.catch_up,
        enabled=row.enabled if switched is None else switched,
        switched_by_hand=switched is not None,
        description=row.description,
        source=row.source,
        created_at=to_datetime(row.created_at),
        updated_at=to_datetime(row.updated_at),
        last_run_at=at(row.last_run_at),
        next_run_at=at(row.next_run_at),
        run_count=row.run_count,
        last_row_id=row.last_row_id,
        last_skip_at=at(row.last_skip_at),
        last_skip_reason=row.last_skip_reason,
        jitter=limits.jitter,
        max_runs=limits.max_runs,
        until=at(limits.until),
        pause_after=limits.pause_after,
        failed_ticks=row.failed_ticks,
    )
