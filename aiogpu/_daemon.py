"""Every thread aiogpu starts: named daemon threads, started on demand, gone when idle.

A :class:`Daemon` owns the pattern the timer, the doorbell, the waiter pool, the armer and the
pinned-memory freer share, so that its lock discipline lives in one place:

- The owner keeps its state under ``Daemon.lock`` and calls :meth:`Daemon.wake` (lock held)
  when it has work: a waiting thread is notified, or, if none runs, one is started.
- A thread asks the owner's ``take`` (lock held) what to do: a *job* (a callable, run with the
  lock released), a number of seconds to wait for a ``wake`` before asking again (a timer's
  next deadline), or ``None``: nothing. A thread that has had nothing to do for
  ``idle_seconds`` exits, under the lock, so the next ``wake`` starts another: an idle process
  holds no thread of aiogpu's. ``import aiogpu`` starts none.
- A job that raises does not end its thread: the error goes to ``threading.excepthook``
  (reported as any thread's would be) and the thread takes its next job. Jobs only schedule
  work on loops or call the driver; the errors they expect they catch themselves.
- A thread keeps no reference to a job it has run while it waits: an idle thread must not keep
  alive what the job referred to (an event the user dropped, a loop closed with waits pending).
- Threads do not survive ``fork()``: a Daemon lives inside an object made with
  ``PerProcess``, which a forked child makes anew, with no thread, and no parent's state.
"""

from __future__ import annotations

import ctypes
import functools
import sys
import threading
import time
from collections import deque
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import TypeAlias

    #: What a thread does next: run a job, wait this many seconds for a ``wake``, or nothing.
    Next: TypeAlias = Callable[[], object] | float | None

IDLE_SECONDS = 10.0
PR_SET_TIMERSLACK = 29  # <linux/prctl.h>
TIMER_SLACK_NS = 1_000


@functools.cache
def _libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


def precise_sleeps() -> None:
    """Let the calling thread's sleeps end within ``TIMER_SLACK_NS`` of their deadline (Linux;
    elsewhere nothing). Linux lets a thread's sleeps end up to 50 µs late by default; aiogpu's
    timing threads sleep to a predicted completion."""
    libc = _libc() if sys.platform.startswith("linux") else None
    if libc is not None:
        libc.prctl(PR_SET_TIMERSLACK, ctypes.c_ulong(TIMER_SLACK_NS), ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0))


class Daemon:
    """Named daemon threads that run ``take``'s jobs, started on demand, gone when idle.

    Args:
        name: The threads' name (``name-1``, ``name-2``... if ``numbered``).
        take: Called with :attr:`lock` held; says what a thread does next (module docstring).
        idle_seconds: A thread with nothing to do for this long exits.
        precise: The threads ask for precise sleeps (``precise_sleeps``).
        numbered: Several threads may run: each gets a serial number in its name.
    """

    def __init__(
        self,
        name: str,
        take: Callable[[], Next],
        *,
        idle_seconds: float = IDLE_SECONDS,
        precise: bool = False,
        numbered: bool = False,
    ) -> None:
        self._name = name
        self._take = take
        self._idle_seconds = idle_seconds
        self._precise = precise
        self._numbered = numbered
        self.lock = threading.Lock()
        self._changed = threading.Condition(self.lock)  # notified: ask ``take`` again
        self._exited = threading.Condition(self.lock)  # notified: a thread exited
        self._threads = 0
        self._waiting = 0
        self._serial = 0
        self._stop_idle = False

    @property
    def threads(self) -> int:
        """Threads running (started and not exited)."""
        return self._threads

    @property
    def waiting(self) -> int:
        """Threads waiting for a ``wake`` (idle, or until a deadline ``take`` gave)."""
        return self._waiting

    def wake(self) -> None:
        """With :attr:`lock` held: one thread asks ``take`` again; one is started if none runs.
        A running thread that is not waiting asks once its job is over."""
        if self._waiting:
            self._changed.notify()
        elif not self._threads:
            self.start()

    def notify(self) -> None:
        """With :attr:`lock` held: one waiting thread (if any) asks ``take`` again."""
        self._changed.notify()

    def start(self) -> None:
        """With :attr:`lock` held: start one more thread (the owner bounds how many)."""
        self._serial += 1
        name = f"{self._name}-{self._serial}" if self._numbered else self._name
        self._threads += 1
        try:
            threading.Thread(target=self._run, name=name, daemon=True).start()
        except BaseException:
            self._threads -= 1
            raise

    def stop_idle(self, until: Callable[[], bool], timeout: float) -> bool:
        """Make threads with nothing to do exit now, and wait (at most ``timeout``) for ``until``
        (asked with :attr:`lock` held at each exit) to hold: tests count threads with it."""
        with self.lock:
            self._stop_idle = True
            self._changed.notify_all()
            try:
                return self._exited.wait_for(until, timeout)
            finally:
                self._stop_idle = False

    def _run(self) -> None:
        if self._precise:
            precise_sleeps()
        while (job := self._next()) is not None:
            try:
                job()
            except Exception:  # a job's error is reported; the thread goes on
                _report()
            # The thread may wait for long next: keep nothing alive that the job referred to.
            del job

    def _next(self) -> Callable[[], object] | None:
        """The next job, or ``None``: this thread has exited (it was idle for long enough)."""
        with self.lock:
            try:
                return self._wait_for_job()
            except BaseException:  # ``take`` failed: the thread ends, and is counted out
                self._exit()
                raise

    def _wait_for_job(self) -> Callable[[], object] | None:  # with self.lock held
        idle_until = None
        while True:
            next_ = self._take()
            if next_ is None:
                now = time.monotonic()
                if idle_until is None:
                    idle_until = now + self._idle_seconds
                if self._stop_idle or now >= idle_until:
                    self._exit()
                    return None
                timeout = idle_until - now
            elif isinstance(next_, float):
                idle_until = None
                timeout = next_
            else:
                return next_
            self._waiting += 1
            try:
                self._changed.wait(timeout)
            finally:
                self._waiting -= 1

    def _exit(self) -> None:  # with self.lock held
        self._threads -= 1
        self._exited.notify_all()


def _report() -> None:
    """Hand the exception being handled to ``threading.excepthook``, as if it ended the thread."""
    exc_type, exc, traceback = sys.exc_info()
    assert exc_type is not None
    threading.excepthook(threading.ExceptHookArgs((exc_type, exc, traceback, threading.current_thread())))


class Executor:
    """Runs callables one at a time, in the order submitted, on one idle-exiting thread."""

    def __init__(self, name: str, *, idle_seconds: float = IDLE_SECONDS) -> None:
        self._jobs: deque[Callable[[], object]] = deque()
        self._daemon = Daemon(name, self._take, idle_seconds=idle_seconds)

    def submit(self, job: Callable[[], object]) -> None:
        """Run ``job`` on the thread after the jobs submitted before it; an error it raises is
        reported by the thread, never raised here."""
        with self._daemon.lock:
            self._jobs.append(job)
            self._daemon.wake()

    def _take(self) -> Next:  # with the lock held
        return self._jobs.popleft() if self._jobs else None
