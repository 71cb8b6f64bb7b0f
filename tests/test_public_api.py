"""The public surface is small, explicit and typed."""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
import traceback
from pathlib import Path

import durafn
import durafn.testing
from durafn._public import PUBLIC


def test_all_is_exact_and_sorted() -> None:
    # "@py_builtins" and the like: pytest rewrites the asserts of a package that ships a
    # plugin (durafn.pytest_plugin), its __init__ included.
    public = {name for name in dir(durafn) if not name.startswith(("_", "@"))}
    modules = {"cli", "cron", "testing", "logging", "pytest_plugin", "dashboard"}
    assert set(durafn.__all__) == public - modules
    assert list(durafn.__all__) == sorted(durafn.__all__)


def test_the_lazy_names_are_the_typed_ones() -> None:
    """``durafn/__init__.py`` imports its names for type checkers only, and loads them on
    first use from ``_public.PUBLIC``: both say the same, name for name and module for
    module."""
    tree = ast.parse((Path(durafn.__file__)).read_text())
    typed = {
        alias.asname or alias.name: node.module
        for block in tree.body
        if isinstance(block, ast.If) and "TYPE_CHECKING" in ast.unparse(block.test)
        for node in block.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    assert typed == PUBLIC
    assert sorted(PUBLIC) == list(durafn.__all__)


def test_importing_the_package_loads_none_of_its_dependencies() -> None:
    """``import durafn`` (and the command line's help) loads no SQLAlchemy or pydantic;
    a class of it is named ``durafn.X`` however it was loaded."""
    probe = (
        "import sys, durafn\n"
        "heavy = [m for m in sys.modules if m.split('.')[0] in "
        "('sqlalchemy', 'pydantic', 'asyncpg', 'aiosqlite', 'anyio', 'rich')]\n"
        "from durafn._errors import SchemaError\n"
        "from durafn._kinds import State\n"
        "print(heavy, SchemaError.__module__, State.__module__)\n"
    )
    ran = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert ran.stdout.split() == ["[]", "durafn", "durafn"]


def test_every_public_name_is_documented() -> None:
    for name in durafn.__all__:
        obj = getattr(durafn, name)
        if callable(obj) and not isinstance(obj, type(durafn.State.PENDING)):
            assert obj.__doc__, f"durafn.{name} has no docstring"


def test_package_is_typed() -> None:
    assert (Path(durafn.__file__).parent / "py.typed").exists()


def test_errors_subclass_the_builtins_callers_catch() -> None:
    assert issubclass(durafn.NotFoundError, LookupError)
    assert issubclass(durafn.UnknownFunctionError, LookupError)
    assert issubclass(durafn.ArgumentError, ValueError)
    assert issubclass(durafn.SchedulingLimitError, durafn.SchedulingError)
    assert issubclass(durafn.FunctionTimeoutError, TimeoutError)
    assert issubclass(durafn.DurableNameWarning, UserWarning)  # the one warning
    for name in durafn.__all__:
        obj = getattr(durafn, name)
        if isinstance(obj, type) and issubclass(obj, Exception) and not issubclass(obj, Warning):
            assert issubclass(obj, durafn.DurafnError)


def test_public_classes_are_named_as_users_import_them() -> None:
    """Tracebacks and reprs say durafn.SchemaError, not durafn._errors.SchemaError."""
    line = traceback.format_exception_only(durafn.SchemaError("missing"))[0]
    assert line == "durafn.SchemaError: missing\n"
    assert repr(durafn.App) == "<class 'durafn.App'>"
    for name in durafn.__all__:
        assert not getattr(getattr(durafn, name), "__module__", "durafn").startswith("durafn._")


def test_the_package_declares_its_licence_and_home() -> None:
    """What `pip install` of a checkout or a git URL publishes: the MIT licence the
    LICENSE file holds, and where the project lives; build output is never committed."""
    root = Path(__file__).resolve().parent.parent
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    assert project["license"] == "MIT"
    assert (root / "LICENSE").read_text().startswith("MIT License\n")
    assert set(project["urls"]) >= {"Homepage", "Documentation", "Source", "Issues"}
    assert all(url.startswith("https://") for url in project["urls"].values())
    assert {"build/", "dist/"} <= set((root / ".gitignore").read_text().split())
