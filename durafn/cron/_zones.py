"""Time zone names: IANA geographic zones only (OJS cron §5).

A schedule's zone must encode its daylight-saving rules, so only ``Area/Location`` names
(links such as ``US/Eastern`` included) and UTC (``UTC``, ``Etc/UTC``, ``GMT``) are
accepted. Fixed offsets (``+05:00``, ``UTC+5``, ``Etc/GMT+5``), abbreviations and legacy
rule names (``EST``, ``EST5EDT``) are refused, as is the wrong case: zone names are
case-sensitive, and ``america/new_york`` would load on a case-insensitive file system only.
"""

from __future__ import annotations

import difflib
import functools
import zoneinfo

from .._errors import CronSyntaxError

UTC_NAMES = frozenset({"UTC", "Etc/UTC", "GMT"})


@functools.cache
def _known() -> frozenset[str]:
    return frozenset(zoneinfo.available_timezones())


def _plain(name: str) -> str:
    return name.lower().replace("_", "").replace(" ", "")


@functools.cache
def zone(name: str) -> zoneinfo.ZoneInfo:
    """The zone for a valid name; CronSyntaxError says why another is refused."""
    if not isinstance(name, str) or not name:
        raise CronSyntaxError(f"time zone: {name!r} is not a zone name")
    if name in UTC_NAMES:
        return zoneinfo.ZoneInfo("UTC")
    if name.startswith("Etc/") or name[0] in "+-" or name.upper().startswith(("UTC", "GMT")):
        raise CronSyntaxError(
            f"time zone: {name!r} is a fixed offset, which has no daylight-saving rules; "
            "use a geographic zone such as 'America/New_York' (or 'UTC')"
        )
    if name not in _known():
        lowered = {known.lower(): known for known in _known()}
        if (match := lowered.get(name.lower())) is not None:
            raise CronSyntaxError(
                f"time zone: {name!r} has the wrong case; zone names are case-sensitive: {match!r}"
            )
        # The nearest geographic names, compared without case, '_' or ' ' (a missing
        # underscore is the common slip: America/NewYork).
        plain = {_plain(known): known for known in _known() if "/" in known}
        near = difflib.get_close_matches(_plain(name), plain, n=3, cutoff=0.8)
        hint = f"; did you mean {' or '.join(repr(plain[n]) for n in near)}?" if near else ""
        raise CronSyntaxError(f"time zone: {name!r} is not an IANA time zone{hint}")
    if "/" not in name:
        raise CronSyntaxError(
            f"time zone: {name!r} is an abbreviation or a legacy name; use a geographic "
            "zone such as 'America/New_York' (or 'UTC')"
        )
    return zoneinfo.ZoneInfo(name)
