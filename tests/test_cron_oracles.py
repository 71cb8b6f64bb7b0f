"""durafn.cron against croniter and cronsim (test-only oracles), on thousands of random
expressions, wherever their rules agree with OJS: in UTC (no daylight saving, where both
differ from OJS), with plain numbers, ranges, steps and lists (no ``L``, ``W`` or ``#``,
whose corner cases they treat otherwise), and day fields that are either ``*`` or
restricted without a leading ``*`` (so that Vixie's day rule and theirs coincide), and
ranges ``a-b`` with ``a < b`` (croniter reads ``5-5`` as a whole cycle). An
expression an oracle refuses (cronsim refuses days no month has) is compared with the
other one only. The generator is seeded: the same expressions every run.
"""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import croniter
import cronsim

from durafn import cron

RUNS = 2000
FIRES = 5


def _field(rng: random.Random, low: int, high: int, *, star_ok: bool = True) -> str:
    kind = rng.choice(["star", "value", "range", "step", "list", "range_step"])
    if kind == "star" and star_ok:
        return "*"
    if kind == "step" and star_ok:
        return f"*/{rng.randint(2, max(2, (high - low) // 2))}"
    if kind == "range" or kind == "range_step":
        # a < b: croniter reads "5-5" as a whole cycle (OJS: the one value 5)
        a = rng.randint(low, high - 1)
        b = rng.randint(a + 1, high)
        return f"{a}-{b}" + (f"/{rng.randint(1, 5)}" if kind == "range_step" else "")
    if kind == "list":
        return ",".join(str(v) for v in sorted(rng.sample(range(low, high + 1), rng.randint(2, 4))))
    return str(rng.randint(low, high))


def _expression(rng: random.Random) -> str:
    minute = _field(rng, 0, 59)
    hour = _field(rng, 0, 23)
    # Day fields: "*" or restricted without a leading "*" (the Vixie rule's two cases).
    dom = "*" if rng.random() < 0.5 else _field(rng, 1, 28, star_ok=False)
    month = _field(rng, 1, 12)
    dow = "*" if rng.random() < 0.5 else _field(rng, 0, 6, star_ok=False)
    return f"{minute} {hour} {dom} {month} {dow}"


def test_durafn_agrees_with_croniter_and_cronsim() -> None:
    rng = random.Random(20261124)
    compared = {"croniter": 0, "cronsim": 0}
    for _ in range(RUNS):
        expression = _expression(rng)
        start = datetime(2026, 1, 1, tzinfo=UTC) + timedelta(minutes=rng.randint(0, 2_000_000))
        schedule = cron.parse(expression)
        ours = [t.astimezone(UTC) for t in _take(schedule.iter_after(start), FIRES)]
        theirs = croniter.croniter(expression, start)
        assert ours == [theirs.get_next(datetime) for _ in range(FIRES)], expression
        compared["croniter"] += 1
        try:
            other = cronsim.CronSim(expression, start)
        except cronsim.CronSimError:
            continue
        assert ours == [next(other) for _ in range(FIRES)], expression
        compared["cronsim"] += 1
    assert compared["croniter"] == RUNS and compared["cronsim"] > RUNS * 0.9


def _take(times: object, n: int) -> list[datetime]:
    out: list[datetime] = []
    for when in times:  # type: ignore[attr-defined]
        out.append(when)
        if len(out) == n:
            return out
    return out
