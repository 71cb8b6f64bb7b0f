"""Signals that arrive before a command can handle them, and after it has stopped.

The ``durafn`` command starts by recording SIGTERM and SIGINT (``_durafn_cli``, outside
this package so that it runs before the imports). What the record means depends on the
command. A worker (or a supervisor) reads it as a stop asked for before it started
(``received``), and goes on recording after it has stopped, so that a late signal cannot
kill a process that is only finishing its exit (``record``). Every other command
``release``s it: default handling again, and what was recorded is raised anew, as though
it had just arrived.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType
from typing import Any

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class _Recorder:
    """The same handler as ``_durafn_cli.EarlySignals``, for processes started otherwise
    (``python -m durafn``)."""

    def __init__(self) -> None:
        self.received: list[int] = []

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        self.received.append(signum)


def _recorder() -> Any:
    handler = signal.getsignal(signal.SIGTERM)
    return handler if isinstance(getattr(handler, "received", None), list) else None


def _main_thread() -> bool:
    """Whether handlers may be set here: only the main thread may (a command invoked from
    another thread, by an embedding or a test runner, leaves the process's own alone)."""
    return threading.current_thread() is threading.main_thread()


def record() -> None:
    """Record SIGTERM and SIGINT from now on, unless they already are."""
    if _recorder() is None and _main_thread():
        recorder = _Recorder()
        for signum in SIGNALS:
            signal.signal(signum, recorder)


def received() -> list[int]:
    """The record itself (empty if nothing records): take it *before* installing another
    handler, and read it after, so that no signal falls between the two."""
    recorder = _recorder()
    return recorder.received if recorder is not None else []


def release() -> None:
    """Default handling again; the signals recorded are raised anew."""
    recorder = _recorder()
    if recorder is None or not _main_thread():
        return
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for signum in recorder.received:
        signal.raise_signal(signum)
