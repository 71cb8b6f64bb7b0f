"""How an executor runs: ``ExecutorConfig``, its keyword form, and their validation."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypedDict

from .._errors import ArgumentError


@dataclass(frozen=True, slots=True)
class ExecutorConfig:
    """How an executor runs. Every field has a production default."""

    concurrency: int = 10
    """Actions running at once (mutation lanes are at most this many, too)."""
    batch_size: int = 256
    """Mutations committed together in one transaction, at most."""
    batch_time: float = 0.05
    """Seconds a batch runs mutations before it commits what it has run; the rows it
    claimed but did not reach stay Pending for the next batch. It bounds how long a batch
    holds its row locks (and, on SQLite, the database's write lock) when mutations are
    slow, whatever ``batch_size`` is."""
    mutation_lanes: int | None = None
    """Mutation transactions at once; default min(concurrency, what the engine benefits from)."""
    poll_interval: float | None = None
    """Fallback poll for work no signal announced (another process on SQLite, a lost
    NOTIFY on PostgreSQL); default 0.5s on SQLite, 5s on PostgreSQL."""
    retention: float = 7 * 86400.0
    """Seconds finished rows are kept after ``completed_time``."""
    retention_interval: float = 60.0
    retention_batch: int = 1000
    grace_period: float = 10.0
    """On stop, how long running actions may take to finish before they are cancelled."""
    heartbeat_interval: float = 5.0
    """How often this executor renews its row in ``_durafn_workers`` (and looks for lost
    workers)."""
    worker_timeout: float = 30.0
    """A worker with no heartbeat for this long is lost: its InProgress actions are
    recorded Failed (``WorkerLostError``) by another worker, never re-run. Recovery after a
    crash takes at most about ``worker_timeout + heartbeat_interval``."""
    worker_name: str | None = None
    """A readable label for this executor's worker id (default ``host:pid``)."""

    def __post_init__(self) -> None:
        for name in ("concurrency", "batch_size", "retention_batch", "mutation_lanes"):
            value = getattr(self, name)
            if value is not None and (not _is_int(value) or value < 1):
                raise ArgumentError(f"{name} must be an integer of at least 1, not {value!r}")
        for name in ("retention", "grace_period"):
            value = getattr(self, name)
            if not _is_number(value) or not value >= 0:
                raise ArgumentError(
                    f"{name} must be a non-negative number of seconds, not {value!r}"
                )
        for name in (
            "retention_interval",
            "poll_interval",
            "heartbeat_interval",
            "worker_timeout",
            "batch_time",
        ):
            value = getattr(self, name)
            if value is not None and (not _is_number(value) or not value > 0):
                raise ArgumentError(f"{name} must be a positive number of seconds, not {value!r}")
        if self.worker_timeout < 3 * self.heartbeat_interval:
            # A pause shorter than the two intervals that reset a rescuer's streak leaves
            # live heartbeats at most three intervals old: still within the timeout.
            raise ArgumentError(
                f"worker_timeout ({self.worker_timeout!r}) must be at least three times "
                f"heartbeat_interval ({self.heartbeat_interval!r}), or a late heartbeat "
                "could declare a live worker lost"
            )
        if self.worker_name is not None and not isinstance(self.worker_name, str):
            raise ArgumentError(f"worker_name must be a string, not {self.worker_name!r}")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


class ExecutorOptions(TypedDict, total=False):
    """The keyword arguments of ``app.executor()``: ``ExecutorConfig``'s fields, so that
    mypy checks their names and types."""

    concurrency: int
    batch_size: int
    batch_time: float
    mutation_lanes: int | None
    poll_interval: float | None
    retention: float
    retention_interval: float
    retention_batch: int
    grace_period: float
    heartbeat_interval: float
    worker_timeout: float
    worker_name: str | None


def make_config(options: Mapping[str, Any]) -> ExecutorConfig:
    """ExecutorConfig from keyword options, with a typed error for an unknown one."""
    known = {f.name for f in dataclasses.fields(ExecutorConfig)}
    if unknown := sorted(set(options) - known):
        raise ArgumentError(
            f"unknown executor option(s) {', '.join(unknown)}; the options are "
            f"{', '.join(sorted(known))}"
        )
    return ExecutorConfig(**options)
