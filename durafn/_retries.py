"""Retry policies: how many times a failed run is tried again, and after how long.

A ``Retry`` is a job option like any other (``@app.action(retry=Retry(5))``,
``ref.options(retry=...)``, ``App(retry=...)`` for every function without one). The row
keeps its policy as data when it can be (``to_json``), so that whichever process records
the failure (the worker that ran it, another worker's rescue) retries it the same way; a
backoff that is a function of your own is looked up from the registered function instead
(and so may only be declared on the decorator or the app).

Backoffs, each ``(attempt, error) -> seconds`` with ``attempt`` the number of failed
attempts so far (1 after the first failure):

* ``Exponential(base=1, factor=2, max_delay=3600, jitter=0.1)``: ``base * factor**(n-1)``,
  capped, then spread by up to ``jitter`` of itself either way (so that rows that failed
  together do not all come back at once);
* ``GRAPHILE``: Graphile Worker's ``exp(min(n, 10))`` seconds;
* ``DELAYED_JOB``: delayed_job's ``5 + n**4`` seconds;
* ``Fixed(seconds)``;
* any function ``(attempt, error) -> seconds`` (delayed_job's ``reschedule_at``).
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from ._checks import Error
from ._errors import ArgumentError, DurafnError, NonRetryableError, OptionError
from ._public import publish

MAX_ATTEMPTS = 10_000
MAX_DELAY = 366 * 24 * 3600.0
SNOOZE_LIMIT = 1_000
"""How many times a row may snooze unless its function says otherwise
(``snooze_limit=``): a minute's snooze a thousand times is about 17 hours."""
MAX_SNOOZES = 1_000_000

BackoffFunction = Callable[[int, BaseException], float]


@dataclass(frozen=True, slots=True)
class Exponential:
    """``base * factor**(attempt - 1)`` seconds, at most ``max_delay``, spread by up to
    ``jitter`` (a fraction) of itself either way."""

    base: float = 1.0
    factor: float = 2.0
    max_delay: float = 3600.0
    jitter: float = 0.1

    def __post_init__(self) -> None:
        _seconds("Exponential base", self.base)
        _seconds("Exponential max_delay", self.max_delay)
        if not (isinstance(self.factor, int | float) and 1 <= self.factor <= 100):
            raise OptionError(f"Exponential factor must be between 1 and 100, not {self.factor!r}")
        if not (isinstance(self.jitter, int | float) and 0 <= self.jitter < 1):
            raise OptionError(f"Exponential jitter must be in [0, 1), not {self.jitter!r}")

    def __call__(self, attempt: int, error: BaseException | None = None) -> float:
        if self.factor == 1 or self.base == 0 or self.max_delay == 0:
            delay = self.base
        elif attempt - 1 >= math.log(self.max_delay / self.base, self.factor):
            delay = self.max_delay  # factor ** attempt would overflow long before any cap
        else:
            delay = self.base * self.factor ** (attempt - 1)
        return min(delay, self.max_delay) * (1 + self.jitter * (2 * random.random() - 1))


@dataclass(frozen=True, slots=True)
class Fixed:
    """The same delay after every failure."""

    seconds: float

    def __post_init__(self) -> None:
        _seconds("Fixed seconds", self.seconds)

    def __call__(self, attempt: int, error: BaseException | None = None) -> float:
        return self.seconds


@dataclass(frozen=True, slots=True)
class NamedBackoff:
    """A backoff of another job system, by name: ``GRAPHILE`` or ``DELAYED_JOB``."""

    name: Literal["graphile", "delayed_job"]

    def __call__(self, attempt: int, error: BaseException | None = None) -> float:
        if self.name == "graphile":
            return math.exp(min(attempt, 10))  # Graphile Worker: exp(least(10, attempts))
        return 5.0 + attempt**4  # delayed_job: 5 + attempts ** 4


GRAPHILE = NamedBackoff("graphile")
"""Graphile Worker's backoff: ``exp(min(attempt, 10))`` seconds (2.7 s, 7.4 s, … 6.1 h)."""
DELAYED_JOB = NamedBackoff("delayed_job")
"""delayed_job's backoff: ``5 + attempt**4`` seconds (6 s, 21 s, 86 s, …)."""

Backoff = Exponential | Fixed | NamedBackoff | BackoffFunction


@dataclass(frozen=True, slots=True)
class Retry:
    """Try a failed run again, up to ``max_attempts`` runs in all, after ``backoff``.

    ``retry_on``: only errors of these types are retried (default: any ``Exception``);
    ``give_up_on``: errors of these types never are. ``NonRetryableError`` never is. A run
    stopped by its time limit, by a stop's grace period ending, or lost with its worker
    counts as failed with ``FunctionTimeoutError``, ``ExecutorShutdownError`` or
    ``WorkerLostError``: retried unless ``give_up_on`` (or ``retry_on``) says otherwise.
    """

    max_attempts: int
    backoff: Backoff = field(default_factory=Exponential)
    retry_on: tuple[type[BaseException], ...] = (Exception,)
    give_up_on: tuple[type[BaseException], ...] = ()

    def __post_init__(self) -> None:
        check_retry("Retry", self)

    def rule(self) -> Rule:
        return Rule(
            self.max_attempts,
            self.backoff,
            frozenset(type_name(c) for c in self.retry_on),
            frozenset(type_name(c) for c in self.give_up_on),
        )

    def to_json(self) -> str | None:
        """The policy as data for the row, or None when its backoff is a function."""
        backoff: dict[str, Any]
        if isinstance(self.backoff, Exponential):
            b = self.backoff
            backoff = {"exponential": [b.base, b.factor, b.max_delay, b.jitter]}
        elif isinstance(self.backoff, Fixed):
            backoff = {"fixed": self.backoff.seconds}
        elif isinstance(self.backoff, NamedBackoff):
            backoff = {"named": self.backoff.name}
        else:
            return None
        rule = self.rule()
        data = {
            "max_attempts": self.max_attempts,
            "backoff": backoff,
            "retry_on": sorted(rule.retry_on),
            "give_up_on": sorted(rule.give_up_on),
        }
        return json.dumps(data, separators=(",", ":"))


@dataclass(frozen=True, slots=True)
class Rule:
    """A policy as the executor applies it, exception types known by name: all a row's
    stored policy (``Retry.to_json``) can say."""

    max_attempts: int
    backoff: Backoff
    retry_on: frozenset[str]
    give_up_on: frozenset[str]

    @classmethod
    def from_json(cls, stored: str) -> Rule:
        data = json.loads(stored)
        [(kind, value)] = data["backoff"].items()
        backoff: Backoff
        if kind == "exponential":
            backoff = Exponential(*value)
        elif kind == "fixed":
            backoff = Fixed(value)
        else:
            backoff = NamedBackoff(value)
        return cls(
            data["max_attempts"],
            backoff,
            frozenset(data["retry_on"]),
            frozenset(data["give_up_on"]),
        )

    def gives_up(self, failures: int, error: BaseException, max_attempts: int | None) -> bool:
        """Whether ``failures`` failed attempts, the last with ``error``, end the retries."""
        limit = self.max_attempts if max_attempts is None else max_attempts
        names = _names(type(error))
        if failures >= limit or _NON_RETRYABLE in names:
            return True
        return bool(names & self.give_up_on or not names & self.retry_on)

    def delay(self, failures: int, error: BaseException, max_attempts: int | None) -> float | None:
        """Seconds until the next attempt after ``failures`` failed ones, the last with
        ``error``; None: give up. ``max_attempts``: the row's own limit, if it has one
        (``app.reschedule(max_attempts=...)``)."""
        if self.gives_up(failures, error, max_attempts):
            return None
        delay = float(self.backoff(failures, error))
        return min(max(delay, 0.0), MAX_DELAY) if math.isfinite(delay) else MAX_DELAY


def type_name(cls: type) -> str:
    """A type's name as users import it (durafn's own errors as ``durafn.X``)."""
    module = cls.__module__
    if module == "builtins":
        return cls.__qualname__
    if module.startswith("durafn._"):
        return f"durafn.{cls.__qualname__}"  # every durafn error is exported
    return f"{module}.{cls.__qualname__}"


def _names(cls: type[BaseException]) -> frozenset[str]:
    """The names of ``cls`` and of its bases, as ``type_name`` gives them: what a rule's
    ``retry_on``/``give_up_on`` match a failure by, made once per exception type (made per
    failure, they cost more than the rest of the retry's decision)."""
    names = _NAMES.get(cls)
    if names is None:
        if len(_NAMES) >= 1024:  # classes made on the fly: do not keep them all
            _NAMES.clear()
        names = _NAMES[cls] = frozenset(type_name(c) for c in cls.__mro__)
    return names


_NAMES: dict[type[BaseException], frozenset[str]] = {}
_NON_RETRYABLE = type_name(NonRetryableError)


def check_retry(name: str, value: object, *, error: Error = OptionError) -> Retry:
    """``value`` as a policy, or ``error`` naming what is wrong with it."""
    if not isinstance(value, Retry):
        raise error(f"{name} must be a durafn.Retry(...), not {value!r}")
    attempts = value.max_attempts
    if (
        isinstance(attempts, bool)
        or not isinstance(attempts, int)
        or not 1 <= attempts <= MAX_ATTEMPTS
    ):
        raise error(
            f"{name}: max_attempts must be an integer from 1 to {MAX_ATTEMPTS} (runs in all, "
            f"the first included), not {attempts!r}"
        )
    if not isinstance(value.backoff, Exponential | Fixed | NamedBackoff) and not callable(
        value.backoff
    ):
        raise error(
            f"{name}: backoff must be Exponential(...), Fixed(...), GRAPHILE, DELAYED_JOB or a "
            f"function (attempt, error) -> seconds, not {value.backoff!r}"
        )
    for label, types in (("retry_on", value.retry_on), ("give_up_on", value.give_up_on)):
        if not isinstance(types, tuple) or not all(
            isinstance(t, type) and issubclass(t, BaseException) for t in types
        ):
            raise error(f"{name}: {label} must be a tuple of exception types, not {types!r}")
    return value


class Snooze(DurafnError):  # a request, as Oban's {:snooze, n}; raised as NonRetryableError is
    """Raise it from a mutation or an action: "not now, run me again in ``seconds``".

    The row goes back to Pending, due then, in the transaction that records the run; it
    is not a failure: no attempt of its retry policy is used up, nothing is added to its
    history of errors, and no error hook fires. A mutation's writes are rolled back, as
    for a failure. A row may snooze ``snooze_limit`` times (the decorator's, default
    ``SNOOZE_LIMIT``); the next snooze fails the run with ``SnoozeLimitError``, which its
    retry policy treats as any failure."""

    def __init__(self, seconds: float) -> None:
        _seconds_or(ArgumentError, "Snooze(seconds)", seconds)
        super().__init__(f"snoozed for {seconds:g}s")
        self.seconds = float(seconds)


def _seconds(name: str, value: object) -> None:
    _seconds_or(OptionError, name, value)


def _seconds_or(error: Error, name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= MAX_DELAY:
        raise error(f"{name} must be a number of seconds from 0 to {MAX_DELAY:g}, not {value!r}")


publish(globals())
