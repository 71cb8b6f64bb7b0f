"""A durable function's signature, and its arguments as JSON can hold them: the context
parameter checked, named parameters only, NaN and infinities refused, pydantic's errors
as one line, the defaults a stored row leaves out (what ``FunctionRef`` reads when a
function is registered, called or run).
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from collections.abc import Callable, Iterable
from typing import Any, cast

import pydantic
import pydantic_core
import typing_extensions
from pydantic import ConfigDict, TypeAdapter

from ._errors import ArgumentError, RegistrationError
from ._kinds import FunctionKind


def refuse_non_finite(value: object, what: str) -> None:
    """ArgumentError if a NaN or an infinity is anywhere in ``value``: JSON has none, and
    pydantic would store them as null, so the function would later run with other
    arguments than it was given (or fail validation days later)."""
    where = _non_finite_at(value, "", 0)
    if where is not None:
        raise ArgumentError(
            f"{what} contain a NaN or an infinity (at {where.lstrip('.') or 'the top'}), "
            "which cannot be stored as JSON; pass a finite number or None"
        )


def _non_finite_at(value: object, path: str, depth: int) -> str | None:
    """The path of the first non-finite float in ``value`` (containers, pydantic models,
    dataclasses), or None."""
    if isinstance(value, float):
        return None if math.isfinite(value) else path
    if depth > 100 or isinstance(value, str | bytes | int):
        return None  # deeper than any JSON pydantic writes; scalars hold no floats
    if isinstance(value, dict):
        steps: Iterable[tuple[str, object]] = ((f".{k}", v) for k, v in value.items())
    elif isinstance(value, list | tuple | set | frozenset):
        steps = ((f"[{i}]", v) for i, v in enumerate(value))
    elif isinstance(value, pydantic.BaseModel) or dataclasses.is_dataclass(value):
        steps = ((f".{k}", v) for k, v in vars(value).items())
    else:
        return None
    for step, item in steps:
        found = _non_finite_at(item, path + step, depth + 1)
        if found is not None:
            return found
    return None


def problems(exc: pydantic.ValidationError) -> str:
    """Pydantic's errors as one line: ``n: Input should be a valid integer (got 'x')``."""
    parts = []
    for err in exc.errors(include_url=False):
        where = ".".join(str(p) for p in err["loc"]) or "arguments"
        got = f" (got {err['input']!r})" if err["type"] != "missing" else ""
        parts.append(f"{where}: {err['msg']}{got}")
    return "; ".join(parts)


def describe(fn: object) -> str:
    module = getattr(fn, "__module__", "?")
    qualname = getattr(fn, "__qualname__", repr(fn))
    return f"{module}.{qualname}"


def parse_signature(
    fn: Callable[..., Any], kind: FunctionKind, ctx_types: tuple[type, ...]
) -> tuple[inspect.Signature, list[inspect.Parameter]]:
    signature = inspect.signature(fn)
    params = list(signature.parameters.values())
    ctx_name = ctx_types[0].__name__ if ctx_types else "ctx"
    if not params or params[0].kind not in (
        inspect.Parameter.POSITIONAL_ONLY,
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
    ):
        raise RegistrationError(
            f"{describe(fn)} must take the context as its first parameter: "
            f"async def {fn.__name__}(ctx: {ctx_name}, ...)"
        )
    first = params[0]
    annotation = first.annotation
    if isinstance(annotation, str):
        annotation = annotation.rsplit(".", 1)[-1]
        wrong_ctx = annotation.endswith("Ctx") and annotation not in {t.__name__ for t in ctx_types}
        names_ctx = first.name == "ctx" or annotation in {t.__name__ for t in ctx_types}
    else:
        is_ctx_class = isinstance(annotation, type) and annotation.__name__.endswith("Ctx")
        wrong_ctx = is_ctx_class and not issubclass(annotation, ctx_types)
        names_ctx = first.name == "ctx" or (
            isinstance(annotation, type) and issubclass(annotation, ctx_types)
        )
    if wrong_ctx:
        raise RegistrationError(
            f"{describe(fn)} is registered as {a_word(kind)} but its context is annotated "
            f"{first.annotation!r}; {a_word(kind)} receives {a_word(ctx_name)}"
        )
    if not names_ctx:
        raise RegistrationError(
            f"{describe(fn)} must take the context as its first parameter, named 'ctx' or "
            f"annotated {ctx_name}; found {first.name!r}"
        )
    rest = params[1:]
    for p in rest:
        if p.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            raise RegistrationError(
                f"{describe(fn)} takes *{p.name}; durable functions need named parameters "
                "so their arguments can be stored and validated"
            )
        if p.kind is inspect.Parameter.POSITIONAL_ONLY:
            raise RegistrationError(
                f"{describe(fn)}: parameter {p.name!r} is positional-only; arguments are "
                "stored by name, so make it a normal parameter"
            )
    return signature.replace(parameters=rest), rest


def a_word(word: str) -> str:
    """``a mutation``, ``an action``."""
    return f"an {word}" if word[:1].lower() in "aeiou" else f"a {word}"


class StoredDefaults:
    """A function's defaults as scheduling from Python stores them, put into stored
    arguments that leave their parameters out.

    One rule on every route: a parameter left out takes its default. Scheduling from
    Python stores the defaults with the call; a row from SQL (``durafn.schedule``, which
    cannot see them) or one scheduled before the parameter was added has them put in when
    it runs, as Python would have stored them (validated, then JSON), so both reach the
    function as the same value. Only rows that lack one pay for it: the hot path is the
    first ``validate_json`` of ``FunctionRef.decode_args``."""

    def __init__(
        self, name: str, fields: dict[str, Any], defaults: dict[str, Any], config: ConfigDict
    ) -> None:
        self._name = name
        self._fields = fields
        self._defaults = defaults
        self._config = config
        self._stored: dict[str, Any] | None = None  # made on the first row that needs one

    def fill_in(self, text: str, exc: pydantic.ValidationError) -> bytes | None:
        """``text`` with the defaults of the parameters ``exc`` says are missing put in;
        None if none of its problems is such a parameter."""
        missing = {
            str(e["loc"][0]) for e in exc.errors() if e["type"] == "missing" and len(e["loc"]) == 1
        } & self._defaults.keys()
        if not missing:
            return None
        defaults = self._values()
        added = {name: defaults[name] for name in missing if name in defaults}
        if not added:
            return None
        # A JSON object (pydantic reports missing fields of nothing else); duplicate keys
        # were already folded by the parse the error came from, as here.
        stored: dict[str, Any] = pydantic_core.from_json(text)
        return pydantic_core.to_json(stored | added)

    def _values(self) -> dict[str, Any]:
        """Each default as JSON values. A default that cannot be stored (``object()``) is
        left out: a row without that parameter fails naming it, as a Python call without
        it cannot be scheduled."""
        if self._stored is None:
            fields = {name: self._fields[name] for name in self._defaults}
            typed_dict: Any = cast(Any, typing_extensions.TypedDict)(
                f"{self._name}:defaults", fields, total=False
            )
            typed_dict.__pydantic_config__ = self._config
            adapter: TypeAdapter[dict[str, Any]] = TypeAdapter(typed_dict)
            values: dict[str, Any] = {}
            for name, default in self._defaults.items():
                try:
                    values |= adapter.dump_python(
                        adapter.validate_python({name: default}), mode="json"
                    )
                except (pydantic.ValidationError, pydantic_core.PydanticSerializationError):
                    continue
            self._stored = values
        return self._stored
