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
statement: ``postgres/multirow.py``) releases its rows itself, and the trigger stays out of
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
write transaction, read as awaited (``sqlite/multirow.py``); actions, whose claim was an
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

NAME = "durafn_release_dependents"
LIVE = "('Pending', 'InProgress')"
FINAL = "('Success', 'Failed', 'Canceled')"
"""The trigger's name, and the states it moves from and to: the same on both engines
(``sqlite/triggers.py``, ``postgres/functions.py`` write its SQL)."""
