"""A precise timer thread: call a (thread-safe, non-blocking) callback at a given time.

Event-loop timers are too coarse for the wake engine: asyncio and libuv round sleeps up to
whole milliseconds. An OS thread sleeping on a condition wakes within tens of µs of its
deadline, so the ``auto`` strategy parks here and lets this thread poke the loop shortly before
the predicted completion. Linux lets a thread's sleeps end up to 50 µs late by default (timer
slack); aiogpu's own timing threads ask for 1 µs (``precise_sleeps``). The callbacks only
schedule work on a loop (``Backend.waker``); they never block and never raise into this thread.

One thread per process, started on first use and gone after ``IDLE_SECONDS`` without timers.
"""

from __future__ import annotations

import ctypes
import functools
import heapq
import itertools
import sys
import threading
import time
from typing import TYPE_CHECKING

from ._per_process import PerProcess

if TYPE_CHECKING:
    from collections.abc import Callable

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
    elsewhere nothing). Only for aiogpu's own threads, which sleep to a predicted completion."""
    libc = _libc() if sys.platform.startswith("linux") else None
    if libc is not None:
        libc.prctl(PR_SET_TIMERSLACK, ctypes.c_ulong(TIMER_SLACK_NS), ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0))


class Timer:
    def __init__(self, name: str = "aiogpu-timer") -> None:
        self._name = name
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._heap: list[tuple[float, int, Callable[[], object]]] = []
        self._live: set[int] = set()  # handles neither fired nor cancelled
        self._serial = itertools.count()
        self._running = False

    def call_at(self, when: float, callback: Callable[[], object]) -> int:
        """Run ``callback`` on the timer thread at ``time.perf_counter() == when``; return a handle."""
        with self._lock:
            handle = next(self._serial)
            self._live.add(handle)
            heapq.heappush(self._heap, (when, handle, callback))
            if not self._running:
                self._running = True
                threading.Thread(target=self._run, name=self._name, daemon=True).start()
            elif self._heap[0][1] == handle:
                self._changed.notify()
            return handle

    def cancel(self, handle: int) -> None:
        """Forget ``handle`` if it has not fired yet (its heap entry is dropped lazily).

        No lock: ``set.discard`` is atomic, a callback the thread has taken runs either way, and
        a finalizer may cancel (a driving wait's coroutine collected with its loop) on a thread
        that holds the lock, interrupted by the garbage collector."""
        self._live.discard(handle)

    def _run(self) -> None:
        precise_sleeps()
        while True:
            with self._lock:
                while True:
                    while self._heap and self._heap[0][1] not in self._live:
                        heapq.heappop(self._heap)
                    if not self._heap:
                        if not self._changed.wait(IDLE_SECONDS) and not self._heap:
                            self._running = False
                            return
                        continue
                    delay = self._heap[0][0] - time.perf_counter()
                    if delay <= 0:
                        _, handle, callback = heapq.heappop(self._heap)
                        self._live.discard(handle)
                        break
                    self._changed.wait(delay)
            try:
                callback()
            except Exception:  # a callback only schedules; never let it kill the timer
                pass
            # The thread may idle for seconds: keep nothing alive that the callback referred to
            # (an armed wait's event, which the user may have dropped).
            del callback


timer = PerProcess(Timer).get
