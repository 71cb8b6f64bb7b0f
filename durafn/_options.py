"""Job options: how a scheduled call runs, apart from its arguments.

One mechanism everywhere: options are a ``JobOptions`` value that travels with a function
reference (``@app.action(queue="mail")`` sets a function's defaults, ``ref.options(...)``
returns a reference carrying per-call ones), so every scheduling route (``run_after``,
``run_at``, ``run_many``, and whatever schedules from a reference later) reads them from
the reference it is given, never from its own keyword arguments, which belong to the
function. An app's ``Queue`` attributes are the defaults beneath both.

Precedence, field by field: per call > decorator > the queue's attributes > built-in
default (priority 0, no queue, no key, no flags).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, fields, replace
from typing import Any, Literal, Protocol, cast, get_args

from ._checks import Error, integer, is_integer, optional, scheduled_id, text
from ._completions import CompletionCallback, check_on_complete
from ._errors import OptionError
from ._flow import Flow, FlowError, check_flow
from ._public import publish
from ._retries import Retry, check_retry

KeyMode = Literal["replace", "preserve_run_at", "unsafe_dedupe"]
"""What scheduling a key that a row already holds does (Graphile Worker's job key modes):

* ``replace``: a Pending row with the key takes the new function, arguments, time,
  priority, queue and flags (its attempts reset); the call returns that row's id.
* ``preserve_run_at``: the same, but a row not yet attempted keeps its time.
* ``unsafe_dedupe``: the existing row is kept unchanged, whatever its state (even Failed
  or Canceled: nothing new runs); the call returns its id.

With ``replace`` and ``preserve_run_at``, a row holding the key that is no longer Pending
(InProgress, Failed, Canceled) gives the key up and a new row is written. A Success row
never holds its key (Graphile deletes a completed job); it keeps it only to be listed.
"""

KEY_MODES: tuple[str, ...] = get_args(KeyMode)

AfterPolicy = Literal["run", "cancel", "fail"]
"""What a row scheduled ``after=`` its dependencies does when one of them ends Failed or
Canceled: ``run`` anyway once all have finished (the default: a completion-style join),
``cancel`` itself, or ``fail`` with ``DependencyFailedError``."""

AFTER_POLICIES: tuple[str, ...] = get_args(AfterPolicy)
MAX_AFTER = 10_000
"""Rows one row may wait for."""

PRIORITY_RANGE = (-(2**31), 2**31 - 1)
"""The stored column is a 32-bit integer on both engines."""

MAX_NAME = 255
MAX_KEY = 512
MAX_FLAG = 64
MAX_FLAGS = 32

# A flag is stored between commas (",a,b,") so that "carries flag x" is one LIKE on both
# engines; a flag therefore cannot contain a comma, and is kept to a plain alphabet so a
# shell or a URL can carry it too.
_FLAG = re.compile(r"[A-Za-z0-9_.:@/+-]+")


@dataclass(frozen=True, slots=True)
class Queue:
    """App-wide attributes of a named queue: ``App(queues={"mail": Queue(...)})``.

    ``concurrency``: how many of its rows may run at once, across every worker, process
    and host (1, the default, is a serial queue: Graphile's ``queue_name``); None: no limit
    (a queue that only routes rows to workers and pools, as delayed_job's queues do).
    ``priority``: the default priority of its rows (delayed_job's ``queue_attributes``).
    ``flow``: the default flow control of its rows (``durafn.Flow``); a queue with flow
    control routes rows only, so its ``concurrency`` must be None.
    """

    concurrency: int | None = 1
    priority: int | None = None
    flow: Flow | None = None

    def __post_init__(self) -> None:
        # A queue's attributes are the defaults of its rows' options: their errors too.
        optional(integer, "Queue concurrency", self.concurrency, high=100_000, error=OptionError)
        check_priority(self.priority, "Queue priority", error=OptionError)
        optional(check_flow, "Queue flow", self.flow, error=OptionError)
        if self.flow is not None and self.concurrency is not None:
            raise OptionError(_FLOW_IN_SERIAL_QUEUE)


_FLOW_IN_SERIAL_QUEUE = (
    "a row with flow control cannot be in a queue with a concurrency limit: the flow "
    "key's limits decide when it starts; declare the queue with Queue(concurrency=None) "
    "(a queue that only routes rows to workers)"
)


class Callback(CompletionCallback, Protocol):
    """An ``on_complete`` mutation, as the options carrying it read it: its own options
    too, resolved when a row that names it is scheduled."""

    @property
    def job_options(self) -> JobOptions: ...


@dataclass(frozen=True, slots=True)
class JobOptions:
    """Options of a scheduled call; None means "not set here" (a lower layer decides)."""

    priority: int | None = None
    queue: str | None = None
    key: str | None = None
    key_mode: KeyMode | None = None
    flags: frozenset[str] | None = None
    retry: Retry | None = None
    on_complete: Callback | None = None
    flow: Flow | None = None
    after: tuple[str, ...] | None = None
    """Ids of rows already written (this transaction's or earlier) that must all finish
    for good before the row may run (``write/dependencies.py``); per call only."""
    after_policy: AfterPolicy | None = None

    @classmethod
    def checked(cls, error: Error = OptionError, **values: Any) -> JobOptions:
        """Options from keyword values, each validated by its check (``CHECKS``; None:
        not set); unknown names are an error."""
        if unknown := sorted(set(values) - set(CHECKS)):
            raise error(
                f"unknown job option(s) {', '.join(unknown)}; the options are "
                f"{', '.join(sorted(CHECKS))}"
            )
        return cls(
            **{
                name: CHECKS[name](name, value, error=error)
                for name, value in values.items()
                if value is not None
            }
        )

    def over(self, base: JobOptions) -> JobOptions:
        """These options, with ``base`` filling what they leave unset."""
        changes = {
            f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None
        }
        return replace(base, **changes) if changes else base


@dataclass(frozen=True, slots=True)
class RowOptions:
    """The options a row is written with: every layer applied, defaults filled in."""

    priority: int
    queue: str | None
    key: str | None
    key_mode: KeyMode
    flags: str | None
    """Stored form: ",a,b," (sorted), or None."""
    retry: str | None
    """The retry policy as data (``Retry.to_json``); None: none, or one whose backoff is a
    function (looked up from the function or the app when a run fails)."""
    max_attempts: int | None
    on_complete: str | None = None
    """The completion callback as data (``_callback``), or None."""
    flow: Flow | None = None
    """Flow control: the key is computed per call, from its arguments (``_scheduler``)."""
    flow_spec: str | None = None
    """The flow's knobs as stored (``Flow.spec``), or None."""
    flow_key: str | None = None
    """A flow key fixed in advance, for a cron's ticks (their arguments never change; the
    key function itself is not stored)."""
    after_policy: AfterPolicy = "run"
    """What the row does if a row it waits for fails (used where it has ``after``)."""


def resolve(
    options: JobOptions, queues: Mapping[str, Queue], retry: Retry | None = None
) -> RowOptions:
    """The row's options: ``options`` (call over decorator), then the queue's attributes;
    ``retry``: the app's policy, for a function without one."""
    priority, flow = options.priority, options.flow
    attributes = queues.get(options.queue) if options.queue is not None else None
    if attributes is not None:
        priority = attributes.priority if priority is None else priority
        flow = attributes.flow if flow is None else flow
    if options.key_mode is not None and options.key is None:
        raise OptionError(f"key_mode={options.key_mode!r} was given without a key")
    if flow is not None:
        if options.queue is not None and (attributes is None or attributes.concurrency is not None):
            raise FlowError(_FLOW_IN_SERIAL_QUEUE + f" (queue {options.queue!r})")
        if flow.coalesce is not None and options.key is not None:
            raise FlowError(
                "a debounced or throttled row's job key is its flow key; drop key= (or the "
                "debounce or throttle)"
            )
    return RowOptions(
        priority=priority or 0,
        queue=options.queue,
        key=options.key,
        key_mode=options.key_mode or "replace",
        flags=stored_flags(options.flags),
        retry=policy.to_json() if (policy := options.retry or retry) is not None else None,
        max_attempts=policy.max_attempts if policy is not None else None,
        on_complete=_callback(options.on_complete, queues, retry),
        flow=flow,
        flow_spec=flow.spec() if flow is not None else None,
        after_policy=options.after_policy or "run",
    )


def _callback(ref: Callback | None, queues: Mapping[str, Queue], retry: Retry | None) -> str | None:
    """What a row keeps of its completion callback (``_completions``): its name, the
    parameter that takes the ``Completion``, and its own options resolved now, as any
    row's are (a callback has no callback of its own)."""
    if ref is None:
        return None
    own = resolve(replace(ref.job_options, on_complete=None), queues, retry)
    attributes = queues.get(own.queue) if own.queue is not None else None
    return json.dumps(
        {
            "name": ref.name,
            "param": ref.parameters[0],
            "priority": own.priority,
            "queue": own.queue,
            "concurrency": 1 if attributes is None else attributes.concurrency,
            "flags": own.flags,
            "retry": own.retry,
            "max_attempts": own.max_attempts,
        },
        separators=(",", ":"),
    )


def stored_flags(flags: Iterable[str] | None) -> str | None:
    return f",{','.join(sorted(flags))}," if flags else None


def read_flags(stored: str | None) -> list[str]:
    return stored.strip(",").split(",") if stored else []


def check_priority(value: object, name: str, *, error: Error = OptionError) -> int | None:
    if value is None:
        return None
    low, high = PRIORITY_RANGE
    if not is_integer(value) or not low <= value <= high:
        raise error(
            f"{name} must be an integer between {low} and {high} (lower runs first), not {value!r}"
        )
    return value


_TRIMMED = " \t\r\n"
"""What a queue's name may not start or end with (``durafn.schedule`` checks the same)."""


def check_name(name: str, value: object, *, error: Error = OptionError) -> str:
    """A queue's name: non-empty text, at most 255 characters, with no comma and no space
    at either end: a worker's ``--queues`` lists names separated by commas and strips
    them, so such a queue's rows could never be served by name."""
    value = text(name, value, error=error)
    if not value.strip() or len(value) > MAX_NAME:
        raise error(f"{name} must be a non-empty name of at most {MAX_NAME} characters")
    if "," in value or value != value.strip(_TRIMMED):
        raise error(
            f"{name} {value!r} has a comma or a space at an end: a worker's --queues lists "
            "queue names separated by commas, and strips them"
        )
    return value


def check_key(name: str, value: object, *, error: Error = OptionError) -> str:
    value = text(name, value, error=error)
    if not value or len(value) > MAX_KEY:
        raise error(f"{name} must be a non-empty string of at most {MAX_KEY} characters")
    return value


def check_after(name: str, value: object, *, error: Error = OptionError) -> tuple[str, ...]:
    """Row ids, each once, in their order (a lone string is refused: read letter by
    letter it would be 36 ids)."""
    if isinstance(value, str) or not isinstance(value, Iterable):
        raise error(f"{name} must be a list of row ids, not {value!r}")
    found: list[str] = []
    for item in value:
        id = scheduled_id(item)
        if id is None:
            raise error(f"{name}: {item!r} is not a row id (ids are UUIDs: run_after returns them)")
        found.append(id)
    ids = tuple(dict.fromkeys(found))
    if not ids or len(ids) > MAX_AFTER:
        raise error(f"{name} must name 1 to {MAX_AFTER} rows, not {len(ids)}")
    return ids


def check_after_policy(name: str, value: object, *, error: Error = OptionError) -> AfterPolicy:
    if value not in AFTER_POLICIES:
        raise error(f"{name} must be one of {', '.join(AFTER_POLICIES)}, not {value!r}")
    return value  # type: ignore[return-value]


def check_flag(name: str, value: object, *, error: Error = OptionError) -> str:
    if not isinstance(value, str) or len(value) > MAX_FLAG or not _FLAG.fullmatch(value):
        raise error(
            f"{name}: {value!r} is not a flag; a flag is 1 to {MAX_FLAG} characters of "
            "letters, digits and _ . : @ / + -"
        )
    return value


def check_flags(name: str, value: object, *, error: Error = OptionError) -> frozenset[str]:
    """A collection of flags (a lone string is refused: it would be read letter by letter)."""
    if isinstance(value, str) or not isinstance(value, Iterable):
        raise error(f"{name} must be a list or set of strings, not {value!r}")
    flags = frozenset(check_flag(name, item, error=error) for item in value)
    if len(flags) > MAX_FLAGS:
        raise error(f"{name}: at most {MAX_FLAGS} flags per row, not {len(flags)}")
    return flags


def _check_key_mode(name: str, value: object, *, error: Error = OptionError) -> KeyMode:
    if value not in KEY_MODES:
        raise error(f"{name} must be one of {', '.join(KEY_MODES)}, not {value!r}")
    return cast(KeyMode, value)


def _check_priority(name: str, value: object, *, error: Error = OptionError) -> int | None:
    return check_priority(value, name, error=error)


CHECKS: dict[str, Callable[..., Any]] = {
    "priority": _check_priority,
    "queue": check_name,
    "key": check_key,
    "key_mode": _check_key_mode,
    "flags": check_flags,
    "retry": check_retry,
    "on_complete": check_on_complete,
    "flow": check_flow,
    "after": check_after,
    "after_policy": check_after_policy,
}
"""Each job option's check, by name: ``JobOptions``' fields, and the keyword arguments of
``JobOptionArgs`` (a test holds the three together)."""


publish(globals())
