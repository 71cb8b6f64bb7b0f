"""Checks of the values that cross the public surface: one place, one wording.

Every public entry point checks its parameters with these before it touches the database,
so bad input is a typed error that names the parameter and what it should be, and never a
raw ``TypeError``, ``OverflowError`` or driver error from deep inside. The property test
(``tests/test_surface.py``) feeds arbitrary values to every entry point and keeps it so.
"""

from __future__ import annotations

import json
import math
import uuid
from collections.abc import Collection, Iterable
from datetime import datetime
from typing import Any, TypeGuard

from ._errors import ArgumentError, DurafnError
from ._kinds import ScheduledFunctionId, State

Error = type[DurafnError]


def is_number(value: object) -> TypeGuard[int | float]:
    """An int or float, not a bool (``True`` is an int to Python, never a count to us)."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def is_integer(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def finite_seconds(name: str, value: object, *, error: Error = ArgumentError) -> float:
    """A finite number of seconds (an int too large for a float is refused, not raised
    as ``OverflowError``)."""
    if not is_number(value):
        raise error(f"{name} must be a number of seconds, not {value!r}")
    try:
        number = float(value)
    except OverflowError:
        raise error(f"{name} is too large to be a number of seconds: {value!r}") from None
    if not math.isfinite(number):
        raise error(f"{name} must be a finite number of seconds, not {value!r}")
    return number


def positive_seconds(name: str, value: object, *, error: Error = ArgumentError) -> float:
    number = finite_seconds(name, value, error=error)
    if number <= 0:
        raise error(f"{name} must be a positive number of seconds, not {value!r}")
    return number


def non_negative_seconds(name: str, value: object, *, error: Error = ArgumentError) -> float:
    number = finite_seconds(name, value, error=error)
    if number < 0:
        raise error(f"{name} must be a non-negative number of seconds, not {value!r}")
    return number


def integer(
    name: str, value: object, *, low: int = 1, high: int | None = None, error: Error = ArgumentError
) -> int:
    """An int (not a bool) in ``[low, high]``."""
    if is_integer(value) and low <= value and (high is None or value <= high):
        return value
    bound = f"at least {low}" if high is None else f"between {low} and {high}"
    raise error(f"{name} must be an integer {bound}, not {value!r}")


def text(name: str, value: object, *, error: Error = ArgumentError) -> str:
    """A string both engines can store: no NUL character (PostgreSQL refuses it in text),
    and valid Unicode (a lone surrogate cannot be encoded as UTF-8)."""
    if not isinstance(value, str):
        raise error(f"{name} must be a string, not {value!r}")
    if "\x00" in value:
        raise error(f"{name} must not contain a NUL character: {value!r}")
    try:
        value.encode()
    except UnicodeEncodeError:
        raise error(f"{name} is not valid Unicode (a lone surrogate): {value!r}") from None
    return value


def aware_time(name: str, value: object, *, error: Error = ArgumentError) -> float:
    """An aware ``datetime``, as epoch seconds."""
    if not isinstance(value, datetime):
        raise error(f"{name} must be an aware datetime, not {value!r}")
    if value.tzinfo is None or value.utcoffset() is None:
        raise error(
            f"{name} must be an aware datetime, got naive {value.isoformat()}; attach a "
            "tzinfo (datetime.now(UTC))"
        )
    try:
        return value.timestamp()
    except (OverflowError, ValueError, OSError) as exc:
        raise error(f"{name} is out of range: {value!r} ({exc})") from None


def state_list(
    name: str, value: object, *, allowed: Collection[State] = tuple(State)
) -> list[State]:
    """One state or several (``State`` members or their names, like ``"Pending"``)."""
    items = [value] if isinstance(value, State | str) else value
    if not isinstance(items, Collection) or not items:
        raise ArgumentError(f"{name} must be a State or a non-empty list of them, not {value!r}")
    found: list[State] = []
    for item in items:
        try:
            state: State | None = State(item)
        except (ValueError, TypeError):
            state = None
        if state is None or state not in allowed:
            names = ", ".join(s.value for s in allowed)
            raise ArgumentError(f"{name}: {item!r} is not one of {names}")
        found.append(state)
    return found


def flag(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise ArgumentError(f"{name} must be True or False, not {value!r}")
    return value


def one_id(value: object, where: str, instead: str = "") -> ScheduledFunctionId | None:
    """``scheduled_id``, after an ``ArgumentError`` for a collection of ids: ``where``
    takes one (``retry`` and ``reschedule`` take many, and a list passed here was read
    as a malformed id). ``instead``: what to use for many."""
    if isinstance(value, list | tuple | set | frozenset):
        raise ArgumentError(
            f"{where} takes one id, not a {type(value).__name__} of {len(value)}; call it "
            f"once per id{instead}"
        )
    return scheduled_id(value)


def scheduled_id(value: object) -> ScheduledFunctionId | None:
    """The canonical form of an id (lower-case, hyphenated), or None if ``value`` is not
    one. Every form ``uuid.UUID`` reads is accepted (upper case, braces, ``urn:uuid:``),
    so that both engines find the same row for the same text."""
    if isinstance(value, uuid.UUID):
        return ScheduledFunctionId(str(value))
    if not isinstance(value, str) or len(value) > 64:
        return None
    try:
        return ScheduledFunctionId(str(uuid.UUID(value)))
    except ValueError:
        return None


def optional(check: Any, name: str, value: object, **kwargs: Any) -> Any:
    """``check`` unless ``value`` is None."""
    return None if value is None else check(name, value, **kwargs)


Scalar = str | int | float | bool


def argument_filters(texts: Iterable[str]) -> tuple[dict[str, Scalar], dict[str, Scalar]]:
    """``PATH=VALUE`` (equals) and ``PATH~VALUE`` (contains) as the command line and the
    dashboard take them, split into ``list``'s ``args`` and ``args_contain``. The value is
    read as JSON where it is a number, true, false or a quoted string, else as the text
    given (``user_id=42``, ``city=Oslo``, ``code="42"``, ``tags~vip``)."""
    equal: dict[str, Scalar] = {}
    contain: dict[str, Scalar] = {}
    for text in texts:
        at = min((i for i in (text.find("="), text.find("~")) if i >= 0), default=-1)
        if at < 0:
            raise ArgumentError(
                f"an argument filter is PATH=VALUE (user_id=42) or PATH~VALUE (tags~vip), "
                f"not {text!r}"
            )
        path, raw = text[:at].strip(), text[at + 1 :]
        try:
            value = json.loads(raw)
        except ValueError:
            value = raw
        if not isinstance(value, str | int | float | bool):
            value = raw  # an object or a list: the text as given
        (equal if text[at] == "=" else contain)[path] = value
    return equal, contain
