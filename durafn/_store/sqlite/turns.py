"""Whose turn it is to write to a SQLite file: durafn's writers wait in line, in the
process and across processes, instead of in SQLite's busy handler.

SQLite lets one writer in at a time and keeps no queue. A writer that finds the lock
taken sleeps in its busy handler (1, 2, 5, 10, ... then 100 ms between tries) and gets in
only if a try lands while the lock is free; a process whose transactions follow each
other (a mutation lane's batches) frees it for a millisecond or two between them. Traced
(2026-12-02) with two ``durafn worker`` processes on one file draining mutations of
0.1 s: whichever got the lock first kept it for seconds; the other's claim waited 2.6 s,
its start-up 9.5 s, and the holder's own heartbeat 4.6 s behind its own lane (late enough
for another worker to declare it lost). After a ``kill -9`` of one of two workers the
survivor and the replacement raced the same way: the replacement's first commit came
3.7-7.6 s after the kill, or later, and then whichever had the lock ran 21 to 400 batches
in a row while the other waited. Nothing waited for the dead process: the kernel frees
its locks as it dies.

So each write transaction of durafn's (``BEGIN IMMEDIATE`` to its COMMIT or ROLLBACK,
``sqlite/calls.py``) first takes the file's turn (``Turn``):

* in the process, a line: a writer that finds the turn taken waits, and the one before
  it hands the turn over as it ends (a plain lock wakes no one in order, and the thread
  that has just given it back often takes it again first);
* between processes, two byte locks on a file beside the database (``<database>-turn``,
  POSIX ``fcntl`` locks, which the kernel frees when a process dies, ``kill -9``
  included): byte 0 is held by the process whose writer has the turn, byte 1 (shared) by
  every process with a writer waiting for it. A waiter tries byte 0 after 1, 2, then
  every 4 ms (``POLL``); a process that has had the turn for ``SLICE`` while another
  waits lets that one go first. Within its slice a process hands byte 0 on with the
  turn, so that its writers in line (a heartbeat, then a batch) take one turn between
  processes, not one each.

A writer then waits for the writers before it in its process, and for another process
at most what remains of its slice and the transaction running at the end of it (a slice
each, with more processes waiting), instead of however long the busy handler's tries keep
missing. Writers that are not durafn's (the ``sqlite3`` shell, another program) still meet
durafn's in the busy handler; without ``fcntl`` (Windows) the turn is the process's line
alone.
"""

from __future__ import annotations

import errno
import logging
import os
import threading
import time
from collections import deque

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no byte locks, the process's line alone
    fcntl = None  # type: ignore[assignment]

logger = logging.getLogger("durafn.store")

SLICE = 0.05
"""Seconds a process keeps the turn while another process waits for it: about one
mutation batch (``batch_time``). Its transactions in that time follow each other without
a hand-over; a waiter's pause after a crash, or behind a busy worker, is bounded by it."""
POLL = 0.001
"""Seconds between a waiting process's first tries of the turn, doubling up to
``POLL_MOST``: the turn is idle that long at most when it passes to another process. The
sleeps cost more than the tries (a system call each): 40-80 µs of CPU a wake-up on the
2-core VM measured, so that a process waiting took 3.3% of a core trying every
millisecond, and 2.8% with the doubling (the tries of the first milliseconds, when the
turn most often comes, are kept)."""
POLL_MOST = 0.004
GIVE_WAY = 0.5
"""Seconds a process that lets another go first waits for that one to take the turn; one
that did not (stopped, say, with SIGSTOP) is not waited for again until this process has
itself waited for the turn."""


class Turn:
    """The turn on one database file, for this process's connections (``turn_for``).

    ``acquire`` and ``release`` are called on a connection's thread, by
    ``sqlite/calls.py``: a thread takes it before its ``BEGIN IMMEDIATE`` and gives it
    back at its COMMIT or ROLLBACK.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._mutex = threading.Lock()
        self._held = False
        self._line: deque[threading.Lock] = deque()
        self._fd: int | None = None
        self._mine = False
        """Whether this process holds byte 0 (the turn across processes)."""
        self._shared = fcntl is not None
        """Whether other processes are waited for (``fcntl``, and a file beside the
        database this process may lock)."""
        self._since = -SLICE
        """When this process last began to have the turn after another process (the
        monotonic clock): it gives way once it has had it for ``SLICE``."""
        self._polite = True

    def acquire(self, timeout: float) -> bool:
        """Wait for the turn, up to ``timeout`` seconds in all; whether it was taken."""
        deadline = time.monotonic() + timeout
        if not self._join_line(timeout):
            return False
        try:
            if self._shared and not self._mine and not self._across(deadline):
                self.release()
                return False
        except BaseException:
            self.release()
            raise
        return True

    def release(self) -> None:
        """Give the turn back: to the next writer of this process in line, if any. Within
        this process's slice, the turn across processes goes along with it (a heartbeat
        and a batch waiting in line take one turn, not one each)."""
        with self._mutex:
            try:
                if self._mine and not (self._line and time.monotonic() - self._since < SLICE):
                    self._mine = False
                    self._unlock(0)
            finally:
                if self._line:
                    self._line.popleft().release()  # handed over: ``_held`` stays True
                else:
                    self._held = False

    # -- in the process ----------------------------------------------------------------

    def _join_line(self, timeout: float) -> bool:
        with self._mutex:
            if not self._held:
                self._held = True
                return True
            waiter = threading.Lock()
            waiter.acquire()
            self._line.append(waiter)
        if waiter.acquire(timeout=timeout):
            return True  # handed over: ``_held`` stayed True
        with self._mutex:
            try:
                self._line.remove(waiter)
            except ValueError:  # handed over as the wait ended
                return True
        return False

    # -- across processes --------------------------------------------------------------

    def _across(self, deadline: float) -> bool:
        """Take byte 0 for this process, in turn with other processes (module docstring);
        False if ``deadline`` passed first."""
        fd = self._fd if self._fd is not None else self._open()
        if fd is None:
            return True
        try:
            return self._wait_across(fd, deadline)
        except OSError as exc:  # not a lock held: a file system without byte locks
            logger.debug("no turn across processes on %s: %s", self.path, exc)
            self._shared = False
            return True

    def _wait_across(self, fd: int, deadline: float) -> bool:
        if time.monotonic() - self._since >= SLICE:
            if self._polite and self._others_wait():
                self._polite = self._give_way(min(deadline, time.monotonic() + GIVE_WAY))
            self._since = time.monotonic()
        if self._try(0):
            self._mine = True
            return True
        fcntl.lockf(fd, fcntl.LOCK_SH, 1, 1)  # waiting (blocks only while one looks)
        pause = POLL
        try:
            while time.monotonic() < deadline:
                time.sleep(pause)
                pause = min(2 * pause, POLL_MOST)
                if self._try(0):
                    self._mine = True
                    self._since = time.monotonic()
                    self._polite = True
                    return True
            return False
        finally:
            self._unlock(1)

    def _others_wait(self) -> bool:
        """Whether another process holds byte 1: a writer of its waits for the turn."""
        if not self._try(1):
            return True
        self._unlock(1)
        return False

    def _give_way(self, until: float) -> bool:
        """Wait for the waiting processes to take the turn; whether they did by ``until``."""
        while time.monotonic() < until:
            time.sleep(POLL)
            if not self._others_wait():
                return True
        return False

    def _try(self, byte: int) -> bool:
        assert self._fd is not None
        try:
            fcntl.lockf(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, byte)
        except OSError as exc:
            if exc.errno in (errno.EACCES, errno.EAGAIN):  # another process has it
                return False
            raise
        return True

    def _unlock(self, byte: int) -> None:
        assert self._fd is not None
        fcntl.lockf(self._fd, fcntl.LOCK_UN, 1, byte)

    def _open(self) -> int | None:
        """The file beside the database that the byte locks are on, opened once per
        process and never closed: closing any descriptor of a file drops all of the
        process's POSIX locks on it."""
        name = f"{self.path}-turn"
        with _files_lock:
            fd = _files.get(name)
            if fd is None:
                try:
                    fd = os.open(name, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
                except OSError as exc:
                    # A directory this process may not write in, say: its writers still
                    # wait in line with each other, and meet other processes' in SQLite's
                    # busy handler, as any writer that is not durafn's does.
                    logger.debug("no turn across processes on %s: %s", self.path, exc)
                    self._shared = False
                    return None
                _share_as_database(fd, self.path)
                _files[name] = fd
        self._fd = fd
        return fd


def _share_as_database(fd: int, path: str) -> None:
    """Give a lock file this process owns the database file's permissions (as SQLite
    does its ``-wal`` and ``-shm``): every user who may write the database may take turns."""
    try:
        if os.fstat(fd).st_uid == os.geteuid():
            os.fchmod(fd, os.stat(path).st_mode & 0o666)
    except OSError as exc:  # the file stays as it was made: the owner's turns still work
        logger.debug("could not set the permissions of %s-turn: %s", path, exc)


_turns: dict[str, Turn] = {}
_turns_lock = threading.Lock()
_files: dict[str, int] = {}
"""The lock files' descriptors, by name: kept across a fork (a child's locks are its own;
closing the descriptor it inherited would drop them)."""
_files_lock = threading.Lock()


def turn_for(path: str) -> Turn:
    """The turn of this process's connections to the database file at ``path`` (resolved:
    one turn for every URL that names the file)."""
    with _turns_lock:
        turn = _turns.get(path)
        if turn is None:
            turn = _turns[path] = Turn(path)
        return turn


def _forget_turns() -> None:
    """In a forked child: a turn that a thread of the parent had would stay taken (the
    thread is not in the child); the child's engines start with turns of their own. Byte
    locks are not inherited by a child."""
    global _turns_lock, _files_lock
    _turns_lock = threading.Lock()
    _files_lock = threading.Lock()
    _turns.clear()


if hasattr(os, "register_at_fork"):  # not on Windows, which has no fork
    os.register_at_fork(after_in_child=_forget_turns)
