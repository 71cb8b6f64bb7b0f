"""``durafn worker -n K``: K worker processes under one supervisor.

Each child is an ordinary ``durafn worker`` (same arguments, without ``-n``), so a worker
behaves the same under the supervisor as on its own. The supervisor:

* starts the children in their own session, so a terminal's Ctrl-C reaches only the
  supervisor, which forwards it once (the children would otherwise see it twice and read
  it as "stop at once");
* forwards SIGTERM/SIGINT as SIGTERM; a second signal is forwarded too (the children then
  stop at once), a third sends SIGKILL;
* restarts a child that dies unexpectedly (crash, ``kill -9``, out of memory) after a
  backoff, and logs it. What that child had InProgress is recorded lost by the others;
* exits 0 when every child exited 0 (a clean stop, or ``--exit-on-complete`` done).
"""

from __future__ import annotations

import logging
import signal
import sys
from collections.abc import AsyncIterator, Sequence

import anyio
import anyio.abc

logger = logging.getLogger("durafn.supervisor")

_RESTART_DELAY = 1.0
_RESTART_DELAY_MAX = 30.0
_STABLE_AFTER = 60.0
"""A child that ran this long before dying restarts after the shortest delay again."""


class Supervisor:
    def __init__(self, worker_args: Sequence[str], processes: int) -> None:
        self.command = [sys.executable, "-m", "durafn", "worker", *worker_args]
        self.processes = processes
        self.children: dict[int, anyio.abc.Process] = {}
        self.stopping = False
        self._stopped = anyio.Event()
        self.signals = 0
        self.failed = 0

    async def run(self) -> int:
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as received:
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
        while not self.stopping:
            started = anyio.current_time()
            process = await anyio.open_process(
                self.command, stdin=None, stdout=None, stderr=None, start_new_session=True
            )
            self.children[slot] = process
            logger.info("worker process %d started (pid %d)", slot, process.pid)
            code = await process.wait()
            del self.children[slot]
            if code == 0:
                return  # a clean stop, or --exit-on-complete found nothing left
            if self.stopping:
                self.failed += 1
                logger.warning("worker process %d (pid %d) exited with %d", slot, process.pid, code)
                return
            if anyio.current_time() - started > _STABLE_AFTER:
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
            self.stopping = True
            self._stopped.set()
            sent = signal.SIGKILL if self.signals > 2 else signal.SIGTERM
            logger.warning(
                "%s received: sending %s to %d worker processes",
                signal.Signals(signum).name,
                sent.name,
                len(self.children),
            )
            for process in list(self.children.values()):
                if process.returncode is None:
                    process.send_signal(sent)


def _describe(code: int) -> str:
    if code < 0:
        return f"killed by {signal.Signals(-code).name}"
    return f"exit status {code}"


async def supervise(worker_args: Sequence[str], processes: int) -> int:
    return await Supervisor(worker_args, processes).run()
