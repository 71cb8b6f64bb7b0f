"""Waking the executors, in every process, for rows a finish here freed (``after=``).

On PostgreSQL the hot finish deletes the edges of the rows it finished and returns the
rows waiting for them (``durafn_release``, ``_store/schema/dependencies.py``). After the
commit, ``FreedRows`` looks at those rows (``wake_freed``): one with an edge nobody is
deleting is not free, and the finish that deletes that edge later will tell; for the
others it waits for the finishes in flight that delete their edges, then a row with none
left is free, and every executor is told (a NOTIFY, and this process's loops at once).
In a fan-in of 10,000 that is one cheap statement per look (they coalesce while one
runs), and a wait only for the last few finishes.

Why after the commit and not in the finish: which finish deletes a row's last edge is
known only once the finishes deleting its last edges have committed. Inside its
transaction a finish sees another's edge still there, and an edge nobody has touched
yet may be deleted and committed by another finish before this one commits (the
trigger's route, say, whose NOTIFY then comes too early). After the commit, an edge
nobody is deleting will be deleted, and its finish committed, later than this one; an
edge being deleted is waited for. Up to version 18 the finish sent the NOTIFY for any
edge it deleted, so every finish of a fan-in's rows woke every executor to claim for
nothing.

Measured (``benchmarks.workflows``, a fan-in of 10,000 no-op mutations against a plain
drain, PostgreSQL, alternating runs of 15 rounds): see ``Runtime.wake_on_finish``.

Lost only if this process dies between the commit and the look, or the look fails: the
executors' poll then starts the rows, as after any wake-up lost.
"""

from __future__ import annotations

import logging

import anyio
from sqlalchemy.ext.asyncio import AsyncConnection

from .._errors import DatabaseError
from .._runtime import Runtime
from .wakeups import KINDS

logger = logging.getLogger("durafn.executor")


class FreedRows:
    """Looks at ``Runtime.maybe_freed`` after the commits that noted them: ``run`` while
    the executor runs (``noted`` is its listener), ``flush`` at its stop, after each round
    of ``run_until_idle`` and after inline runs."""

    def __init__(self, runtime: Runtime) -> None:
        self._rt = runtime
        self._noted: anyio.Event | None = None

    def noted(self) -> None:
        if self._noted is not None:
            self._noted.set()

    async def run(self) -> None:
        """Look each time rows are noted, until cancelled."""
        while True:
            self._noted = anyio.Event()
            if not self._rt.maybe_freed:
                await self._noted.wait()
            await self.flush()

    async def flush(self) -> None:
        """Look at the rows noted so far: wait for the finishes deleting their edges, and
        wake every executor if one has none left."""
        rt = self._rt
        if not rt.maybe_freed:
            return
        ids, rt.maybe_freed = rt.maybe_freed, set()

        async def _look(conn: AsyncConnection) -> int:
            return await rt.driver.wake_freed(conn, ids)

        try:
            freed = await rt.transaction(
                _look, doing="looking for rows a finish freed", single_statement=True
            )
        except DatabaseError as exc:  # the executors' poll starts them
            logger.warning("could not look for rows a finish freed: %s", exc)
            return
        if freed:
            rt.wake(KINDS)  # here at once; the NOTIFY tells the others
