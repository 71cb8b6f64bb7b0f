"""The cron rules: when a cron fires and what each of its ticks writes, decided without I/O.

Both sides read them here. The declaring side (``_cron_declarations.py``:
``app.cron``, ``app.crontab``; ``_cron_registry.py``: the registry's API) reads a
schedule (``schedule_of``), a cron's first run and what a declaration changes in its
stored cron; the cron loop (``_executor/crons.py``) asks each due cron's ``plan_ticks``,
reads the state of its previous run, and writes what the plan says through
``_store/crons.py``'s statements. Nothing here reads the clock or the database: times
come in as arguments, stored crons as ``StoredCron``.

How a due cron is planned::

    StoredCron, now ─▶ plan_ticks
        the latest tick due by now (however long the downtime) and the one after it
        catch_up: "latest" runs that tick; "none" only while it is at most LATE old;
          "fill:<seconds>" every missed tick of the window, oldest first (MAX_FILL at most)
        the limits (CronLimits): no tick past ``until`` nor beyond ``max_runs``
        the wall times daylight saving skipped since the last tick (reported, dst_skip)
        the ticks' rows (tick_rows): arguments, a CronTick, options, an id per tick
    ─▶ TickPlan, judged against the cron's previous run (its state read by the loop):
        count_failed: a finished run counted among its failed ticks (pause_after)
        skip_reason: paused; no tick to write (until, max_runs, missed); overlap_skip
        to_cancel: the previous run its ticks cancel (cancel_previous)
    ─▶ CronMove (moved, skipped): the cron moved on from the next run it was read with
"""

from __future__ import annotations

import dataclasses
import functools
import json
import random
import typing
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from ._clock import to_datetime
from ._errors import RegistrationError
from ._hooks import HookEvent, HookName
from ._kinds import FunctionKind, ScheduledFunctionId, State
from ._models import CronTick
from ._options import RowOptions
from ._registry import Registry, SchedulableRef
from ._store import CronChange, CronMove, CronRow, NewRow, StoredCron, new_id, new_row, tick_id
from .cron import Schedule, parse, parse_cron_item

LATE = 60.0
"""A tick older than this when the loop reaches it was missed (downtime)."""
MAX_FILL = 100_000
"""The most ticks a backfill writes at once (one transaction): a backfill window may span
at most this many of its schedule's ticks (a second-by-second cron, 27 hours)."""


@dataclasses.dataclass(frozen=True, slots=True)
class CronLimits:
    """A cron's extras (Temporal's, Convex's, Oban Web's), stored as JSON on its row.

    ``jitter``: each tick's row is due at a random offset of 0 to ``jitter`` seconds
    after its tick (its id is still the tick's: written once); ``max_runs``: the cron
    stops after that many runs; ``until``: it stops after that time (epoch seconds);
    ``pause_after``: it is disabled after that many consecutive ticks whose rows ended
    Failed (``enable_cron`` resumes it)."""

    jitter: float | None = None
    max_runs: int | None = None
    until: float | None = None
    pause_after: int | None = None

    def stored(self) -> str | None:
        values = {k: v for k, v in dataclasses.asdict(self).items() if v is not None}
        return json.dumps(values, separators=(",", ":"), sort_keys=True) if values else None

    @classmethod
    def of(cls, stored: str | None) -> CronLimits:
        return cls(**json.loads(stored)) if stored else _NO_LIMITS

    def runs_left(self, run_count: int) -> int | None:
        return None if self.max_runs is None else max(0, self.max_runs - run_count)


_NO_LIMITS = CronLimits()


def schedule_of(expression: str, timezone: str, source: str) -> Schedule:
    """A registered cron's schedule: a crontab line's five fields keep Graphile's day rule
    (``cron.parse_cron_item``), the others are read as ``cron.parse`` reads them."""
    if source == "crontab":
        return parse_cron_item(f"{expression} x").schedule
    return parse(expression, timezone)


def first_run(row: CronRow, now: float) -> float | None:
    """A cron's first run after ``now`` (None while disabled)."""
    if not row.enabled:
        return None
    following = schedule_of(row.schedule, row.timezone, row.source).next_after(to_datetime(now))
    return following.timestamp() if following is not None else None


def changes(row: CronRow, stored: StoredCron, now: float) -> CronChange | None:
    """What a declaration (or a registration) changes in its stored cron, or None. An
    ``enabled`` that changed is a new decision, and clears the operator's switch
    (``_cron_registry``); the next run is recomputed when the schedule, the zone or the
    cron's being enabled changed."""
    if not row.differs(stored):
        return None
    switched = None if row.enabled != stored.enabled else stored.operator_enabled
    values: CronChange = {**row.columns(), "operator_enabled": switched, "updated_at": now}
    enabled = row.enabled if switched is None else switched
    was_enabled = stored.next_run_at is not None
    if row.timing_differs(stored) or enabled != was_enabled:
        values["next_run_at"] = first_run(dataclasses.replace(row, enabled=enabled), now)
    return values


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


def tick_rows(
    cron: StoredCron,
    ticks: Sequence[float],
    *,
    latest: float,
    registry: Registry,
    tracing: bool,
    triggered: bool = False,
) -> list[NewRow]:
    """The rows of a stored cron's ``ticks`` (``latest``: the one not backfilled), as the
    cron loop writes them and ``trigger_cron`` too: the cron's arguments, a ``CronTick``
    for a function (found in ``registry``) that takes one, and its options. A tick's id is
    made from the cron and the tick (``tick_id``: a second writer of it writes nothing); a
    triggered run's is new. ``tracing``: OpenTelemetry is installed."""
    options = RowOptions(**json.loads(cron.options))
    jitter = CronLimits.of(cron.limits).jitter
    ref = registry.find(cron.function)
    param = tick_parameter(ref) if isinstance(ref, SchedulableRef) else None
    rows = []
    for tick in ticks:
        args = cron.args
        if param is not None:  # a function that takes a CronTick is given one
            given = CronTick(ts=to_datetime(tick), backfilled=tick != latest, triggered=triggered)
            args = json.dumps(json.loads(args) | {param: given.model_dump(mode="json")})
        id = new_id(tick) if triggered else tick_id(cron.name, tick)
        row = new_row(
            id=id,
            name=cron.function,
            kind=cron.kind,
            args=args,
            due=tick,
            parent_id=None,
            options=options,
            flow_key=options.flow_key,
            # Its run is a root span, named for its cron (``_telemetry``); nothing stored
            # where OpenTelemetry is not installed.
            trace_context=json.dumps({"cron": cron.name}) if tracing else None,
        )
        if jitter:  # due a little later; the tick (and so the id) stays the tick's
            row["available_at"] = tick + random.Random(id).uniform(0, jitter)
        rows.append(row)
    return rows


BUSY = (State.PENDING, State.IN_PROGRESS)
"""A cron's previous run in one of these states overlaps a new one (its ``overlap``)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TickPlan:
    """One due cron's ticks, worked out before the transaction that writes them, and how
    it is judged against its previous run (``judged``, ``skip_reason``, ``to_cancel``)
    and moved on (``moved``, ``skipped``)."""

    cron: StoredCron
    expected: float
    """Its next run as read: it moves on only from this."""
    latest: float
    following: float | None
    rows: list[NewRow]
    gaps: list[float]
    """Ticks daylight saving skipped since the last one (their wall times, as instants)."""
    now: float = 0.0
    """When the leader evaluated it (the events' ``actual_at``)."""
    ended: str | None = None
    """Why it has no tick to write and no next run: ``until`` or ``max_runs`` reached."""
    overfull: datetime | None = None
    """Its backfill window held more than ``MAX_FILL`` ticks: those after the first
    ``MAX_FILL - 1`` are skipped up to this one (the last), to be logged."""

    @property
    def judged(self) -> ScheduledFunctionId | None:
        """The previous run whose state its judgement reads, if any: where its overlap
        may keep its ticks from running (``skip``) or cancel that run
        (``cancel_previous``), or where its failures are counted (``pause_after``)."""
        cron = self.cron
        if cron.last_row_id and (
            (self.rows and cron.overlap in ("skip", "cancel_previous"))
            or CronLimits.of(cron.limits).pause_after
        ):
            return cron.last_row_id
        return None

    def skip_reason(self, previous: State | None, *, paused: bool) -> str | None:
        """Why its ticks are not written (the reason its skip records), or None: they
        are. ``previous``: its previous run's state (None: not read, or gone);
        ``paused``: its failed ticks reached ``pause_after`` (``count_failed``)."""
        if paused:
            return "paused"
        if not self.rows:
            return self.ended or "missed"
        if previous in BUSY and self.cron.overlap == "skip":
            return "overlap_skip"
        return None

    def to_cancel(self, previous: State | None) -> ScheduledFunctionId | None:
        """The previous run its ticks cancel (``cancel_previous``, while that run is Pending
        or InProgress), if any: with their commit, a running action told."""
        if previous in BUSY and self.cron.overlap == "cancel_previous":
            return self.cron.last_row_id
        return None

    def moved(self) -> CronMove:
        """How the cron moves on once its ticks are written: its last tick and row, its
        runs counted, and the last wall time daylight saving skipped (if any)."""
        last = self.rows[-1]
        last_gap = self.gaps[-1] if self.gaps else None
        return CronMove(
            name=self.cron.name,
            expected=self.expected,
            next_run_at=self.following,
            last_run_at=last["scheduled_time"],
            last_row_id=last["id"],
            runs=len(self.rows),
            last_skip_at=last_gap,
            last_skip_reason="dst_skip" if last_gap is not None else None,
        )

    def skipped(self, reason: str) -> CronMove:
        """How the cron moves on with its ticks skipped for ``reason``: a paused cron has
        no next run (``enable_cron`` gives it one)."""
        return CronMove(
            name=self.cron.name,
            expected=self.expected,
            next_run_at=None if reason == "paused" else self.following,
            last_skip_at=self.latest,
            last_skip_reason=reason,
        )

    def event(self, hook: HookName, id: str, **more: Any) -> HookEvent:
        more.setdefault("scheduled_at", self.latest)
        more["scheduled_at"] = to_datetime(more["scheduled_at"])
        return HookEvent(
            hook,
            ScheduledFunctionId(id),
            self.cron.function,
            FunctionKind(self.cron.kind),
            state=State.PENDING if hook == "cron.triggered" else None,
            cron=self.cron.name,
            actual_at=to_datetime(self.now),
            **more,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class FailedTicks:
    """A cron's consecutive failed ticks (``pause_after``), its previous run counted."""

    count: int
    row: ScheduledFunctionId
    """That run: each counted once (``failed_row``)."""
    limit: int

    @property
    def paused(self) -> bool:
        """They reached ``pause_after``: the cron is disabled (as by ``disable_cron``,
        until ``enable_cron``), and this tick skipped (``paused``)."""
        return self.count >= self.limit

    def values(self, cron: StoredCron) -> CronChange:
        """The columns of ``cron`` the count writes."""
        values: CronChange = {"failed_ticks": self.count, "failed_row": self.row}
        if self.paused:
            values |= {"enabled": cron.enabled, "operator_enabled": False}
        return values


def count_failed(cron: StoredCron, previous: State | None) -> FailedTicks | None:
    """The cron's previous run counted (once) among its consecutive failed ticks, where it
    has ``pause_after`` and that run has finished (``previous``: its state); None: nothing
    to count."""
    limit = CronLimits.of(cron.limits).pause_after
    row = cron.last_row_id
    if not limit or row is None or row == cron.failed_row or previous is None:
        return None
    if previous in BUSY:
        return None  # not finished: judged at a later tick
    failed = cron.failed_ticks + 1 if previous is State.FAILED else 0
    return FailedTicks(count=failed, row=row, limit=limit)


def plan_ticks(cron: StoredCron, now: float, *, registry: Registry, tracing: bool) -> TickPlan:
    """What a due cron's ticks are (with ``backfill``, each missed tick in the window;
    none when missed and not caught up), its next run, and its tick rows as written
    unless its overlap says otherwise. A cron that cannot be read raises."""
    schedule = schedule_of(cron.schedule, cron.timezone, cron.source)
    assert cron.next_run_at is not None  # due: read by its next run
    expected = float(cron.next_run_at)
    # The latest tick due by now and the one after it, however long the downtime
    # (found by bisection, not by stepping through every missed tick).
    last = schedule.last_until(to_datetime(expected), to_datetime(now))
    latest, following = last.timestamp(), schedule.next_after(last)
    catch_up: str = cron.catch_up
    overfull = None
    if catch_up == "latest":
        ticks = [latest]
    elif catch_up == "none":
        ticks = [latest] if now - latest <= LATE else []
    else:  # "fill:<seconds>": every missed tick of the window, oldest first
        start = max(expected, now - int(catch_up.removeprefix("fill:")))
        ticks = []
        for t in schedule.iter_from(to_datetime(expected), to_datetime(start)):
            if t.timestamp() > now:
                break
            if len(ticks) == MAX_FILL:  # a window declared before the bound (declare)
                ticks[-1], overfull = latest, last
                break
            ticks.append(t.timestamp())
    # The operator's limits: no tick past ``until`` nor beyond ``max_runs``, and no next
    # run once either is reached (the cron has run its course: next_run_at None).
    limits = CronLimits.of(cron.limits)
    following_at, ended = _stamp(following), None
    if limits.until is not None:
        ticks = [t for t in ticks if t <= limits.until]
        if following_at is not None and following_at > limits.until:
            following_at, ended = None, "until"
    left = limits.runs_left(cron.run_count)
    if left is not None:
        ticks = ticks[:left]
        if left - len(ticks) <= 0:
            following_at, ended = None, "max_runs"
    latest = ticks[-1] if ticks else latest
    rows = tick_rows(cron, ticks, latest=latest, registry=registry, tracing=tracing)
    # Fixed wall times daylight saving skipped since the last tick (or registration),
    # reported rather than silent (OJS's dst_skip).
    since = cron.last_run_at if cron.last_run_at is not None else cron.updated_at
    gaps = [
        wall.replace(tzinfo=schedule.zone).astimezone(UTC).timestamp()
        for wall in schedule.skipped(to_datetime(float(since)), to_datetime(latest))
    ]
    return TickPlan(
        cron=cron,
        expected=expected,
        latest=latest,
        following=following_at,
        rows=rows,
        gaps=gaps,
        now=now,
        ended=ended,
        overfull=overfull,
    )


def _stamp(t: datetime | None) -> float | None:
    return t.timestamp() if t is not None else None
