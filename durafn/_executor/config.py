"""How an executor runs: ``ExecutorConfig``, its keyword form, and their validation."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypedDict

from .._checks import integer, non_negative_seconds, optional, positive_seconds, text
from .._errors import ArgumentError
from .._options import check_flags, check_name
from .._public import publish
from .._retention import Retention, periods

if TYPE_CHECKING:
    from .._store import ClaimFilter


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
    NOTIFY on PostgreSQL), and for cancels of the actions running here made by other
    processes; default 0.5s on SQLite, 5s on PostgreSQL."""
    retention: float | Retention = 7 * 86400.0
    """Seconds finished rows are kept after ``completed_time``: one number for every state,
    or a ``Retention`` per state (a function's own, on its decorator, comes first)."""
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
    queues: tuple[str, ...] | None = None
    """Serve only rows of these named queues (a worker pool: ``durafn worker --queues``);
    None, the default, serves every row, queued or not."""
    forbidden_flags: tuple[str, ...] = ()
    """Never claim rows carrying any of these flags (to shed a kind of work)."""

    @property
    def serve(self) -> ClaimFilter:
        """What this executor's claims may take."""
        from .._store import ClaimFilter  # the store's: ``durafn worker --help`` needs none

        return ClaimFilter(
            queues=None if self.queues is None else frozenset(self.queues),
            forbidden_flags=frozenset(self.forbidden_flags),
        )

    def __post_init__(self) -> None:
        # Upper bounds far above any use, so that a typo is an error here rather than a
        # driver's overflow in a LIMIT.
        integer("concurrency", self.concurrency, high=100_000)
        integer("batch_size", self.batch_size, high=100_000)
        integer("retention_batch", self.retention_batch, high=1_000_000)
        optional(integer, "mutation_lanes", self.mutation_lanes, high=1_000)
        periods(self.retention)
        non_negative_seconds("grace_period", self.grace_period)
        for name in ("retention_interval", "heartbeat_interval", "worker_timeout", "batch_time"):
            positive_seconds(name, getattr(self, name))
        optional(positive_seconds, "poll_interval", self.poll_interval)
        if self.worker_timeout < 3 * self.heartbeat_interval:
            # A pause shorter than the two intervals that reset a rescuer's streak leaves
            # live heartbeats at most three intervals old: still within the timeout.
            raise ArgumentError(
                f"worker_timeout ({self.worker_timeout!r}) must be at least three times "
                f"heartbeat_interval ({self.heartbeat_interval!r}), or a late heartbeat "
                "could declare a live worker lost"
            )
        optional(text, "worker_name", self.worker_name)
        if self.queues is not None:
            if isinstance(self.queues, str) or not self.queues:
                raise ArgumentError(
                    f"queues must be a non-empty list of queue names, not {self.queues!r}"
                )
            object.__setattr__(
                self,
                "queues",
                tuple(check_name("queues", q, error=ArgumentError) for q in self.queues),
            )
        flags = check_flags("forbidden_flags", self.forbidden_flags, error=ArgumentError)
        object.__setattr__(self, "forbidden_flags", tuple(sorted(flags)))


class ExecutorOptions(TypedDict, total=False):
    """The keyword arguments of ``app.executor()``: ``ExecutorConfig``'s fields, so that
    mypy checks their names and types."""

    concurrency: int
    batch_size: int
    batch_time: float
    mutation_lanes: int | None
    poll_interval: float | None
    retention: float | Retention
    retention_interval: float
    retention_batch: int
    grace_period: float
    heartbeat_interval: float
    worker_timeout: float
    worker_name: str | None
    queues: Sequence[str] | None
    forbidden_flags: Sequence[str]


def make_config(options: Mapping[str, Any]) -> ExecutorConfig:
    """ExecutorConfig from keyword options, with a typed error for an unknown one."""
    known = {f.name for f in dataclasses.fields(ExecutorConfig)}
    if unknown := sorted(set(options) - known):
        raise ArgumentError(
            f"unknown executor option(s) {', '.join(unknown)}; the options are "
            f"{', '.join(sorted(known))}"
        )
    return ExecutorConfig(**options)


publish(globals())
