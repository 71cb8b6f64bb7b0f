"""The suite's own rules, read from its files.

Two suites may share one PostgreSQL server (``DURAFN_TEST_PG_DATABASE``, README.md): each
database a test uses there must have a name derived from that one (``tests/conftest.py``),
or the two suites empty and migrate each other's database mid-run. The test kit's tests
once named ``durafn_kit`` outright.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

TESTS = Path(__file__).resolve().parent
_HOLE = "\x00"
"""What stands for an f-string's replacement field in the text read."""
_URL = re.compile(r"postgres(?:ql)?(?:\+\w+)?://(?P<netloc>[^/\s]*)/(?P<database>[^\s?'\"]*)")


def _strings(tree: ast.AST) -> list[tuple[int, str]]:
    """Every string literal (an f-string with each replacement field as ``_HOLE``)."""
    found = []
    inside_fstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            parts: list[str] = []
            for value in node.values:
                inside_fstrings.add(id(value))
                parts.append(str(value.value) if isinstance(value, ast.Constant) else _HOLE)
            found.append((node.lineno, "".join(parts)))
    for node in ast.walk(tree):
        if id(node) in inside_fstrings:
            continue
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            found.append((node.lineno, node.value))
    return found


def _on_the_test_server(netloc: str) -> bool:
    """Whether a URL's host and port are the suite's server (PostgreSQL's default port,
    5432): a URL to a port nothing serves (a test of a failing connection) names no
    database anyone's suite uses."""
    port = netloc.rpartition("@")[2].rpartition(":")[2] if ":" in netloc else ""
    return port in ("", "5432")


def hard_coded_databases(source: str) -> list[str]:
    """``line: text`` for each literal PostgreSQL database name in ``source``: a URL to
    the test server whose database is not derived (an f-string's field), or a
    ``CREATE DATABASE`` of a literal name."""
    found = []
    for line, text in _strings(ast.parse(source)):
        for url in _URL.finditer(text):
            database = url["database"]
            if database and _HOLE not in database and _on_the_test_server(url["netloc"]):
                found.append(f"{line}: {url[0]}")
        if re.search(r"CREATE DATABASE\s+[\"']?[A-Za-z_]", text, re.IGNORECASE):
            found.append(f"{line}: {text.strip()}")
    return found


def test_the_reading_finds_what_it_looks_for() -> None:
    source = """
named = "postgresql+asyncpg://postgres@127.0.0.1:5432/durafn_kit"
bare = "postgresql://postgres@localhost/mine"
option = "--durafn-url=postgresql+asyncpg://postgres@127.0.0.1:5432/durafn_kit"
derived = f"postgresql+asyncpg://postgres@127.0.0.1:5432/{BASE}_kit"
elsewhere = f"postgresql+asyncpg://app@127.0.0.1:{port}/nowhere"
closed = "postgresql+asyncpg://postgres@127.0.0.1:1/nothing"
created = "CREATE DATABASE other"
"""
    assert [f.split(":")[0] for f in hard_coded_databases(source)] == ["2", "3", "4", "8"]


def test_no_test_names_a_database_of_its_own() -> None:
    """Every database name a test uses on the server derives from ``PG_DATABASE`` (or
    ``PG_BASE``): only ``conftest.py`` names them, from the environment variable."""
    found = {
        path.name: hard_coded_databases(path.read_text())
        for path in sorted(TESTS.glob("*.py"))
        if path.name not in ("conftest.py", Path(__file__).name)
    }
    assert {name: lines for name, lines in found.items() if lines} == {}
