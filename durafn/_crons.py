"""Recurring schedules declared in code: ``app.cron(name, schedule, call, ...)``.

A cron runs a registered function (a mutation or an action, with the options its
reference carries) on a schedule in a time zone. Declarations are checked at once (the
name, the schedule, the arguments against the function's signature) and kept as data
(``CronRow``): an executor reconciles them with the registry table when it starts, and
the cron loop writes each tick as an ordinary row (``_executor/crons.py``).

The schedules: a cron expression (``durafn.cron``'s grammar) or one of its helpers
(``every(minutes=5)``, ``daily(hour=9)``, ...).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import re
import typing
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal, TypedDict, get_args

from sqlalchemy.ext.asyncio import AsyncConnection
from typing_extensions import Unpack

from ._clock import to_datetime
from ._errors import ArgumentError, CronSyntaxError, RegistrationError
from ._registry import Call, SchedulableRef
from ._retries import GRAPHILE, Retry
from ._runtime import Runtime
from ._scheduler import Scheduler
from ._store import CronRow
from ._types import CronInfo, CronTick, ScheduledFunctionId
from ._writers import DirectWriter
from .cron import Schedule, parse, parse_cron_item, parse_crontab

Overlap = Literal["skip", "allow", "cancel_previous", "enqueue"]
"""What a tick does while the cron's previous run is still Pending or InProgress (OJS):
``skip`` (the default) records the tick as skipped; ``allow`` runs it anyway;
``cancel_previous`` cancels the previous run (a running action is told) and runs the new
one; ``enqueue`` runs the new one after the previous ends (the cron's rows go through a
serial queue of its own, ``cron:<name>``)."""
CatchUp = Literal["latest", "none"]
"""After downtime: ``latest`` (the default) runs the latest missed tick once, then the
schedule goes on from now; ``none`` runs none of the missed ticks."""


class CronSettings(TypedDict, total=False):
    """A cron's settings besides its name, schedule and call (``cron``, ``register_cron``):
    see ``cron``; the defaults are ``declare``'s."""

    timezone: str
    overlap: Overlap
    catch_up: CatchUp
    enabled: bool
    description: str | None
    backfill: timedelta | None


OVERLAPS: tuple[str, ...] = get_args(Overlap)
CATCH_UPS: tuple[str, ...] = get_args(CatchUp)
_NAME = re.compile(r"[a-z0-9][a-z0-9\-.]*")


class CronDeclarations:
    """``app.cron``: the crons an app declares (a base class of ``App``)."""

    _rt: Runtime

    def cron(
        self,
        name: str,
        schedule: str,
        call: Call | SchedulableRef[[], Any],
        **settings: Unpack[CronSettings],
    ) -> None:
        """Run ``call`` (``fn.call(*args, **kwargs)``, or ``fn`` with no arguments) on
        ``schedule`` (a cron expression or ``durafn.cron.every``/``hourly``/``daily``/
        ``weekly``/``monthly``) in ``timezone`` (IANA; default UTC). Settings
        (``CronSettings``): ``timezone``, ``overlap``, ``catch_up``, ``enabled`` (True),
        ``description``, ``backfill``. Each tick is an ordinary row of
        ``_scheduled_functions``, written once however many executors run; the function's
        options (queue, priority, retry, ...) travel with ``fn``. ``overlap``, while the
        previous run is Pending or InProgress: ``"skip"`` the tick, ``"allow"`` it,
        ``"cancel_previous"`` or ``"enqueue"`` (see ``Overlap``);
        ``catch_up``: after downtime, ``"latest"`` runs the latest missed tick once,
        ``"none"`` none; ``backfill=timedelta(...)``: every missed tick of that last span
        instead, oldest first (a ``CronTick`` parameter says ``backfilled``). Name: 1-255
        characters of a-z, 0-9, '-' and '.'."""
        declare(self._rt, name, schedule, call, **settings)

    def crontab(self, crontab: str | Path) -> list[str]:
        """Declare the crons of a Graphile Worker crontab (its text, or a ``Path`` to its
        file); returns their names. Each line's task identifier is the durable name of a
        function of this app; its payload becomes the keyword arguments; its options map
        onto durafn's: ``queue``, ``priority``, ``max`` (``Retry(max, backoff=GRAPHILE)``),
        ``jobKey``/``jobKeyMode`` (``key``/``key_mode``), ``fill`` (``backfill``), ``id``
        (the cron's name, else the task). Times are UTC with Graphile's day rule; like
        Graphile, a tick missed while no worker ran is not run unless ``fill`` says so, and
        overlapping runs are allowed."""
        text = crontab.read_text() if isinstance(crontab, Path) else crontab
        try:
            items = parse_crontab(text)
        except CronSyntaxError as exc:
            raise RegistrationError(str(exc)) from None
        names = []
        for item in items:
            ref = self._rt.registry.find(item.task)
            if not isinstance(ref, SchedulableRef):
                raise RegistrationError(
                    f"crontab: no mutation or action of this app is named {item.task!r} "
                    f"(the task of cron {item.identifier!r})"
                )
            opts = item.options
            options: dict[str, Any] = {"queue": opts.queue, "priority": opts.priority}
            if opts.job_key is not None:
                options.update(key=opts.job_key, key_mode=opts.job_key_mode or "replace")
            if opts.max_attempts is not None:
                options["retry"] = Retry(opts.max_attempts, backoff=GRAPHILE)
            fill = opts.backfill_period
            declare(
                self._rt,
                item.identifier,
                item.schedule.expression,
                ref.options(**options).call(**(item.payload or {})),
                source="crontab",
                overlap="allow",
                catch_up="none",
                backfill=fill if fill > timedelta(0) else None,
            )
            names.append(item.identifier)
        return names

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
        row = declare(rt, name, schedule, call, source="api", **settings)

        async def _write(conn: AsyncConnection) -> None:
            now = rt.clock.now()
            stored = {r["name"]: r for r in await rt.driver.stored_crons(conn)}
            found = stored.get(name)
            following = first_run(row, now)
            if found is None:
                await rt.driver.add_cron(conn, row, now, following)
            elif found["source"] != "api":
                raise RegistrationError(f"cron {name!r} is declared in code; give another name")
            else:
                await rt.driver.change_cron(conn, row, now, following, row.timing_differs(found))

        await rt.transaction(_write, doing="registering a cron")
        info = await self.get_cron(name)
        assert info is not None
        return info

    async def crons(self, *, enabled: bool | None = None) -> list[CronInfo]:
        """The registry's crons, by name (``enabled``: only those, or only the others)."""
        rt = self._rt

        async def _read(conn: AsyncConnection) -> list[dict[str, Any]]:
            return await rt.driver.stored_crons(conn)

        rows = await rt.transaction(_read, read_only=True, doing="listing crons")
        found = [_info(row) for row in rows]
        return [c for c in found if enabled is None or c.enabled is enabled]

    async def get_cron(self, name: str) -> CronInfo | None:
        """One cron of the registry, or None."""
        return next((c for c in await self.crons() if c.name == name), None)

    async def enable_cron(self, name: str) -> None:
        """Let the cron run again, from its next tick after now."""
        await self._set_enabled(name, True)

    async def disable_cron(self, name: str) -> None:
        """Stop the cron (its ``next_run_at`` becomes None) without removing it. A cron
        declared in code is enabled again by the next deploy only if its declaration
        changes."""
        await self._set_enabled(name, False)

    async def _set_enabled(self, name: str, enabled: bool) -> None:
        rt = self._rt

        async def _write(conn: AsyncConnection) -> bool:
            row = next((r for r in await rt.driver.stored_crons(conn) if r["name"] == name), None)
            if row is None:
                return False
            now = rt.clock.now()
            schedule = schedule_of(row["schedule"], row["timezone"], row["source"])
            following = schedule.next_after(to_datetime(now)) if enabled else None
            await rt.driver.set_cron(
                conn,
                name,
                {
                    "enabled": enabled,
                    "next_run_at": following.timestamp() if following is not None else None,
                    "updated_at": now,
                },
            )
            return True

        # The leader sees it at its next look (every third of its lease at most).
        if not await rt.transaction(_write, doing="enabling or disabling a cron"):
            raise ArgumentError(f"no cron named {name!r} (app.crons() and durafn crons list them)")

    async def remove_cron(self, name: str) -> bool:
        """Remove a cron from the registry (rows it wrote stay); False if there was none.
        A cron declared in code comes back when an executor of that code starts."""
        rt = self._rt

        async def _write(conn: AsyncConnection) -> int:
            return await rt.driver.remove_crons(conn, [name])

        return bool(await rt.transaction(_write, doing="removing a cron"))

    async def trigger_cron(self, name: str) -> ScheduledFunctionId:
        """Run the cron's function now, once, outside its schedule (its ticks go on)."""
        rt = self._rt
        cron = await self.get_cron(name)
        if cron is None:
            raise ArgumentError(f"no cron named {name!r} (app.crons() and durafn crons list them)")
        ref = rt.registry.resolve(cron.function)
        if not isinstance(ref, SchedulableRef):
            raise ArgumentError(f"cron {name!r} runs {cron.function!r}, not a function of this app")
        scheduler = Scheduler(rt, DirectWriter(rt, check_parent=None))
        return await scheduler.run_after(0, ref, **cron.args)


def _describe(row: dict[str, Any]) -> str:
    try:
        return schedule_of(row["schedule"], row["timezone"], row["source"]).describe()
    except CronSyntaxError as exc:  # stored by another version: listed all the same
        return f"cannot be read: {exc}"


def _info(row: dict[str, Any]) -> CronInfo:
    def at(value: float | None) -> datetime | None:
        return to_datetime(value) if value is not None else None

    return CronInfo(
        name=row["name"],
        schedule=row["schedule"],
        timezone=row["timezone"],
        describe=_describe(row),
        function=row["function"],
        args=json.loads(row["args"]),
        overlap=row["overlap"],
        catch_up=row["catch_up"],
        enabled=row["enabled"],
        description=row["description"],
        source=row["source"],
        created_at=to_datetime(row["created_at"]),
        updated_at=to_datetime(row["updated_at"]),
        last_run_at=at(row["last_run_at"]),
        next_run_at=at(row["next_run_at"]),
        run_count=row["run_count"],
        last_row_id=row["last_row_id"],
        last_skip_at=at(row["last_skip_at"]),
        last_skip_reason=row["last_skip_reason"],
    )


def first_run(row: CronRow, now: float) -> float | None:
    """A cron's first run after ``now`` (None while disabled)."""
    if not row.enabled:
        return None
    following = schedule_of(row.schedule, row.timezone, row.source).next_after(to_datetime(now))
    return following.timestamp() if following is not None else None


def schedule_of(expression: str, timezone: str, source: str) -> Schedule:
    """A registered cron's schedule: a crontab line's five fields keep Graphile's day rule
    (``cron.parse_cron_item``), the others are read as ``cron.parse`` reads them."""
    if source == "crontab":
        return parse_cron_item(f"{expression} x").schedule
    return parse(expression, timezone)


MAX_BACKFILL = 366 * 86400
MAX_FILL = 100_000
"""The most ticks a backfill writes at once (one transaction): a backfill window may span
at most this many of its schedule's ticks (a second-by-second cron, 27 hours)."""
_SAMPLE = 500
_SAMPLE_FROM = datetime(2001, 1, 1, tzinfo=UTC)


def _check_fill(name: str, schedule: Schedule, seconds: float) -> None:
    """Refuse a backfill window that could hold more than ``MAX_FILL`` ticks, judged by
    the closest two of the schedule's first ``_SAMPLE`` ticks (from a fixed day, so that
    a declaration is accepted or refused the same way every time)."""
    ticks = list(itertools.islice(schedule.iter_after(_SAMPLE_FROM), _SAMPLE))
    gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(ticks)]
    shortest = min(gaps, default=seconds)
    if seconds / shortest > MAX_FILL:
        raise RegistrationError(
            f"cron {name!r}: a backfill of {timedelta(seconds=seconds)} may hold "
            f"{seconds / shortest:,.0f} ticks (one every {shortest:g} s), more than the "
            f"{MAX_FILL:,} one catch-up writes; make it at most "
            f"{timedelta(seconds=MAX_FILL * shortest)}"
        )


_TICK_TYPES = (CronTick, CronTick | None)


@functools.lru_cache(maxsize=256)
def tick_parameter(ref: SchedulableRef[Any, Any]) -> str | None:
    """The parameter of ``ref``'s function typed ``CronTick`` (or ``CronTick | None``, so
    that mypy lets a cron's call leave it out), if any: the cron gives it."""
    hints = typing.get_type_hints(ref.fn)
    found = [name for name in ref.parameters if hints.get(name) in _TICK_TYPES]
    if len(found) > 1:
        raise RegistrationError(f"{ref.name!r} has more than one CronTick parameter")
    return found[0] if found else None


def declare(
    rt: Runtime,
    name: str,
    schedule: str,
    call: Call | SchedulableRef[[], Any],
    *,
    source: str = "code",
    timezone: str = "UTC",
    overlap: Overlap = "skip",
    catch_up: CatchUp = "latest",
    enabled: bool = True,
    description: str | None = None,
    backfill: timedelta | None = None,
) -> CronRow:
    """A cron as data, every part checked (``RegistrationError`` names the bad one)."""
    # A crontab line's identifier follows Graphile's grammar, checked by its parser.
    if source != "crontab" and (
        not isinstance(name, str) or len(name) > 255 or not _NAME.fullmatch(name)
    ):
        raise RegistrationError(
            f"a cron's name is 1 to 255 characters of a-z, 0-9, '-' and '.', starting with a "
            f"letter or digit (OJS), not {name!r}"
        )
    if source != "api" and name in rt.crons:
        raise RegistrationError(f"a cron named {name!r} is already declared")
    try:
        parsed = schedule_of(schedule, timezone, source)
    except CronSyntaxError as exc:
        raise RegistrationError(f"cron {name!r}: {exc}") from None
    if overlap not in OVERLAPS:
        raise RegistrationError(f"overlap must be one of {', '.join(OVERLAPS)}, not {overlap!r}")
    if catch_up not in CATCH_UPS:
        raise RegistrationError(f"catch_up must be one of {', '.join(CATCH_UPS)}, not {catch_up!r}")
    seconds = 0.0
    if backfill is not None:
        seconds = backfill.total_seconds() if isinstance(backfill, timedelta) else -1
        if not 1 <= seconds <= MAX_BACKFILL:
            raise RegistrationError(
                f"backfill must be a timedelta of 1 s to 366 days, not {backfill!r}"
            )
        _check_fill(name, parsed, seconds)
    stored_catch_up = catch_up if backfill is None else f"fill:{int(seconds)}"
    if not isinstance(enabled, bool):
        raise RegistrationError(f"enabled must be True or False, not {enabled!r}")
    if description is not None and not isinstance(description, str):
        raise RegistrationError(f"description must be a string, not {description!r}")
    if isinstance(call, SchedulableRef):
        call = call.call()
    if not isinstance(call, Call) or call.delay is not None or call.when is not None:
        raise RegistrationError(
            "a cron runs fn.call(*args, **kwargs) (or fn itself, with no arguments) of a "
            f"mutation or an action, with no .after()/.at(); not {call!r}"
        )
    ref = call.fn
    tick = tick_parameter(ref)
    if tick is not None and tick in call.kwargs:
        raise RegistrationError(f"cron {name!r}: {tick!r} is given each tick; leave it out")
    placeholder = {tick: CronTick(ts=to_datetime(0))} if tick is not None else {}
    # ArgumentError names a bad argument.
    values, args = ref.encode_call(call.args, call.kwargs | placeholder)
    if tick is not None:
        stored = json.loads(args)
        del stored[tick]
        args = json.dumps(stored, separators=(",", ":"))
        values = {name: value for name, value in values.items() if name != tick}
    options = rt.row_options(ref.job_options)
    if options.flow is not None:  # the ticks' flow key, computed once: the arguments are fixed
        if options.flow.coalesce is not None:
            raise RegistrationError(
                f"cron {name!r}: {ref.name!r} is debounced or throttled, but a cron writes one "
                "row per tick already; give the cron fn.options(flow=Flow(...)) without them"
            )
        key = options.flow.key_of(ref.name, values)
        options = dataclasses.replace(options, flow=None, flow_key=key)
    if overlap == "enqueue":
        if options.queue is not None:
            raise RegistrationError(
                f"cron {name!r}: overlap='enqueue' runs its rows in a serial queue of its own "
                f"(cron:{name}); its function already has queue {options.queue!r}"
            )
        options = dataclasses.replace(options, queue=f"cron:{name}")
    row = CronRow(
        name=name,
        schedule=schedule,
        timezone=timezone,
        function=ref.name,
        kind=ref.kind.value,
        args=args,
        options=json.dumps(dataclasses.asdict(options)),
        overlap=overlap,
        catch_up=stored_catch_up,
        enabled=enabled,
        description=description,
        source=source,
    )
    if source != "api":
        rt.crons[name] = row
    return row
