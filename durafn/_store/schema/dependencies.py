"""The trigger that lets a row's dependents go when it finishes for good (``after=``).

A row scheduled ``after=[a, b]`` is written Pending, due as asked, with ``awaiting`` = how
many of them had not finished for good, and one edge per such row in
``_durafn_dependencies``. The claim takes it only when it is ``ready``
(``claim/take.py``): ``awaiting = 0``, or no edge of it is left, or one of its
dependencies failed and its ``after_policy`` is ``cancel`` or ``fail`` (the executor then
records what the policy says). When a row with ``dependents = 1`` moves from a live
state (Pending, InProgress) to a final one (Success, Failed, Canceled), this trigger, in
the same transaction:

* counts a failure (``after_failed``) on each waiting row if it ended other than
  Success (rare: the only write to a dependent here);
* deletes the finished row's edges: what is left is what each row still awaits;
* on PostgreSQL, sends the executors' NOTIFY (at commit, once per transaction), so a
  dependent starts as soon as its last dependency commits, in any process.

On PostgreSQL the hot finish (Success with nothing returned, a whole batch in one
statement: ``postgres/batches.py``) releases its rows itself, and the trigger stays out of
its way: it sets ``dependents = 2`` on the rows it finished that had dependents (the
trigger fires on 1 only) and passes their ids to ``durafn_release``, which deletes their
edges in one statement and returns the rows waiting for them; the executor sends the
NOTIFY after the commit, for a row left with no edge only (``_executor/releases.py``).
``durafn_release`` is a VOLATILE function so
that its DELETE reads a snapshot of its own, taken after the UPDATE has locked and
finished every row: an edge a scheduler committed while the finish waited for one of its
rows is seen and deleted (the same statement's CTE, reading the statement's snapshot,
would miss it and leave the dependent waiting for good:
``tests/test_workflows.py`` makes that race). Measured on the finish statements alone
(10,000 rows in batches of 256, eight interleaved rounds, medians): rows with dependents
took the trigger's form 329 ms against 295 ms without; the released form, 278 ms against
280 ms. In a fan-in's drain, the trigger's per-row work had cost about 6%
(``benchmarks.workflows``, with the trigger taken out).

On SQLite a mutation batch's finish does the same for the rows its claim, in the same
write transaction, read as awaited (``sqlite/batches.py``); actions, whose claim was an
earlier transaction, keep the trigger.

``dependents``: 0, no row waits for it; 1, rows wait for it (its finish releases them);
2, rows waited for it and the finish that wrote Success released them.

Why edges and a check in the claim, not a counter on the dependent: a counter written by
every finish made the dependent of a fan-in a hot row on PostgreSQL (10,000 finishes,
ten lanes at once: each waited for the last one's lock and walked its dead versions; the
drain fell to 174 rows/s from 8,844, ``benchmarks.workflows``). Deleting its own edges is
all a finish writes, and no two finishes write the same row. Why a trigger: a row
finishes for good on a dozen routes (a batch's finish, an action's, a retry's last
failure, a cancel, a lost worker's rescue), and a trigger is one place for all of them,
atomic with each; a finish of a row nobody waits for pays the trigger's ``WHEN
dependents = 1`` test only.
"""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.engine import Connection

_NAME = "durafn_release_dependents"
_LIVE = "('Pending', 'InProgress')"
_FINAL = "('Success', 'Failed', 'Canceled')"

_SQLITE = f"""
CREATE TRIGGER {_NAME}
AFTER UPDATE OF state ON _scheduled_functions
FOR EACH ROW
WHEN NEW.dependents = 1 AND NEW.state IN {_FINAL} AND OLD.state IN {_LIVE}
BEGIN
    UPDATE _scheduled_functions SET after_failed = after_failed + 1
     WHERE NEW.state <> 'Success'
       AND id IN (SELECT row_id FROM _durafn_dependencies WHERE dep_id = NEW.id)
       AND state = 'Pending';
    DELETE FROM _durafn_dependencies WHERE dep_id = NEW.id;
END
"""

# Two plain statements, the first only for a failure: a CTE that deleted, counted and
# joined for the dependents' kinds cost the drain 3x on PostgreSQL (a no-op mutation drain
# whose rows all had dependents: 4,165 rows/s against 12,052). The NOTIFY wakes both
# kinds' loops (one per transaction: PostgreSQL folds identical ones).
_POSTGRES_FUNCTION = """
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
        PERFORM pg_notify('durafn_wakeup', 'action,mutation');  -- batches.py's CHANNEL
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
_POSTGRES_RELEASE = """
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
_POSTGRES_MAY_BE_FREE = """
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

_POSTGRES_TRIGGER = f"""
CREATE TRIGGER {_NAME}
AFTER UPDATE OF state ON _scheduled_functions
FOR EACH ROW
WHEN (NEW.dependents = 1 AND NEW.state IN {_FINAL} AND OLD.state IN {_LIVE})
EXECUTE FUNCTION durafn_release_dependents()
"""


def create_release_function(conn: Connection) -> None:
    """On PostgreSQL, create (or make again) the hot finish's ``durafn_release``, and the
    executor's ``durafn_may_be_free``: the catalogue only, no lock on
    ``_scheduled_functions``. Dropped first: version 19 changed what ``durafn_release``
    returns, which ``CREATE OR REPLACE`` cannot."""
    if conn.dialect.name == "postgresql":
        conn.execute(text("DROP FUNCTION IF EXISTS durafn_release(uuid[])"))
        conn.execute(text(_POSTGRES_RELEASE))
        conn.execute(text(_POSTGRES_MAY_BE_FREE))


def create_release_trigger(conn: Connection) -> None:
    """Create (or replace) the trigger on this connection's engine, and on PostgreSQL the
    hot finish's ``durafn_release``."""
    if conn.dialect.name == "postgresql":
        conn.execute(text(_POSTGRES_FUNCTION))
        create_release_function(conn)
        conn.execute(text(f"DROP TRIGGER IF EXISTS {_NAME} ON _scheduled_functions"))
        conn.execute(text(_POSTGRES_TRIGGER))
    else:
        conn.execute(text(f"DROP TRIGGER IF EXISTS {_NAME}"))  # version 15's: replaced
        conn.execute(text(_SQLITE))
