"""SQL that both engines write their own way, and the literals partial indexes match:
a row's new ``seq`` (``next_seq``), "carries this flag" (``carries``), the states a
claim's partial indexes name (``PENDING``, ``RUNNING``)."""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    Text,
    literal,
    literal_column,
)
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.sql.functions import FunctionElement

from .._kinds import State
from .schema.tables import sf

# Literals, not bind parameters: a partial index is used only when the query's WHERE
# visibly implies the index's (SQLite does not look into parameters).
PENDING: ColumnElement[str] = literal_column(f"'{State.PENDING.value}'")
RUNNING: ColumnElement[str] = literal_column(f"'{State.IN_PROGRESS.value}'")


class _Within(FunctionElement[bool]):
    """``needle`` occurs in ``haystack``, case-sensitively on both engines: SQLite's LIKE
    ignores ASCII case (a worker forbidding ``bulk`` skipped rows flagged ``Bulk``), and
    its case_sensitive_like pragma would change the users' own queries on the connection.
    """

    type = Boolean()
    name = "within"
    inherit_cache = True


@compiles(_Within)
def _strpos(element: _Within, compiler: SQLCompiler, **kw: Any) -> str:
    needle, haystack = (compiler.process(c, **kw) for c in element.clauses)
    return f"(strpos({haystack}, {needle}) > 0)"


@compiles(_Within, "sqlite")
def _instr(element: _Within, compiler: SQLCompiler, **kw: Any) -> str:
    needle, haystack = (compiler.process(c, **kw) for c in element.clauses)
    return f"(instr({haystack}, {needle}) > 0)"


class _NextSeq(FunctionElement[int]):
    """A new row's ``seq`` (``schema/tables.py``), the ``offset``-th of the rows one statement
    writes: PostgreSQL's identity gives it (``DEFAULT``); on SQLite it is the rowid the row
    gets, one more than the largest (a write holds the database's one write lock). SQLite
    reads the subquery of every row of a multi-row VALUES before it writes the first
    (tests/test_driver.py checks that it stays so), hence the offset."""

    type = BigInteger()
    name = "next_seq"
    inherit_cache = True

    def __init__(self, offset: int) -> None:
        super().__init__()
        self.offset = offset


@compiles(_NextSeq)
def _identity(element: _NextSeq, compiler: SQLCompiler, **kw: Any) -> str:
    return "DEFAULT"


@compiles(_NextSeq, "sqlite")
def _rowid(element: _NextSeq, compiler: SQLCompiler, **kw: Any) -> str:
    return f"((SELECT coalesce(max(rowid), 0) FROM _scheduled_functions) + {element.offset:d})"


def next_seq(offset: int = 1) -> ColumnElement[int]:
    """The ``seq`` of the ``offset``-th new row of a statement (``_NextSeq``)."""
    return _NextSeq(offset)


def carries(flag: str) -> ColumnElement[bool]:
    """The row carries ``flag`` (``flags`` is stored ``,a,b,``: one substring test)."""
    return _Within(literal(f",{flag},", Text), sf.c.flags)


class _ArgEquals(FunctionElement[bool]):
    """The row's argument at a dotted ``path`` equals a JSON scalar (given as JSON text).
    PostgreSQL compares ``jsonb`` values (so 42 and "42" differ); SQLite compares the SQL
    values ``json_extract`` gives on both sides (a number, text, 1/0 for true/false)."""

    type = Boolean()
    name = "arg_equals"
    inherit_cache = True


@compiles(_ArgEquals)
def _jsonb_path(element: _ArgEquals, compiler: SQLCompiler, **kw: Any) -> str:
    args, path, value = (compiler.process(c, **kw) for c in element.clauses)
    found = f"CAST({args} AS JSONB) #> string_to_array({path}, '.')"
    return f"({found} = CAST({value} AS JSONB))"


@compiles(_ArgEquals, "sqlite")
def _json_extract(element: _ArgEquals, compiler: SQLCompiler, **kw: Any) -> str:
    args, path, value = (compiler.process(c, **kw) for c in element.clauses)
    return f"(json_extract({args}, '$.' || {path}) = json_extract({value}, '$'))"


class _ArgContains(FunctionElement[bool]):
    """The row's argument at a dotted ``path`` contains a JSON scalar: it is an array
    holding an element equal to it, a string holding it (a string) as a part, or equal
    to it. Read as ``_ArgEquals`` reads values, engine by engine."""

    type = Boolean()
    name = "arg_contains"
    inherit_cache = True


@compiles(_ArgContains)
def _jsonb_contains(element: _ArgContains, compiler: SQLCompiler, **kw: Any) -> str:
    args, path, value = (compiler.process(c, **kw) for c in element.clauses)
    found = f"(CAST({args} AS JSONB) #> string_to_array({path}, '.'))"
    wanted = f"CAST({value} AS JSONB)"
    return (
        f"(({found} = {wanted}) "
        f"OR (jsonb_typeof({found}) = 'array' AND {found} @> jsonb_build_array({wanted})) "
        f"OR (jsonb_typeof({found}) = 'string' AND jsonb_typeof({wanted}) = 'string' "
        f"AND strpos({found} #>> '{{}}', {wanted} #>> '{{}}') > 0))"
    )


@compiles(_ArgContains, "sqlite")
def _json_contains(element: _ArgContains, compiler: SQLCompiler, **kw: Any) -> str:
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


def argument_contains(path: str, value: str | int | float | bool) -> ColumnElement[bool]:
    """The row's argument at ``path`` contains ``value`` (``_ArgContains``)."""
    return _ArgContains(sf.c.args, literal(path, Text), literal(json.dumps(value), Text))


def argument_is(path: str, value: str | int | float | bool) -> ColumnElement[bool]:
    """The row's argument at ``path`` (keys joined by dots, checked by the caller: letters,
    digits and underscores) equals ``value``."""
    return _ArgEquals(sf.c.args, literal(path, Text), literal(json.dumps(value), Text))
