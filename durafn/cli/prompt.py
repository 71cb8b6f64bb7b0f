"""A yes/no question on the terminal that the first Ctrl-C always ends."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import sys
import threading
from collections.abc import Iterator

import click

YES = frozenset({"y", "yes"})
NO = frozenset({"", "n", "no"})


def confirm(question: str) -> None:
    """Ask `question [y/N]` on stderr and read the answer from stdin; anything but yes,
    Ctrl-C and end of input raise `click.Abort` ("Aborted!", exit 1).

    Why not `click.confirm`: its `input()` could miss a Ctrl-C. Python's C signal handler
    only sets a flag that the interpreter checks between bytecodes; a SIGINT that lands
    after the last check and before `read()` blocks leaves the read waiting, and the next
    key is taken as the answer. Under CPU load that window was hit in about one run in
    three of the terminal test. Here the signal also writes a byte to a wakeup pipe, and
    the wait is a `select` on stdin and that pipe: a signal arriving at any moment ends
    the wait, and the interpreter then raises KeyboardInterrupt."""
    while True:
        click.echo(f"{question} [y/N]: ", nl=False, err=True)
        try:
            answer = _answer()
        except KeyboardInterrupt:
            click.echo(err=True)
            raise click.Abort() from None
        if answer is None:  # end of input: nobody said yes
            click.echo(err=True)
            raise click.Abort()
        answer = answer.strip().lower()
        if answer in YES:
            return
        if answer in NO:
            raise click.Abort()
        click.echo("Error: answer y or n.", err=True)


def _answer() -> str | None:
    try:
        fd = sys.stdin.fileno()
    except (OSError, ValueError):  # a stream without a descriptor (click's test runner)
        fd = None
    # select() on a terminal and set_wakeup_fd() need POSIX and the main thread.
    if (
        fd is None
        or os.name != "posix"
        or threading.current_thread() is not threading.main_thread()
    ):
        return sys.stdin.readline() or None
    with _wakeup_pipe() as wakeup:
        return _read_line(fd, wakeup)


@contextlib.contextmanager
def _wakeup_pipe() -> Iterator[int]:
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    previous = signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
    try:
        yield read_end
    finally:
        signal.set_wakeup_fd(previous)
        os.close(read_end)
        os.close(write_end)


def _read_line(fd: int, wakeup: int) -> str | None:
    """One line from `fd`, or None at end of input. A signal that arrived before the
    pipe was set is raised by the interpreter at its next check, before `select` is
    reached; one that arrives later makes `wakeup` readable."""
    data = b""
    while not data.endswith(b"\n"):
        ready, _, _ = select.select([fd, wakeup], [], [])
        if wakeup in ready:
            os.read(wakeup, 64)
            continue  # the handler runs now, between bytecodes: KeyboardInterrupt
        # A byte at a time: the next line (typed ahead, or piped) is the next question's.
        chunk = os.read(fd, 1)
        if not chunk:
            return data.decode(errors="replace") if data else None
        data += chunk
    return data.decode(errors="replace")
