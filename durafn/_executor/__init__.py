"""The executor: claim what is due, run it, record how it ended.

How a row travels, and which task owns each step (every box is a module here)::

                           Pending row in _scheduled_functions
                 mutation │                                   │ action
                          ▼                                   ▼
    mutations.py ── lane tasks (mutation_lanes)   actions.py ── dispatcher task
      one GroupCommit per turn                  action_claims.py: ActionClaims.claim
    group_commit.py (one transaction)             Pending -> InProgress, COMMITTED
      claim ... FOR UPDATE SKIP LOCKED              before any row starts (worker_id)
      run each mutation on that connection                    │ queue
      finish_pending: Pending -> Success/Failed               ▼
      COMMIT (effects + state together)           actions.py ── worker tasks (concurrency)
                          │                         run each row in its Slot's scope
                          │                       deadlines.py ── watch task
                          │                         cancels a Slot past its time limit
                          │                                   │ Finisher.queue(outcome)
                          │                                   ▼
                          │                       finisher.py ── finisher task
                          │                         finish_in_progress, in batches:
                          │                         InProgress -> Success/Failed
                          ▼                                   ▼
              outcomes.py: Tally.record (stats, one log line per row, progress signal)

    Beside them: wakeups.py (what wakes the claiming loops, the idle wait), membership.py
    (heartbeat task, lost-worker rescue), maintenance.py (retention task, and rollups.py:
    what ended per minute and hour, for the dashboard's charts), crons.py (the
    cron task: while it leads, each due tick written once as a Pending row above),
    config.py, tasks.py (Signal, Pace, shielded, first_of). executor.py builds the parts,
    starts the tasks in one task group, and runs the stop sequence.

Where the guarantees are kept:

* **Mutations, exactly once** (``group_commit.py``): a mutation's effects and its row's
  move out of Pending are in one transaction, whose claim locks the row (SKIP LOCKED on
  PostgreSQL, the write lock on SQLite). A crash before COMMIT leaves the row Pending with
  no effects; after it, finished. Faults roll the batch back and the lane retries it
  (``mutations.py``); they never turn a row Failed.
* **Actions, at most once** (``action_claims.py``): InProgress is committed before the
  action starts, so nobody else ever claims it again. Every later write is guarded by
  ``state = 'InProgress'`` (``finisher.py``): a cancel that landed meanwhile is never
  overwritten. A row that never started when a stop ends (claimed ahead, or queued) goes
  back to Pending (``ActionClaims.release``); a worker that dies has its InProgress rows
  recorded Failed by another worker's rescue (``membership.py``), never re-run; unless
  the row has a retry policy, which its author chose: then Pending again, at least once.

Where to add things: how a run's end becomes the row's next state is decided in
``outcomes.py`` (the outcome) and ``retrying.py`` (a failure its retry policy tries
again: Pending at a later time, in the same transaction as the failure's history), and
written by ``retrying.settle``, called from ``GroupCommit._write`` (mutations, in the
batch's transaction) and ``Finisher.write`` (actions), through the driver's guarded
statements; the lost-worker path is ``Membership._rescue_lost``. Which due rows may be
claimed (priority levels, named queues, pauses, flags, a worker's pools) is
``_store/claim/take.py``, reached through the driver's ``claim_mutations`` and
``claim_actions``/``claim_actions_fast``, called from ``GroupCommit.run`` and
``ActionClaims.claim`` with the executor's ``ClaimFilter``. Cron ticks: what a due cron
writes (catch-up, backfill, limits, daylight saving's gaps, the rows) and how it is judged
against its previous run (overlap, pause_after) is decided with no I/O in
``_cron_rules.py`` (``plan_ticks``, ``TickPlan``), the rules that the declarations
(``_cron_declarations.py``) and the registry's API (``_cron_registry.py``) read too;
``CronLoop`` (``crons.py``) reads the due crons and their previous runs' states, and
writes what the rules decide through ``_store/crons.py``.
"""

from typing import TYPE_CHECKING, Any

from .config import ExecutorConfig, ExecutorOptions, make_config

if TYPE_CHECKING:
    from .executor import Executor, RunawayError

__all__ = ["Executor", "ExecutorConfig", "ExecutorOptions", "RunawayError", "make_config"]


if not TYPE_CHECKING:  # for type checkers, the names are the imports above: no Any

    def __getattr__(name: str) -> Any:
        """The executor itself loads on first use: ``durafn worker --help`` reads only
        its configuration's defaults."""
        if name in ("Executor", "RunawayError"):
            from . import executor

            return getattr(executor, name)
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
