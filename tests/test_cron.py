"""Cron expressions (durafn.cron): the OJS grammar, the day rules, time zones and DST.

Pure computation, no database: each case gives an expression, a zone, a start and the
next fire times. ``source`` says where a case comes from: "croniter:NAME" or
"cronsim:NAME" a test of their published suites (where their answer is OJS's too: not,
for example, cronsim's substitute 04:00 for a 03:30 that does not exist), "OJS" the OJS
cron text in
../shared/reference/ojs-cron.md (its examples and rules, quoted in the issue), "Vixie"
the day rule of Vixie cron as the issue states it, "calendar" a case whose answer is read
off the calendar (month ends, leap years, weekdays), "tzdb" a transition of the IANA
database (the dates are those of the zone's rules).
"""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from click.testing import CliRunner

import durafn
import durafn.cli
from durafn import cron


def at(text: str, zone: str = "UTC") -> datetime:
    """An aware datetime from ISO text; a naive one is read in ``zone``."""
    when = datetime.fromisoformat(text)
    return when if when.tzinfo else when.replace(tzinfo=ZoneInfo(zone))


def iso(when: datetime) -> str:
    return when.isoformat()


def upcoming(expression: str, zone: str, start: str, count: int) -> list[str]:
    schedule = cron.parse(expression, zone)
    times = schedule.iter_after(at(start, zone))
    return [iso(next(times)) for _ in range(count)]


# (source, expression, zone, start, expected fire times)
CASES: list[tuple[str, str, str, str, list[str]]] = [
    # -- croniter's published tests (tests/test_croniter.py), where OJS agrees ----------
    (
        "croniter:test_dst_issue90_st31ny",
        "1 2 * * *",
        "Europe/Paris",
        "2020-03-29T01:59:55",
        ["2020-03-30T02:01:00+02:00"],
    ),
    (
        "croniter:test_dst_issue90_st31ny",
        "1 2 * * *",
        "Europe/Paris",
        "2020-03-29T02:00:00",
        ["2020-03-30T02:01:00+02:00"],
    ),
    (
        "croniter:test_issue_k11",
        "* * * * *",
        "America/New_York",
        "2019-01-14T11:00:59",
        ["2019-01-14T11:01:00-05:00"],
    ),
    (
        "croniter:test_issue_k12",
        "* * * * *",
        "Europe/Athens",
        "2010-01-23T12:18",
        ["2010-01-23T12:19:00+02:00"],
    ),
    (
        "croniter:CroniterDST138Test",
        "*/5 * * * *",
        "UTC",
        "2024-01-25T04:46",
        ["2024-01-25T04:50:00+00:00", "2024-01-25T04:55:00+00:00", "2024-01-25T05:00:00+00:00"],
    ),
    # -- cronsim's published tests (tests/test_cronsim.py), where OJS agrees ----------------
    ("cronsim:test_it_handles_l", "1 1 L * *", "UTC", "2020-01-01", ["2020-01-31T01:01:00+00:00"]),
    (
        "cronsim:test_it_handles_last_friday",
        "1 1 * * 5L",
        "UTC",
        "2020-01-01",
        [
            "2020-01-31T01:01:00+00:00",
            "2020-02-28T01:01:00+00:00",
            "2020-03-27T01:01:00+00:00",
            "2020-04-24T01:01:00+00:00",
            "2020-05-29T01:01:00+00:00",
        ],
    ),
    (
        "cronsim:test_it_handles_last_sunday_two_notations",
        "1 1 * * 0L",
        "UTC",
        "2020-01-01",
        ["2020-01-26T01:01:00+00:00"],
    ),
    (
        "cronsim:test_it_handles_last_sunday_two_notations",
        "1 1 * * 7L",
        "UTC",
        "2020-01-01",
        ["2020-01-26T01:01:00+00:00"],
    ),
    (
        "cronsim:test_it_handles_nth_weekday",
        "1 1 * * 1#2",
        "UTC",
        "2020-01-01",
        ["2020-01-13T01:01:00+00:00"],
    ),
    (
        "cronsim:test_it_handles_dow_star",
        "1 1 1-7 * */7",
        "UTC",
        "2020-01-01",
        [
            "2020-01-05T01:01:00+00:00",
            "2020-02-02T01:01:00+00:00",
            "2020-03-01T01:01:00+00:00",
            "2020-04-05T01:01:00+00:00",
        ],
    ),
    (
        "cronsim:test_it_handles_dom_star",
        "1 1 */100,1-7 * MON",
        "UTC",
        "2020-01-01",
        [
            "2020-01-06T01:01:00+00:00",
            "2020-02-03T01:01:00+00:00",
            "2020-03-02T01:01:00+00:00",
            "2020-04-06T01:01:00+00:00",
        ],
    ),
    (
        "cronsim:test_001_every_hour_mar",
        "0 * * * *",
        "Europe/Riga",
        "2021-03-28T01:30",
        ["2021-03-28T02:00:00+02:00", "2021-03-28T04:00:00+03:00"],
    ),
    (
        "cronsim:test_001_every_hour_oct",
        "0 * * * *",
        "Europe/Riga",
        "2021-10-31T01:30",
        [
            "2021-10-31T02:00:00+03:00",
            "2021-10-31T03:00:00+03:00",
            "2021-10-31T03:00:00+02:00",
            "2021-10-31T04:00:00+02:00",
        ],
    ),
    (
        "cronsim:test_002_every_30_minutes_mar",
        "*/30 * * * *",
        "Europe/Riga",
        "2021-03-28T02:10",
        ["2021-03-28T02:30:00+02:00", "2021-03-28T04:00:00+03:00", "2021-03-28T04:30:00+03:00"],
    ),
    (
        "cronsim:test_002_every_30_minutes_oct",
        "*/30 * * * *",
        "Europe/Riga",
        "2021-10-31T02:10",
        [
            "2021-10-31T02:30:00+03:00",
            "2021-10-31T03:00:00+03:00",
            "2021-10-31T03:30:00+03:00",
            "2021-10-31T03:00:00+02:00",
            "2021-10-31T03:30:00+02:00",
            "2021-10-31T04:00:00+02:00",
        ],
    ),
    (
        "cronsim:test_004_every_2_hours_oct",
        "0 */2 * * *",
        "Europe/Riga",
        "2021-10-31T01:30",
        ["2021-10-31T02:00:00+03:00", "2021-10-31T04:00:00+02:00", "2021-10-31T06:00:00+02:00"],
    ),
    (
        "cronsim:test_006_every_3_hours_oct",
        "0 */3 * * *",
        "Europe/Riga",
        "2021-10-31T01:30",
        ["2021-10-31T03:00:00+03:00", "2021-10-31T03:00:00+02:00", "2021-10-31T06:00:00+02:00"],
    ),
    (
        "cronsim:test_008_at_1_2_3_4_5_oct",
        "0 1,2,3,4,5 * * *",
        "Europe/Riga",
        "2021-10-31T01:30",
        ["2021-10-31T02:00:00+03:00", "2021-10-31T03:00:00+03:00", "2021-10-31T04:00:00+02:00"],
    ),
    (
        "cronsim:test_010_at_2_mar",
        "0 2 * * *",
        "Europe/Riga",
        "2021-03-28T01:30",
        ["2021-03-28T02:00:00+02:00", "2021-03-29T02:00:00+03:00"],
    ),
    # -- the grammar ------------------------------------------------------------------
    ("OJS", "* * * * *", "UTC", "2026-01-01T00:00:30", ["2026-01-01T00:01:00+00:00"]),
    (
        "OJS",
        "1,15 * * * *",
        "UTC",
        "2026-01-01T00:00",
        ["2026-01-01T00:01:00+00:00", "2026-01-01T00:15:00+00:00", "2026-01-01T01:01:00+00:00"],
    ),
    (
        "OJS",
        "1-5 * * * *",
        "UTC",
        "2026-01-01T00:03",
        ["2026-01-01T00:04:00+00:00", "2026-01-01T00:05:00+00:00", "2026-01-01T01:01:00+00:00"],
    ),
    (
        "OJS",
        "*/15 * * * *",
        "UTC",
        "2026-01-01T00:00",
        [
            "2026-01-01T00:15:00+00:00",
            "2026-01-01T00:30:00+00:00",
            "2026-01-01T00:45:00+00:00",
            "2026-01-01T01:00:00+00:00",
        ],
    ),
    (
        "OJS",
        "0 0 L * *",
        "UTC",
        "2026-01-01",
        [
            "2026-01-31T00:00:00+00:00",
            "2026-02-28T00:00:00+00:00",
            "2026-03-31T00:00:00+00:00",
            "2026-04-30T00:00:00+00:00",
        ],
    ),
    (
        "OJS",
        "0 0 15W * *",
        "UTC",
        "2026-02-01",
        ["2026-02-16T00:00:00+00:00", "2026-03-16T00:00:00+00:00", "2026-04-15T00:00:00+00:00"],
    ),
    (
        "OJS",
        "0 0 * * 5#3",
        "UTC",
        "2026-01-01",
        ["2026-01-16T00:00:00+00:00", "2026-02-20T00:00:00+00:00", "2026-03-20T00:00:00+00:00"],
    ),
    (
        "OJS",
        "0 9 * * MON-FRI",
        "America/New_York",
        "2026-11-27T10:00",
        ["2026-11-30T09:00:00-05:00", "2026-12-01T09:00:00-05:00"],
    ),
    (
        "OJS",
        "0 23 L * *",
        "America/Chicago",
        "2026-02-01",
        ["2026-02-28T23:00:00-06:00", "2026-03-31T23:00:00-05:00"],
    ),
    (
        "OJS",
        "@hourly",
        "UTC",
        "2026-01-01T00:00",
        ["2026-01-01T01:00:00+00:00", "2026-01-01T02:00:00+00:00"],
    ),
    ("OJS", "@daily", "UTC", "2026-01-01T00:00", ["2026-01-02T00:00:00+00:00"]),
    ("OJS", "@midnight", "UTC", "2026-01-01T00:00", ["2026-01-02T00:00:00+00:00"]),
    (
        "OJS",
        "@weekly",
        "UTC",
        "2026-01-01",
        ["2026-01-04T00:00:00+00:00", "2026-01-11T00:00:00+00:00"],
    ),
    ("OJS", "@monthly", "UTC", "2026-01-01T00:00", ["2026-02-01T00:00:00+00:00"]),
    ("OJS", "@yearly", "UTC", "2026-01-01T00:00", ["2027-01-01T00:00:00+00:00"]),
    ("OJS", "@annually", "UTC", "2026-06-01", ["2027-01-01T00:00:00+00:00"]),
    (
        "OJS",
        "*/20 * * * * *",
        "UTC",
        "2026-01-01T00:00:00",
        ["2026-01-01T00:00:20+00:00", "2026-01-01T00:00:40+00:00", "2026-01-01T00:01:00+00:00"],
    ),
    (
        "OJS",
        "30 0 9 * * *",
        "UTC",
        "2026-01-01T09:00:00",
        ["2026-01-01T09:00:30+00:00", "2026-01-02T09:00:30+00:00"],
    ),
    ("OJS", "0 0 1 jan *", "UTC", "2026-05-01", ["2027-01-01T00:00:00+00:00"]),
    ("OJS", "0 0 * * sun", "UTC", "2026-01-01", ["2026-01-04T00:00:00+00:00"]),
    ("OJS", "0 0 * * Sun", "UTC", "2026-01-01", ["2026-01-04T00:00:00+00:00"]),
    ("OJS", "0 0 * * 7", "UTC", "2026-01-01", ["2026-01-04T00:00:00+00:00"]),
    ("OJS", "0 0 * * 0", "UTC", "2026-01-01", ["2026-01-04T00:00:00+00:00"]),
    (
        "OJS",
        "0 0 1 JAN-MAR *",
        "UTC",
        "2026-01-15",
        ["2026-02-01T00:00:00+00:00", "2026-03-01T00:00:00+00:00", "2027-01-01T00:00:00+00:00"],
    ),
    (
        "OJS",
        "0 12 * * SAT,SUN",
        "UTC",
        "2026-01-01",
        ["2026-01-03T12:00:00+00:00", "2026-01-04T12:00:00+00:00", "2026-01-10T12:00:00+00:00"],
    ),
    (
        "issue",
        "5-5 * * * *",
        "UTC",
        "2026-01-01T00:00",
        ["2026-01-01T00:05:00+00:00", "2026-01-01T01:05:00+00:00"],
    ),
    ("issue", "5,* * * * *", "UTC", "2026-01-01T00:00", ["2026-01-01T00:01:00+00:00"]),
    (
        "Vixie",
        "10/20 * * * *",
        "UTC",
        "2026-01-01T00:00",
        [
            "2026-01-01T00:10:00+00:00",
            "2026-01-01T00:30:00+00:00",
            "2026-01-01T00:50:00+00:00",
            "2026-01-01T01:10:00+00:00",
        ],
    ),
    (
        "Vixie",
        "0-30/10 * * * *",
        "UTC",
        "2026-01-01T00:00",
        [
            "2026-01-01T00:10:00+00:00",
            "2026-01-01T00:20:00+00:00",
            "2026-01-01T00:30:00+00:00",
            "2026-01-01T01:00:00+00:00",
        ],
    ),
    (
        "Vixie",
        "0 0 * * 1-5/2",
        "UTC",
        "2026-01-01",
        ["2026-01-02T00:00:00+00:00", "2026-01-05T00:00:00+00:00", "2026-01-07T00:00:00+00:00"],
    ),
    # -- the day rules ----------------------------------------------------------------
    (
        "Vixie",
        "0 0 13 * 5",
        "UTC",
        "2026-01-01",
        [
            "2026-01-02T00:00:00+00:00",
            "2026-01-09T00:00:00+00:00",
            "2026-01-13T00:00:00+00:00",
            "2026-01-16T00:00:00+00:00",
        ],
    ),
    (
        "Vixie",
        "0 0 */2 * 5",
        "UTC",
        "2026-01-01",
        ["2026-01-09T00:00:00+00:00", "2026-01-23T00:00:00+00:00", "2026-02-13T00:00:00+00:00"],
    ),
    ("Vixie", "0 0 * * 1", "UTC", "2026-01-01", ["2026-01-05T00:00:00+00:00"]),
    (
        "Vixie",
        "0 0 29 2 1",
        "UTC",
        "2026-01-01",
        ["2026-02-02T00:00:00+00:00", "2026-02-09T00:00:00+00:00"],
    ),
    (
        "calendar",
        "0 0 LW * *",
        "UTC",
        "2026-01-01",
        [
            "2026-01-30T00:00:00+00:00",
            "2026-02-27T00:00:00+00:00",
            "2026-03-31T00:00:00+00:00",
            "2026-04-30T00:00:00+00:00",
        ],
    ),
    (
        "calendar",
        "0 0 1W * *",
        "UTC",
        "2026-08-01T01:00",
        [
            "2026-08-03T00:00:00+00:00",
            "2026-09-01T00:00:00+00:00",
            "2026-10-01T00:00:00+00:00",
            "2026-11-02T00:00:00+00:00",
        ],
    ),
    (
        "calendar",
        "0 0 31W * *",
        "UTC",
        "2026-01-01",
        ["2026-01-30T00:00:00+00:00", "2026-03-31T00:00:00+00:00", "2026-05-29T00:00:00+00:00"],
    ),
    (
        "calendar",
        "0 0 * * 1#5",
        "UTC",
        "2026-01-01",
        ["2026-03-30T00:00:00+00:00", "2026-06-29T00:00:00+00:00"],
    ),
    (
        "calendar",
        "0 0 * * 0L",
        "UTC",
        "2026-01-01",
        ["2026-01-25T00:00:00+00:00", "2026-02-22T00:00:00+00:00"],
    ),
    (
        "calendar",
        "0 0 * * SUN#1",
        "UTC",
        "2026-01-01",
        ["2026-01-04T00:00:00+00:00", "2026-02-01T00:00:00+00:00"],
    ),
    ("calendar", "0 0 * * 7#2", "UTC", "2026-01-01", ["2026-01-11T00:00:00+00:00"]),
    (
        "calendar",
        "0 0 L 2 *",
        "UTC",
        "2027-03-01",
        ["2028-02-29T00:00:00+00:00", "2029-02-28T00:00:00+00:00"],
    ),
    (
        "calendar",
        "0 0 29 2 *",
        "UTC",
        "2026-01-01",
        ["2028-02-29T00:00:00+00:00", "2032-02-29T00:00:00+00:00"],
    ),
    ("calendar", "0 0 29 2 *", "UTC", "2096-03-01", ["2104-02-29T00:00:00+00:00"]),
    (
        "calendar",
        "0 0 31 * *",
        "UTC",
        "2026-01-31T00:00",
        ["2026-03-31T00:00:00+00:00", "2026-05-31T00:00:00+00:00"],
    ),
    ("calendar", "0 0 30 * *", "UTC", "2026-01-30T12:00", ["2026-03-30T00:00:00+00:00"]),
    ("calendar", "59 23 31 12 *", "UTC", "2026-12-31T23:59", ["2027-12-31T23:59:00+00:00"]),
    ("calendar", "0 0 1 * *", "UTC", "2026-12-15", ["2027-01-01T00:00:00+00:00"]),
    # -- time zones -----------------------------------------------------------------------
    ("tzdb", "0 9 * * *", "Asia/Tokyo", "2026-01-01T00:00:00+00:00", ["2026-01-02T09:00:00+09:00"]),
    ("tzdb", "0 9 * * *", "US/Eastern", "2026-01-01T00:00:00+00:00", ["2026-01-01T09:00:00-05:00"]),
    (
        "tzdb",
        "0 9 * * *",
        "Europe/Kiev",
        "2026-07-01T00:00:00+00:00",
        ["2026-07-01T09:00:00+03:00"],
    ),
    ("tzdb", "0 9 * * *", "Etc/UTC", "2026-01-01", ["2026-01-01T09:00:00+00:00"]),
    ("tzdb", "0 9 * * *", "GMT", "2026-01-01", ["2026-01-01T09:00:00+00:00"]),
    # -- DST: spring forward (the gap does not fire) ------------------------------------
    ("OJS", "30 2 * * *", "America/New_York", "2026-03-07T12:00", ["2026-03-09T02:30:00-04:00"]),
    ("tzdb", "0 2 * * *", "America/New_York", "2026-03-07T12:00", ["2026-03-09T02:00:00-04:00"]),
    ("tzdb", "0 3 * * *", "America/New_York", "2026-03-07T12:00", ["2026-03-08T03:00:00-04:00"]),
    (
        "tzdb",
        "0 * * * *",
        "America/New_York",
        "2026-03-08T00:30",
        ["2026-03-08T01:00:00-05:00", "2026-03-08T03:00:00-04:00", "2026-03-08T04:00:00-04:00"],
    ),
    (
        "tzdb",
        "*/30 * * * *",
        "America/New_York",
        "2026-03-08T01:15",
        ["2026-03-08T01:30:00-05:00", "2026-03-08T03:00:00-04:00"],
    ),
    ("tzdb", "30 1 * * *", "Europe/London", "2026-03-28T12:00", ["2026-03-30T01:30:00+01:00"]),
    ("tzdb", "0 * * * *", "Europe/London", "2026-03-29T00:30", ["2026-03-29T02:00:00+01:00"]),
    ("tzdb", "30 3 * * *", "Europe/Riga", "2026-03-28T12:00", ["2026-03-30T03:30:00+03:00"]),
    (
        "tzdb",
        "15 2 * * *",
        "Australia/Lord_Howe",
        "2026-10-03T12:00",
        ["2026-10-05T02:15:00+11:00"],
    ),
    (
        "tzdb",
        "45 2 * * *",
        "Australia/Lord_Howe",
        "2026-10-03T12:00",
        ["2026-10-04T02:45:00+11:00"],
    ),
    # -- DST: fall back (a fixed time once, a periodic one in both passes) ---------------
    (
        "OJS",
        "30 1 * * *",
        "America/New_York",
        "2026-10-31T12:00",
        ["2026-11-01T01:30:00-04:00", "2026-11-02T01:30:00-05:00"],
    ),
    (
        "issue",
        "0 * * * *",
        "America/New_York",
        "2026-11-01T00:30",
        ["2026-11-01T01:00:00-04:00", "2026-11-01T01:00:00-05:00", "2026-11-01T02:00:00-05:00"],
    ),
    (
        "issue",
        "*/15 * * * *",
        "America/New_York",
        "2026-11-01T01:40",
        ["2026-11-01T01:45:00-04:00", "2026-11-01T01:00:00-05:00", "2026-11-01T01:15:00-05:00"],
    ),
    ("issue", "0 */3 * * *", "America/New_York", "2026-11-01T00:30", ["2026-11-01T03:00:00-05:00"]),
    (
        "issue",
        "0 */1 * * *",
        "America/New_York",
        "2026-11-01T00:30",
        ["2026-11-01T01:00:00-04:00", "2026-11-01T01:00:00-05:00"],
    ),
    (
        "issue",
        "30 1 * * *",
        "America/New_York",
        "2026-11-01T01:40-05:00",
        ["2026-11-02T01:30:00-05:00"],
    ),
    (
        "issue",
        "*/30 * * * *",
        "America/New_York",
        "2026-11-01T01:10-05:00",
        ["2026-11-01T01:30:00-05:00", "2026-11-01T02:00:00-05:00"],
    ),
    (
        "tzdb",
        "30 1 * * *",
        "Europe/London",
        "2026-10-24T12:00",
        ["2026-10-25T01:30:00+01:00", "2026-10-26T01:30:00+00:00"],
    ),
    (
        "tzdb",
        "0 * * * *",
        "Europe/London",
        "2026-10-25T00:30",
        ["2026-10-25T01:00:00+01:00", "2026-10-25T01:00:00+00:00", "2026-10-25T02:00:00+00:00"],
    ),
    (
        "tzdb",
        "30 3 * * *",
        "Europe/Riga",
        "2026-10-24T12:00",
        ["2026-10-25T03:30:00+03:00", "2026-10-26T03:30:00+02:00"],
    ),
    (
        "tzdb",
        "45 1 * * *",
        "Australia/Lord_Howe",
        "2026-04-04T12:00",
        ["2026-04-05T01:45:00+11:00", "2026-04-06T01:45:00+10:30"],
    ),
    (
        "tzdb",
        "*/30 * * * *",
        "Australia/Lord_Howe",
        "2026-04-05T01:20+11:00",
        ["2026-04-05T01:30:00+11:00", "2026-04-05T01:30:00+10:30", "2026-04-05T02:00:00+10:30"],
    ),
]


@pytest.mark.parametrize(
    ("source", "expression", "zone", "start", "expected"),
    CASES,
    ids=[f"{c[0]}:{c[1]}@{c[2]}:{c[3]}" for c in CASES],
)
def test_fire_times(
    source: str, expression: str, zone: str, start: str, expected: list[str]
) -> None:
    assert upcoming(expression, zone, start, len(expected)) == expected


# (source, expression, what the message must say)
REJECTED: list[tuple[str, str, str]] = [
    ("issue", "0 0 32 * *", "day-of-month: 32 is out of range 1-31"),
    ("OJS", "60 * * * *", "minute: 60 is out of range 0-59"),
    ("OJS", "* 24 * * *", "hour: 24 is out of range 0-23"),
    ("OJS", "* * 0 * *", "day-of-month: 0 is out of range 1-31"),
    ("OJS", "* * * 13 *", "month: 13 is out of range 1-12"),
    ("OJS", "* * * 0 *", "month: 0 is out of range 1-12"),
    ("OJS", "* * * * 8", "day-of-week: 8 is out of range 0-7"),
    ("OJS", "*/0 * * * *", "minute: the step in '*/0' is 0"),
    ("issue", "5-1 * * * *", "minute: the range '5-1' is reversed"),
    ("issue", "1,,2 * * * *", "minute: empty item"),
    ("issue", "* * * *", "has 4 fields"),
    ("issue", "* * * * * * *", "has 7 fields"),
    ("issue", "", "has 0 fields"),
    ("issue", "* * * FOO *", "month: 'FOO' is not a name or number"),
    ("issue", "* * * * FUNDAY", "day-of-week: 'FUNDAY' is not a name or number"),
    ("issue", "a * * * *", "minute: 'a' is not a number"),
    ("issue", "* * * * MON#6", "the occurrence must be 1 to 5"),
    ("issue", "* * * * 1#0", "the occurrence must be 1 to 5"),
    ("issue", "* * 32W * *", "day-of-month: 32 is out of range 1-31"),
    ("issue", "* * 5L * *", "day-of-month: '5L' is not a number"),
    ("issue", "* * * * 9L", "day-of-week: 9 is out of range 0-7"),
    ("issue", "*/x * * * *", "minute: the step in '*/x' is not a number"),
    ("issue", "1-2-3 * * * *", "minute: '1-2-3' is not a number"),
    ("issue", "@fortnightly", "is not a cron alias"),
    ("OJS", "@every", "the duration must be like"),
    ("OJS", "@every 0s", "the duration must be more than 0"),
    ("OJS", "@every 5 minutes", "the duration must be like"),
    ("issue", "* * * JAN-FOO *", "month: 'JAN-FOO' is not a name or number"),
]


@pytest.mark.parametrize(
    ("source", "expression", "message"), REJECTED, ids=[c[1] for c in REJECTED]
)
def test_rejected_expressions(source: str, expression: str, message: str) -> None:
    with pytest.raises(durafn.CronSyntaxError) as caught:
        cron.parse(expression)
    assert message in str(caught.value)
    assert isinstance(caught.value, ValueError)


@pytest.mark.parametrize(
    ("zone", "why"),
    [
        ("+05:00", "fixed offset"),
        ("UTC+5", "fixed offset"),
        ("Etc/GMT+5", "fixed offset"),
        ("EST", "abbreviation or a legacy name"),
        ("PST8PDT", "abbreviation or a legacy name"),
        ("MST", "abbreviation or a legacy name"),
        ("EST5EDT", "abbreviation or a legacy name"),
        ("CST6CDT", "abbreviation or a legacy name"),
        ("america/new_york", "wrong case"),
        ("Mars/Olympus_Mons", "not an IANA time zone$"),
        ("America/NewYork", "not an IANA time zone; did you mean 'America/New_York'\\?"),
        ("America/Sao Paulo", "did you mean 'America/Sao_Paulo'\\?"),
        ("", "not a zone name"),
    ],
)
def test_zones_without_daylight_rules_or_in_the_wrong_case_are_refused(zone: str, why: str) -> None:
    with pytest.raises(durafn.CronSyntaxError, match=why):
        cron.parse("0 9 * * *", zone)


@pytest.mark.parametrize(
    "expression",
    [
        "0 0 31 2 *",
        "0 0 30 2 *",
        "0 0 31 4,6,9,11 *",
        "0 0 30,31 2 *",
        "1 1 */100 * MON#4",  # cronsim:test_it_handles_no_matches: the 1st is no 4th Monday
    ],
)
def test_a_day_no_month_has_is_accepted_and_never_fires(expression: str) -> None:
    """OJS: accepted at registration, never fires; and found out at once, or after a few
    years of search at most, not centuries: the schedule checks every shape a month can
    have (its length, the weekday of its 1st)."""
    assert cron.parse(expression).next_after(at("2026-01-01")) is None


def test_every_counts_from_its_anchor() -> None:
    """OJS: ``@every 30m`` fires every 30 minutes from registration or the last run."""
    schedule = cron.parse("@every 1h30m")
    anchor = at("2026-01-01T10:07:13")
    assert schedule.next_after(anchor) == at("2026-01-01T11:37:13")
    times = schedule.iter_after(anchor)
    assert [iso(next(times)) for _ in range(2)] == [
        "2026-01-01T11:37:13+00:00",
        "2026-01-01T13:07:13+00:00",
    ]
    assert cron.parse("@every 45s").next_after(anchor) == at("2026-01-01T10:07:58")


def test_matches_and_results_in_the_schedules_zone() -> None:
    schedule = cron.parse("0 9 * * MON-FRI", "America/New_York")
    fire = schedule.next_after(at("2026-11-27T10:00:00+00:00"))
    assert fire is not None and fire.tzinfo == ZoneInfo("America/New_York")
    assert schedule.matches(fire)
    assert not schedule.matches(at("2026-11-28T09:00", "America/New_York"))  # a Saturday


def test_a_naive_time_is_refused() -> None:
    with pytest.raises(durafn.ArgumentError, match="aware"):
        cron.parse("* * * * *").next_after(datetime(2026, 1, 1))


def test_a_start_in_the_second_pass_never_yields_a_time_before_it() -> None:
    """From every 7th minute through the fall-back night (both passes of 1 a.m.): each
    next time is after the start, and they come in instant order; the periodic job
    fires 6 times in each pass of the repeated hour."""
    schedule = cron.parse("*/10 * * * *", "America/New_York")
    start = datetime(2026, 11, 1, 4, 50, tzinfo=UTC)  # 00:50 EDT
    nexts = []
    for minute in range(0, 200, 7):
        t = start + timedelta(minutes=minute)
        fire = schedule.next_after(t)
        assert fire is not None and fire.astimezone(UTC) > t
        nexts.append(fire.astimezone(UTC))
    assert nexts == sorted(nexts)
    walk = [w.astimezone(UTC) for w in itertools.islice(schedule.iter_after(start), 20)]
    assert walk == sorted(set(walk))
    one_am = [w for w in walk if w.astimezone(ZoneInfo("America/New_York")).hour == 1]
    assert len(one_am) == 12


# -- Graphile crontab lines -----------------------------------------------------------------
# Cases from Graphile Worker's published test, __tests__/crontab.test.ts ("parses crontab
# file correctly", "gives error on syntax error"), and its documentation's examples.

ALL_MINUTES, ALL_HOURS = list(range(60)), list(range(24))
ALL_DATES, ALL_MONTHS, ALL_DOWS = list(range(1, 32)), list(range(1, 13)), list(range(7))

GRAPHILE_CRONTAB = """\
# ┌───────────── UTC minute (0 - 59)
# * * * * * task ?opts {payload}

* * * * * simple
0 4 * * * every_day_at_4_am
0 4 * * 0 every_sunday_at_4_am
0 4 * * 7 every_sunday_at_4_am ?id=sunday_7



0 4 * * 2 every_tuesday_at_4_am {isTuesday: true}
*/10,7,56-59 1 1 1 1 one ?id=stuff&fill=4w3d2h1m&max=3&queue=my_queue&priority=3 {myExtraPayload:{stuff:"here with # hash char"}}
    *     *      *       *       *      lots_of_spaces
* * * * * with_key ?jobKey=my_key
* * * * * with_key_and_mode ?jobKey=my_key&jobKeyMode=preserve_run_at
* * * * * nested/task ?jobKey=my_key&jobKeyMode=preserve_run_at
* * * * * nested/folder/task ?jobKey=my_key&jobKeyMode=preserve_run_at
"""


def test_graphile_crontab_file() -> None:
    items = cron.parse_crontab(GRAPHILE_CRONTAB)
    simple = items[0]
    assert (simple.task, simple.identifier, simple.payload) == ("simple", "simple", None)
    assert [simple.minutes, simple.hours, simple.dates, simple.months, simple.dows] == [
        ALL_MINUTES,
        ALL_HOURS,
        ALL_DATES,
        ALL_MONTHS,
        ALL_DOWS,
    ]
    assert simple.options == cron.CronItemOptions()
    assert (items[1].minutes, items[1].hours, items[1].dows) == ([0], [4], ALL_DOWS)
    assert (items[2].dows, items[3].dows) == ([0], [0])  # 7 is Sunday too
    assert (items[3].task, items[3].identifier) == ("every_sunday_at_4_am", "sunday_7")
    assert items[4].payload == {"isTuesday": True}
    one = items[5]
    assert one.minutes == [0, 7, 10, 20, 30, 40, 50, 56, 57, 58, 59]
    assert (one.hours, one.dates, one.months, one.dows) == ([1], [1], [1], [1])
    assert (one.task, one.identifier) == ("one", "stuff")
    assert one.options == cron.CronItemOptions(
        backfill_period=timedelta(weeks=4, days=3, hours=2, minutes=1),
        max_attempts=3,
        queue="my_queue",
        priority=3,
    )
    assert one.payload == {"myExtraPayload": {"stuff": "here with # hash char"}}
    assert items[6].task == "lots_of_spaces" and items[6].minutes == ALL_MINUTES
    assert (items[7].options.job_key, items[7].options.job_key_mode) == ("my_key", "replace")
    assert items[8].options.job_key_mode == "preserve_run_at"
    assert [items[9].task, items[10].task] == ["nested/task", "nested/folder/task"]
    assert len(items) == 11


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (
            "* * * * too_few_parameters",
            "Could not process line '1' of crontab: '* * * * too_few_parameters': expected "
            "five time fields (minute hour day month weekday) and a task, found 5 fields",
        ),
        (
            "* * * * * two tasks",
            "Invalid command specification in line 1 of crontab: after the task (and "
            "?options), only a {JSON5 payload} may follow, not 'tasks'",
        ),
        (
            "1,60 * * * * out_of_range",
            "Too large value '60' in minutes range in line 1 of crontab: expected values in the range 0-59.",
        ),
        (
            "*/0 * * * * division_by_zero",
            "Invalid wildcard expression '*/0' in minutes range in line 1 of crontab: divisor '0' expected to be greater than zero",
        ),
        (
            "* * * * * invalid_options ?unknown=3",
            "Options on line 1 of crontab contains unsupported key 'unknown'; supported keys are: 'id', 'fill', 'max', 'queue', 'jobKey', 'jobKeyMode', 'priority'.",
        ),
        (
            "* * * * * json_syntax_error {invalidJson=true}",
            "Failed to parse JSON5 payload on line 1 of crontab:",
        ),
        (
            "5-5 * * * * same",
            "Invalid range '5-5' in minutes range in line 1 of crontab: destination is not larger than source",
        ),
        ("* * 0 * * too_small", "Too small value '0' in dates range in line 1 of crontab"),
        ("* * * * 8 big_dow", "Too large value '8' in days of week range in line 1 of crontab"),
        (
            "* * * JAN * named",
            "Could not process line '1' of crontab: '* * * JAN * named': names are not "
            "allowed in a Graphile line: JAN (the months field)",
        ),
        (
            "* * L * * last",
            "Could not process line '1' of crontab: '* * L * * last': the dates field 'L' "
            "is not numbers, *, */n, ranges or lists of them (no L, W, # or ?)",
        ),
        (
            "\t0 4 * * MON-FRI named_range ",
            "names are not allowed in a Graphile line: MON-FRI (the days of week field)",
        ),
        ("* * * * * t ?max=x", "contains invalid value for 'max', value 'x' is not compatible"),
        ("* * * * * t ?fill=3y", "contains invalid value for 'fill', value '3y' is not compatible"),
        ("* * * * * t ?jobKeyMode=keep", "contains invalid value for 'jobKeyMode'"),
        ("* * * * * t ?max=1&max=2", "invalid value for 'max', did you specify it more than once?"),
        (
            "* * * * * 9task",
            "Invalid command specification in line 1 of crontab: the task identifier "
            "'9task' must start with a letter or _ and hold only letters, digits and _ : - /",
        ),
    ],
)
def test_graphile_crontab_errors(line: str, message: str) -> None:
    with pytest.raises(durafn.CronSyntaxError) as caught:
        cron.parse_crontab(line)
    assert message in str(caught.value)


def test_a_graphile_line_may_have_whitespace_around_it() -> None:
    """As the lines of Graphile's own test crontab do."""
    for line in ("    *     *      *       *       *      lots_of_spaces     ", "\t0 4 * * 1\tt\t"):
        item = cron.parse_cron_item(line)
        assert item.task in ("lots_of_spaces", "t")


def test_graphile_duplicate_identifiers() -> None:
    with pytest.raises(durafn.CronSyntaxError, match="duplicate identifiers found: 'a'"):
        cron.parse_crontab("* * * * * a\n0 * * * * a\n")


def test_graphile_documentation_examples_fire_in_utc() -> None:
    """The examples of Graphile's crontab page, and its own day rule: when neither day set
    is full, either may match (``*/2`` counts as restricted, unlike Vixie's rule)."""
    weekly = cron.parse_cron_item("30 4 * * 1 send_weekly_email ?fill=2d&max=10 {onboarding:false}")
    assert weekly.options.backfill_period == timedelta(days=2)
    assert weekly.payload == {"onboarding": False}
    assert iso(weekly.schedule.next_after(at("2026-01-01"))) == "2026-01-05T04:30:00+00:00"  # type: ignore[arg-type]
    rollup = cron.parse_cron_item("0 */4 * * * rollup")
    assert upcoming_of(rollup, "2026-01-01T01:00", 2) == [
        "2026-01-01T04:00:00+00:00",
        "2026-01-01T08:00:00+00:00",
    ]
    either = cron.parse_cron_item("0 0 */2 * 5 either")
    assert upcoming_of(either, "2026-01-01", 3) == [
        "2026-01-02T00:00:00+00:00",  # a Friday (an even date: Vixie's rule would skip it)
        "2026-01-03T00:00:00+00:00",  # an odd date
        "2026-01-05T00:00:00+00:00",
    ]
    assert upcoming("0 0 */2 * 5", "UTC", "2026-01-01", 1) == ["2026-01-09T00:00:00+00:00"]


def upcoming_of(item: cron.CronItem, start: str, count: int) -> list[str]:
    return [iso(t) for t in itertools.islice(item.schedule.iter_after(at(start)), count)]


# -- describe, and `durafn cron check` --------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "zone", "described"),
    [
        (
            "0 9 * * MON-FRI",
            "America/New_York",
            "at 09:00 on Monday through Friday, America/New_York",
        ),
        ("*/15 * * * *", "UTC", "every 15 minutes, UTC"),
        ("* * * * *", "UTC", "every minute, UTC"),
        ("0 * * * *", "UTC", "at minute 0 of every hour, UTC"),
        ("0 0 L * *", "UTC", "at 00:00 on the last day of the month, UTC"),
        ("0 0 * * 5#3", "UTC", "at 00:00 on the third Friday of the month, UTC"),
        ("0 0 13 * 5", "UTC", "at 00:00 on day 13 of the month or on Friday, UTC"),
        ("0 0 1 JAN-MAR *", "UTC", "at 00:00 on day 1 of the month in January through March, UTC"),
        ("*/20 * * * * *", "UTC", "at seconds 0, 20 and 40 of every minute, UTC"),
        ("@every 1h30m", "Europe/Riga", "every 1h30m, Europe/Riga"),
    ],
)
def test_describe(expression: str, zone: str, described: str) -> None:
    assert cron.parse(expression, zone).describe() == described


def test_cron_check_command() -> None:
    runner = CliRunner()
    result = runner.invoke(
        durafn.cli.main,
        [
            "cron",
            "check",
            "30 1 * * *",
            "--tz",
            "America/New_York",
            "--count",
            "2",
            "--after",
            "2026-10-31T12:00:00-04:00",
        ],
    )
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [
        "at 01:30, America/New_York",
        "2026-11-01T01:30:00-04:00",  # the first pass only (OJS)
        "2026-11-02T01:30:00-05:00",
    ]
    never = runner.invoke(durafn.cli.main, ["cron", "check", "0 0 31 2 *"])
    assert never.stdout.splitlines()[-1] == "never fires"
    bad = runner.invoke(durafn.cli.main, ["cron", "check", "0 0 32 * *"])
    assert bad.exit_code == 1
    assert bad.stderr.strip() == "error: day-of-month: 32 is out of range 1-31"


@pytest.mark.parametrize(
    ("expression", "zone"),
    [
        ("*/7 * * * * *", "UTC"),
        ("0 * * * *", "America/New_York"),  # both passes of the repeated hour
        ("30 1 * * *", "America/New_York"),  # the fold's first pass only
        ("30 2 * * *", "America/New_York"),  # skipped in the spring-forward gap
        ("0 0 L * *", "Europe/Riga"),
        ("15 9 * * 5#3", "Australia/Lord_Howe"),
        ("@every 1h30m", "America/New_York"),
    ],
)
def test_the_latest_tick_and_the_ticks_from_a_time_match_stepping_through_them(
    expression: str, zone: str
) -> None:
    """``last_until`` (bisection) and ``iter_from`` agree with stepping through every
    fire time, across daylight-saving days, from many starts and ends."""
    schedule = cron.parse(expression, zone)
    first = schedule.next_after(datetime(2026, 2, 20, tzinfo=UTC))
    assert first is not None
    ticks = [first, *itertools.islice(schedule.iter_after(first), 300)]
    if expression.startswith("@every"):  # real time: 90 minutes apart across the change too
        gaps = {b.astimezone(UTC) - a.astimezone(UTC) for a, b in itertools.pairwise(ticks)}
        assert gaps == {timedelta(minutes=90)}
    for n, until in enumerate(ticks[1:], start=1):
        if n % 7:
            continue
        for offset in (timedelta(0), timedelta(milliseconds=1), -timedelta(milliseconds=1)):
            end = until + offset
            assert schedule.last_until(first, end) == max(t for t in ticks if t <= end)
    for start in ticks[:-10:11]:
        for offset in (timedelta(0), timedelta(milliseconds=1), -timedelta(milliseconds=1)):
            begin = start + offset
            found = list(itertools.islice(schedule.iter_from(first, begin), 5))
            assert found == [t for t in ticks if t >= begin][:5]
