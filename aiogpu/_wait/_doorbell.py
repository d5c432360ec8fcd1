"""The doorbell: GPU streams ring it through a CUDA host function that runs no Python.

The ``callback`` strategy enqueues, behind the work it waits for, a host function that is the C
library's ``sem_post`` on one process-wide POSIX semaphore. A host function that takes the GIL
can deadlock against the driver's lock (numba-cuda #317, TensorRT-LLM #15855): this one never
touches Python, so it cannot. One doorbell thread waits in ``sem_timedwait`` (through ctypes, so
without the GIL) and, at each ring (and once a second without one), pokes every watcher that
armed it; the watchers then look at their streams (a ring does not say which stream rang).

Host functions are never called after a sticky context error, so a wait must not rely on the
doorbell alone: the watcher keeps querying armed streams on its back-off schedule (the
watchdog), which surfaces the error as ``CudaError``.
"""

from __future__ import annotations

import ctypes
import time
from typing import TYPE_CHECKING

from .._daemon import Daemon
from .._per_process import PerProcess

if TYPE_CHECKING:
    from collections.abc import Callable

    from .._daemon import Next

_SEM_T_SIZE = 64  # sizeof(sem_t) is 32 on 64-bit glibc; leave room


class _Timespec(ctypes.Structure):
    _fields_ = (("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long))


class Doorbell:
    def __init__(self) -> None:
        self._libc = ctypes.CDLL(None, use_errno=True)
        self._semaphore = ctypes.create_string_buffer(_SEM_T_SIZE)
        if self._libc.sem_init(self._semaphore, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "sem_init failed")
        self._daemon = Daemon("aiogpu-doorbell", self._take)
        self._lock = self._daemon.lock
        self._listeners: dict[Callable[[], bool], None] = {}

    @property
    def address(self) -> int:
        """The ``sem_t *`` to pass as the host function's argument."""
        return ctypes.addressof(self._semaphore)

    @property
    def function(self) -> int:
        """The address of the C library's ``sem_post``: the host function itself."""
        address = ctypes.cast(self._libc.sem_post, ctypes.c_void_p).value
        assert address is not None
        return address

    def ring(self) -> None:
        """Ring from Python (the simulated driver's host functions)."""
        self._libc.sem_post(self._semaphore)

    def listen(self, poke: Callable[[], bool]) -> None:
        """Call ``poke`` (thread-safe, non-blocking) at every ring, and once a second without one,
        until :meth:`ignore`, or until it returns ``False`` (its loop is gone: closed with the
        wait pending, it never ignores)."""
        with self._lock:
            self._listeners[poke] = None
            self._daemon.wake()

    def ignore(self, poke: Callable[[], bool]) -> None:
        # No lock: ``dict.pop`` is atomic, and a finalizer may ignore (a driving wait's coroutine
        # collected with its loop) on a thread that holds the lock, interrupted by the collector.
        self._listeners.pop(poke, None)

    def _take(self) -> Next:  # with self._lock held
        # With nobody listening the thread waits for a listener, and exits after a while.
        return self._round if self._listeners else None

    def _round(self) -> None:
        # At a ring, and at least once a second: a loop closed with its wait pending right after
        # the last ring is forgotten all the same (its poke fails), and a live one only sweeps
        # once more.
        self._wait(1.0)
        self._poke_listeners()

    def _poke_listeners(self) -> None:
        """A method of its own: the thread then waits for the next ring (up to a second) with no
        listener in its frame, which would keep its watcher alive, and a loop dropped with waits
        pending along with it."""
        with self._lock:
            listeners = list(self._listeners)
        for poke in listeners:
            try:
                if not poke():
                    self.ignore(poke)
            except Exception:  # a poke only schedules; never let it kill the doorbell
                pass

    def _wait(self, timeout: float) -> None:
        """Wait for a ring, at most ``timeout`` (GIL released). Consecutive rings coalesce."""
        deadline = time.time() + timeout
        when = _Timespec(int(deadline), int((deadline % 1) * 1e9))
        if self._libc.sem_timedwait(self._semaphore, ctypes.byref(when)) != 0:
            return  # timed out (or interrupted): the listeners are poked all the same
        while self._libc.sem_trywait(self._semaphore) == 0:  # drain: one poke serves them all
            pass


doorbell = PerProcess(Doorbell).get
