"""``Executor``: builds the parts, runs them as tasks of one task group, and stops them.

The parts are built once per executor and keep what they learn across runs (paces, the
claim ledger, the mutation mode); ``begin`` gives each a fresh run. The stop sequence is
here, because it orders the parts: claiming stops, running actions get their grace period
(``ActionPool.stop``), then outcomes are written and unstarted rows released
(``Finisher.close``), then the other loops are cancelled; once every one has ended (a
mutation batch running still commits), the rows the last finishes freed are announced
(``FreedRows``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import anyio
from sqlalchemy.ext.asyncio import AsyncConnection

from .._context import SystemTable
from .._errors import DatabaseError, DurafnError, NotFoundError
from .._invoke import Invoker
from .._kinds import FunctionKind, ScheduledFunctionId
from .._models import ScheduledFunction
from .._public import publish
from .._runtime import Inline, Runtime
from .action_claims import ActionClaims
from .actions import ActionPool
from .batched import Unit
from .cancel_poll import poll_cancels
from .config import ExecutorConfig
from .crons import LEASE_SHARE, CronLoop
from .finisher import Finisher
from .maintenance import Maintenance
from .membership import Membership
from .mutations import MutationLanes
from .outcomes import Tally
from .releases import FreedRows
from .tasks import single_errors_unwrapped
from .wakeups import KINDS, Wakeups


class RunawayError(DurafnError, RuntimeError):
    """Work that keeps scheduling more: ``run_until_idle`` found work still due after its
    round limit (a function scheduling itself with no delay), ``advance`` due times still
    ahead after its stops, or ``finish_all`` rows still Pending after its steps (its
    message names what keeps scheduling them; ``advance`` runs such work up to a time)."""


class Executor:
    """Runs due scheduled functions. Use ``async with app.run_executor():`` to run it in
    the background, or ``await executor.run_until_idle()`` to run what is due now."""

    def __init__(self, runtime: Runtime, invoker: Invoker, config: ExecutorConfig) -> None:
        self._rt = runtime
        self.config = config
        driver = runtime.driver
        self._lanes = config.mutation_lanes or min(config.concurrency, driver.max_mutation_lanes)
        poll = config.poll_interval
        self._wakeups = Wakeups(runtime, driver.default_poll_interval if poll is None else poll)
        self._tally = Tally(runtime.telemetry.fields)
        self.stats = self._tally.stats
        """Rows this executor finished ("mutations", "actions", "failed") and internal
        retries of mutation batches ("retries")."""
        self._membership = Membership(runtime, config, self._tally.progress, self._on_leave)
        self._claims = ActionClaims(runtime, lambda: self._membership.worker_id, config.serve)
        self._finisher = Finisher(runtime, self._tally, self._claims)
        self._mutations = MutationLanes(
            runtime, invoker, config, self._tally, self._wakeups, lambda: self._membership.worker_id
        )
        self._actions = ActionPool(
            runtime, invoker, config, self._claims, self._finisher, self._wakeups
        )
        self._maintenance = Maintenance(runtime, config)
        self._crons = CronLoop(
            runtime, lambda: self._membership.worker_id, config.worker_timeout / LEASE_SHARE
        )
        self._freed = FreedRows(runtime)
        self._hurry = 0  # stop_now() calls

    @property
    def worker_id(self) -> str:
        """This executor's id in ``_durafn_workers``: new for every run."""
        return self._membership.worker_id

    def _on_leave(self) -> None:
        self._claims.forget()

    # -- public ------------------------------------------------------------------------

    async def __aenter__(self) -> Executor:
        self._exit_stack = self._running()
        return await self._exit_stack.__aenter__()

    async def __aexit__(self, *exc_info: Any) -> bool | None:
        return await self._exit_stack.__aexit__(*exc_info)

    async def run_until_idle(self, *, max_rounds: int = 1000) -> int:
        """Run everything due now, including what that schedules due now; return the count.

        Deterministic: returns once nothing is due at the clock's current time and every
        action it started has finished and been recorded (rows that other processes
        commit while it runs may be left to the next call). A round is one mutation batch
        plus one claim of actions; after ``max_rounds`` rounds that all found work it raises
        RunawayError (a function that keeps scheduling itself with no delay).
        """
        await self._rt.ensure_ready()
        total = 0
        # Crons: the app's, or the registry's when this executor first looked.
        crons = self._crons.active if self._crons.looked else await self._crons.look()
        cron_next: float | None = None
        # Kinds whose rows this process committed (or freed) during a round: a round that
        # claimed less than it asked and woke nothing has left nothing due behind it, so
        # no last round is needed to find nothing (as the lanes' idle wait, mutations.py).
        # (Stepping a fake clock through a cron's ticks: a third of the statements.)
        woken: set[FunctionKind] = set()
        self._rt._wake_listeners.add(woken.update)
        async with AsyncExitStack() as stack:
            stack.callback(self._rt._wake_listeners.discard, woken.update)
            for _ in range(max_rounds):
                written = 0
                # The crons' due ticks, written as rows first (and run by this round); in a
                # later round only if the next run the last one read has come.
                if crons and (cron_next is None or cron_next <= self._rt.clock.now()):
                    written, cron_next = await self._crons.tick()
                woken.clear()  # the ticks' rows are this round's to claim
                ran, full = await self._mutations.run_batch(timed=False)
                room = self.config.concurrency
                rows: list[Unit] = []
                if self._actions.batches.batching:
                    rows += await self._actions.batches.claim(room)
                rows += await self._claims.claim(room - len(rows)) if len(rows) < room else []
                if rows:
                    if not self._membership.depth:
                        # Running actions: heartbeat like a worker, so that no other worker
                        # takes them for lost. (Only now: most calls run no action.)
                        await stack.enter_async_context(self._membership.hold("run_until_idle()"))
                    await self._actions.run_claimed(rows)
                    ran += sum(len(u) if isinstance(u, list) else 1 for u in rows)
                    full = full or len(rows) >= self.config.concurrency
                total += ran
                await self._freed.flush()  # wakes ``woken`` if a finish freed rows
                if ran == 0 and written == 0:
                    return total
                again = cron_next is not None and cron_next <= self._rt.clock.now()
                # A claim visits 16 flow keys at most; its cursor says where the rest start.
                keys_left = self._mutations.hint.flow.after or self._claims.hint.flow.after
                if not (full or woken or again or keys_left):
                    return total
        raise RunawayError(
            f"work was still due after {max_rounds} rounds ({total} functions run): a "
            "function probably schedules itself with no delay"
        )

    async def run_inline(self, calls: list[Inline]) -> None:
        """Run these rows now, due or not (inline mode: ``App(inline=...)``, after the
        transaction that scheduled them committed): each mutation in a batch of its own,
        then the actions, as ``run_until_idle`` runs them. What they schedule and inline
        mode accepts runs as it commits, in turn."""
        for id, kind in calls:
            if kind is FunctionKind.MUTATION:
                await self._mutations.run_batch(timed=False, only=[id])
        actions = [id for id, kind in calls if kind is FunctionKind.ACTION]
        if actions:
            async with self._membership.hold("inline"):
                rows = await self._claims.claim_ids(actions)
                await self._actions.run_claimed(rows)
        await self._freed.flush()

    async def wait_until_idle(self) -> None:
        """Return once nothing is due at the clock's current time and every action this
        executor started has finished and been recorded (``durafn worker
        --exit-on-complete``). Work due later does not count."""
        while True:
            progress = self._tally.progress.current()
            if self._idle_here():
                try:
                    due = await self.next_due()
                except DatabaseError as exc:
                    if not exc.transient:
                        raise
                    self._rt.health.fault(exc, "looking for due work")
                    due = self._rt.clock.now()  # unknown: not idle; look again
                # Checked again after the read: a claim may have committed during it.
                if (due is None or due > self._rt.clock.now()) and self._idle_here():
                    return
            with anyio.move_on_after(0.05):  # rows finished by other processes: no signal
                await progress.wait()

    def _idle_here(self) -> bool:
        return not self._actions.running and self._claims.idle

    def stop_now(self) -> None:
        """Cut a stop short: the first call ends the grace period (running actions are
        cancelled and recorded Failed); a second also stops waiting for those records
        to be written (rows left InProgress are later recorded lost by other workers).
        Before a stop, it makes the coming stop skip the grace period."""
        self._hurry += 1
        self._actions.end_grace()
        if self._hurry > 1:
            self._finisher.give_up()

    async def run_maintenance(self) -> int:
        """Delete finished rows older than the retention period; returns how many."""
        return await self._maintenance.run_once()

    async def next_due(self, *, after: float | None = None, crons: bool = True) -> float | None:
        """The earliest time (epoch seconds) any Pending row becomes due, or a cron of the
        app's runs next, or None. Rows due already that this executor's last claims left
        for a flow key's spent rate budget count from when the budget allows a start.
        ``after``: only times later than it (after ``run_until_idle`` at that time, the
        rows still due are held: a paused queue, a full key, another executor's).
        ``crons=False``: the rows' times only (``finish_all``: a cron always has a next
        tick)."""
        driver = self._rt.driver
        now = self._rt.clock.now()
        held = [w for w in (self._mutations.hint.flow.wake_at, self._claims.hint.flow.wake_at) if w]

        async def _both(conn: AsyncConnection) -> list[float | None]:
            times = [await driver.next_due(conn, kind, after) for kind in KINDS]
            if held and (after is not None or any(t is not None and t <= now for t in times)):
                if after is None:
                    times = [await driver.next_due(conn, kind, now) for kind in KINDS]
                times.append(min(held))
            if crons and self._crons.active:
                times.append(await driver.next_cron(conn))
            return times

        times = await self._rt.transaction(_both, read_only=True, doing="reading the next due time")
        due = [t for t in times if t is not None and (after is None or t > after)]
        return min(due) if due else None

    async def wait_for(
        self, id: ScheduledFunctionId | str, *, timeout: float = 30.0
    ) -> ScheduledFunction:
        """Wait (signal-driven, no polling loop) until the row has finished; return it."""
        with anyio.fail_after(timeout):
            while True:
                progress = self._tally.progress.current()
                row = await SystemTable(self._rt, None).get(id)
                if row is None:
                    raise NotFoundError(str(id))
                if row.state.finished:
                    return row
                # Rows finished by this executor signal at once; a cancel or another
                # process does not, so look again every 100 ms as well.
                with anyio.move_on_after(0.1):
                    await progress.wait()

    # -- lifecycle ---------------------------------------------------------------------

    @asynccontextmanager
    async def _running(self) -> AsyncIterator[Executor]:
        await self._rt.ensure_ready()
        await self._declare_queues()
        self._hurry = 0
        wakeups = self._wakeups
        wakeups.begin()
        self._rt._wake_listeners.add(wakeups.on_wake)
        self._rt._freed_listeners.add(self._freed.noted)
        try:
            async with (
                single_errors_unwrapped(),
                self._membership.hold("executor"),
                anyio.create_task_group() as tg,
            ):
                self._actions.begin(tg)
                self._finisher.begin()
                tg.start_soon(self._finisher.run)
                for _ in range(self._lanes):
                    tg.start_soon(self._mutations.lane)
                tg.start_soon(self._actions.dispatch)
                tg.start_soon(self._actions.watch.run)
                tg.start_soon(self._maintenance.loop, wakeups.stopping)
                tg.start_soon(self._maintenance.operations_loop, wakeups.stopping)
                tg.start_soon(poll_cancels, self._rt, wakeups.poll_interval)
                tg.start_soon(self._freed.run)
                await self._crons.reconcile()
                tg.start_soon(self._crons.loop, wakeups.stopping)
                try:
                    listening = self._rt.driver.listen(
                        self._rt.engine, wakeups.on_wake, self._rt.cancels.request
                    )
                    async with listening as heard:
                        self._rt.listening += heard
                        try:
                            yield self
                        finally:
                            self._rt.listening -= heard
                finally:
                    # On every way out (the block's end, a cancelled host, a failed listen
                    # or loop). Shielded: a cancelled host still gives running actions their
                    # grace period and records how every one of them ended.
                    with anyio.CancelScope(shield=True):
                        try:
                            await self._stop()
                        finally:
                            self._actions.watch.stop()
                tg.cancel_scope.cancel()
        finally:
            # Once every loop has ended: a mutation batch running when the stop came
            # commits after ``_stop``'s look, and the rows its finish freed are known to
            # this process only (``FreedRows``: its NOTIFY is what tells the other
            # executors). Left unlooked at, a join another executor could run waited for
            # that executor's poll (``make stress``: 25 rounds in 3,000 on PostgreSQL).
            with anyio.CancelScope(shield=True):
                await self._freed.flush()
            self._rt._wake_listeners.discard(wakeups.on_wake)
            self._rt._freed_listeners.discard(self._freed.noted)
            self._actions.end()

    async def _declare_queues(self) -> None:
        """Write the concurrency of the queues the app declares (``App(queues=...)``), so
        that every worker's claims, on every host, hold the queues to it."""
        rt = self._rt
        declared = {name: q.concurrency for name, q in rt.queues.items()}
        if not declared:
            return

        async def _declare(conn: AsyncConnection) -> None:
            await rt.driver.declare_queues(conn, declared, rt.clock.now())

        await rt.transaction(_declare, doing="declaring the app's queues")

    async def _stop(self) -> None:
        """Stop claiming, give running actions their grace period, cancel the rest, and
        record how every claimed action ended (bounded, should the database be away).
        The rows those finishes freed are announced now (not after a mutation batch
        still running ends), and those of that batch once it has (``_running``)."""
        self._wakeups.stop()
        unstarted = await self._actions.stop(self.config.grace_period)
        await self._finisher.close(unstarted)
        await self._freed.flush()


publish(globals())
