"""How a run ended, as an ``Outcome`` to write, and the tally of outcomes written.

The one place that turns a function's result or exception into the row's next state:
``succeeded``, ``failed`` (with the error's public type name and a storable message) and
``stopped`` (an action cancelled by a stop). ``Tally`` counts and logs outcomes once they
are committed, and wakes whoever waits for progress (``wait_for``, ``wait_until_idle``).
"""

from __future__ import annotations

import logging
import os
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .._clock import to_datetime
from .._errors import DependencyFailedError, ExecutorShutdownError
from .._kinds import FunctionKind, State
from .._registry import ActionRef
from .._retries import type_name
from .._store import Claimed, Outcome
from .tasks import Signal

logger = logging.getLogger("durafn.executor")

MAX_ERROR_MESSAGE = 8000
MAX_TRACEBACK = 16000
"""Characters of a traceback a row keeps: its end, where the error was raised."""
_DURAFN_DIR = str(Path(__file__).resolve().parent.parent) + os.sep


def error_fields(exc: BaseException) -> tuple[str, str]:
    """The error's type as users import it, and its message as a row can hold it."""
    name = type_name(type(exc))
    # PostgreSQL text cannot hold NUL: a message with one must not make the row unwritable.
    message = str(exc).replace("\x00", "\\x00")
    if len(message) > MAX_ERROR_MESSAGE:
        message = message[:MAX_ERROR_MESSAGE] + "…"
    return name, message


def forget_frames(exc: BaseException) -> None:
    """Drop the tracebacks of ``exc`` and of the exceptions it chains (their frames)."""
    seen: set[int] = set()
    chain: list[BaseException | None] = [exc]
    while chain:
        e = chain.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        e.__traceback__ = None
        chain += (e.__cause__, e.__context__)


def traceback_text(exc: BaseException) -> str | None:
    """Where ``exc`` was raised, for the row (its last ``MAX_TRACEBACK`` characters), or
    None when no frame of it is the user's: an error durafn made itself (a time limit, a
    stop) says all in its message."""
    frames = traceback.extract_tb(exc.__traceback__)
    if all(frame.filename.startswith(_DURAFN_DIR) for frame in frames):
        return None
    text = "".join(traceback.format_exception(exc)).replace("\x00", "\\x00")
    if len(text) > MAX_TRACEBACK:
        text = "…" + text[-MAX_TRACEBACK:]
    return text


def failed(row: Claimed | Outcome, exc: BaseException) -> Outcome:
    error_type, message = error_fields(exc)
    return Outcome(
        row.id,
        State.FAILED,
        error_type=error_type,
        error_message=message,
        # The traceback is written for a final failure only (``retrying.settle``): it
        # cost ~0.2 ms per failed run, a third of what a retried no-op run added.
        name=row.name,
        queue=row.slot if isinstance(row, Claimed) else row.queue,
        flow_key=row.flow_key,
        error=exc,
        on_complete=row.on_complete,
        retry_state=row.retry_state() if isinstance(row, Claimed) else row.retry_state,
    )


def held_back(row: Claimed) -> Outcome | None:
    """What a row scheduled ``after=`` others records instead of running when one of
    them ended Failed or Canceled and its ``after_policy`` says so; None: it runs."""
    if not row.after_failed or row.after_policy not in ("cancel", "fail"):
        return None
    if row.after_policy == "fail":
        return failed(
            row,
            DependencyFailedError(
                f"{row.after_failed} of the rows it was scheduled after ended Failed or "
                "Canceled (after_policy='fail'); it did not run"
            ),
        )
    return Outcome(
        row.id,
        State.CANCELED,
        name=row.name,
        queue=row.slot,
        flow_key=row.flow_key,
        on_complete=row.on_complete,
    )


def stopped(row: Claimed) -> Outcome:
    return failed(
        row,
        ExecutorShutdownError(
            "the executor stopped while this action was running (after its grace period); "
            "it was cancelled and will not be retried"
        ),
    )


def succeeded(row: Claimed, ref: ActionRef[Any, Any], result: Any) -> Outcome:
    try:
        encoded = ref.encode_result(result)
    except Exception as exc:  # a result that cannot be stored fails the row, not the worker
        outcome = failed(row, exc)
        outcome.error = None  # the action itself succeeded: never run it again for this
        return outcome
    return success(row, encoded)


def success(row: Claimed, encoded: str | None) -> Outcome:
    """Success, with the result already in its stored form."""
    return Outcome(
        row.id,
        State.SUCCESS,
        result=encoded,
        name=row.name,
        queue=row.slot,
        flow_key=row.flow_key,
        on_complete=row.on_complete,
        awaited=row.dependents == 1,
    )


def log_fields(
    kind: FunctionKind, id: str, name: str, state: State, run: dict[str, Any] | None = None
) -> dict[str, Any]:
    """``extra`` for state-change log records, so a structured formatter (JSON logs) gets
    the row's fields without parsing the message; ``run``: its run's (``Telemetry.fields``:
    attempt, lag, duration, worker, trace and span ids)."""
    fields: dict[str, Any] = {
        "durafn_kind": kind,
        "durafn_id": id,
        "durafn_function": name,
        "durafn_state": state,
    }
    return fields if run is None else fields | run


def log_start(row: Claimed, run_fields: Callable[[str], dict[str, Any]]) -> None:
    """An action's start, at DEBUG: written inside its run (``Telemetry.running``), so
    that the line carries the run's fields (``run_fields``: ``Telemetry.fields``), its
    span's ids among them. At its claim, the line had none of them: the span begins when
    the function is called, and a row claimed ahead waits for a free worker first."""
    if logger.isEnabledFor(logging.DEBUG):
        run = run_fields(row.id)
        logger.debug(
            "action %s (%s) Pending -> InProgress: started",
            row.id,
            row.name,
            extra=log_fields(FunctionKind.ACTION, row.id, row.name, State.IN_PROGRESS, run),
        )


class Tally:
    """Counts (``stats``) and logs committed outcomes, and signals ``progress``."""

    def __init__(self, run_fields: Callable[[str], dict[str, Any]] | None = None) -> None:
        self._run_fields = run_fields
        """A run's own fields for its log line (``Telemetry.fields``), if recorded."""
        self.stats: dict[str, int] = {
            "mutations": 0,
            "actions": 0,
            "failed": 0,
            "retried": 0,
            "retries": 0,
            "snoozed": 0,
        }
        self.progress = Signal()
        """Fired whenever rows finished: by this executor, or by its rescue of lost ones."""

    def record(self, kind: FunctionKind, outcomes: list[Outcome]) -> None:
        """Count and log committed outcomes (one line each), and fire ``progress``."""
        before = State.PENDING if kind is FunctionKind.MUTATION else State.IN_PROGRESS
        debug = logger.isEnabledFor(logging.DEBUG)
        info = logger.isEnabledFor(logging.INFO)
        failures = retried = unwritten = snoozed = 0
        for o in outcomes:
            if o.unwritten:  # its row had moved on (cancelled, recorded lost): not ours
                unwritten += 1
            elif o.snoozed:
                snoozed += 1
                if info:
                    logger.info(
                        "%s %s (%s) %s -> Pending, snoozed until %s",
                        kind,
                        o.id,
                        o.name,
                        before,
                        to_datetime(o.retry_at or 0).isoformat(timespec="milliseconds"),
                        extra=log_fields(kind, o.id, o.name, State.PENDING, self._run(o.id)),
                    )
            elif o.retry_at is not None:
                retried += 1
                # INFO: a failure its policy retries is expected; the last one is a warning.
                # (A warning per retried run cost ~20 us, a fifth of what it added to a
                # SQLite drain.)
                if info:
                    logger.info(
                        "%s %s (%s) %s -> Pending, to be retried at %s: %s: %s",
                        kind,
                        o.id,
                        o.name,
                        before,
                        to_datetime(o.retry_at).isoformat(timespec="milliseconds"),
                        o.error_type,
                        o.error_message,
                        extra=log_fields(kind, o.id, o.name, State.PENDING, self._run(o.id)),
                    )
            elif o.state is State.FAILED:
                failures += 1
                logger.warning(
                    "%s %s (%s) %s -> Failed: %s: %s%s",
                    kind,
                    o.id,
                    o.name,
                    before,
                    o.error_type,
                    o.error_message,
                    f"\n{o.error_traceback.rstrip()}" if o.error_traceback else "",
                    extra=log_fields(kind, o.id, o.name, o.state, self._run(o.id)),
                )
            elif debug:
                logger.debug(
                    "%s %s (%s) %s -> %s",
                    kind,
                    o.id,
                    o.name,
                    before,
                    o.state,
                    extra=log_fields(kind, o.id, o.name, o.state, self._run(o.id)),
                )
        self.stats["failed"] += failures
        self.stats["retried"] += retried
        self.stats["snoozed"] += snoozed
        self.stats[f"{kind}s"] += len(outcomes) - failures - retried - unwritten - snoozed
        self.progress.fire()

    def _run(self, id: str) -> dict[str, Any] | None:
        return self._run_fields(id) if self._run_fields is not None else None
