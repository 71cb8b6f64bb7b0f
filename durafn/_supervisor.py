"""``durafn worker -n K`` / ``--pool``: worker processes under one supervisor.

Each child is an ordinary ``durafn worker`` (same arguments, without ``-n`` or ``--pool``;
a pool's child gets its ``--queues``), so a worker behaves the same under the supervisor
as on its own. The supervisor:

* starts the children in their own session, so a terminal's Ctrl-C reaches only the
  supervisor, which forwards it once (the children would otherwise see it twice and read
  it as "stop at once");
* forwards SIGTERM/SIGINT as SIGTERM; a second signal is forwarded too (the children then
  stop at once), a third sends SIGKILL;
* restarts a child that dies unexpectedly (crash, ``kill -9``, out of memory) after a
  backoff, and logs it. What that child had InProgress is recorded lost by the others;
* gives up (exit 1) on a child that keeps dying right after it starts: that is a
  configuration error (schema not migrated, database unreachable), not a crash;
* is watched by its children: one whose supervisor is gone (killed with SIGKILL, which
  it cannot forward) stops gracefully within a second rather than run on as an orphan;
* exits 0 when every child ended cleanly (a clean stop, or ``--exit-on-complete`` done);
  a crash it recovered from by restarting does not count against that.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from collections.abc import AsyncIterator, Sequence

import anyio
import anyio.abc

from . import _signals

logger = logging.getLogger("durafn.supervisor")

_RESTART_DELAY = 1.0
_RESTART_DELAY_MAX = 30.0
_STABLE_AFTER = 60.0
"""A child that ran this long before dying restarts after the shortest delay again."""
_EARLY = 5.0
_EARLY_DEATHS = 5
"""A slot whose child dies within _EARLY seconds this many times in a row is a
configuration problem (a bad schema, an unreachable database), not a crash: give up."""


class Supervisor:
    def __init__(self, children: Sequence[Sequence[str]]) -> None:
        """``children``: the ``durafn worker`` arguments of each child process."""
        # Through the command's entry point, so that a child records a signal from its
        # first instant (``_signals``) instead of dying of it during its imports.
        self.commands = [[sys.executable, "-m", "_durafn_cli", "worker", *a] for a in children]
        self.processes = len(children)
        self.children: dict[int, anyio.abc.Process] = {}
        self.stopping = False
        self._stopped = anyio.Event()
        self.signals = 0
        self.failed = 0

    async def run(self) -> int:
        early = _signals.received()
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as received:
            if early:  # before it started: start no children
                logger.warning(
                    "%s received while starting: no worker processes started",
                    signal.Signals(early[0]).name,
                )
                return 0
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._forward, received)
                async with anyio.create_task_group() as children:
                    for slot in range(self.processes):
                        children.start_soon(self._keep_running, slot)
                tg.cancel_scope.cancel()
        logger.info("all %d worker processes have exited", self.processes)
        return 1 if self.failed or self.signals > 1 else 0

    async def _keep_running(self, slot: int) -> None:
        delay = _RESTART_DELAY
        early_deaths = 0
        while not self.stopping:
            started = anyio.current_time()
            process = await anyio.open_process(
                self.commands[slot],
                stdin=None,
                stdout=None,
                stderr=None,
                start_new_session=True,
                # A child stops by itself if this process dies without stopping it.
                env={**os.environ, "DURAFN_SUPERVISOR_PID": str(os.getpid())},
            )
            self.children[slot] = process
            if self.stopping:  # the signal came while this child was being started
                process.send_signal(signal.SIGTERM)
            logger.info("worker process %d started (pid %d)", slot, process.pid)
            code = await process.wait()
            del self.children[slot]
            if code == 0 or (self.stopping and code == -signal.SIGTERM):
                # A clean stop, --exit-on-complete done, or a child our SIGTERM reached
                # before it could install its handler (still starting up).
                return
            if self.stopping:
                self.failed += 1
                logger.warning("worker process %d (pid %d) exited with %d", slot, process.pid, code)
                return
            ran_for = anyio.current_time() - started
            early_deaths = early_deaths + 1 if ran_for < _EARLY else 0
            if early_deaths >= _EARLY_DEATHS:
                self.failed += 1
                logger.error(
                    "worker process %d died within %gs of starting %d times in a row (%s); "
                    "giving up: fix the error it logged, then start again",
                    slot,
                    _EARLY,
                    early_deaths,
                    _describe(code),
                )
                self._stop_all()
                return
            if ran_for > _STABLE_AFTER:
                delay = _RESTART_DELAY
            logger.warning(
                "worker process %d (pid %d) died (%s); restarting it in %.0fs",
                slot,
                process.pid,
                _describe(code),
                delay,
            )
            with anyio.move_on_after(delay):
                await self._stopped.wait()
            delay = min(delay * 2, _RESTART_DELAY_MAX)

    async def _forward(self, received: AsyncIterator[signal.Signals]) -> None:
        async for signum in received:
            self.signals += 1
            sent = signal.SIGKILL if self.signals > 2 else signal.SIGTERM
            logger.warning(
                "%s received: sending %s to %d worker processes",
                signal.Signals(signum).name,
                sent.name,
                len(self.children),
            )
            self._stop_all(sent)

    def _stop_all(self, sent: signal.Signals = signal.SIGTERM) -> None:
        self.stopping = True
        self._stopped.set()
        for process in list(self.children.values()):
            if process.returncode is None:
                process.send_signal(sent)


def _describe(code: int) -> str:
    if code < 0:
        return f"killed by {signal.Signals(-code).name}"
    return f"exit status {code}"


async def supervise(children: Sequence[Sequence[str]]) -> int:
    return await Supervisor(children).run()
