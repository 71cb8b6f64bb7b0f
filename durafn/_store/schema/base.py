"""What every table module of the schema shares: the ``MetaData`` they are declared on,
the id type, and how an index's predicate is given to both engines."""

from __future__ import annotations

from typing import Any

from sqlalchemy import MetaData, String, Uuid
from sqlalchemy.sql.elements import ColumnElement

metadata = MetaData()


def partial(where: ColumnElement[bool]) -> dict[str, Any]:
    """An index's predicate, for both engines (SQLAlchemy takes it per dialect): the one
    place the schema names them."""
    return {"postgresql_where": where, "sqlite_where": where}


# Native uuid on PostgreSQL (16 bytes, cheap to compare); readable text on SQLite.
ID_TYPE = Uuid(as_uuid=False).with_variant(String(36), "sqlite")
