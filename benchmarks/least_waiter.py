"""The least CPU a waiter on asyncio spends on the sustained load: a reference, not a way to wait.

``LeastWaiter`` does only what keeping pace with a busy GPU needs: a plain future per wait, a
queue per stream, and one loop callback that asks each stream's oldest wait once its predicted
time has come (``Event.is_done``, one call of aiogpu's public API) and completes what is done in
order; until the soonest predicted time it sleeps on a loop timer. Nothing else: no strategies,
threads, cancellation, faults, closed events, trio, or latency below a loop timer's millisecond.

The sustained load's queues are deep, so a wake-up a millisecond late costs its wall nothing,
and what this waiter spends is about the least any waiter spends there: the loop's own cost of
making, completing and resuming a future per wait, and a driver query or so per wait. Beside
aiogpu's rows it says how much of a way of waiting's CPU is the engine's, and whether a CPU goal
is within reach of any waiter on asyncio at all.
"""

from __future__ import annotations

import time
from collections import deque
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import asyncio

    import aiogpu

#: After a completion on a stream, its oldest wait is asked again once this share of the time
#: between its completions has passed: a little early, so that steady work is seen on time.
DUE_SHARE = 0.8
#: Each estimate moves this share of the way to the latest time between completions.
ALPHA = 0.2
#: A sweep due within this is run on the loop's next iteration rather than on a timer.
SOON = 200e-6


class _StreamWaits:
    __slots__ = ("due", "interval", "last_done", "waits")

    def __init__(self) -> None:
        self.waits: deque[tuple[aiogpu.Event, asyncio.Future[None]]] = deque()
        self.due = 0.0  # asked from then on (0: at every sweep)
        self.interval = 0.0  # the time between the last completions (0: unknown)
        self.last_done = 0.0


class LeastWaiter:
    """Waits of one loop for events recorded on streams, completed in each stream's order."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._streams: dict[aiogpu.Stream, _StreamWaits] = {}  # every stream waited on, and what it learned
        self._pending: dict[aiogpu.Stream, _StreamWaits] = {}  # those with waits
        self._scheduled = False

    def wait(self, stream: aiogpu.Stream, event: aiogpu.Event) -> asyncio.Future[None]:
        """A future that is done once ``event``, last recorded on ``stream``, is."""
        future = self._loop.create_future()
        queue = self._pending.get(stream)
        if queue is None:
            queue = self._pending[stream] = self._streams.setdefault(stream, _StreamWaits())
        queue.waits.append((event, future))
        if not self._scheduled:
            self._scheduled = True
            self._loop.call_soon(self._sweep)
        return future

    def _sweep(self) -> None:
        self._scheduled = False
        now = time.perf_counter()
        soonest = float("inf")
        for stream, queue in list(self._pending.items()):
            if now < queue.due:
                soonest = min(soonest, queue.due)
                continue
            waits, completed = queue.waits, False
            while waits:
                if not waits[0][0].is_done:
                    break
                waits.popleft()[1].set_result(None)
                completed = True
            if completed:
                if queue.last_done:
                    latest = now - queue.last_done
                    queue.interval = latest if not queue.interval else queue.interval + ALPHA * (latest - queue.interval)
                queue.last_done = now
                queue.due = now + DUE_SHARE * queue.interval
            if not waits:
                del self._pending[stream]
            else:
                soonest = min(soonest, queue.due)
        if self._pending:
            self._scheduled = True
            if soonest - now < SOON:
                self._loop.call_soon(self._sweep)
            else:
                self._loop.call_later(soonest - now, self._sweep)
