"""SQL that each engine writes its own way, and the literals partial indexes match: a
row's new ``seq`` (``next_seq``), "carries this flag" (``carries``), an argument equals or
contains a value (``argument_is``, ``argument_contains``), the minute a time falls in
(``MinuteStart``), the states a claim's partial
indexes name (``PENDING``, ``RUNNING``).

Each element here is only a name and its operands: what it compiles to is the dialect's
(``sqlite/sql.py``, ``postgres/sql.py``, each registered when its driver is loaded). On
any other dialect it refuses to compile, naming itself; ``missing_sql`` lists those a
dialect lacks, which a driver checks when it is made (``EngineDriver.__init__``)."""

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
from sqlalchemy.exc import CompileError
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


class Within(FunctionElement[bool]):
    """``needle`` occurs in ``haystack``, case-sensitively on both engines: SQLite's LIKE
    ignores ASCII case (a worker forbidding ``bulk`` skipped rows flagged ``Bulk``), and
    its case_sensitive_like pragma would change the users' own queries on the connection.
    """

    type = Boolean()
    name = "within"
    inherit_cache = True


class NextSeq(FunctionElement[int]):
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


def next_seq(offset: int = 1) -> ColumnElement[int]:
    """The ``seq`` of the ``offset``-th new row of a statement (``NextSeq``)."""
    return NextSeq(offset)


def carries(flag: str) -> ColumnElement[bool]:
    """The row carries ``flag`` (``flags`` is stored ``,a,b,``: one substring test)."""
    return Within(literal(f",{flag},", Text), sf.c.flags)


class ArgEquals(FunctionElement[bool]):
    """The row's argument at a dotted ``path`` equals a JSON scalar (given as JSON text).
    PostgreSQL compares ``jsonb`` values (so 42 and "42" differ); SQLite compares the SQL
    values ``json_extract`` gives on both sides (a number, text, 1/0 for true/false)."""

    type = Boolean()
    name = "arg_equals"
    inherit_cache = True


class ArgContains(FunctionElement[bool]):
    """The row's argument at a dotted ``path`` contains a JSON scalar: it is an array
    holding an element equal to it, a string holding it (a string) as a part, or equal
    to it. Read as ``ArgEquals`` reads values, engine by engine."""

    type = Boolean()
    name = "arg_contains"
    inherit_cache = True


def argument_contains(path: str, value: str | int | float | bool) -> ColumnElement[bool]:
    """The row's argument at ``path`` contains ``value`` (``ArgContains``)."""
    return ArgContains(sf.c.args, literal(path, Text), literal(json.dumps(value), Text))


def argument_is(path: str, value: str | int | float | bool) -> ColumnElement[bool]:
    """The row's argument at ``path`` (keys joined by dots, checked by the caller: letters,
    digits and underscores) equals ``value``."""
    return ArgEquals(sf.c.args, literal(path, Text), literal(json.dumps(value), Text))


class MinuteStart(FunctionElement[int]):
    """The start of the minute a time (float epoch seconds, not negative) falls in, as
    whole seconds: SQLite truncates a CAST to INTEGER, PostgreSQL rounds it (so it takes
    ``floor`` first). The per-minute rollups group by it (``rollups.py``)."""

    type = BigInteger()
    name = "minute_start"
    inherit_cache = True


ELEMENTS: tuple[type[FunctionElement[Any]], ...] = (
    *(Within, NextSeq, ArgEquals, ArgContains, MinuteStart),
)
"""Every element a dialect must compile."""


@compiles(Within)
@compiles(NextSeq)
@compiles(ArgEquals)
@compiles(ArgContains)
@compiles(MinuteStart)
def _refuse(element: FunctionElement[Any], compiler: SQLCompiler, **kw: Any) -> str:
    raise CompileError(
        f"durafn has no SQL for {element.name!r} on {compiler.dialect.name}: durafn runs on "
        "SQLite and PostgreSQL, each of which defines it (durafn/_store/sqlite/sql.py)"
    )


def missing_sql(dialect: str) -> list[str]:
    """The elements ``dialect`` has no SQL for (none once its driver module is loaded)."""
    return [
        str(getattr(e, "name"))  # noqa: B009  (a class attribute each element sets)
        for e in ELEMENTS
        if dialect not in getattr(e, "_compiler_dispatcher").specs  # noqa: B009
    ]
