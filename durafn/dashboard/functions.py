"""Run a function from the page: a form per registered mutation and action (its durable
name, its parameters as declared), the arguments entered as one JSON object, scheduled
now or after a delay through ``app.scheduler().run_after(delay, name, **arguments)``:
validated exactly as scheduling from Python validates them (pydantic, the function's
own annotations). A problem (not JSON, not an object, a parameter missing or of the
wrong type, a delay that is not a number) is said on the page, naming it, and nothing is
scheduled; a scheduled row is audited and its page shown. Read-write mode only."""

from __future__ import annotations

import inspect
import json
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from .._errors import ArgumentError, UnknownFunctionError
from .surface import Done, Pages, Refused

SCHEDULABLE = ("mutation", "action")
"""The kinds a row can run (a query is read in a caller's transaction, never scheduled)."""
MAX_DELAY = 366 * 86400.0


def routes(d: Pages) -> list[Route]:
    async def listing(request: Request) -> Response:
        async def body(user: str) -> dict[str, Any]:
            return {"functions": [_described(d, name) for name in _schedulable(d)]}

        return await d.page(request, "functions.html", body)

    async def run(request: Request) -> Response:
        async def act(user: str, form: Any) -> Done:
            name = str(request.path_params["name"])
            if name not in _schedulable(d):
                raise Refused(404, f"no mutation or action registered as {name!r}")
            arguments = _arguments(str(form.get("args") or "{}"))
            delay = _delay(str(form.get("delay") or "0"))
            try:
                id = await d.app.scheduler().run_after(delay, name, **arguments)
            except ArgumentError as exc:  # pydantic's problems, each named; nothing written
                raise Refused(400, f"{exc}: nothing was scheduled") from None
            when = "now" if delay == 0 else f"in {delay:g} s"
            return Done(f"scheduled {name} to run {when}: row {id}", f"/rows/{id}", "run", name, 1)

        return await d.act(request, act)

    return [
        Route("/functions", listing),
        Route("/functions/{name}/run", run, methods=["POST"]),
    ]


def runnable(d: Pages) -> list[str]:
    """The registered mutations and actions: what the form can schedule (a function's
    page links to its form)."""
    return _schedulable(d)


def _schedulable(d: Pages) -> list[str]:
    return [n for n in d.app.functions() if str(d.app.function(n).kind) in SCHEDULABLE]


def _described(d: Pages, name: str) -> dict[str, Any]:
    """A function as its form shows it: its kind, its parameters as declared, its doc."""
    try:
        ref = d.app.function(name)
    except UnknownFunctionError:  # pragma: no cover - listed a moment ago
        raise Refused(404, f"no function {name!r}") from None
    params = list(inspect.signature(ref.fn).parameters.values())[1:]  # after ctx
    example = {p.name: None for p in params if p.default is inspect.Parameter.empty}
    return {
        "name": name,
        "kind": str(ref.kind),
        "parameters": [_parameter(p) for p in params],
        "doc": inspect.getdoc(ref.fn) or "",
        "example": json.dumps(example),
    }


def _parameter(p: inspect.Parameter) -> str:
    text = p.name
    if p.annotation is not inspect.Parameter.empty:
        shown = p.annotation
        text += f": {shown if isinstance(shown, str) else inspect.formatannotation(shown)}"
    if p.default is not inspect.Parameter.empty:
        text += f" = {p.default!r}"
    return text


def _arguments(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise Refused(400, f"the arguments are not JSON ({exc}): nothing was scheduled") from None
    if not isinstance(value, dict):
        raise Refused(
            400,
            "the arguments must be one JSON object naming the parameters "
            f'({{"to": "ann"}}), not {type(value).__name__}: nothing was scheduled',
        )
    return value


def _delay(text: str) -> float:
    try:
        delay = float(text)
    except ValueError:
        raise Refused(
            400, f"delay {text!r} is not a number of seconds: nothing was scheduled"
        ) from None
    if not 0 <= delay <= MAX_DELAY:
        raise Refused(400, f"delay {text!r} must be from 0 to {MAX_DELAY:g} seconds")
    return delay
