"""asyncio's own loops, faster through asyncio's internals: the one module that reads them.

CPython promises none of what this module relies on, so it runs only on a loop whose internals
pass ``supports`` (checked once, as the loop's backend is made), and every part of it falls
back to what ``_asyncio`` does (public API only) when something is not as expected:

- Parks (``_AsyncioPark``): a future that keeps its awaiting task's wake-up (the first
  done-callback a task adds as it awaits a future) and runs it itself. asyncio's own loops
  schedule each future's wake-up as a callback made and run in Python; a sweep that wakes
  thousands of tasks resumes them in one callback instead, and a park woken from a loop
  callback of its own (a thread's poke, a timer) resumes its task right there, a loop
  iteration sooner. The first wake-up a park keeps on a loop must be a method of the task
  that awaits it; if it is not, that loop's signals and parks are plain futures from then on.
- ``earliest_timer`` reads the loop's heap of timers (``_scheduled``, TimerHandles with
  ``_when`` and ``_cancelled``): asyncio rounds its sleeps up to whole milliseconds, and the
  watcher keeps the loop's own timers on time only if it knows when the next one is due.
  ``supports`` checks that a timer the loop schedules lands in that heap as expected.

On any other asyncio loop (uvloop) only the driving task parks: uvloop schedules a future's
wake-up in C, where it costs as little, and its timers are out of reach.
"""

from __future__ import annotations

import asyncio
import contextvars
import heapq
import weakref
from typing import TYPE_CHECKING, Any

from ._asyncio import AsyncioBackend, FuturePark
from ._base import set_signal, set_signals

if TYPE_CHECKING:
    from collections.abc import Callable

    from ._base import Park, Signal, Waiters


def supports(loop: asyncio.AbstractEventLoop) -> bool:
    """Whether ``loop`` is one of asyncio's own and its timers are where this module reads
    them: a timer scheduled on it is a ``TimerHandle`` in its ``_scheduled`` list, with
    ``_when`` its time and ``_cancelled`` set by ``cancel()``. Schedules one timer and cancels
    it at once (the loop drops it as it drops any cancelled timer). Never raises."""
    if not isinstance(loop, asyncio.BaseEventLoop):
        return False
    try:
        scheduled = getattr(loop, "_scheduled", None)
        if not isinstance(scheduled, list):
            return False
        probe = loop.call_at(loop.time(), _nothing)
        try:
            found = (
                isinstance(probe, asyncio.TimerHandle)
                and any(handle is probe for handle in scheduled)
                and getattr(probe, "_when", None) == probe.when()
                and getattr(probe, "_cancelled", None) is False
                and scheduled[0]._when <= probe.when()  # a heap: the earliest first
            )
        finally:
            probe.cancel()
        return found and getattr(probe, "_cancelled", None) is True
    except Exception:  # not the asyncio this module was written against
        return False


def _nothing() -> None:
    return None


class PrivateAsyncioBackend(AsyncioBackend):
    """``own_loop``: one of asyncio's own loops, whose internals passed ``supports``: waiting
    tasks park too and the loop's timers are read. On any other asyncio loop (uvloop, which
    schedules a future's wake-up in C, as quickly as a park's) only the driving task parks."""

    def __init__(self, loop: asyncio.AbstractEventLoop, *, own_loop: bool) -> None:
        super().__init__(loop)
        self._own_loop = own_loop
        # Parks until the first wake-up a park keeps fails its check.
        self._parks = True
        self._wakeup_checked = False
        # The parks to resume on the loop's next iteration: held by the loop's callback that
        # resumes them, and only weakly here, so that a loop closed before running it is freed.
        self._batch: Callable[[], _Batch | None] = _no_batch

    def new_signal(self) -> Signal:
        if self._parks and self._own_loop:
            return _AsyncioPark(self._running_loop(), self)
        return self._running_loop().create_future()

    def new_park(self) -> Park:
        if self._parks:
            return _AsyncioPark(self._running_loop(), self)
        return FuturePark(loop=self._running_loop())

    def look_each_iteration(self, callback: Callable[[], object]) -> bool:
        """Run ``callback`` on the loop's next iteration, before the tasks made ready during
        this one: a park woken there resumes its task at once, ahead of them."""
        if not self._parks:
            return False
        self._running_loop().call_soon(callback)
        return True

    def keeps_wakeup(self, wakeup: Callable[[Any], object]) -> bool:
        """Whether a park may keep ``wakeup``, the first done-callback added to it: checked on
        the first one only, which must be a method of the task awaiting the park (a task's
        wake-up, called with the future as a future would call it). Otherwise parks are off."""
        if self._wakeup_checked:
            return True
        if not self._parks:
            return False
        task = asyncio.current_task(self._running_loop())
        if task is not None and getattr(wakeup, "__self__", None) is task:
            self._wakeup_checked = True
            return True
        self._parks = False
        return False

    def set_signals(self, waking: list[Waiters]) -> None:
        """Set every signal of ``waking``'s items, in order, and empty it (loop thread).

        The parks are set here, not through their ``set_result``: two calls in Python fewer
        for each of the thousands of tasks a fan-out wakes.
        """
        if not self._own_loop:
            set_signals(waking)  # futures, and the driving task's flag
            return
        batch = None
        set_result = _set_future_result
        for waiters in waking:
            signal = waiters.signal
            try:
                # The first signal, then any more: written out twice, not a loop over a tuple
                # of the first, because every lone wait's wake-up passes here (a tuple and a loop
                # over it would add to that path).
                if type(signal) is _AsyncioPark:
                    set_result(signal, None)
                    if batch is None:
                        batch = self._batch_to_resume()
                    batch.append(signal)
                elif signal is not None:  # the driving task's flag, or a future
                    signal.set_result(None)
                if waiters.more_signals:
                    for signal in waiters.more_signals:
                        if type(signal) is _AsyncioPark:
                            set_result(signal, None)
                            if batch is None:
                                batch = self._batch_to_resume()
                            batch.append(signal)
                        else:  # the driving task's flag, or a future
                            signal.set_result(None)
            except asyncio.InvalidStateError:  # a task that was cancelled has not left yet
                for signal in waiters.signals():
                    set_signal(signal)
        waking.clear()

    def resume_soon(self, park: _AsyncioPark) -> None:
        """Resume ``park``'s task on the loop's next iteration, in one callback with every other
        park woken until then (loop thread)."""
        self._batch_to_resume().append(park)

    def _batch_to_resume(self) -> _Batch:
        batch = self._batch()
        if batch is None:
            batch = _Batch()
            self._running_loop().call_soon(self._resume_batch, batch)  # first: it may raise
            self._batch = weakref.ref(batch)
        return batch

    def _resume_batch(self, batch: _Batch) -> None:
        if self._batch() is batch:
            self._batch = _no_batch
        position = 0
        try:
            for position, park in enumerate(batch):  # noqa: B007 (read if a task raises)
                wakeup = park._wakeup
                if wakeup is not None:  # (None: resumed before this batch was restarted)
                    park._wakeup = None
                    park._wakeup_context.run(wakeup, park)  # type: ignore[union-attr]
        except BaseException:  # KeyboardInterrupt in a task: the others still resume, later
            for park in batch[position:]:  # from the one that raised (or was next: skipped)
                self.resume_soon(park)
            raise

    def earliest_timer(self) -> tuple[float, float] | None:
        """The loop's earliest live timer: (when, by the loop's clock; seconds from now), or
        ``None`` (none found).

        asyncio rounds the timeout of its sleep up to whole milliseconds (``epoll_wait``), so a
        loop that goes to sleep at any other moment than one of its timers' wakes up to 1 ms
        after its next timer is due. Reads the loop's heap of timers without changing it;
        cancelled timers stay in it until the loop drops them, so it looks past a few of them,
        no further.
        """
        if not self._own_loop:
            return None  # its timers are out of reach
        loop = self._loop()
        scheduled = getattr(loop, "_scheduled", None)
        if not scheduled or not isinstance(scheduled, list):
            return None
        try:
            frontier = [(scheduled[0]._when, 0)]
            for _ in range(_TIMERS_LOOKED_AT):
                if not frontier:
                    break
                when, position = heapq.heappop(frontier)
                if not scheduled[position]._cancelled:
                    return when, when - loop.time()  # type: ignore[union-attr]
                for child in (2 * position + 1, 2 * position + 2):
                    if child < len(scheduled):
                        heapq.heappush(frontier, (scheduled[child]._when, child))
        except (AttributeError, IndexError, TypeError):  # not the asyncio this was written against
            return None
        return None


#: How many of the loop's timers ``earliest_timer`` looks at, the cancelled ones it skips included.
_TIMERS_LOOKED_AT = 8


#: A future's own ``set_result``, a park's without its override (``set_signals``).
_set_future_result = asyncio.Future.set_result


class _Batch(list["_AsyncioPark"]):
    __slots__ = ("__weakref__",)


def _no_batch() -> None:
    return None


class _AsyncioPark(asyncio.Future[None]):
    """Where one asyncio task waits to be woken: a future that resumes its task itself rather
    than scheduling a callback that does.

    A future's ``set_result`` schedules its task's wake-up, a callback of its own (on asyncio's
    own loops a ``Handle``, made and run in Python), run on the loop's next iteration. A park
    keeps its task's wake-up (the first done-callback added, once the backend's check passed)
    to itself and runs it:

    - after ``set_result`` (the loop thread, a task's step included), on the loop's next
      iteration, in one callback with every other park woken meanwhile
      (``PrivateAsyncioBackend.resume_soon``): a sweep wakes hundreds of tasks at once;
    - in ``wake_in_callback`` (a loop callback of its own: a waiter thread's poke, the timer
      thread's, a loop timer), right there: one iteration less between the GPU's completion
      and the watcher's driver (it shows in the ``thread`` strategy's latency, which
      ``python -m benchmarks.wake`` measures).

    Otherwise it is the loop's future: done, cancelled and its result as a future's (anyio, for
    one, skips cancelling a task whose future is done), other done-callbacks as a future's.
    """

    __slots__ = ("_backend", "_wakeup", "_wakeup_context")

    def __init__(self, loop: asyncio.AbstractEventLoop, backend: PrivateAsyncioBackend) -> None:
        super().__init__(loop=loop)
        self._backend = backend
        # The awaiting task's wake-up and its context: two slots, not a tuple (a fan-out makes
        # and frees thousands of them).
        self._wakeup: Callable[[Any], object] | None = None
        self._wakeup_context: contextvars.Context | None = None

    def add_done_callback(self, fn: Callable[[Any], object], *, context: contextvars.Context | None = None) -> None:
        backend = self._backend
        if self._wakeup is None and not self.done() and (backend._wakeup_checked or backend.keeps_wakeup(fn)):
            self._wakeup = fn  # the awaiting task's wake-up
            self._wakeup_context = contextvars.copy_context() if context is None else context
        else:
            super().add_done_callback(fn, context=context)

    def remove_done_callback(self, fn: Callable[[Any], object]) -> int:
        if self._wakeup is not None and self._wakeup == fn:
            self._wakeup = None
            return 1 + super().remove_done_callback(fn)
        return super().remove_done_callback(fn)

    def set_result(self, result: None, /) -> None:
        super().set_result(result)
        if self._wakeup is not None:
            self._backend.resume_soon(self)

    def wake_in_callback(self) -> None:
        if self.done():
            return
        super().set_result(None)
        wakeup = self._wakeup
        if wakeup is None:  # nobody awaits it (yet)
            return
        if asyncio.current_task(self.get_loop()) is not None:  # not in a callback of its own after all
            self._backend.resume_soon(self)
        else:
            self._wakeup = None
            self._wakeup_context.run(wakeup, self)  # type: ignore[union-attr]

    def cancel(self, msg: Any = None) -> bool:
        if not super().cancel(msg=msg):
            return False
        wakeup = self._wakeup
        if wakeup is not None:  # resumed with CancelledError, as a future's task would be
            self._wakeup = None
            self.get_loop().call_soon(wakeup, self, context=self._wakeup_context)
        return True
