"""Looking at parked waits from the loop itself while the loop thread is busy.

A thread that sees a completion while the loop thread runs Python without a pause waits for the
GIL before it can poke the loop (``_policy.BUSY_SHARE`` says why), often until the busy task's
next step has begun: a whole step of latency. A loop callback that re-adds itself runs once per
loop iteration, ahead of the tasks made ready during the iteration before it, so it can wake
the driving task (whose park resumes it right there) before the busy task runs again.

Rules this file keeps:

1. Only while the loop was busy: ``BusyLook.busy`` is learned across each park (loop thread
   CPU against wall time, the looks' own CPU left out), and only while some parked wait is
   watched on the loop (``auto``, ``poll``); an idle loop is never kept awake for it.
2. The look stops at the first iteration that took less than ``BUSY_MIN_ITERATION`` or in
   which the loop was less busy (the loop could sleep: a thread's poke then gets in at once);
   the time a look itself takes never counts as the loop's. It stops when its park ends: each
   park has a chain of its own, and one left from an earlier park finds it is not current.
3. Only where the backend can run it ahead of the ready tasks, with a park that resumes its
   task in the callback (``Backend.look_each_iteration``); elsewhere it would wake nobody
   sooner.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from . import _policy

if TYPE_CHECKING:
    from collections.abc import Callable

    from ._backends import Backend


class BusyLook:
    """Whether the loop was busy while the driver was last parked, and the per-iteration look
    while it is parked now. ``look()`` queries the parked waits and wakes the driver if one is
    done (returning ``True``)."""

    __slots__ = ("_backend", "_chain", "_clock", "_first", "_look", "_own_cpu", "busy")

    def __init__(self, backend: Backend, look: Callable[[], bool]) -> None:
        self._backend = backend
        self._look = look
        self.busy = False
        # The look of the current park (a new object per park): a look left over from an earlier
        # park finds it changed and stops.
        self._chain: object = None
        self._first = False  # the next look is the first of this park: it runs whatever it finds
        self._clock = (0.0, 0.0)  # (wall, loop thread CPU) when the park began or last looked
        self._own_cpu = 0.0  # loop thread CPU the looks of this park took: not the loop's work

    def park(self, watched_on_loop: Callable[[], bool]) -> tuple[float, float]:
        """The driver is about to park: look each iteration if the loop was busy and some parked
        wait is watched on the loop (``watched_on_loop()``, asked only then). Returns the clock
        to hand to ``resumed``."""
        clock = self._clock = (time.perf_counter(), time.thread_time())
        self._own_cpu = 0.0
        chain = self._chain = object()
        self._first = self.busy and watched_on_loop() and self._backend.look_each_iteration(lambda: self._each_iteration(chain))
        return clock

    def resumed(self, parked_at: tuple[float, float]) -> None:
        """The driver woke (whatever woke it): learn whether the loop was busy meanwhile, its
        own looks left out."""
        self._chain = None
        wall, cpu = parked_at
        self.busy = _policy.loop_was_busy(time.perf_counter() - wall, time.thread_time() - cpu - self._own_cpu)

    def _each_iteration(self, chain: object) -> None:
        if chain is not self._chain:
            return  # the park it was for is over
        wall, cpu = self._clock
        now, started = time.perf_counter(), time.thread_time()
        elapsed = now - wall
        if not self._first and (elapsed < _policy.BUSY_MIN_ITERATION or not _policy.loop_was_busy(elapsed, started - cpu)):
            return  # the loop has little else to do: a thread's poke gets in
        self._first = False
        if elapsed >= _policy.BUSY_LOOK:
            if self._look():
                return
            self._clock = (time.perf_counter(), time.thread_time())  # after the look: not the loop's work
        self._backend.look_each_iteration(lambda: self._each_iteration(chain))
        self._own_cpu += time.thread_time() - started
