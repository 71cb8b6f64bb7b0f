"""A workflow's turn: its body re-run against its journal until it blocks.

The body runs as a task of the turn's event loop, so that ``asyncio.gather`` of steps
works as anywhere. Each step call is numbered as it is made (``Turn.request``): the
journal's outcome resolves it at once; a step the journal lacks is left for the turn
(``steps.advance``), which runs mutation and query steps at once, in its own transaction,
and starts the others (rows, a child, a timer) for a later turn to see finished. The
turn lets the body run until none of its tasks can move (``_settle``), starts what it
asked for, and repeats while a step it ran resolved something; then it records what the
workflow waits on, or how it ended, and cancels the blocked body. Nothing of the body's
own state survives a turn: the journal is the workflow.
"""

from __future__ import annotations

import dataclasses
import json
import time
from typing import TYPE_CHECKING, Any

from .._errors import (
    WorkflowDeterminismError,
    WorkflowError,
    WorkflowLimitError,
    WorkflowStepError,
    WorkflowTimeoutError,
)
from .._registry import FunctionRef
from .._store import StepRow, WorkflowRow
from .._store import workflow_sql as store
from . import seams
from .api import (
    INLINE_SECONDS,
    MAX_JOURNAL_BYTES,
    MAX_RESULT_BYTES,
    MAX_STEPS,
    StepFuture,
    WorkflowRef,
)

if TYPE_CHECKING:
    from .._context import MutationCtx
    from .._runtime import Runtime


@dataclasses.dataclass(slots=True)
class Request:
    """A step the body asked for, in this turn, and what it needs to start it."""

    step_no: int
    kind: str
    name: str
    args: str
    future: StepFuture[Any]
    entry: StepRow | None = None
    ref: FunctionRef[Any, Any] | None = None
    values: dict[str, Any] | None = None
    wait: float | None = None
    until: float | None = None


class Turn:
    """One turn of one workflow, inside the mutation ``durafn:workflow_turn`` (or a
    step's completion)."""

    def __init__(
        self,
        rt: Runtime,
        ctx: MutationCtx,
        row: WorkflowRow,
        journal: list[StepRow],
        ref: WorkflowRef[Any, Any],
    ) -> None:
        self.rt = rt
        self.ctx = ctx
        self.conn = seams.connection(ctx)
        """The turn's transaction's connection."""
        self.row = row
        self.ref = ref
        self.now = rt.clock.now()
        self.journal = {s.step_no: s for s in journal}
        self.rounds: dict[int, list[int]] = {}
        """The steps whose outcomes earlier turns handed to the body, by round, in order:
        this turn hands them over again in the same rounds (``turns.play``)."""
        for s in journal:
            if s.delivered is not None:
                self.rounds.setdefault(s.delivered, []).append(s.step_no)
        self.round = max(self.rounds, default=0)
        self.delivered_now: list[tuple[int, int]] = []  # (step, round) to write at the end
        self.requests: list[Request] = []
        self.todo: list[Request] = []
        self.workflow_time = row.created_at
        self.mismatch: WorkflowDeterminismError | None = None
        self.inline_steps = 0
        self.inline_until = time.monotonic() + INLINE_SECONDS
        self.more = False  # the inline budget ran out: another turn goes on at once
        self.waiting_events: set[str] = set()
        self.touched = 0  # step calls and reads: activity the settling loop watches
        self.new_entries: list[StepRow] = []  # journaled at the turn's end, in one go
        self.blocked: dict[object, StepFuture[Any]] = {}  # task -> the step it awaits

    # -- what the body's calls reach ----------------------------------------------------

    def observed(self, ended_at: float | None) -> None:
        self.touched += 1
        if ended_at is not None and ended_at > self.workflow_time:
            self.workflow_time = ended_at

    def resolve(self, fn: FunctionRef[Any, Any]) -> FunctionRef[Any, Any]:
        return self.rt.registry.resolve(fn)

    def workflow_ref(self, fn: WorkflowRef[Any, Any]) -> WorkflowRef[Any, Any]:
        found: WorkflowRef[Any, Any] | None = self.rt.registry.workflows.get(
            getattr(fn, "name", "")
        )
        if found is None or not isinstance(fn, WorkflowRef):
            raise WorkflowError(
                f"step.run_workflow takes a workflow registered on this app (@app.workflow), "
                f"not {fn!r}"
            )
        return found

    def request(
        self,
        kind: str,
        name: str,
        args: str,
        *,
        ref: FunctionRef[Any, Any] | None = None,
        values: dict[str, Any] | None = None,
        wait: float | None = None,
        until: float | None = None,
    ) -> StepFuture[Any]:
        self.touched += 1
        step_no = len(self.requests) + 1
        future: StepFuture[Any] = StepFuture(self, step_no)
        req = Request(step_no, kind, name, args, future, None, ref, values, wait, until)
        self.requests.append(req)
        if step_no > MAX_STEPS:
            # Not journaled: the same step number fails the same way on every replay.
            future.set_exception(
                WorkflowLimitError(
                    f"step {step_no} ({kind} {name!r}) would exceed the bound of {MAX_STEPS} "
                    "steps per workflow; split the work into child workflows"
                )
            )
            return future
        entry = self.journal.get(step_no)
        if entry is None:
            self.todo.append(req)
            return future
        req.entry = entry
        if (entry.kind, entry.name, entry.args) != (kind, name, args):
            self.mismatch = WorkflowDeterminismError(
                f"workflow {self.row.id} ({self.row.name!r}) replayed step {step_no} as "
                f"{kind} {name!r} with {_short(args)}, but its journal holds {entry.kind} "
                f"{entry.name!r} with {_short(entry.args)}: its code changed under it, or "
                "it branches on something not journaled. It is Stopped: deploy code that "
                "matches and resume it (app.resume_workflow), or cancel it"
            )
            return future  # never resolved: the turn stops the workflow
        if entry.state == store.STARTED:
            self.todo.append(req)  # a sleep or a wait may end in this turn
        # A finished step's outcome is handed over in its round (``deliver``), never as
        # it is asked for: at once, its branch would go on ahead of the others, and ask
        # for its next step under a number another branch had the first time.
        return future

    def undelivered(self) -> list[Request]:
        """Steps asked for whose outcomes are journaled and not yet handed to the body."""
        return [
            r
            for r in self.requests
            if r.entry is not None and r.entry.state != store.STARTED and not r.future.done()
        ]

    def deliver(self, reqs: list[Request]) -> None:
        """Hand these outcomes to the body, in a new round (recorded on their entries)."""
        self.round += 1
        new = {id(e) for e in self.new_entries}
        for req in sorted(reqs, key=lambda r: r.step_no):
            entry = req.entry
            assert entry is not None and entry.delivered is None
            entry.delivered = self.round
            if id(entry) not in new:
                self.delivered_now.append((entry.step_no, self.round))
            settle_future(req)

    def redeliver(self, round: int) -> bool:
        """Hand over again the outcomes an earlier turn handed over in ``round``; False
        (and the turn's mismatch set) where the body has not asked for each of them."""
        steps = self.rounds[round]
        if any(n > len(self.requests) for n in steps):
            missing = min(n for n in steps if n > len(self.requests))
            entry = self.journal[missing]
            self.mismatch = WorkflowDeterminismError(
                f"workflow {self.row.id} ({self.row.name!r}) asked for {len(self.requests)} "
                f"steps before its journal's step {missing} ({entry.kind} {entry.name!r}) "
                "was handed to it the first time, and this replay asked for fewer: its code "
                "changed under it. It is Stopped: deploy code that matches and resume it "
                "(app.resume_workflow), or cancel it"
            )
            return False
        for n in steps:
            settle_future(self.requests[n - 1])
        return True

    # -- bookkeeping the steps share ----------------------------------------------------

    def count_result(self, text: str | None) -> str | None:
        """Add a result to the journal's size: None if it fits its bounds, else why not."""
        size = 0 if text is None else len(text.encode())
        if size > MAX_RESULT_BYTES:
            return f"its result is {size} bytes as JSON; a step's bound is {MAX_RESULT_BYTES}"
        if self.row.journal_bytes + size > MAX_JOURNAL_BYTES:
            return (
                f"it would bring the journal to {self.row.journal_bytes + size} bytes; a "
                f"workflow's bound is {MAX_JOURNAL_BYTES} (split it into child workflows)"
            )
        self.row.journal_bytes += size
        return None


def settle_future(req: Request) -> None:
    """Resolve a request's future from its finished journal entry."""
    entry = req.entry
    assert entry is not None
    req.future.ended_at = entry.ended_at
    if entry.state == "Success":
        req.future.set_result(None if entry.result is None else json.loads(entry.result))
        return
    error_type = entry.error_type or "durafn.WorkflowError"
    message = entry.error_message or ""
    if error_type == "durafn.WorkflowTimeoutError":
        req.future.set_exception(WorkflowTimeoutError(message))
    elif error_type == "durafn.WorkflowLimitError":
        req.future.set_exception(WorkflowLimitError(message))
    else:
        req.future.set_exception(
            WorkflowStepError(req.step_no, entry.kind, entry.name, error_type, message)
        )


def _short(text: str) -> str:
    return text if len(text) <= 120 else text[:117] + "..."
