"""Flow control: one option (``flow=Flow(...)``) that limits how rows sharing a key start.

A row's **flow key** is computed when it is scheduled, from its validated arguments, and
stored on the row (``flow_key``) with the knobs the claim needs (``flow``, as JSON). Every
knob is enforced by the claim, inside its transaction (``_store/claim/flow.py``), never
in the function: a row the limits hold back simply stays Pending.

* ``concurrency``: at most N rows of the key run at once, across every worker and process.
* ``rate``: a GCRA (the generic cell rate algorithm, a token bucket kept as one timestamp,
  the key's *theoretical arrival time*): starts are spaced ``per / limit`` seconds apart,
  with up to ``burst`` at once. One number per key, updated by the claim that consumes it,
  so a claim rolled back (a mutation batch retried after a fault) consumes nothing.
* ``weight``: fairness. Claims take due keyed rows round-robin across keys (``weight`` rows
  of a key per round), so one key's backlog never delays another key's row by more than a
  round; a row without a flow key counts as a key of its own.
* ``debounce``: calls within ``quiet`` seconds of each other become one run. On the
  trailing edge (default) it is due ``quiet`` after the last call (at most ``max_wait``
  after the first), with the last call's arguments, or every call's values of one list
  parameter (``accumulate``); built on the job key: the key's one Pending row takes each
  new call. On the leading edge the first call runs at once and the calls that follow
  it less than ``quiet`` apart are absorbed by that run (``max_wait``: a new run at
  least that often under a steady stream).
* ``throttle``: at most one run per ``per`` seconds: the first call runs at once, the
  calls of the next ``per`` seconds join one run due when the period ends. Leading edge
  and throttle keep one row per function and key in ``_durafn_flow_windows``
  (``_store/write/debounce.py``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from ._checks import Error, integer, optional, positive_seconds, text
from ._errors import SchedulingError
from ._public import publish

KeyFunction = Callable[[Mapping[str, Any]], str]
PRIORITY_FLOOR = -(2**31)  # _options.PRIORITY_RANGE[0] (which imports this module)
MAX_FLOW_KEY = 512


class FlowError(SchedulingError):
    """A flow option (``Flow``, ``Rate``, ``Debounce``) is not valid, or a flow key could
    not be computed from a call's arguments."""


@dataclass(frozen=True, slots=True)
class Rate:
    """At most ``limit`` starts per ``per`` seconds for one key, ``burst`` of them at once.

    A GCRA: starts are spaced ``per / limit`` seconds apart; a key idle long enough may
    start ``burst`` rows at once (default 1: evenly spaced). Over any window of ``w``
    seconds a key starts at most ``burst + w * limit / per`` rows."""

    limit: int
    per: float = 1.0
    burst: int = 1

    def __post_init__(self) -> None:
        integer("Rate limit", self.limit, low=1, high=10**9, error=FlowError)
        positive_seconds("Rate per", self.per, error=FlowError)
        integer("Rate burst", self.burst, low=1, high=10**9, error=FlowError)

    @property
    def interval(self) -> float:
        """Seconds between two starts at the sustained rate."""
        return self.per / self.limit


@dataclass(frozen=True, slots=True)
class Debounce:
    """Calls of one key less than ``quiet`` seconds apart run once, ``quiet`` seconds
    after the last of them (trailing edge) and never later than ``max_wait`` seconds after
    the first (so a steady stream still runs). ``accumulate``: the name of a list
    parameter whose values every call adds to (Graphile's array merge); otherwise the last
    call's arguments win."""

    quiet: float
    max_wait: float | None = None
    accumulate: str | None = None
    edge: Literal["trailing", "leading"] = "trailing"
    """``"leading"``: the first call of a burst runs at once and the calls that follow it
    less than ``quiet`` apart are absorbed by that run (they return its id); with
    ``max_wait``, a call at least ``max_wait`` after the last run starts a new one."""

    def __post_init__(self) -> None:
        positive_seconds("Debounce quiet", self.quiet, error=FlowError)
        optional(positive_seconds, "Debounce max_wait", self.max_wait, error=FlowError)
        optional(text, "Debounce accumulate", self.accumulate, error=FlowError)
        if self.edge not in ("trailing", "leading"):
            raise FlowError(f"Debounce edge must be 'trailing' or 'leading', not {self.edge!r}")
        if self.edge == "trailing" and self.max_wait is not None and self.max_wait < self.quiet:
            raise FlowError(
                f"Debounce max_wait ({self.max_wait}s) is shorter than quiet ({self.quiet}s): "
                "no call could ever wait out its quiet period"
            )
        if self.edge == "leading" and self.accumulate is not None:
            raise FlowError(
                "Debounce(edge='leading') cannot accumulate: its run starts at the first "
                "call, before the others come (use the trailing edge, or Throttle)"
            )


@dataclass(frozen=True, slots=True)
class Throttle:
    """At most one run per ``per`` seconds for one key: the first call runs at once; the
    calls that come before ``per`` seconds have passed since the last run join one run,
    due then, with the last call's arguments (or every call's values of the list
    parameter ``accumulate``). A steady stream runs every ``per`` seconds."""

    per: float
    accumulate: str | None = None

    def __post_init__(self) -> None:
        positive_seconds("Throttle per", self.per, error=FlowError)
        optional(text, "Throttle accumulate", self.accumulate, error=FlowError)


@dataclass(frozen=True, slots=True)
class Flow:
    """Flow control for the rows of a function, on its decorator (``flow=``), per call
    (``fn.options(flow=...)``) or for a queue (``Queue(flow=...)``).

    ``key``: the flow key, a string (every call shares it) or a function of the call's
    validated arguments, by name, returning a string (``lambda a: f"user:{a['user_id']}"``).
    ``concurrency``: at most this many rows of a key run at once (1: a per-key mutex).
    ``rate``: a ``Rate``. ``weight``: rows of this key per round when claims share out due
    keyed rows (fairness). ``debounce``: a ``Debounce``; ``throttle``: a ``Throttle`` (one
    or the other). ``aging``: seconds per priority
    level: a waiting row competes as though its priority were one lower (more urgent) for
    each ``aging`` seconds it has been due, so no stream of more urgent rows starves it."""

    key: str | KeyFunction
    concurrency: int | None = None
    rate: Rate | None = None
    weight: int = 1
    debounce: Debounce | None = None
    aging: float | None = None
    throttle: Throttle | None = None

    def __post_init__(self) -> None:
        if not callable(self.key):
            check_flow_key("Flow key", self.key)
        optional(
            integer, "Flow concurrency", self.concurrency, low=1, high=100_000, error=FlowError
        )
        if self.rate is not None and not isinstance(self.rate, Rate):
            raise FlowError(f"Flow rate must be a durafn.Rate, not {self.rate!r}")
        integer("Flow weight", self.weight, low=1, high=10_000, error=FlowError)
        if self.debounce is not None and not isinstance(self.debounce, Debounce):
            raise FlowError(f"Flow debounce must be a durafn.Debounce, not {self.debounce!r}")
        if self.throttle is not None and not isinstance(self.throttle, Throttle):
            raise FlowError(f"Flow throttle must be a durafn.Throttle, not {self.throttle!r}")
        if self.debounce is not None and self.throttle is not None:
            raise FlowError("a Flow debounces or throttles, not both: choose one")
        optional(positive_seconds, "Flow aging", self.aging, error=FlowError)

    def key_of(self, name: str, arguments: Mapping[str, Any]) -> str:
        """The flow key of a call of ``name`` with these validated arguments."""
        if not callable(self.key):
            return self.key
        try:
            found = self.key(arguments)
        except Exception as exc:
            raise FlowError(
                f"the flow key function of {name!r} raised {type(exc).__name__}: {exc}"
            ) from exc
        return check_flow_key(f"the flow key of {name!r}", found)

    @property
    def coalesce(self) -> Debounce | Throttle | None:
        """How calls of a key become fewer runs, if they do."""
        return self.debounce or self.throttle

    def spec(self) -> str:
        """What the claim needs, as stored in the row's ``flow`` column."""
        return spec_of(self.concurrency, self.rate, self.weight, self.aging)


def spec_of(concurrency: int | None, rate: Rate | None, weight: int, aging: float | None) -> str:
    data: dict[str, Any] = {"w": weight}
    if concurrency is not None:
        data["c"] = concurrency
    if rate is not None:
        data["r"] = [rate.limit, rate.per, rate.burst]
    if aging is not None:
        data["a"] = aging
    return json.dumps(data, separators=(",", ":"))


@dataclass(frozen=True, slots=True)
class Limits:
    """A key's knobs as the claim reads them from a row (``Flow.spec``)."""

    concurrency: int | None
    rate: Rate | None
    weight: int
    aging: float | None = None

    @classmethod
    def parse(cls, stored: str | None) -> Limits:
        data = json.loads(stored) if stored else {}
        rate = data.get("r")
        return cls(
            data.get("c"),
            Rate(rate[0], rate[1], rate[2]) if rate else None,
            data.get("w", 1),
            data.get("a"),
        )

    def priority(self, stored: int, due: float, now: float) -> int:
        """The priority a row competes with: ``stored``, one level more urgent for each
        ``aging`` seconds it has been due."""
        if self.aging is None or now <= due:
            return stored
        return max(PRIORITY_FLOOR, stored - int((now - due) // self.aging))


def check_flow_key(name: str, value: object, *, error: Error = FlowError) -> str:
    value = text(name, value, error=error)
    if not value or len(value) > MAX_FLOW_KEY:
        raise error(f"{name} must be a non-empty string of at most {MAX_FLOW_KEY} characters")
    return value


def check_flow(name: str, value: object, *, error: Error = FlowError) -> Flow:
    if not isinstance(value, Flow):
        raise error(f"{name} must be a durafn.Flow, not {value!r}")
    return value


# -- the GCRA ----------------------------------------------------------------------------

EPSILON = 1e-9
"""Slack in a count of starts, for the rounding of a division."""


def _slack(*times: float) -> float:
    """How far apart two float times may be and still be one instant: four units in the
    last place of the larger. An epoch time of 2030 is exact to 0.24 us only, so a slot
    computed as ``tat - tolerance`` and checked as ``tat - now <= tolerance`` may miss by
    that much; with a fixed 1e-9 s of slack, a claim at the very slot ``next_slot`` gave
    found nothing (``Rate(5, burst=2)``), and ``finish_all`` stepped to it forever. The
    budget is exact to this: a microsecond's worth of starts at most, at 10^6 a second
    and more."""
    return 4 * math.ulp(max(abs(t) for t in times))


def allowance(rate: Rate, tat: float, now: float) -> int:
    """How many starts the key's budget allows at ``now`` (its stored ``tat``)."""
    interval = rate.interval
    tolerance = (rate.burst - 1) * interval
    start = max(tat, now)
    slack = _slack(tat, now)
    if start - now > tolerance + slack:
        return 0
    return math.floor((now + tolerance - start + slack) / interval + EPSILON) + 1


def consumed(rate: Rate, tat: float, now: float, starts: int) -> float:
    """The key's ``tat`` after ``starts`` starts at ``now``."""
    return max(tat, now) + starts * rate.interval


def next_slot(rate: Rate, tat: float) -> float:
    """When the key's budget next allows a start (for a key whose budget is spent)."""
    return tat - (rate.burst - 1) * rate.interval


publish(globals())
