"""The public names and where they live: ``durafn/__init__.py`` loads each with its
module on first use, and each module that defines public classes names them as users
import them (``publish``). Standard library only: every module imports it.
"""

from __future__ import annotations

from typing import Any, NewType

PUBLIC: dict[str, str] = {
    "ActionCtx": "_context",
    "ActionRef": "_registry",
    "App": "_app",
    "AuditEntry": "_models",
    "ArgumentError": "_errors",
    "Call": "_registry",
    "Batch": "_batching",
    "BatchActionRef": "_batching",
    "BatchItemError": "_errors",
    "BatchResultError": "_errors",
    "CallError": "_errors",
    "CancelOwnRunError": "_errors",
    "CancelResult": "_models",
    "Clock": "_clock",
    "Completion": "_models",
    "CronInfo": "_models",
    "CronSyntaxError": "_errors",
    "CronTick": "_models",
    "DEFAULT_URL": "_app",
    "DELAYED_JOB": "_retries",
    "DatabaseError": "_errors",
    "DependencyFailedError": "_errors",
    "Debounce": "_flow",
    "DurableNameWarning": "_errors",
    "DurafnError": "_errors",
    "ErrorInfo": "_models",
    "Executor": "_executor",
    "ExecutorConfig": "_executor",
    "ExecutorOptions": "_executor",
    "ExecutorShutdownError": "_errors",
    "Explanation": "_explain",
    "Exponential": "_retries",
    "FailedAttempt": "_models",
    "FailureGroup": "_models",
    "Fixed": "_retries",
    "Flow": "_flow",
    "FlowError": "_flow",
    "FlowKeyInfo": "_explain",
    "FunctionKind": "_kinds",
    "FunctionRef": "_registry",
    "FunctionTimeoutError": "_errors",
    "GRAPHILE": "_retries",
    "GroupCompletion": "_groups",
    "HookEvent": "_hooks",
    "ItemFailed": "_batching",
    "JobOptions": "_options",
    "MutationCtx": "_context",
    "MutationRef": "_registry",
    "NamedBackoff": "_retries",
    "NonRetryableError": "_errors",
    "NotFoundError": "_errors",
    "Operation": "_models",
    "OptionError": "_errors",
    "Page": "_models",
    "QueryCtx": "_context",
    "QueryRef": "_registry",
    "Queue": "_options",
    "LostWorker": "_models",
    "QueueInfo": "_models",
    "Rate": "_flow",
    "ReadOnlyError": "_errors",
    "RegistrationError": "_errors",
    "Retention": "_retention",
    "Retry": "_retries",
    "RunawayError": "_executor",
    "SCHEMA_VERSION": "_store",
    "SchedulableRef": "_registry",
    "ScheduledFunction": "_models",
    "ScheduledFunctionId": "_kinds",
    "Scheduler": "_scheduler",
    "SchedulingError": "_errors",
    "SyncApp": "_sync_app",
    "SyncMutationCtx": "_sync_functions",
    "SyncScheduler": "_sync_scheduler",
    "SchedulingLimitError": "_errors",
    "SchemaError": "_errors",
    "Snooze": "_retries",
    "SnoozeLimitError": "_errors",
    "State": "_kinds",
    "Stats": "_models",
    "SystemClock": "_clock",
    "SystemTable": "_context",
    "Throttle": "_flow",
    "TransactionError": "_errors",
    "UnknownFunctionError": "_errors",
    "Watch": "_watch",
    "json_log_formatter": "_telemetry.logs",
    "WorkerInfo": "_models",
    "WorkerLostError": "_errors",
    "metadata": "_store",
    "scheduled_functions": "_store",
}
"""Each public name, and the private module (of the package) it is taken from."""


def publish(namespace: dict[str, Any]) -> None:
    """Name the public classes this module defines as users import them: ``durafn.X``,
    not ``durafn._errors.X``, in tracebacks, reprs and the error types rows record.
    Called at the end of each such module, so it holds however the module was loaded."""
    module = namespace["__name__"]
    for name in PUBLIC:
        value = namespace.get(name)
        if isinstance(value, type | NewType) and value.__module__ == module:
            value.__module__ = "durafn"
