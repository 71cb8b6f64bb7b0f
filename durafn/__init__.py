"""durafn: durable scheduled functions for Python, in the style of Convex.

Register ``query``, ``mutation`` and ``action`` functions on an :class:`App`; schedule them
with ``ctx.scheduler.run_after`` / ``run_at``; run an executor to execute what is due.

This module is the public surface only. The package's map, a line per module grouped by
layer, is the Layout of ``docs/contributing.md`` (a test holds it to the tree); the
executor's own map is ``durafn/_executor/__init__.py``, the store's seam on one page
``durafn/_store/interface.py``.
"""

import importlib as _importlib
import logging
import typing as _typing

from ._public import PUBLIC as _PUBLIC

if _typing.TYPE_CHECKING:  # (mypy knows the condition by this spelling, not an alias)
    from ._activity import Activity, ActivityPoint, FunctionActivity, Latency
    from ._app import DEFAULT_URL, App
    from ._batching import Batch, BatchActionRef, ItemFailed
    from ._clock import Clock, SystemClock
    from ._context import ActionCtx, MutationCtx, QueryCtx, SystemTable
    from ._errors import (
        ArgumentError,
        BatchItemError,
        BatchResultError,
        CallError,
        CancelOwnRunError,
        CronSyntaxError,
        DatabaseError,
        DependencyFailedError,
        DurableNameWarning,
        DurafnError,
        ExecutorShutdownError,
        FunctionTimeoutError,
        NonRetryableError,
        NotFoundError,
        OptionError,
        ReadOnlyError,
        RegistrationError,
        SchedulingError,
        SchedulingLimitError,
        SchemaError,
        SnoozeLimitError,
        TransactionError,
        UnknownFunctionError,
        UnknownOperationError,
        WorkerLostError,
        WorkflowCanceledError,
        WorkflowDeterminismError,
        WorkflowError,
        WorkflowLimitError,
        WorkflowStepError,
        WorkflowTimeoutError,
    )
    from ._executor import Executor, ExecutorConfig, ExecutorOptions, RunawayError
    from ._explain import Explanation, FlowKeyInfo
    from ._flow import Debounce, Flow, FlowError, Rate, Throttle
    from ._groups import GroupCompletion
    from ._hooks import HookEvent
    from ._kinds import FunctionKind, ScheduledFunctionId, State
    from ._models import (
        AuditEntry,
        CancelResult,
        Completion,
        CronInfo,
        CronTick,
        ErrorInfo,
        FailedAttempt,
        FailureGroup,
        LinkedRow,
        LostWorker,
        Operation,
        Page,
        QueueInfo,
        RowLinks,
        ScheduledFunction,
        Stats,
        WorkerInfo,
    )
    from ._options import JobOptions, Queue
    from ._registry import ActionRef, Call, FunctionRef, MutationRef, QueryRef, SchedulableRef
    from ._retention import Retention
    from ._retries import (
        DELAYED_JOB,
        GRAPHILE,
        Exponential,
        Fixed,
        NamedBackoff,
        Retry,
        Snooze,
    )
    from ._scheduler import Scheduler
    from ._search import SearchResult
    from ._store import SCHEMA_VERSION, metadata, scheduled_functions
    from ._sync_app import SyncApp
    from ._sync_functions import SyncMutationCtx
    from ._sync_scheduler import SyncScheduler
    from ._telemetry.logs import json_log_formatter
    from ._watch import Watch
    from ._workflow.api import WorkflowCtx, WorkflowRef
    from ._workflow.lifecycle import WorkflowNotFoundError
    from ._workflow.models import Workflow, WorkflowState, WorkflowStep

__version__ = "0.1.0"

logging.getLogger("durafn").addHandler(logging.NullHandler())

__all__ = [
    "ActionCtx",
    "ActionRef",
    "Activity",
    "ActivityPoint",
    "App",
    "ArgumentError",
    "AuditEntry",
    "Batch",
    "BatchActionRef",
    "BatchItemError",
    "BatchResultError",
    "Call",
    "CallError",
    "CancelOwnRunError",
    "CancelResult",
    "Clock",
    "Completion",
    "CronInfo",
    "CronSyntaxError",
    "CronTick",
    "DEFAULT_URL",
    "DELAYED_JOB",
    "DatabaseError",
    "Debounce",
    "DependencyFailedError",
    "DurableNameWarning",
    "DurafnError",
    "ErrorInfo",
    "Executor",
    "ExecutorConfig",
    "ExecutorOptions",
    "ExecutorShutdownError",
    "Explanation",
    "Exponential",
    "FailedAttempt",
    "FailureGroup",
    "Fixed",
    "Flow",
    "FlowError",
    "FlowKeyInfo",
    "FunctionActivity",
    "FunctionKind",
    "FunctionRef",
    "FunctionTimeoutError",
    "GRAPHILE",
    "GroupCompletion",
    "HookEvent",
    "ItemFailed",
    "JobOptions",
    "Latency",
    "LinkedRow",
    "LostWorker",
    "MutationCtx",
    "MutationRef",
    "NamedBackoff",
    "NonRetryableError",
    "NotFoundError",
    "Operation",
    "OptionError",
    "Page",
    "QueryCtx",
    "QueryRef",
    "Queue",
    "QueueInfo",
    "Rate",
    "ReadOnlyError",
    "RegistrationError",
    "Retention",
    "Retry",
    "RowLinks",
    "RunawayError",
    "SCHEMA_VERSION",
    "SchedulableRef",
    "ScheduledFunction",
    "ScheduledFunctionId",
    "Scheduler",
    "SchedulingError",
    "SchedulingLimitError",
    "SchemaError",
    "SearchResult",
    "Snooze",
    "SnoozeLimitError",
    "State",
    "Stats",
    "SyncApp",
    "SyncMutationCtx",
    "SyncScheduler",
    "SystemClock",
    "SystemTable",
    "Throttle",
    "TransactionError",
    "UnknownFunctionError",
    "UnknownOperationError",
    "Watch",
    "WorkerInfo",
    "WorkerLostError",
    "Workflow",
    "WorkflowCanceledError",
    "WorkflowCtx",
    "WorkflowDeterminismError",
    "WorkflowError",
    "WorkflowLimitError",
    "WorkflowNotFoundError",
    "WorkflowRef",
    "WorkflowState",
    "WorkflowStep",
    "WorkflowStepError",
    "WorkflowTimeoutError",
    "json_log_formatter",
    "metadata",
    "scheduled_functions",
]


if not _typing.TYPE_CHECKING:  # for type checkers the names are the imports above: no Any

    def __getattr__(name: str) -> _typing.Any:
        """A public name, loaded with its module on first use: ``import durafn`` alone
        (the command line's help, a worker process before its app) costs no SQLAlchemy
        nor pydantic. The module names its classes ``durafn.X`` as it loads
        (``_public``)."""
        module = _PUBLIC.get(name)
        if module is None:
            raise AttributeError(f"module 'durafn' has no attribute {name!r}")
        value = getattr(_importlib.import_module(f".{module}", __name__), name)
        globals()[name] = value
        return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
