"""The exceptions durafn raises.

Every error durafn raises itself is a :class:`DurafnError`; each one also subclasses the
builtin a caller would naturally catch, so ``except LookupError`` finds an unknown id::

    DurafnError
    ├── RegistrationError (TypeError)      a function cannot be registered as written
    ├── CallError (TypeError)              a function reference was called like a function
    ├── UnknownFunctionError (LookupError) no function has that durable name
    ├── ArgumentError (ValueError)         arguments fail validation or cannot be stored
    ├── CronSyntaxError (ValueError)       a cron expression or time zone cannot be used
    ├── SchedulingError (ValueError)       a bad time, delay, or place to schedule from
    │   ├── SchedulingLimitError           too many functions / too many bytes in one run
    │   └── CancelOwnRunError              a mutation tried to cancel its own run
    ├── NotFoundError (LookupError)        no scheduled function has that id
    ├── UnknownOperationError (LookupError) no operation has that id
    ├── ReadOnlyError                      a query tried to write
    ├── TransactionError                   a mutation committed or rolled back ctx.db itself
    ├── FunctionTimeoutError (TimeoutError) a function outlived its time limit
    ├── ExecutorShutdownError              an action was cut short by the executor stopping
    ├── WorkerLostError                    an action's worker died (recorded on its row)
    ├── SchemaError                        the system tables are missing or too new
    ├── DatabaseError                      the database failed and retrying did not help
    └── WorkflowError                      a durable workflow's step, replay or bound
        ├── WorkflowStepError              a step failed (raised where it is awaited)
        ├── WorkflowDeterminismError       a replay asked for another step than journaled
        ├── WorkflowLimitError (ValueError) a step would exceed a workflow's bound
        ├── WorkflowTimeoutError (TimeoutError) an event did not come in time
        └── WorkflowCanceledError          the workflow (or a child) was cancelled

and one warning, ``DurableNameWarning`` (a ``UserWarning``): a durable name no worker
will find, registered from ``__main__``.

A failure raised *by a user's function* is never wrapped: the executor records its type and
message on the function's row, and ``app.run_mutation`` re-raises it unchanged.
"""

from __future__ import annotations

from ._public import publish


class DurafnError(Exception):
    """Base class of every error durafn raises itself."""


class RegistrationError(DurafnError, TypeError):
    """A function cannot be registered: it is not async, lacks ``ctx``, or its name is taken."""


class CallError(DurafnError, TypeError):
    """A function reference was called like a plain function (``await send_email(...)``):
    run it through the app (``app.run_mutation``) or schedule it (``ctx.scheduler``)."""


class UnknownFunctionError(DurafnError, LookupError):
    """No function is registered under the durable name (on this app)."""

    def __init__(self, name: str, *, elsewhere: str | None = None) -> None:
        if elsewhere is not None:
            message = (
                f"{name!r} is registered on another durafn.App (the one made at "
                f"{elsewhere}), not on this one: use that app, or app.using(url, "
                "clock=...) for that app on another database or with another clock (tests)"
            )
        else:
            message = (
                f"no function is registered as {name!r}; register it with @app.mutation or "
                "@app.action (check the module is imported and the name is spelled as stored)"
            )
        super().__init__(message)
        self.name = name


class ArgumentError(DurafnError, ValueError):
    """Arguments do not match the function's signature, or cannot be stored as JSON."""


class CronSyntaxError(DurafnError, ValueError):
    """A cron expression, crontab line or time zone cannot be used; the message names the
    field, the token and the problem (``day-of-month: 32 is out of range 1-31``)."""


class SchedulingError(DurafnError, ValueError):
    """A schedule request is invalid: bad delay or time, wrong kind of function or context."""


class OptionError(SchedulingError):
    """A job option (priority, queue, key, key mode, flags, retry and its backoff,
    on_complete) is not valid."""


class SchedulingLimitError(SchedulingError):
    """One function execution scheduled more functions, or more argument bytes, than allowed.

    In a mutation this aborts the whole mutation even if the user code catches it.
    """


class CancelOwnRunError(SchedulingError):
    """A mutation tried to cancel the scheduled run it is executing in."""


class UnknownOperationError(DurafnError, LookupError):
    """No operation (``app.start_operation``) has the given id: it never existed, or it
    ended longer ago than the retention period."""


class NotFoundError(DurafnError, LookupError):
    """No scheduled function has the given id (it may have been removed by retention)."""

    def __init__(self, id: str, *, malformed: bool = False) -> None:
        super().__init__(
            f"{id!r} is not a scheduled function id (ids are UUIDs, as run_after returns them)"
            if malformed
            else f"no scheduled function has id {id!r}; finished rows are removed after the "
            "retention period"
        )
        self.id = id


class ReadOnlyError(DurafnError):
    """A query (read-only) tried to write to the database or to schedule a function."""


class TransactionError(DurafnError):
    """A mutation ended its own transaction (``ctx.db.rollback()``, or a failed flush it
    caught). durafn owns the transaction: raise an exception to abort a mutation."""


class FunctionTimeoutError(DurafnError, TimeoutError):
    """A function ran past its time limit and was stopped (a mutation is also rolled back)."""


class ExecutorShutdownError(DurafnError):
    """An action was still running when its executor stopped after the grace period."""


class NonRetryableError(DurafnError):
    """Raise it (or a subclass) from a function to end its retries now: the row is Failed
    whatever attempts its retry policy has left."""


class DependencyFailedError(NonRetryableError):
    """A row scheduled ``after=`` others, with ``after_policy="fail"``: one of them ended
    Failed or Canceled, so it was recorded Failed without running (never retried)."""


class SnoozeLimitError(DurafnError):
    """A run raised ``durafn.Snooze`` once more than its function's ``snooze_limit``
    allows: recorded as a failure (its retry policy decides what follows)."""


class BatchResultError(DurafnError):
    """A batched action returned something other than one result per item, in order:
    every row of the call is recorded failed with it (their retry policies decide)."""


class BatchItemError(DurafnError):
    """The error of an item a batched action failed with ``ItemFailed("message")``."""


class WorkerLostError(DurafnError):
    """The worker running an action stopped heartbeating (killed, crashed, or cut off from
    the database); another worker recorded the action Failed. It is never re-run."""


class SchemaError(DurafnError):
    """The durafn system tables are missing, or were created by a newer durafn."""


class DatabaseError(DurafnError):
    """The database failed in a way durafn could not recover from by retrying.

    ``transient`` tells whether the cause was the kind of fault that usually passes
    (a lost connection, a lock timeout): retrying later may succeed.
    """

    def __init__(self, message: str, *, transient: bool = False) -> None:
        super().__init__(message)
        self.transient = transient


class WorkflowError(DurafnError):
    """Base class of the errors of durable workflows (``@app.workflow``)."""


class WorkflowStepError(WorkflowError):
    """A workflow's step failed: raised in the workflow's body where the step is awaited,
    the same on every replay (the step's own exception ran elsewhere, perhaps in another
    process; ``error_type`` and ``error_message`` are what its row recorded)."""

    def __init__(self, step_no: int, kind: str, name: str, error_type: str, message: str) -> None:
        super().__init__(f"step {step_no} ({kind} {name!r}) failed: {error_type}: {message}")
        self.step_no = step_no
        self.kind = kind
        self.name = name
        self.error_type = error_type
        self.error_message = message


class WorkflowDeterminismError(WorkflowError):
    """A replay asked for a different step than the journal holds at that number (the
    workflow's code changed under it, or it branches on something not journaled). The
    workflow is Stopped for an operator: deploy code that matches and
    ``app.resume_workflow(id)``, or ``app.cancel_workflow(id)``."""


class WorkflowLimitError(WorkflowError, ValueError):
    """A step would take a workflow past one of its bounds (steps, a result's size, the
    journal's size): that step fails with it, the workflow goes on."""


class WorkflowTimeoutError(WorkflowError, TimeoutError):
    """``wait_for_event(..., timeout=...)`` ended with no event of that name."""


class WorkflowCanceledError(WorkflowError):
    """The workflow was cancelled (``app.cancel_workflow``): recorded on it, and on a
    parent's step that waited for it as a child."""


class DurableNameWarning(UserWarning):
    """A function's durable name is one no worker will find: it starts with ``__main__``
    (the function was registered by a script run as ``python file.py``)."""


publish(globals())
