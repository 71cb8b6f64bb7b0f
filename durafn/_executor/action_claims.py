"""Claiming actions, and the ledger of claimed actions whose outcome is not written yet.

A claim commits the move Pending -> InProgress (under this worker's id) *before* any of
the rows starts: that commit is where "at most once" begins. The ledger (``unrecorded``)
is what lets a claim whose COMMIT failed be recovered without ever starting a row twice.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Iterable

import anyio
from sqlalchemy.ext.asyncio import AsyncConnection

from .._errors import DatabaseError
from .._kinds import FunctionKind, ScheduledFunctionId
from .._runtime import Runtime, one_line
from .._store import SERVE_ALL, Claimed, ClaimFilter, FastPathHint, StartTime

logger = logging.getLogger("durafn.executor")


class ActionClaims:
    """Claims due actions for one worker and keeps its ledger.

    ``worker_id`` gives the current worker id (it is new for every run of the executor).
    """

    def __init__(
        self, runtime: Runtime, worker_id: Callable[[], str], serve: ClaimFilter = SERVE_ALL
    ) -> None:
        self._rt = runtime
        self._worker_id = self.worker_id = worker_id
        self.serve = serve
        """Which rows this worker serves (its queues, its forbidden flags)."""
        self.hint = FastPathHint()
        # Claimed actions whose outcome is not written yet; held with the lock so that
        # adopting this worker's unaccounted InProgress rows never races a claim.
        self.unrecorded: set[ScheduledFunctionId] = set()
        # fast_acquire: an uncontended acquire does not yield. The dispatcher's claim ahead
        # must be on the wire before the workers take the event loop to run the rows it
        # has just queued; with a yield here, claim and run alternated instead of overlapping.
        self._lock = anyio.Lock(fast_acquire=True)
        self.in_flight = 0
        """Claims on the wire now."""
        self.uncertain = False
        """A claim failed at COMMIT, which may nonetheless have taken effect."""

    @property
    def idle(self) -> bool:
        """No claim is in flight and every claimed row's outcome is written."""
        return not (self.in_flight or self.unrecorded)

    def written(self, ids: Iterable[ScheduledFunctionId]) -> None:
        """These rows are no longer this worker's to record (finished, or released)."""
        self.unrecorded.difference_update(ids)

    def forget(self) -> None:
        """The worker's run ended: what it left unrecorded is the lost-worker rescue's."""
        self.unrecorded.clear()
        self.uncertain = False

    async def claim(
        self, limit: int, now: float | None = None, *, retries: int | None = None
    ) -> list[Claimed]:
        """Pending -> InProgress for up to ``limit`` due actions, committed on return.

        ``retries=0``: the caller backs off itself. A claim run again after an unseen
        outcome would leave the first one's rows InProgress, unstarted; the next claim
        adopts them (below).
        """
        clock = self._rt.clock
        now = clock.now() if now is None else now
        driver = self._rt.driver
        worker_id = self._worker_id()

        # ``now`` decides what is due; the rows' start is read once the claim holds its
        # connection and lock (``StartTime``): a finish that committed while it waited
        # came before the rows it released.
        async def _fast(conn: AsyncConnection) -> list[Claimed]:
            room = limit - len(adopted)
            started = StartTime(clock)
            return await driver.claim_actions_fast(conn, now, room, worker_id, self.serve, started)

        async def _claim(conn: AsyncConnection) -> list[Claimed]:
            room = limit - len(adopted) - len(rows)
            started = StartTime(clock)
            return await driver.claim_actions(
                conn, now, room, worker_id, self.serve, self.hint, started
            )

        async with self._lock:
            self.in_flight += 1
            try:
                adopted = await self._adopt(limit) if self.uncertain else []
                rows: list[Claimed] = []
                try:
                    # The fast path first, as one autocommit statement where the caller
                    # backs off itself; then, if it fell short, the whole claim
                    # (``_store/claim/take.py``). Rows it committed stay in ``rows`` even if
                    # the second part fails.
                    if len(adopted) < limit and self.hint.use:
                        rows = await self._rt.transaction(
                            _fast,
                            doing="claiming actions",
                            retries=retries,
                            single_statement=retries == 0,
                        )
                    # Rows from the fast path: it read every level, and no queued row was
                    # due; the full claim could add nothing.
                    if len(adopted) < limit and not rows:
                        rows = await self._rt.transaction(
                            _claim, doing="claiming actions", retries=retries
                        )
                except DatabaseError:
                    self.uncertain = True
                    if not adopted and not rows:
                        raise
                rows = adopted + rows
                self.unrecorded.update(r.id for r in rows)
            finally:
                self.in_flight -= 1
        return rows

    async def _adopt(self, limit: int) -> list[Claimed]:
        """A claim failed at COMMIT, which may nonetheless have taken effect: its rows would
        be InProgress under our id, never started. Start them now (still at most once:
        nobody else runs a row claimed by a live worker); at most ``limit``, the rest the
        next time. ``known`` is taken before the read: a row of ours InProgress in the
        read's snapshot had its outcome written after it, so it was still in
        ``unrecorded`` then, even if the write has removed it by now."""
        worker_id = self._worker_id()

        async def _ours(conn: AsyncConnection) -> list[Claimed]:
            return await self._rt.driver.claimed_by(conn, worker_id)

        known = set(self.unrecorded)
        ours = await self._rt.transaction(_ours, doing="checking an uncertain claim")
        orphans = [r for r in ours if r.id not in known]
        adopted = orphans[:limit]
        self.uncertain = len(orphans) > limit
        if adopted:
            logger.warning(
                "%d actions claimed by a commit whose outcome was unknown were found "
                "InProgress under this worker; starting them",
                len(adopted),
            )
        return adopted

    @contextlib.asynccontextmanager
    async def claiming(self) -> AsyncIterator[None]:
        """Hold the ledger's lock for a claim (``BatchClaims``' too), counted in flight;
        its rows go into the ledger, ``handed``, before it is released."""
        async with self._lock:
            self.in_flight += 1
            try:
                yield
            finally:
                self.in_flight -= 1

    def handed(self, rows: list[Claimed]) -> None:
        """Rows a finish of this worker started (``Finisher``: a queue's next row), or a
        claim of batches: in the ledger, as any claimed row."""
        self.unrecorded.update(r.id for r in rows)

    async def claim_ids(self, ids: list[ScheduledFunctionId]) -> list[Claimed]:
        """Pending -> InProgress for these rows (inline mode: due or not), committed."""
        driver, worker_id = self._rt.driver, self._worker_id()

        async def _claim(conn: AsyncConnection) -> list[Claimed]:
            now = self._rt.clock.now()
            started = StartTime(self._rt.clock)
            return await driver.claim_ids(conn, FunctionKind.ACTION, ids, now, worker_id, started)

        rows = await self._rt.transaction(_claim, doing="claiming actions to run inline")
        self.unrecorded.update(r.id for r in rows)
        return rows

    async def release(self, rows: list[Claimed]) -> None:
        """Put rows this worker claimed and never started back to Pending, for any worker
        to run (a stop ended before a worker was free for them). Best effort: if that
        cannot be written they stay InProgress and are recorded lost later, never run."""
        if not rows:
            return
        ids = [r.id for r in rows]
        driver = self._rt.driver
        worker_id = self._worker_id()

        async def _release(conn: AsyncConnection) -> int:
            released = await driver.release_unstarted(conn, ids, worker_id)
            # Due already: idle executors elsewhere wait only for later rows (or their poll).
            await driver.notify(conn, {FunctionKind.ACTION})
            return released

        failure = "the stop was cut short"  # unless the transaction says otherwise
        released: int | None = None
        try:
            released = await self._rt.transaction(
                _release, doing="returning unstarted actions to Pending"
            )
        except Exception as exc:  # best effort: a stop must not fail here
            failure = one_line(exc)
        finally:
            if released is None:
                logger.error(
                    "%d claimed actions never started, and could not be returned to Pending "
                    "(%s); they stay InProgress and will be recorded lost, never run",
                    len(rows),
                    failure,
                )
        if released is not None:
            self.written(ids)
            self._rt.wake({FunctionKind.ACTION})
            logger.info("%d claimed actions never started; returned to Pending", released)
