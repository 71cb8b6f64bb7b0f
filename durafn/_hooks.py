"""Lifecycle hooks: your code told when rows are scheduled, start, end and fail, for
metrics, logging and alerting (delayed_job's ``enqueue``, ``before``, ``after``,
``success``, ``error``, ``failure``).

``@app.on("failure")`` registers a hook for every function; ``@send_email.on("error")`` for
one (its hooks run first, then the app's). A hook is ``def hook(event: HookEvent)`` or an
``async def``; it runs in the process where the event happens, in the executor's task
(keep it short: a slow hook slows the executor), and outside every guarantee: it may miss
an event (a crash right after a commit) and a mutation's ``before``/``after`` may fire
again for a run whose batch was re-run. A hook that raises is logged and changes nothing.

When each fires:

* ``enqueue``: rows written by durafn's own transactions (a mutation's, an action's,
  ``app.scheduler()``), once they commit; not rows written through your own session or
  connection (``app.scheduler(session)``): you know when you commit those;
* ``before`` / ``after``: around each run of the function (``after`` with how it ended);
* ``success``: the row is Success (committed);
* ``error``: a run failed (committed): retried (``retry_at``) or not;
* ``failure``: the row is Failed for good (after its ``error``);
* ``cron.triggered`` / ``cron.skipped``: a cron's tick was written (or skipped), in the
  process of the cron leader, once it committed (OJS's events).
"""

from __future__ import annotations

import inspect
import json
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, Protocol, TypeVar, get_args

from ._clock import to_datetime
from ._errors import RegistrationError
from ._kinds import FunctionKind, ScheduledFunctionId, State
from ._models import ErrorInfo
from ._public import publish
from ._telemetry import Telemetry

logger = logging.getLogger("durafn.hooks")

HookName = Literal[
    "enqueue", "before", "after", "success", "error", "failure", "cron.triggered", "cron.skipped"
]
HOOK_NAMES: tuple[str, ...] = get_args(HookName)


@dataclass(frozen=True, slots=True)
class HookEvent:
    """What happened to a row. ``state``: how the run or row ended (``after``, ``success``,
    ``error``: Pending when it is retried, ``failure``); ``error`` and ``retry_at`` for
    failures; ``result`` (its JSON form) for ``success``."""

    hook: HookName
    id: ScheduledFunctionId
    name: str
    kind: FunctionKind
    state: State | None = None
    error: ErrorInfo | None = None
    retry_at: datetime | None = None
    result: Any = None
    cron: str | None = None
    """For ``cron.triggered`` and ``cron.skipped``: the cron's name (``id`` is then the
    tick's row, or for a skip the previous run that was still active, if any)."""
    scheduled_at: datetime | None = None
    """The tick's time."""
    actual_at: datetime | None = None
    """When the cron leader wrote (or skipped) the tick: ``actual_at - scheduled_at`` is
    the tick's lag (OJS's ``actual_time``)."""
    run_count: int | None = None
    reason: str | None = None
    """Why a tick was skipped: ``overlap_skip``, ``missed`` or ``dst_skip``."""
    flow_key: str | None = None
    """The row's flow key, if it has one (per-key metrics: count ``before`` less ``after``
    for the rows of a key running in this process)."""


Hook = Callable[[HookEvent], Awaitable[None] | None]
HookT = TypeVar("HookT", bound=Hook)

FUNCTION_HOOKS: set[str] = set()
"""Functions that have hooks of their own (any app): events are built when it is not empty."""


def check_hook(hook: object) -> HookName:
    if hook not in HOOK_NAMES:
        raise RegistrationError(
            f"no hook is called {hook!r}; the hooks are {', '.join(HOOK_NAMES)}"
        )
    return hook  # type: ignore[return-value]


class Started(Protocol):
    """What ``before`` reads of a claimed row (the store's ``Claimed``)."""

    @property
    def id(self) -> ScheduledFunctionId: ...
    @property
    def name(self) -> str: ...
    @property
    def flow_key(self) -> str | None: ...


class Ended(Started, Protocol):
    """What ``after`` and the finish hooks read of a run's end (the store's ``Outcome``)."""

    @property
    def state(self) -> State: ...
    @property
    def unwritten(self) -> bool: ...
    @property
    def result(self) -> str | None: ...
    @property
    def error_type(self) -> str | None: ...
    @property
    def error_message(self) -> str | None: ...
    @property
    def error_traceback(self) -> str | None: ...
    @property
    def retry_at(self) -> float | None: ...


FunctionHooks = Callable[[str], Mapping[str, Sequence[Hook]]]
"""A function's own hooks by its durable name (``Registry.hooks_of``)."""


class Hooks:
    """The app's hooks, and the functions' (``own``: their registered references')."""

    def __init__(self, own: FunctionHooks, telemetry: Telemetry) -> None:
        self._own = own
        self._telemetry = telemetry
        self._app: dict[str, list[Hook]] = {name: [] for name in HOOK_NAMES}
        self._any = False

    @property
    def active(self) -> bool:
        """Any hook registered at all: without one, no event is even built."""
        return self._any or bool(FUNCTION_HOOKS)

    @property
    def counting(self) -> bool:
        """Whether scheduled rows are wanted (``enqueued``): by a hook, or by metrics."""
        return self.active or self._telemetry.metrics is not None

    def add(self, hook: HookName, fn: Hook) -> None:
        if not callable(fn):
            raise RegistrationError(f"a hook must be a function of one HookEvent, not {fn!r}")
        self._app[check_hook(hook)].append(fn)
        self._any = True

    async def fire(self, event: HookEvent) -> None:
        if event.cron is not None and event.hook.startswith("cron."):
            self._telemetry.tick(event.cron, event.hook.removeprefix("cron."))
            if event.hook == "cron.triggered":  # the tick's row: this process wrote it
                self._telemetry.scheduled((event.name,))
        own = self._own(event.name).get(event.hook, ())
        for fn in (*own, *self._app[event.hook]):
            try:
                result = fn(event)
                if inspect.isawaitable(result):
                    await result
            except Exception:
                logger.exception(
                    "the %s hook %r failed on %s %s (%s); ignored",
                    event.hook,
                    getattr(fn, "__qualname__", fn),
                    event.kind,
                    event.id,
                    event.name,
                )

    async def before(self, kind: FunctionKind, row: Started) -> None:
        """``before``: a claimed row is about to run."""
        if self.active:
            await self.fire(HookEvent("before", row.id, row.name, kind, flow_key=row.flow_key))

    async def after(self, kind: FunctionKind, outcome: Ended) -> None:
        """``after``: a run ended, as ``outcome`` says (not yet written)."""
        if self.active:
            event = HookEvent(
                "after", outcome.id, outcome.name, kind, outcome.state, flow_key=outcome.flow_key
            )
            await self.fire(event)

    async def enqueued(
        self, rows: Iterable[tuple[ScheduledFunctionId, str, FunctionKind, str | None]]
    ) -> None:
        if self._telemetry.metrics is not None:
            rows = list(rows)
            self._telemetry.scheduled(name for _, name, _, _ in rows)
        if self.active:
            for id, name, kind, key in rows:
                event = HookEvent("enqueue", id, name, kind, state=State.PENDING, flow_key=key)
                await self.fire(event)

    async def finished(
        self, kind: FunctionKind, outcomes: Sequence[Ended], *, measured: bool = True
    ) -> None:
        """``success``, ``error``, ``failure`` for committed outcomes (and their traces and
        metrics, unless ``measured`` is False: a lost worker's, counted as lost)."""
        if measured and self._telemetry.on:
            self._telemetry.ended(kind, outcomes)
        if not self.active:
            return
        for o in outcomes:
            if o.unwritten:  # its row had moved on (cancelled): nothing happened to it
                continue
            if o.state is State.SUCCESS:
                result = json.loads(o.result) if o.result is not None else None
                event = HookEvent(
                    "success", o.id, o.name, kind, o.state, result=result, flow_key=o.flow_key
                )
                await self.fire(event)
            elif o.error_type is not None:
                error = ErrorInfo(
                    type=o.error_type, message=o.error_message or "", traceback=o.error_traceback
                )
                at = to_datetime(o.retry_at) if o.retry_at is not None else None
                key = o.flow_key
                await self.fire(
                    HookEvent("error", o.id, o.name, kind, o.state, error, at, flow_key=key)
                )
                if o.state is State.FAILED:
                    await self.fire(
                        HookEvent("failure", o.id, o.name, kind, o.state, error, flow_key=key)
                    )


publish(globals())
