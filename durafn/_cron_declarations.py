"""Recurring schedules declared in code: ``app.cron(name, schedule, call, ...)``.

A cron runs a registered function (a mutation or an action, with the options its
reference carries) on a schedule in a time zone. Declarations are checked at once (the
name, the schedule, the arguments against the function's signature) and kept as data
(``CronRow``): an executor reconciles them with the registry table when it starts, and
the cron loop writes each tick as an ordinary row (``_executor/crons.py``). The rules
both sides follow (a stored schedule read, a first run, what a tick writes) are
``_cron_rules.py``'s.

The schedules: a cron expression (``durafn.cron``'s grammar) or one of its helpers
(``every(minutes=5)``, ``daily(hour=9)``, ...).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import re
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal, TypedDict, get_args

from typing_extensions import Unpack

from ._checks import aware_time, integer, optional
from ._clock import to_datetime
from ._cron_rules import MAX_FILL, CronLimits, schedule_of, tick_parameter
from ._errors import CronSyntaxError, DurafnError, RegistrationError
from ._models import CronTick
from ._options import RowOptions
from ._registry import Call, SchedulableRef
from ._retries import GRAPHILE, Retry
from ._runtime import Runtime
from ._store import CronRow
from .cron import Schedule, parse_crontab

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
    jitter: float | None
    max_runs: int | None
    until: datetime | None
    pause_after: int | None


def check_settings(settings: Mapping[str, object], where: str) -> None:
    """A ``RegistrationError`` naming an unknown setting (mypy refuses it too)."""
    known = CronSettings.__annotations__
    unknown = [name for name in settings if name not in known]
    if unknown:
        raise RegistrationError(
            f"{where}: no setting {unknown[0]!r}; the settings are {', '.join(known)}"
        )


MAX_JITTER = 86_400.0
"""Seconds a tick's row may be spread over (``jitter``): a day."""


def _limits(
    name: str,
    *,
    jitter: float | None,
    max_runs: int | None,
    until: datetime | None,
    pause_after: int | None,
) -> CronLimits:
    """The extras, each checked (``RegistrationError`` names the bad one)."""
    if jitter is not None and (
        isinstance(jitter, bool)
        or not isinstance(jitter, int | float)
        or not 0 < jitter <= MAX_JITTER
    ):
        raise RegistrationError(
            f"cron {name!r}: jitter must be seconds, more than 0 and at most {MAX_JITTER:g}, "
            f"not {jitter!r}"
        )
    optional(integer, f"cron {name!r}: max_runs", max_runs, high=10**9, error=RegistrationError)
    optional(
        integer, f"cron {name!r}: pause_after", pause_after, high=10_000, error=RegistrationError
    )
    stop = optional(aware_time, f"cron {name!r}: until", until, error=RegistrationError)
    return CronLimits(
        jitter=float(jitter) if jitter is not None else None,
        max_runs=max_runs,
        until=stop,
        pause_after=pause_after,
    )


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
        instead, oldest first (a ``CronTick`` parameter says ``backfilled``). The
        operator's extras (``CronLimits``): ``jitter`` (seconds: each tick's row due at a
        random offset up to it), ``max_runs``, ``until`` (an aware datetime), and
        ``pause_after`` (consecutive failed ticks; ``enable_cron`` resumes). Name: 1-255
        characters of a-z, 0-9, '-' and '.'."""
        check_settings(settings, "app.cron")
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
        rows: list[CronRow] = []  # declared together or not at all, as Graphile parses
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
            try:
                call = ref.options(**options).call(**(item.payload or {}))
                row = declare(
                    self._rt,
                    item.identifier,
                    item.schedule.expression,
                    call,
                    source="crontab",
                    overlap="allow",
                    catch_up="none",
                    backfill=fill if fill > timedelta(0) else None,
                    keep=False,
                )
            except DurafnError as exc:  # its line named, nothing declared
                exc.args = (f"crontab, cron {item.identifier!r}: {exc}",)
                raise
            rows.append(row)
        for row in rows:
            self._rt.crons[row.name] = row
        return [row.name for row in rows]


MAX_BACKFILL = 366 * 86400
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
    jitter: float | None = None,
    max_runs: int | None = None,
    until: datetime | None = None,
    pause_after: int | None = None,
    keep: bool = True,
) -> CronRow:
    """A cron as data, every part checked (``RegistrationError`` names the bad one);
    ``keep``: one declared in code is kept among the app's (``app.crontab`` keeps its
    rows itself, once every line is checked)."""
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
    limits = _limits(name, jitter=jitter, max_runs=max_runs, until=until, pause_after=pause_after)
    if description is not None and not isinstance(description, str):
        raise RegistrationError(f"description must be a string, not {description!r}")
    ref, args, values = _checked_call(name, call)
    options = _tick_options(rt, name, ref, values, overlap=overlap)
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
        limits=limits.stored(),
    )
    if source != "api" and keep:
        rt.crons[name] = row
    return row


def _checked_call(
    name: str, call: Call | SchedulableRef[[], Any]
) -> tuple[SchedulableRef[Any, Any], str, dict[str, Any]]:
    """The cron's function, and its arguments checked against its signature: as stored
    (JSON) and as values, without the ``CronTick`` parameter that each tick gives."""
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
    return ref, args, values


def _tick_options(
    rt: Runtime,
    name: str,
    ref: SchedulableRef[Any, Any],
    values: dict[str, Any],
    *,
    overlap: Overlap,
) -> RowOptions:
    """The options of the cron's tick rows, resolved once: its function's, with their
    flow key computed (the arguments are fixed) and, for ``overlap="enqueue"``, the
    cron's serial queue."""
    options = rt.row_options(ref.job_options)
    if options.flow is not None:
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
    return options
