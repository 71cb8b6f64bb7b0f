"""The seams of the dashboard: what it asks of a ``durafn.App`` (``App``: the methods the
command line calls, and nothing else: no query of its own, no second copy of a filter or
an action), and what its parts (``rows``, ``operations``) ask of its core (``Pages``)."""

from __future__ import annotations

import builtins
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol

from starlette.requests import Request
from starlette.responses import Response

from .._activity import Activity
from .._clock import Clock
from .._explain import Explanation, FlowKeyInfo
from .._kinds import ScheduledFunctionId, State
from .._models import (
    AuditEntry,
    CancelResult,
    CronInfo,
    FailureGroup,
    LostWorker,
    Operation,
    Page,
    QueueInfo,
    RowLinks,
    ScheduledFunction,
    Stats,
    WorkerInfo,
)
from .._registry import FunctionRef
from .._scheduler import Scheduler
from .._search import SearchResult
from .._watch import Watch
from .._workflow.models import Workflow


class App(Protocol):
    @property
    def clock(self) -> Clock: ...
    def functions(self) -> builtins.list[str]: ...
    def function(self, name: str) -> FunctionRef[Any, Any]: ...
    def scheduler(self) -> Scheduler: ...
    async def stats(self, *, bound: int | None = None) -> Stats: ...
    async def queues(self, *, bound: int | None = None) -> builtins.list[QueueInfo]: ...
    async def flow_keys(self, *, limit: int = 100) -> builtins.list[FlowKeyInfo]: ...
    async def workers(self) -> builtins.list[WorkerInfo]: ...
    def metrics_app(self) -> Any: ...
    async def lost_workers(self, *, limit: int = 20) -> builtins.list[LostWorker]: ...
    def watch(
        self, *, poll: float = 2.0, settle: float = 0.5
    ) -> AbstractAsyncContextManager[Watch]: ...
    async def finished(
        self, *, within: float | timedelta = 3600.0, limit: int = 5000
    ) -> builtins.list[ScheduledFunction]: ...
    async def crons(self, *, enabled: bool | None = None) -> builtins.list[CronInfo]: ...
    async def activity(
        self,
        *,
        within: float | timedelta = 3600.0,
        name: str | None = None,
        queue: str | None = None,
    ) -> Activity: ...
    async def list(
        self,
        *,
        state: State | None = None,
        name: str | None = None,
        limit: int = 100,
        cursor: str | None = None,
        newest_first: bool = False,
        queue: str | None = None,
        key: str | None = None,
        flag: str | None = None,
        parent: ScheduledFunctionId | str | None = None,
        args: Mapping[str, str | int | float | bool] | None = None,
        args_contain: Mapping[str, str | int | float | bool] | None = None,
        scan: int | None = None,
    ) -> Page: ...
    async def count(
        self,
        *,
        state: State | None = None,
        name: str | None = None,
        queue: str | None = None,
        key: str | None = None,
        flag: str | None = None,
    ) -> int: ...
    async def get(self, id: ScheduledFunctionId | str) -> ScheduledFunction | None: ...
    async def explain(self, id: ScheduledFunctionId | str) -> Explanation: ...
    async def row_links(self, id: ScheduledFunctionId | str, *, limit: int = 20) -> RowLinks: ...
    async def search(self, query: str, *, scan: int = 10_000, limit: int = 20) -> SearchResult: ...
    async def cancel(self, id: ScheduledFunctionId | str) -> CancelResult: ...
    async def cancel_where(
        self,
        *,
        name: str | None = None,
        queue: str | None = None,
        key: str | None = None,
        flag: str | None = None,
    ) -> int: ...
    async def retry(
        self, ids: Sequence[ScheduledFunctionId | str], *, run_at: datetime | None = None
    ) -> builtins.list[ScheduledFunctionId]: ...
    async def retry_where(
        self,
        *,
        name: str | None = None,
        queue: str | None = None,
        key: str | None = None,
        flag: str | None = None,
    ) -> int: ...
    async def reschedule(
        self,
        ids: Sequence[ScheduledFunctionId | str] | None = None,
        *,
        run_at: datetime | None = None,
        priority: int | None = None,
        name: str | None = None,
        queue: str | None = None,
        key: str | None = None,
        flag: str | None = None,
    ) -> int: ...
    async def enable_cron(self, name: str) -> None: ...
    async def disable_cron(self, name: str) -> None: ...
    async def trigger_cron(self, name: str) -> ScheduledFunctionId: ...
    async def remove_cron(self, name: str) -> bool: ...
    async def pause_queue(self, *names: str) -> int: ...
    async def list_workflows(
        self, *, state: Any = None, name: str | None = None, limit: int = 100
    ) -> builtins.list[Workflow]: ...
    async def get_workflow(self, workflow_id: str) -> Workflow | None: ...
    async def explain_workflow(self, workflow_id: str) -> str: ...
    async def cancel_workflow(self, workflow_id: str) -> bool: ...
    async def resume_queue(self, *names: str) -> int: ...
    async def record_action(
        self, *, who: str, action: str, target: str, rows: int, outcome: str, via: str = "api"
    ) -> AuditEntry: ...
    async def audit_log(
        self, *, limit: int = 50, before: int | None = None
    ) -> builtins.list[AuditEntry]: ...
    async def start_operation(
        self,
        kind: str,
        *,
        who: str,
        name: str | None = None,
        queue: str | None = None,
        key: str | None = None,
        flag: str | None = None,
        error_type: str | None = None,
        run_at: datetime | None = None,
        priority: int | None = None,
    ) -> Operation: ...
    async def operation(self, id: int) -> Operation: ...
    async def operations(
        self, *, limit: int = 50, before: int | None = None
    ) -> builtins.list[Operation]: ...
    async def run_operation(self, id: int, *, pages: int | None = None) -> Operation: ...
    async def cancel_operation(self, id: int) -> bool: ...
    async def failure_groups(
        self, *, scan: int = 10_000, limit: int = 100
    ) -> builtins.list[FailureGroup]: ...


COUNT_BOUND = 10_000
"""Where the dashboard's counts stop (``app.stats(bound=)``, ``app.queues(bound=)``): each
a range of at most this many index entries, so a page's cost does not grow with the table
(shown as "10,000+")."""


class Refused(Exception):
    """A request the dashboard answers with a message and a 4xx, never a traceback."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Done:
    """What an action did: said on the page it returns to, and recorded in the audit
    trail as ``action`` on ``target``, ``rows`` rows changed."""

    said: str
    back: str
    """The page to return to: a path under the dashboard's root (``/rows/...``)."""
    action: str
    target: str
    rows: int


Body = Callable[[str], Awaitable[dict[str, Any]]]
"""A page's content for a visitor (their name): the template's context."""
Act = Callable[[str, Any], Awaitable[Done]]
"""An action for a visitor, given the form."""


class Pages(Protocol):
    """The dashboard's core, as its parts see it (``server.Dashboard``)."""

    @property
    def app(self) -> App: ...
    @property
    def hide_args(self) -> bool: ...
    async def visitor(self, request: Request) -> str | None: ...
    async def page(self, request: Request, template: str, body: Body) -> Response: ...
    async def act(self, request: Request, act: Act) -> Response: ...
