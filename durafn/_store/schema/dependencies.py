"""The trigger that releases a row's dependents when it finishes for good (``after=``).

A row scheduled ``after=[a, b]`` is written Pending with ``awaiting`` = how many of them
have not finished for good, due at ``WAITING`` (far beyond any claim's "due now") while
it awaits any: the claims and their indexes never see it. When a row with
``dependents = 1`` moves from a live state (Pending, InProgress) to a final one (Success,
Failed, Canceled), this trigger, in the same statement's transaction, for each Pending
row that waits for it:

* counts one dependency less (``awaiting``), and one more that ended other than Success
  (``after_failed``);
* makes it due (at its scheduled time, or now if that has passed) when that was the
  last one, or at once when one failed and its ``after_policy`` is ``cancel`` or
  ``fail``: the executor that claims it then records what its policy says;
* deletes the finished row's edges (``_durafn_dependencies``): what is left is what each
  row still awaits.

On PostgreSQL it also sends the executors' NOTIFY (delivered at commit), so a dependent
starts as soon as its last dependency commits, in any process.

Why a trigger rather than a statement in each finish: a row finishes for good on a
dozen routes (a batch's finish, an action's, a retry's last failure, a cancel, a lost
worker's rescue, ``retry`` by hand undone...), and a trigger is one place for all of
them, atomic with each; a finish of a row nobody waits for pays the trigger's WHEN test
only (``dependents = 1``, evaluated in C). Why not a check in the claim: it would cost
every claim of every row a subquery, and rows waiting at the head of an index would be
read and skipped by each claim; parked at ``WAITING`` they are never read.
"""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.engine import Connection

WAITING = 32503680000.0
"""``available_at`` of a row that awaits a dependency: 3000-01-01, beyond every horizon
(scheduling is limited to 5 years ahead)."""

_NAME = "durafn_release_dependents"
_LIVE = "('Pending', 'InProgress')"
_FINAL = "('Success', 'Failed', 'Canceled')"

_SQLITE = f"""
CREATE TRIGGER IF NOT EXISTS durafn_release_dependents
AFTER UPDATE OF state ON _scheduled_functions
FOR EACH ROW
WHEN NEW.dependents = 1 AND NEW.state IN {_FINAL} AND OLD.state IN {_LIVE}
BEGIN
    UPDATE _scheduled_functions
       SET awaiting = awaiting - 1,
           after_failed = after_failed + (NEW.state <> 'Success'),
           available_at = CASE
               WHEN awaiting = 1
                 OR (NEW.state <> 'Success' AND after_policy IN ('cancel', 'fail'))
               THEN max(scheduled_time, coalesce(NEW.completed_time, scheduled_time))
               ELSE available_at END
     WHERE id IN (SELECT row_id FROM _durafn_dependencies WHERE dep_id = NEW.id)
       AND state = 'Pending' AND awaiting > 0;
    DELETE FROM _durafn_dependencies WHERE dep_id = NEW.id;
END
"""

_POSTGRES_FUNCTION = f"""
CREATE OR REPLACE FUNCTION durafn_release_dependents() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    kinds text;
BEGIN
    WITH released AS (
        UPDATE _scheduled_functions AS sf
           SET awaiting = sf.awaiting - 1,
               after_failed = sf.after_failed + (NEW.state <> 'Success')::int,
               available_at = CASE
                   WHEN sf.awaiting = 1
                     OR (NEW.state <> 'Success' AND sf.after_policy IN ('cancel', 'fail'))
                   THEN greatest(sf.scheduled_time, coalesce(NEW.completed_time, sf.scheduled_time))
                   ELSE sf.available_at END
          FROM _durafn_dependencies AS d
         WHERE d.dep_id = NEW.id AND sf.id = d.row_id
           AND sf.state = 'Pending' AND sf.awaiting > 0
        RETURNING sf.kind, sf.available_at
    )
    SELECT string_agg(DISTINCT kind, ',' ORDER BY kind) INTO kinds
      FROM released WHERE available_at < {WAITING};
    DELETE FROM _durafn_dependencies WHERE dep_id = NEW.id;
    IF kinds IS NOT NULL THEN
        PERFORM pg_notify('durafn_wakeup', kinds);  -- postgres/batches.py's CHANNEL
    END IF;
    RETURN NULL;
END
$$
"""

_POSTGRES_TRIGGER = f"""
CREATE TRIGGER durafn_release_dependents
AFTER UPDATE OF state ON _scheduled_functions
FOR EACH ROW
WHEN (NEW.dependents = 1 AND NEW.state IN {_FINAL} AND OLD.state IN {_LIVE})
EXECUTE FUNCTION durafn_release_dependents()
"""


def create_release_trigger(conn: Connection) -> None:
    """Create (or replace) the trigger on this connection's engine."""
    if conn.dialect.name == "postgresql":
        conn.execute(text(_POSTGRES_FUNCTION))
        conn.execute(
            text("DROP TRIGGER IF EXISTS durafn_release_dependents ON _scheduled_functions")
        )
        conn.execute(text(_POSTGRES_TRIGGER))
    else:
        conn.execute(text(_SQLITE))
