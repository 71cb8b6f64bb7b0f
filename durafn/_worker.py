"""``durafn worker``: one executor as a process, with signals, logging and an exit status.

The executor does the work; this module makes it a well-behaved process: SIGTERM or SIGINT
stops it gracefully (no new claims, running functions get the grace period, the rest are
cancelled and recorded Failed), a second signal stops it at once, and the exit status says
which happened (0: clean stop or ``--exit-on-complete`` finished; 1: forced or failed).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from collections.abc import AsyncIterator
from typing import TextIO

import anyio

from . import _signals
from ._app import App
from ._executor import ExecutorOptions
from ._executor.tasks import first_of, single_errors_unwrapped
from ._signals import SIGNALS
from ._telemetry.logs import handler

logger = logging.getLogger("durafn.worker")


def configure_logging(level: str, stream: TextIO = sys.stderr, *, json: bool = False) -> None:
    """One line per record on stderr (``json``: one JSON object per line, ``_telemetry.logs``);
    durafn itself only ever logs, never prints."""
    root = logging.getLogger()
    root.addHandler(handler(stream, json))
    root.setLevel(logging.WARNING)  # other libraries: warnings only
    logging.getLogger("durafn").setLevel(level.upper())


SUPERVISOR_ENV = "DURAFN_SUPERVISOR_PID"
"""Set by the supervisor in its children's environment: the pid they belong to."""


async def _watch_supervisor(stop: anyio.Event) -> None:
    """Stop (gracefully) once the supervisor is gone: a supervisor killed with SIGKILL
    cannot forward a stop, and its children, in their own sessions, would run on as
    orphans nobody manages. Checked every second (the parent pid changes when it dies)."""
    expected = os.environ.get(SUPERVISOR_ENV)
    if not expected or not expected.isdigit():
        return
    while os.getppid() == int(expected):  # noqa: ASYNC110 - a parent dying sets no event
        await anyio.sleep(1.0)
    logger.warning("the supervisor (pid %s) is gone: stopping", expected)
    stop.set()


async def serve(app: App, options: ExecutorOptions, *, exit_on_complete: bool = False) -> int:
    """Run an executor until a signal (or, with ``exit_on_complete``, until nothing is
    due); return the process's exit status."""
    executor = app.executor(**options)
    grace = executor.config.grace_period
    stop = anyio.Event()
    forced = False

    async def _watch(received: AsyncIterator[signal.Signals]) -> None:
        nonlocal forced
        async for signum in received:
            name = signal.Signals(signum).name
            if not stop.is_set():
                logger.warning(
                    "%s received: stopping; running functions get %gs to finish (send it "
                    "again to stop at once)",
                    name,
                    grace,
                )
                stop.set()
            else:
                if not forced:
                    logger.warning("%s received again: cancelling running actions now", name)
                else:
                    logger.warning("%s received again: no longer waiting to record outcomes", name)
                forced = True
                executor.stop_now()

    # Installed before the executor starts, so that a signal during start-up is a graceful
    # stop too rather than the default (immediate death). One that came earlier still (the
    # command was being imported: see ``_signals``) means the executor never starts. On
    # the way out, the recording handler is back: a late signal cannot kill the exit.
    early = _signals.received()
    with anyio.open_signal_receiver(*SIGNALS) as received:
        if early:
            logger.warning(
                "%s received while starting: stopping before any work was claimed",
                signal.Signals(early[0]).name,
            )
            return 0
        async with single_errors_unwrapped(), anyio.create_task_group() as tg:
            tg.start_soon(_watch, received)
            tg.start_soon(_watch_supervisor, stop)
            async with executor:
                if exit_on_complete:
                    await first_of(stop.wait, executor.wait_until_idle)
                    if not stop.is_set():
                        logger.info("nothing is due: exiting (--exit-on-complete)")
                else:
                    await stop.wait()
            tg.cancel_scope.cancel()
    stats = executor.stats
    # "succeeded": the counts are of outcomes (a run retried is counted as retried, once
    # per attempt); "actions run" read as nothing ran after four retried attempts.
    logger.info(
        "stopped: %d mutations and %d actions succeeded, %d failed, %d retried, %d snoozed",
        stats["mutations"],
        stats["actions"],
        stats["failed"],
        stats["retried"],
        stats["snoozed"],
    )
    return 1 if forced else 0
