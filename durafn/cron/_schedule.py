"""When a cron schedule fires: the wall-clock search, the day rules, and DST.

The search walks wall-clock time in the schedule's zone, day by day, and inside a day
through the allowed hours, minutes and seconds (``bisect`` jumps straight to the first
candidate, so a rare schedule skips whole months at once and an ordinary one takes a few
steps). Each wall time found is turned into instants:

* a wall time in a spring-forward gap does not exist and does not fire;
* a wall time that occurs twice (the fall-back fold) fires at its first occurrence, or, if
  the hour field is ``*`` or ``*/n`` (a periodic job), at both, in instant order.

Days: the month's matching days are computed once per (year, month) and cached, with the
Vixie rule: when both day fields are restricted a day matches if either does; when either
begins with ``*``, both must.
"""

from __future__ import annotations

import bisect
import calendar
import functools
import heapq
from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta, tzinfo
from zoneinfo import ZoneInfo

from .._errors import ArgumentError
from ._describe import describe
from ._fields import Field

_LAST_YEAR = 9999
_SEARCH_YEARS = 400  # the calendar repeats every 400 years: no match by then, none ever
_LONGEST = {m: 29 if m == 2 else calendar.monthrange(2001, m)[1] for m in range(1, 13)}


class Days:
    """The day-of-month and day-of-week fields, and which days of a month they allow."""

    def __init__(self, dom: Field, months: Field, dow: Field, *, vixie: bool) -> None:
        self.dom, self.months, self.dow = dom, months, dow
        if vixie:  # a day field beginning with "*" makes the two an "and"
            self._or = not (dom.star or dow.star)
        else:  # Graphile: "or" unless one of the two sets is full
            self._or = not (dom.full or dow.full)
        self._month_days = functools.lru_cache(maxsize=64)(self._compute)
        self.possible = self._possible()
        """False for a schedule that can never fire (``0 0 31 2 *``): no search at all."""

    def _possible(self) -> bool:
        by_dom = by_dow = False
        for month in self.months.values:
            longest = _LONGEST[month]
            by_dom = by_dom or (
                any(d <= longest for d in self.dom.values)
                or self.dom.last_day
                or self.dom.last_weekday
                or any(d <= longest for d in self.dom.nearest_weekdays)
            )
        by_dow = bool(self.months.values) and bool(
            self.dow.values or self.dow.last_of_weekdays or self.dow.nth_weekdays
        )
        return by_dom or by_dow if self._or else by_dom and by_dow

    def in_month(self, year: int, month: int) -> tuple[int, ...]:
        return self._month_days(year, month)

    def _compute(self, year: int, month: int) -> tuple[int, ...]:
        first = (calendar.weekday(year, month, 1) + 1) % 7  # cron: Sunday 0 .. Saturday 6
        return self._days(first, calendar.monthrange(year, month)[1])

    def _days(self, first: int, length: int) -> tuple[int, ...]:
        """The matching days of a month of ``length`` days whose 1st is weekday ``first``."""
        by_dom = _dom_days(self.dom, first, length)
        by_dow = _dow_days(self.dow, first, length)
        return tuple(sorted(by_dom | by_dow if self._or else by_dom & by_dow))

    @functools.cached_property
    def ever(self) -> bool:
        """Whether any month can match: a month is one of a few shapes (its length, the
        weekday of its 1st), so trying each shape of each allowed month settles it.
        Asked only after a long fruitless search (``0 0 */100 * MON#4``: the 1st is
        never a fourth Monday), so that parsing stays cheap."""
        for month in self.months.values:
            lengths = (28, 29) if month == 2 else (calendar.monthrange(2001, month)[1],)
            for length in lengths:
                if any(self._days(first, length) for first in range(7)):
                    return True
        return False


def _dom_days(field: Field, first: int, length: int) -> set[int]:
    days = {d for d in field.values if d <= length}
    if field.last_day:
        days.add(length)
    if field.last_weekday:
        days.add(_nearest_weekday(first, length, length))
    for day in field.nearest_weekdays:
        if day <= length:  # a day the month lacks does not fire that month
            days.add(_nearest_weekday(first, day, length))
    return days


def _nearest_weekday(first: int, day: int, length: int) -> int:
    """The weekday (Mon-Fri) nearest ``day``, never crossing into another month."""
    weekday = (first + day - 1) % 7  # Sunday 0 .. Saturday 6
    if weekday == 6:  # Saturday: Friday, or Monday if the 1st is a Saturday
        return day - 1 if day > 1 else day + 2
    if weekday == 0:  # Sunday: Monday, or Friday if it is the month's last day
        return day + 1 if day < length else day - 2
    return day


def _dow_days(field: Field, first: int, length: int) -> set[int]:
    days = {d for d in range(1, length + 1) if (first + d - 1) % 7 in field.values}
    for weekday in field.last_of_weekdays:
        days.add(length - ((first + length - 1 - weekday) % 7))
    for weekday, nth in field.nth_weekdays:
        day = 1 + (weekday - first) % 7 + 7 * (nth - 1)
        if day <= length:
            days.add(day)
    return days


class Clock:
    """The time-of-day fields and the walk through wall time in a zone."""

    def __init__(
        self, seconds: Field, minutes: Field, hours: Field, days: Days, zone: ZoneInfo
    ) -> None:
        self.fields = (seconds, minutes, hours)
        self.seconds, self.minutes, self.hours = seconds.values, minutes.values, hours.values
        self.days, self.zone = days, zone
        # Periodic (hour field "*" or "*/n"): fires in both passes of a repeated hour.
        self.both_passes = hours.star

    def after(self, t: datetime) -> Iterator[datetime]:
        """Fire times strictly after the aware instant ``t``, in order, in the zone.

        Every comparison is in UTC: Python compares two datetimes of one zone by their
        wall times, fold ignored, which is wrong in the repeated hour."""
        zone = self.zone
        after = t.astimezone(UTC)
        local = after.astimezone(zone)
        wall = local.replace(tzinfo=None, fold=0)
        # In a repeated hour, the second pass of earlier wall times is still to come.
        start = wall - _fold_shift(local)
        deferred: list[tuple[datetime, datetime]] = []  # (UTC, local) of second passes
        for candidate in self._walls_from(start):
            first = candidate.replace(tzinfo=zone, fold=0)
            first_utc = first.astimezone(UTC)
            if first_utc.astimezone(zone).replace(tzinfo=None) != candidate:
                continue  # the spring-forward gap: this wall time does not exist
            if self.both_passes:
                second = candidate.replace(tzinfo=zone, fold=1)
                if second.utcoffset() != first.utcoffset():
                    heapq.heappush(deferred, (second.astimezone(UTC), second))
            while deferred and deferred[0][0] < first_utc:
                earlier_utc, earlier = heapq.heappop(deferred)
                if earlier_utc > after:
                    yield earlier
            if first_utc > after:
                yield first

    def skipped(self, after: datetime, until: datetime) -> list[datetime]:
        """The wall times (naive) a fixed-time schedule matches that do not exist, in the
        spring-forward gap, between the aware instants ``after`` and ``until``; a periodic
        one (hour ``*`` or ``*/n``) skips no tick of its own, only an hour of the clock."""
        if self.both_passes:
            return []
        zone = self.zone
        found: list[datetime] = []
        end = until.astimezone(UTC)
        wall = after.astimezone(zone).replace(tzinfo=None, fold=0)
        for candidate in self._walls_from(wall):
            first = candidate.replace(tzinfo=zone, fold=0)
            instant = first.astimezone(UTC)
            if instant > end:
                return found
            if instant.astimezone(zone).replace(tzinfo=None) != candidate:
                found.append(candidate)
        return found

    def _walls_from(self, start: datetime) -> Iterator[datetime]:
        """Allowed wall times at or after ``start`` (naive), in order."""
        if not self.days.possible:
            return
        day = start.date()
        first_day = True
        end = day.replace(year=min(_LAST_YEAR, day.year + _SEARCH_YEARS))
        months = self.days.months.values
        empty = 0  # months in a row without a matching day
        while day < end:
            if day.month not in months or not (
                month_days := self.days.in_month(day.year, day.month)
            ):
                empty += 1
                if empty == 48 and not self.days.ever:
                    return  # no month of any year matches: it never fires
                day = _next_month(day)
                first_day = False
                continue
            empty = 0
            i = bisect.bisect_left(month_days, day.day)
            if i == len(month_days):
                day = _next_month(day)
                first_day = False
                continue
            if month_days[i] != day.day:
                day = day.replace(day=month_days[i])
                first_day = False
            yield from self._times(day, start if first_day else None)
            first_day = False
            day += timedelta(days=1)

    def _times(self, day: date, start: datetime | None) -> Iterator[datetime]:
        hours, minutes, seconds = self.hours, self.minutes, self.seconds
        h0 = m0 = s0 = 0
        if start is not None:
            h0, m0, s0 = start.hour, start.minute, start.second
        for h in hours[bisect.bisect_left(hours, h0) :]:
            mins = minutes if h != h0 else minutes[bisect.bisect_left(minutes, m0) :]
            for m in mins:
                secs = seconds if (h, m) != (h0, m0) else seconds[bisect.bisect_left(seconds, s0) :]
                for s in secs:
                    yield datetime(day.year, day.month, day.day, h, m, s)


def _fold_shift(local: datetime) -> timedelta:
    """How far a repeated (ambiguous) wall time's second pass is from its first, or 0."""
    first = local.replace(fold=0).utcoffset()
    second = local.replace(fold=1).utcoffset()
    if first is None or second is None or first <= second:
        return timedelta(0)
    return first - second


def _next_month(day: date) -> date:
    return date(day.year + (day.month == 12), day.month % 12 + 1, 1)


class Schedule:
    """A parsed cron expression in a time zone."""

    def __init__(self, expression: str, timezone: str, clock: Clock) -> None:
        self.expression = expression
        self.timezone = timezone
        self._clock = clock

    def __repr__(self) -> str:
        return f"Schedule({self.expression!r}, timezone={self.timezone!r})"

    @property
    def zone(self) -> tzinfo:
        return self._clock.zone

    def next_after(self, t: datetime) -> datetime | None:
        """The first fire time strictly after the aware ``t``, aware in the schedule's
        zone, or None if it never fires again."""
        _check_aware(t)
        return next(self._clock.after(t), None)

    def iter_after(self, t: datetime) -> Iterator[datetime]:
        """Every fire time after ``t``, in order."""
        _check_aware(t)
        return self._clock.after(t)

    def last_until(self, first: datetime, until: datetime) -> datetime:
        """The last fire time from ``first`` (a fire time) to ``until``, both included:
        the latest tick a cron missed, however long it was down. Found by bisection on
        ``next_after``, about 45 calls whatever the span: stepping through every tick
        took 100,000 steps for a second-by-second cron down for 28 hours."""
        _check_aware(first)
        _check_aware(until)
        # In UTC: arithmetic on datetimes of one zone is wall-clock arithmetic.
        low, high = first.astimezone(UTC), until.astimezone(UTC)
        # next_after(low) <= until < next_after(high) (or None) all along.
        found = self.next_after(low)
        if found is None or found > until:
            return first
        while high - low > _RESOLUTION:  # fire times are whole seconds apart at least
            middle = low + (high - low) / 2
            following = self.next_after(middle)
            if following is not None and following <= until:
                low, found = middle, following
            else:
                high = middle
        return found

    def iter_from(self, first: datetime, start: datetime) -> Iterator[datetime]:
        """The fire times from ``start`` on (included, if it is one), ``first`` being a fire
        time (``Every`` counts from it)."""
        _check_aware(first)
        _check_aware(start)
        if start <= first:
            yield first.astimezone(self.zone)
            yield from self.iter_after(first)
        else:
            yield from self.iter_after(start - _RESOLUTION)

    def skipped(self, after: datetime, until: datetime) -> list[datetime]:
        """Wall times (naive, in the zone) this schedule would have fired at between the
        aware ``after`` and ``until`` but did not, because daylight saving skipped them
        (a fixed time in the spring-forward gap)."""
        _check_aware(after)
        _check_aware(until)
        return self._clock.skipped(after, until)

    def describe(self) -> str:
        """A short English line: ``at 09:00 on Monday through Friday, America/New_York``."""
        days = self._clock.days
        return describe(*self._clock.fields, days.dom, days.months, days.dow, self.timezone)

    def matches(self, t: datetime) -> bool:
        """Whether ``t`` is a fire time (to the second)."""
        _check_aware(t)
        return self.next_after(t - timedelta(microseconds=1)) == t


class Every(Schedule):
    """``@every <duration>``: fires every duration after the time it is counted from
    (registration, or the last run): ``next_after(anchor)`` is ``anchor + duration``."""

    def __init__(self, expression: str, timezone: str, interval: timedelta, zone: ZoneInfo) -> None:
        self.expression, self.timezone, self.interval = expression, timezone, interval
        self._tz = zone

    @property
    def zone(self) -> tzinfo:
        return self._tz

    def next_after(self, t: datetime) -> datetime | None:
        _check_aware(t)
        # In UTC: adding to a datetime of a zone with daylight saving adds wall-clock time
        # (an hour less or more across a change), and this is an interval of real time.
        return (t.astimezone(UTC) + self.interval).astimezone(self._tz)

    def iter_after(self, t: datetime) -> Iterator[datetime]:
        _check_aware(t)
        at = t.astimezone(UTC)
        while True:
            at = at + self.interval
            yield at.astimezone(self._tz)

    def last_until(self, first: datetime, until: datetime) -> datetime:
        _check_aware(first)
        _check_aware(until)
        first, until = first.astimezone(UTC), until.astimezone(UTC)  # absolute arithmetic
        steps = max(0, (until - first) // self.interval)
        return (first + steps * self.interval).astimezone(self._tz)

    def iter_from(self, first: datetime, start: datetime) -> Iterator[datetime]:
        _check_aware(first)
        _check_aware(start)
        first, start = first.astimezone(UTC), start.astimezone(UTC)  # absolute arithmetic
        steps = max(0, -((first - start) // self.interval))  # the first at or after start
        at = first + steps * self.interval
        while True:
            yield at.astimezone(self._tz)
            at = at + self.interval

    def matches(self, t: datetime) -> bool:
        return False  # it has no fixed times: only times counted from an anchor

    def skipped(self, after: datetime, until: datetime) -> list[datetime]:
        return []  # an interval of real time: daylight saving skips none of it

    def describe(self) -> str:
        return f"every {self.expression.split(None, 1)[1]}, {self.timezone}"


_RESOLUTION = timedelta(milliseconds=1)
"""Finer than the closest two fire times of any expression (a second, at the seconds
field): what ``last_until`` bisects down to."""


def _check_aware(t: datetime) -> None:
    if not isinstance(t, datetime) or t.tzinfo is None or t.utcoffset() is None:
        raise ArgumentError(f"cron times are aware datetimes, not {t!r}")
