"""Typed references to registered functions, and the registry of durable names.

A ``FunctionRef[P, R]`` keeps the parameters ``P`` of the user's function (without ``ctx``)
so that ``scheduler.run_after(5, destruct, message_id=1)`` is checked by mypy, and it owns a
pydantic adapter built from the type hints so the same call is validated at run time,
*when scheduled*, not days later when the row runs.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
import sys
import typing
import warnings
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, Generic, ParamSpec, Self, TypedDict, TypeVar, cast

import pydantic
import pydantic_core
import typing_extensions
from pydantic import ConfigDict, TypeAdapter
from typing_extensions import Unpack

from ._cancels import CancelMode
from ._checks import optional, positive_seconds, text
from ._errors import (
    ArgumentError,
    CallError,
    DurableNameWarning,
    OptionError,
    RegistrationError,
    UnknownFunctionError,
)
from ._flow import Flow
from ._groups import GROUP_COMPLETE, complete_group
from ._hooks import FUNCTION_HOOKS, Hook, HookName, HookT, check_hook
from ._kinds import FunctionKind
from ._models import Completion
from ._options import AfterPolicy, JobOptions, KeyMode
from ._public import publish
from ._retention import Retention
from ._retries import SNOOZE_LIMIT, Retry
from ._signatures import (
    StoredDefaults,
    describe,
    parse_signature,
    problems,
    refuse_non_finite,
)

P = ParamSpec("P")
# Covariant: a reference whose function returns ``int`` is one that returns ``object``, so
# ``print(await app.run_query(count))`` type-checks.
R = TypeVar("R", covariant=True)

# JSON has no NaN or infinity (pydantic would store them as null, and the run would then
# fail validation days later): reject them when called or scheduled.
_ARGS_CONFIG = ConfigDict(extra="forbid", arbitrary_types_allowed=False, allow_inf_nan=False)


class FunctionRef(Generic[P, R]):
    """A registered function: its durable name, kind, and argument/result codecs.

    Returned by ``@app.query``, ``@app.mutation`` and ``@app.action``; pass it to the
    scheduler or to ``app.run_*``. The durable name is stored in rows: renaming it orphans
    rows already scheduled under the old name.
    """

    kind: FunctionKind

    def __init__(
        self,
        fn: Callable[..., Awaitable[R]],
        *,
        name: str | None,
        timeout: float | None,
        ctx_types: tuple[type, ...],
    ) -> None:
        if not inspect.iscoroutinefunction(fn):
            raise RegistrationError(
                f"{describe(fn)} must be declared with 'async def' to be a durafn {self.kind}"
            )
        if name is not None and (not isinstance(name, str) or not name.strip()):
            raise RegistrationError(
                f"the durable name of {describe(fn)} must be a non-empty string"
            )
        self.fn = fn
        self.name: str = text(
            f"the durable name of {describe(fn)}",
            name or f"{fn.__module__}:{fn.__qualname__}",
            error=RegistrationError,
        )
        if self.name.startswith("__main__:"):
            warnings.warn(
                f"{describe(fn)} is registered as {self.name!r}: a worker that imports "
                "your app by its module name (durafn worker --app module:app) finds no "
                "function of that name, and rows scheduled under it end Failed. Give it a "
                "name (@app.mutation(name='messages:send')), or run your program as a "
                "module (python -m ...)",
                DurableNameWarning,
                stacklevel=_outside_durafn(),
            )
        self.timeout = optional(
            positive_seconds, f"the timeout of {describe(fn)}", timeout, error=RegistrationError
        )
        self.__doc__ = fn.__doc__
        self.__wrapped__ = fn
        self.job_options = JobOptions()
        """Options for scheduling it: the decorator's, with ``options()``'s over them."""
        self.registered: FunctionRef[Any, Any] = self
        """The reference the app registered (``options()`` returns copies of it)."""
        self.retention: Retention | None = None
        """How long its finished rows are kept, per state (its decorator's)."""
        self.snooze_limit = SNOOZE_LIMIT
        """How many times one row may snooze (the decorator's ``snooze_limit``)."""
        self.hooks: dict[str, list[Hook]] = {}
        """This function's lifecycle hooks (``on``), by hook name."""
        self.origin: str | None = None
        """Where the app it is registered on was made (``Registry.add``)."""
        self._signature, self._params = parse_signature(fn, self.kind, ctx_types)
        # For the fast path of validate_call (see there).
        self._by_position = [p.name for p in self._params if p.kind is p.POSITIONAL_OR_KEYWORD]
        self._names = frozenset(p.name for p in self._params)
        self._defaults = {p.name: p.default for p in self._params if p.default is not p.empty}
        self._required = self._names - self._defaults.keys()
        try:
            hints = typing.get_type_hints(fn, include_extras=True)
        except Exception as exc:  # NameError for unresolvable forward references, mostly
            raise RegistrationError(
                f"cannot resolve the type hints of {describe(fn)}: {exc}; define the types "
                "it names at module level"
            ) from exc
        fields = {p.name: hints.get(p.name, Any) for p in self._params}
        self._stored_defaults = StoredDefaults(self.name, fields, self._defaults, _ARGS_CONFIG)
        # A TypedDict, not a pydantic model: parameter names such as ``json`` or ``copy``
        # would collide with BaseModel attributes, and a dict maps straight onto **kwargs.
        typed_dict: Any = cast(Any, typing_extensions.TypedDict)(f"{self.name}:args", fields)
        typed_dict.__pydantic_config__ = _ARGS_CONFIG
        try:
            self._args_adapter: TypeAdapter[dict[str, Any]] = TypeAdapter(typed_dict)
            self._result_adapter: TypeAdapter[Any] = TypeAdapter(hints.get("return", Any))
        except pydantic.PydanticSchemaGenerationError as exc:
            raise RegistrationError(
                f"{describe(fn)} takes or returns a type that cannot be stored as JSON: {exc}"
            ) from exc

    if not typing.TYPE_CHECKING:  # for mypy it stays no callable: a call is a type error

        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            run = {"query": "run_query", "mutation": "run_mutation", "action": "run_action"}
            how = f"await app.{run[self.kind]}({self.__wrapped__.__name__}, ...)"
            if self.kind != "query":
                how += (
                    f", or schedule it: await ctx.scheduler.run_after(0, "
                    f"{self.__wrapped__.__name__}, ...)"
                )
            raise CallError(
                f"{self.name!r} is a durafn {self.kind}, not a plain function: run it with {how}"
            )

    def __repr__(self) -> str:
        options = self.job_options
        if options == JobOptions():
            return f"<{type(self).__name__} {self.name!r}>"
        return f"<{type(self).__name__} {self.name!r} {options}>"

    @property
    def parameters(self) -> list[str]:
        """The names of its parameters (besides ``ctx``), in order."""
        return [p.name for p in self._params]

    def validate_call(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        """Validate a direct call's arguments; returns them by name, defaults filled in."""
        values = self._validate(args, kwargs)
        refuse_non_finite(values, f"arguments for {self.name!r}")
        return values

    def _validate(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        try:
            return self._args_adapter.validate_python(self._bind(args, kwargs))
        except pydantic.ValidationError as exc:
            raise ArgumentError(f"invalid arguments for {self.name!r}: {problems(exc)}") from None

    def _bind(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        # The parameters are all plain or keyword-only (checked at registration), so a
        # call that fits them is bound by two dict operations: inspect.Signature.bind took
        # 2.3 us, a fifth of scheduling a row. A call that does not fit goes to inspect,
        # for its exact message.
        if len(args) <= len(self._by_position):
            values = dict(zip(self._by_position, args, strict=False))
            if kwargs.keys() <= self._names and not kwargs.keys() & values.keys():
                values.update(kwargs)
                if values.keys() >= self._required:
                    for name, default in self._defaults.items():
                        values.setdefault(name, default)
                    return values
        try:
            bound = self._signature.bind(*args, **kwargs)
        except TypeError as exc:
            raise ArgumentError(f"bad arguments for {self.name!r}: {exc}") from None
        bound.apply_defaults()  # not reached: a call bind() accepts fits the fast path
        return bound.arguments

    def encode_args(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        """Validate a call's arguments and return their JSON text (defaults filled in)."""
        return self.encode_call(args, kwargs)[1]

    def encode_call(
        self, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[dict[str, Any], str]:
        """A call's validated arguments, by name, and their JSON text."""
        value = self._validate(args, kwargs)
        try:
            data = self._args_adapter.dump_json(value)
        except pydantic_core.PydanticSerializationError as exc:
            raise ArgumentError(
                f"arguments for {self.name!r} cannot be stored as JSON: {exc}; annotate the "
                "parameter with a JSON-serialisable type (pydantic models, datetimes, ...)"
            ) from None
        if b"null" in data:  # where a NaN or an infinity would have gone: look closer
            refuse_non_finite(value, f"arguments for {self.name!r}")
        return value, data.decode()

    def decode_args(self, text: str) -> dict[str, Any]:
        """Validate stored arguments back into Python values for a run."""
        if text == "{}" and not self._params:
            return {}  # pydantic's parse of "{}": 2.5% of a no-op mutation's CPU, skipped
        try:
            return self._args_adapter.validate_json(text)
        except pydantic.ValidationError as exc:
            filled = self._stored_defaults.fill_in(text, exc)
            if filled is None:
                raise ArgumentError(
                    f"stored arguments no longer match {self.name!r}: {problems(exc)}"
                ) from None
        try:
            return self._args_adapter.validate_json(filled)
        except pydantic.ValidationError as exc:
            raise ArgumentError(
                f"stored arguments no longer match {self.name!r}: {problems(exc)}"
            ) from None

    def encode_result(self, value: object) -> str | None:
        if value is None:
            return None
        try:
            data = self._result_adapter.dump_json(value)
        except pydantic_core.PydanticSerializationError as exc:
            raise ArgumentError(
                f"the return value of {self.name!r} cannot be stored as JSON: {exc}"
            ) from None
        if b"null" in data:
            refuse_non_finite(value, f"the return value of {self.name!r}")
        return data.decode()


class QueryRef(FunctionRef[P, R]):
    """A registered query: read-only."""

    kind = FunctionKind.QUERY


@dataclasses.dataclass(frozen=True, slots=True)
class Call:
    """One call of a function, with its arguments and options, to schedule with others
    (``scheduler.run_many``). Build it with ``fn.call(...)`` (mypy checks the arguments);
    its time is now unless ``after``/``at`` say otherwise."""

    fn: SchedulableRef[Any, Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    delay: float | timedelta | None = None
    when: datetime | float | None = None

    def after(self, delay: float | timedelta) -> Call:
        """This call, ``delay`` seconds (or a timedelta) from when it is scheduled."""
        return dataclasses.replace(self, delay=delay, when=None)

    def at(self, when: datetime | float) -> Call:
        """This call, at an aware datetime or epoch seconds."""
        return dataclasses.replace(self, when=when, delay=None)


class SchedulableRef(FunctionRef[P, R]):
    """A function that can be scheduled: a mutation or an action."""

    def on(self, hook: HookName) -> Callable[[HookT], HookT]:
        """Register a lifecycle hook of this function: ``@send_email.on("failure")`` over
        ``def alert(event: durafn.HookEvent)`` (or ``async def``). See ``App.on``."""
        name = check_hook(hook)

        def _add(fn: HookT) -> HookT:
            if not callable(fn):
                raise RegistrationError(f"a hook must be a function of one HookEvent, not {fn!r}")
            self.registered.hooks.setdefault(name, []).append(fn)
            FUNCTION_HOOKS.add(self.registered.name)
            return fn

        return _add

    def call(self, *args: P.args, **kwargs: P.kwargs) -> Call:
        """This function called with these arguments, for ``scheduler.run_many``."""
        return Call(self, args, kwargs)

    def options(self, **options: Unpack[JobOptionArgs]) -> Self:
        """This function with job options for the calls scheduled through the result
        (which has the same parameters, so mypy still checks the arguments).

        ``priority``: lower runs first among due rows (default 0, or the queue's).
        ``queue``: a named queue; its rows run one at a time across every worker, in
        order (or up to the queue's ``concurrency``). ``key``/``key_mode``: a job key,
        at most one Pending row per key (``"replace"``, the default,
        ``"preserve_run_at"`` or ``"unsafe_dedupe"``: Graphile Worker's modes, see the
        README). ``flags``: strings a worker can refuse (``forbidden_flags``).
        ``retry``: a ``durafn.Retry`` policy for these calls (its backoff one of durafn's,
        kept on the row: a backoff function belongs on the decorator). ``on_complete``: a
        mutation taking a ``durafn.Completion``, scheduled in the same transaction as the
        row's final Success, Failed or Canceled (never lost, never twice). ``flow``: a
        ``durafn.Flow`` (flow key, concurrency, rate, fairness weight, debounce), in place
        of the decorator's. ``after``: ids of rows already written (this transaction's or
        earlier) that must all finish for good first; ``after_policy``: what the row does
        if one of them ends Failed or Canceled (``"run"`` anyway, ``"cancel"``,
        ``"fail"``). Options not given keep the decorator's.
        """
        chosen = JobOptions.checked(**options)
        if chosen.retry is not None and chosen.retry.to_json() is None:
            raise OptionError(
                "a retry policy given per call keeps its backoff on the row, as data: use "
                "Exponential(...), Fixed(...), GRAPHILE or DELAYED_JOB here, and declare a "
                "backoff function on the decorator (@app.action(retry=Retry(...)))"
            )
        copy = object.__new__(type(self))
        copy.__dict__.update(self.__dict__)
        copy.job_options = chosen.over(self.job_options)
        return copy


class MutationRef(SchedulableRef[P, R]):
    """A registered mutation: runs in one transaction, exactly once when scheduled."""

    kind = FunctionKind.MUTATION


class JobOptionArgs(TypedDict, total=False):
    """The job options as keyword arguments (of ``@app.mutation``/``@app.action`` and
    ``options(...)``): their one declaration for the type checker (``JobOptions`` is
    their checked form, ``_options.CHECKS`` their checks)."""

    priority: int | None
    queue: str | None
    key: str | None
    key_mode: KeyMode | None
    flags: Iterable[str] | None
    retry: Retry | None
    on_complete: MutationRef[[Completion], Any] | None
    flow: Flow | None
    after: Iterable[str] | None
    after_policy: AfterPolicy | None


class ActionRef(SchedulableRef[P, R]):
    """A registered action: runs outside a transaction, at most once when scheduled."""

    kind = FunctionKind.ACTION
    cancel: CancelMode = "cooperative"
    """How a run learns of its row's cancel (its decorator's ``cancel=``)."""


class StartableRef(FunctionRef[P, R]):
    """A durable workflow's reference (``durafn.WorkflowRef``, ``_workflow``) as the
    scheduler sees it: what ``start_workflow`` takes, so that mypy checks its
    arguments."""


RefT = TypeVar("RefT", bound="FunctionRef[Any, Any]")


class Registry:
    """Durable name -> function. One per app (shared by its ``app.using`` copies)."""

    def __init__(self, origin: str = "?") -> None:
        self._by_name: dict[str, FunctionRef[Any, Any]] = {}
        self.version = 0
        """How many functions were registered: what was read of it may be stale."""
        self.origin = origin
        """Where its app was made (``file:line``): errors name the app a function is on."""
        self.workflows: dict[str, Any] = {}
        """Durable workflows by name (``@app.workflow``, ``_workflow``): not rows'
        functions, so kept apart from them."""
        self.workflow_ops: Any = None
        """What starts and signals workflows (``_workflow.lifecycle``), set by the first
        ``@app.workflow``: the scheduler reaches it here, not by importing it (which
        would import the scheduler back)."""
        # durafn's own mutation that completes a group (``_groups``): every worker runs it.
        self.add(MutationRef(complete_group, name=GROUP_COMPLETE, timeout=None, ctx_types=()))

    def add(self, ref: FunctionRef[Any, Any]) -> None:
        existing = self._by_name.get(ref.name)
        if existing is not None:
            raise RegistrationError(
                f"the durable name {ref.name!r} is already registered (by "
                f"{describe(existing.fn)}); pass name=... to give one of them another name"
            )
        self._by_name[ref.name] = ref
        ref.origin = self.origin
        self.version += 1

    def refs(self) -> list[FunctionRef[Any, Any]]:
        """Every function registered, durafn's own included."""
        return list(self._by_name.values())

    def get(self, name: str) -> FunctionRef[Any, Any]:
        try:
            return self._by_name[name]
        except KeyError:
            raise UnknownFunctionError(name) from None

    def find(self, name: str) -> FunctionRef[Any, Any] | None:
        return self._by_name.get(name)

    def hooks_of(self, name: str) -> Mapping[str, Sequence[Hook]]:
        """The hooks of the function registered as ``name`` (none if there is none)."""
        ref = self._by_name.get(name)
        return ref.registered.hooks if ref is not None else {}

    def get_kind(self, name: str, kind: type[RefT]) -> RefT:
        """The function a scheduled row names, which must be of the row's ``kind``."""
        ref = self.get(name)
        if not isinstance(ref, kind):
            raise UnknownFunctionError(name)
        return ref

    def resolve(self, fn: FunctionRef[Any, Any] | str) -> FunctionRef[Any, Any]:
        """The registered function for a reference or a durable name."""
        if isinstance(fn, str):
            return self.get(fn)
        if not isinstance(fn, FunctionRef):
            raise UnknownFunctionError(repr(fn))
        if self._by_name.get(fn.name) is not fn.registered:
            raise UnknownFunctionError(fn.name, elsewhere=fn.registered.origin)
        return fn

    def retentions(self) -> dict[str, Retention]:
        """The functions that keep their finished rows for periods of their own."""
        return {n: r.retention for n, r in self._by_name.items() if r.retention is not None}

    def names(self) -> list[str]:
        """The durable names registered, without durafn's own (``durafn:...``)."""
        return sorted(n for n in self._by_name if not n.startswith("durafn:"))


_PACKAGE = os.path.dirname(os.path.abspath(__file__))


def _outside_durafn() -> int:
    """The ``stacklevel`` of the first frame outside durafn: a warning then names the
    user's line (the decorator's), whichever way the function was registered."""
    level, frame = 1, sys._getframe(1)
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(_PACKAGE):
        level, frame = level + 1, frame.f_back  # type: ignore[assignment]
    return level


publish(globals())
