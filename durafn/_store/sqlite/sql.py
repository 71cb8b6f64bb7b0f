"""SQLite's SQL for the elements of ``_store/sql.py`` (registered when this module is
imported, with its driver): ``instr`` for a substring (its LIKE ignores ASCII case), the
next rowid for a new row's ``seq``, ``json_extract`` and ``json_each`` for the
arguments."""

from __future__ import annotations

from typing import Any

from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler

from ..sql import ArgContains, ArgEquals, MinuteStart, NextSeq, Within


@compiles(Within, "sqlite")
def _instr(element: Within, compiler: SQLCompiler, **kw: Any) -> str:
    needle, haystack = (compiler.process(c, **kw) for c in element.clauses)
    return f"(instr({haystack}, {needle}) > 0)"


@compiles(NextSeq, "sqlite")
def _rowid(element: NextSeq, compiler: SQLCompiler, **kw: Any) -> str:
    return f"((SELECT coalesce(max(rowid), 0) FROM _scheduled_functions) + {element.offset:d})"


@compiles(ArgEquals, "sqlite")
def _json_extract(element: ArgEquals, compiler: SQLCompiler, **kw: Any) -> str:
    args, path, value = (compiler.process(c, **kw) for c in element.clauses)
    return f"(json_extract({args}, '$.' || {path}) = json_extract({value}, '$'))"


@compiles(ArgContains, "sqlite")
def _json_contains(element: ArgContains, compiler: SQLCompiler, **kw: Any) -> str:
    args, path, value = (compiler.process(c, **kw) for c in element.clauses)
    at = f"'$.' || {path}"
    wanted = f"json_extract({value}, '$')"
    return (
        f"((json_extract({args}, {at}) = {wanted}) "
        f"OR (json_type({args}, {at}) = 'array' AND EXISTS (SELECT 1 FROM json_each({args}, "
        f"{at}) AS e WHERE e.value = {wanted} AND e.type = json_type({value}, '$'))) "
        f"OR (json_type({args}, {at}) = 'text' AND json_type({value}, '$') = 'text' "
        f"AND instr(json_extract({args}, {at}), {wanted}) > 0))"
    )


@compiles(MinuteStart, "sqlite")
def _minute_start(element: MinuteStart, compiler: SQLCompiler, **kw: Any) -> str:
    (at,) = (compiler.process(c, **kw) for c in element.clauses)
    return f"(CAST(({at}) / 60 AS INTEGER) * 60)"
