"""How every command finds its app and database, runs its async body, and reports errors:
one line on stderr and exit status 1 (``--verbose`` adds the traceback)."""

from __future__ import annotations

import functools
import getpass
import importlib
import os
import socket
import sys
import traceback
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import click

from .._errors import DurafnError

if TYPE_CHECKING:
    from .._app import App

T = TypeVar("T")


class CliError(DurafnError):
    """A problem with what the command was given (an app path, an id): one line for the user."""


# -- the app and the database ----------------------------------------------------------


def load_app(ref: str) -> App:
    """Import ``pkg.module:attr`` (the current directory on the path, as uvicorn does)."""
    from .._app import App

    module_name, _, attr = ref.partition(":")
    attr = attr or "app"
    if not module_name or not all(p.isidentifier() for p in module_name.split(".")):
        raise CliError(f"{ref!r} is not an app reference; use pkg.module:app")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            raise CliError(
                f"cannot import {module_name!r} (from --app {ref!r}): no module named "
                f"{exc.name!r}; run durafn from your project's directory or fix the path"
            ) from exc
        raise _import_failed(module_name, ref, exc) from exc
    except Exception as exc:  # the user's module itself failed: say where it happened
        raise _import_failed(module_name, ref, exc) from exc
    try:
        value = functools.reduce(getattr, attr.split("."), module)
    except AttributeError:
        raise CliError(
            f"module {module_name!r} has no attribute {attr!r} (from --app {ref!r})"
        ) from None
    if not isinstance(value, App):
        what = "a class" if isinstance(value, type) else f"a {type(value).__name__}"
        raise CliError(f"{ref!r} is {what}, not a durafn.App")
    return value


def _import_failed(module_name: str, ref: str, exc: Exception) -> CliError:
    return CliError(
        f"importing {module_name!r} (from --app {ref!r}) failed: "
        f"{type(exc).__qualname__}: {exc} (--verbose shows where)"
    )


def open_app(app_ref: str | None, url: str | None, *, create: bool = False) -> App:
    """The app to work with: the user's (``--app``), on ``--url`` if given, or a bare app
    on ``--url`` for commands that only read and write rows.

    ``create``: may create the system tables (SQLite's first use); inspection commands
    must not, so that a mistyped path is an error rather than a new empty database.
    """
    from .._app import App

    if app_ref:
        app = load_app(app_ref)
        if url:
            app._use_url(url)
    elif url:
        app = App(url)
    else:
        raise CliError(_no_database())
    if not create:
        app._inspect_only()
    return app


def _no_database() -> str:
    """Which database to name: the default App()'s file, if it is here."""
    from .._app import DEFAULT_FILE

    here = ""
    if os.path.exists(DEFAULT_FILE):
        here = (
            f" (a {DEFAULT_FILE} is here, an App()'s default database: --url "
            f"sqlite:///{DEFAULT_FILE}, or --app MODULE:APP for your app)"
        )
    return (
        "no database given: pass --url (or set DURAFN_DATABASE_URL), or --app (or "
        f"DURAFN_APP) for your app and the database it names{here}"
    )


# -- running and reporting -------------------------------------------------------------


def fail(message: str, status: int = 1) -> NoReturn:
    """One line on stderr, and exit ``status``: 1, or 2 for a bad option (as click's)."""
    click.echo(f"error: {message}", err=True)
    sys.exit(status)


def run(body: Callable[[], Awaitable[T]], *, verbose: bool) -> T:
    """Run an async command body; errors become one line on stderr and exit status 1."""
    import anyio  # with the command's body, not with every command's --help

    try:
        return anyio.run(body)
    except (click.ClickException, click.Abort):
        raise  # click's own (a declined confirmation): click reports them its way
    except (DurafnError, OSError) as exc:
        if verbose:
            traceback.print_exc()
        fail(str(exc))
    except Exception as exc:
        if verbose:
            traceback.print_exc()
        fail(
            f"{type(exc).__module__}.{type(exc).__qualname__}: {exc} "
            "(run with --verbose for the traceback)"
        )


@dataclass(frozen=True)
class Audited:
    """A change a command makes, recorded in the audit trail once made (``via="cli"``,
    who: ``user@host``): ``action`` on ``target``, and from the body's result how many
    rows it changed and what came of it."""

    action: str
    target: str
    rows: Callable[[Any], int]
    outcome: Callable[[Any], str]


def run_with_app(
    app_ref: str | None,
    url: str | None,
    body: Callable[[App], Awaitable[T]],
    *,
    verbose: bool,
    create: bool = False,
    audited: Audited | None = None,
) -> T:
    """``run`` a body that needs the app, opened as ``open_app`` does and always closed;
    if it makes a change (``audited``), record it in the audit trail."""

    async def _run() -> T:
        app = open_app(app_ref, url, create=create)
        try:
            result = await body(app)
            if audited is not None:
                await _record(app, audited, result)
            return result
        finally:
            await app.aclose()

    return run(_run, verbose=verbose)


def _printable(text: str) -> str:
    """An argument as stored text: bytes that were not UTF-8 (a lone surrogate here) as
    escapes, NUL as ``\\x00``."""
    return text.encode("utf-8", "backslashreplace").decode().replace("\x00", "\\x00")


async def _record(app: App, audited: Audited, result: Any) -> None:
    try:
        await app.record_action(
            who=f"{getpass.getuser()}@{socket.gethostname()}",
            via="cli",
            action=audited.action,
            target=_printable(audited.target),
            rows=audited.rows(result),
            outcome=_printable(audited.outcome(result)),
        )
    except DurafnError as exc:  # the change is made: say so, and what was not recorded
        click.echo(f"warning: done, but not recorded in the audit trail: {exc}", err=True)
