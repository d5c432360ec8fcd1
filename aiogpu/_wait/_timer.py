"""A precise timer thread: call a (thread-safe, non-blocking) callback at a given time.

Event-loop timers are too coarse for the wake engine: asyncio and libuv round sleeps up to
whole milliseconds. An OS thread sleeping on a condition wakes within tens of µs of its
deadline, so the ``auto`` strategy parks here and lets this thread poke the loop shortly before
the predicted completion; the thread asks for precise sleeps (``_daemon.precise_sleeps``). The
callbacks only schedule work on a loop (``Backend.waker``); they never block, and an error one
raises is reported without ending the thread (``_daemon``).

One thread per process, started on first use and gone after ``_daemon.IDLE_SECONDS`` without
timers.
"""

from __future__ import annotations

import heapq
import itertools
import time
from typing import TYPE_CHECKING

from .._daemon import Daemon
from .._per_process import PerProcess

if TYPE_CHECKING:
    from collections.abc import Callable

    from .._daemon import Next


class Timer:
    def __init__(self) -> None:
        self._daemon = Daemon("aiogpu-timer", self._take, precise=True)
        self._lock = self._daemon.lock
        self._heap: list[tuple[float, int, Callable[[], object]]] = []
        self._live: set[int] = set()  # handles neither fired nor cancelled
        self._serial = itertools.count()

    def call_at(self, when: float, callback: Callable[[], object]) -> int:
        """Run ``callback`` on the timer thread at ``time.perf_counter() == when``; return a handle."""
        with self._lock:
            handle = next(self._serial)
            self._live.add(handle)
            heapq.heappush(self._heap, (when, handle, callback))
            # A timer that is not the earliest needs no wake: while the heap holds one, the
            # thread runs, waiting for an earlier deadline, after which it looks again.
            if self._heap[0][1] == handle:
                self._daemon.wake()
            return handle

    def cancel(self, handle: int) -> None:
        """Forget ``handle`` if it has not fired yet (its heap entry is dropped lazily).

        No lock: ``set.discard`` is atomic, a callback the thread has taken runs either way, and
        a finalizer may cancel (a driving wait's coroutine collected with its loop) on a thread
        that holds the lock, interrupted by the garbage collector."""
        self._live.discard(handle)

    def _take(self) -> Next:  # with self._lock held: the callback due, or the wait until one is
        heap = self._heap
        while heap and heap[0][1] not in self._live:
            heapq.heappop(heap)
        if not heap:
            return None
        delay = heap[0][0] - time.perf_counter()
        if delay > 0:
            return delay
        _, handle, callback = heapq.heappop(heap)
        self._live.discard(handle)
        return callback


timer = PerProcess(Timer).get
