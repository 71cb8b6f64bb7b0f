"""SQLite's release trigger (``schema/dependencies.py`` says what it does): one
statement per finished row, in the finishing transaction."""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.engine import Connection

from ..schema.dependencies import FINAL, LIVE, NAME

_TRIGGER = f"""
CREATE TRIGGER {NAME}
AFTER UPDATE OF state ON _scheduled_functions
FOR EACH ROW
WHEN NEW.dependents = 1 AND NEW.state IN {FINAL} AND OLD.state IN {LIVE}
BEGIN
    UPDATE _scheduled_functions SET after_failed = after_failed + 1
     WHERE NEW.state <> 'Success'
       AND id IN (SELECT row_id FROM _durafn_dependencies WHERE dep_id = NEW.id)
       AND state = 'Pending';
    DELETE FROM _durafn_dependencies WHERE dep_id = NEW.id;
END
"""


def install_release_trigger(conn: Connection) -> None:
    conn.execute(text(f"DROP TRIGGER IF EXISTS {NAME}"))  # version 15's: replaced
    conn.execute(text(_TRIGGER))
