"""PostgreSQL's SQL for the elements of ``_store/sql.py`` (registered when this module is
imported, with its driver): ``strpos`` for a substring, the identity's ``DEFAULT`` for a
new row's ``seq``, ``jsonb`` paths for the arguments."""

from __future__ import annotations

from typing import Any

from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler

from ..sql import ArgContains, ArgEquals, MinuteStart, NextSeq, Within


@compiles(Within, "postgresql")
def _strpos(element: Within, compiler: SQLCompiler, **kw: Any) -> str:
    needle, haystack = (compiler.process(c, **kw) for c in element.clauses)
    return f"(strpos({haystack}, {needle}) > 0)"


@compiles(NextSeq, "postgresql")
def _identity(element: NextSeq, compiler: SQLCompiler, **kw: Any) -> str:
    return "DEFAULT"


@compiles(ArgEquals, "postgresql")
def _jsonb_path(element: ArgEquals, compiler: SQLCompiler, **kw: Any) -> str:
    args, path, value = (compiler.process(c, **kw) for c in element.clauses)
    found = f"CAST({args} AS JSONB) #> string_to_array({path}, '.')"
    return f"({found} = CAST({value} AS JSONB))"


@compiles(ArgContains, "postgresql")
def _jsonb_contains(element: ArgContains, compiler: SQLCompiler, **kw: Any) -> str:
    args, path, value = (compiler.process(c, **kw) for c in element.clauses)
    found = f"(CAST({args} AS JSONB) #> string_to_array({path}, '.'))"
    wanted = f"CAST({value} AS JSONB)"
    return (
        f"(({found} = {wanted}) "
        f"OR (jsonb_typeof({found}) = 'array' AND {found} @> jsonb_build_array({wanted})) "
        f"OR (jsonb_typeof({found}) = 'string' AND jsonb_typeof({wanted}) = 'string' "
        f"AND strpos({found} #>> '{{}}', {wanted} #>> '{{}}') > 0))"
    )


@compiles(MinuteStart, "postgresql")
def _minute_start(element: MinuteStart, compiler: SQLCompiler, **kw: Any) -> str:
    (at,) = (compiler.process(c, **kw) for c in element.clauses)
    return f"(CAST(floor(({at}) / 60) AS BIGINT) * 60)"
