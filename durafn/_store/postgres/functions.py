"""PostgreSQL's release trigger and the hot finish's functions (``schema/dependencies.py``
says what they do): ``durafn_release_dependents`` (the trigger's function),
``durafn_release`` and ``durafn_may_be_free``."""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.engine import Connection

from ..schema.dependencies import FINAL, LIVE, NAME

# Two plain statements, the first only for a failure: a CTE that deleted, counted and
# joined for the dependents' kinds cost the drain 3x on PostgreSQL (a no-op mutation drain
# whose rows all had dependents: 4,165 rows/s against 12,052). The NOTIFY wakes both
# kinds' loops (one per transaction: PostgreSQL folds identical ones).
RELEASE_DEPENDENTS = """
CREATE OR REPLACE FUNCTION durafn_release_dependents() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.state <> 'Success' THEN
        UPDATE _scheduled_functions SET after_failed = after_failed + 1
         WHERE id IN (SELECT row_id FROM _durafn_dependencies WHERE dep_id = NEW.id)
           AND state = 'Pending';
    END IF;
    DELETE FROM _durafn_dependencies WHERE dep_id = NEW.id;
    IF FOUND THEN
        PERFORM pg_notify('durafn_wakeup', 'action,mutation');  -- multirow.py's CHANNEL
    END IF;
    RETURN NULL;
END
$$
"""

# The hot finish's release (see above): every edge of ``finished`` deleted, in a snapshot
# taken after the finish's UPDATE (VOLATILE). Returns the rows whose edges it deleted
# (NULL if none): the executor looks at them after the commit (``durafn_may_be_free``,
# ``postgres/driver.py``'s ``wake_freed``). Up to version 18 it sent the NOTIFY itself,
# for every finish that deleted an edge (see ``_executor/releases.py``).
_RELEASE = """
CREATE FUNCTION durafn_release(finished uuid[]) RETURNS uuid[]
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    touched uuid[];
BEGIN
    WITH gone AS (
        DELETE FROM _durafn_dependencies WHERE dep_id = ANY(finished) RETURNING row_id
    )
    SELECT array_agg(DISTINCT row_id) INTO touched FROM gone;
    RETURN touched;
END
$$
"""

# The executor's look after a release committed: of ``waiting``, the rows that may be
# free, that is with no edge left that no transaction is deleting (``xmax = 0``: neither
# deleted nor locked by one in flight). A row with such an edge is not free, and the
# finish that deletes that edge, later than this look and so committed after the
# release, will tell: through this look again, or the trigger's NOTIFY at its commit.
# Read from the highest ``dep_id`` down (``ix_durafn_dependencies_row``): rows finish
# about in the order they were written, so the newest edge is the one most likely still
# there. A scalar subquery, not EXISTS, whose ORDER BY and LIMIT the planner drops; and
# no sort (the function's SET): with no statistics on the edges yet (a fan-in just
# written) the planner read them all and sorted them, 2 ms a call over 10,000 edges
# against 0.03 ms for the index scan.
_MAY_BE_FREE = """
CREATE OR REPLACE FUNCTION durafn_may_be_free(waiting uuid[]) RETURNS uuid[]
LANGUAGE sql STABLE
SET enable_sort = off
AS $$
    SELECT ARRAY(
        SELECT t FROM unnest(waiting) AS t
         WHERE (SELECT true FROM _durafn_dependencies AS d
                 WHERE d.row_id = t AND d.xmax = '0'::xid
                 ORDER BY d.dep_id DESC LIMIT 1) IS NULL)
$$
"""

_TRIGGER = f"""
CREATE TRIGGER {NAME}
AFTER UPDATE OF state ON _scheduled_functions
FOR EACH ROW
WHEN (NEW.dependents = 1 AND NEW.state IN {FINAL} AND OLD.state IN {LIVE})
EXECUTE FUNCTION durafn_release_dependents()
"""


def install_release_functions(conn: Connection) -> None:
    """Create (or make again) the hot finish's ``durafn_release``, and the executor's
    ``durafn_may_be_free``: the catalogue only, no lock on ``_scheduled_functions``.
    Dropped first: version 19 changed what ``durafn_release`` returns, which ``CREATE OR
    REPLACE`` cannot."""
    conn.execute(text("DROP FUNCTION IF EXISTS durafn_release(uuid[])"))
    conn.execute(text(_RELEASE))
    conn.execute(text(_MAY_BE_FREE))


def install_release_trigger(conn: Connection) -> None:
    """Create (or replace) the trigger, its function, and the hot finish's functions."""
    conn.execute(text(RELEASE_DEPENDENTS))
    install_release_functions(conn)
    conn.execute(text(f"DROP TRIGGER IF EXISTS {NAME} ON _scheduled_functions"))
    conn.execute(text(_TRIGGER))
