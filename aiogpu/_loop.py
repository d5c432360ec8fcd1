"""The little that differs between asyncio (and uvloop) and trio, behind one small interface.

- ``Signal``: a one-shot wake-up a task can await, set from the loop thread: future-like
  (``set_result(None)``, ``done()``). On asyncio's own loops a park (below), whose tasks woken
  together resume in one callback (10,000 of them are set in a fan-out); on uvloop the loop's
  own future, with nothing around it. ``Backend.set_signals`` sets a sweep's worth at once.
- ``Backend.waker``: a thread-safe, non-blocking "run this soon on the loop". Foreign threads
  (aiogpu's waiter and timer threads) may only *schedule* a call on the loop: never run user
  code, never raise, never block. ``anyio.from_thread.run_sync`` is not an option: it waits
  until the loop has run the call. A loop that has closed meanwhile is ignored (``False``): the
  task that wanted the wake-up is gone with it. ``Backend.runs_here``: whether the calling code
  runs on the loop (its thread, inside its run).
- ``Backend.spawn_system_task``: a background task that belongs to the loop, not to a user task.
- ``Backend.earliest_timer``: the loop's own earliest timer, where the loop rounds its sleeps
  (asyncio's own loops): the watcher has it kept on time (``Watcher._keep_loop_timer``).
- ``Park``: where the task that drives a watcher sleeps. A ``Signal`` that can also be woken
  from a loop callback outside every task (``wake_in_callback``: a thread's poke, a timer), and
  on asyncio and uvloop then resumes its task right there (``_AsyncioPark``, a future).

Which library runs the calling code is what trio says through sniffio (``in_trio_task``), read
defensively: trio or sniffio may be half-imported by another thread.
"""

from __future__ import annotations

import asyncio
import contextvars
import heapq
import sys
import types
import weakref
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Generator


class Signal(Protocol):
    """Set once (``set_result(None)``); setting it again is an error for an asyncio future."""

    def set_result(self, result: None, /) -> None: ...
    def done(self) -> bool: ...
    def __await__(self) -> Generator[Any, None, None]: ...


class Park(Signal, Protocol):
    def wake_in_callback(self) -> None:
        """Set it from a loop callback that runs outside every task (a ``waker``'s, a timer's)."""


class Waiters(Protocol):
    """The signals of the tasks waiting for one thing: the first in a slot, any more in a dict."""

    signal: Signal | None
    more_signals: dict[Signal, None] | None

    def signals(self) -> list[Signal]: ...


class Backend(Protocol):
    def waker(self, callback: Callable[[], object]) -> bool: ...
    def runs_here(self) -> bool: ...
    def new_signal(self) -> Signal: ...
    def set_signals(self, waking: list[Waiters]) -> None: ...
    def new_park(self) -> Park: ...
    def spawn_system_task(self, function: Callable[[], Awaitable[None]], ended: Callable[[object], None]) -> object: ...
    def yield_now(self) -> Awaitable[None]: ...
    async def sleep_in_park(self, park: Park, timeout: float) -> None: ...
    def earliest_timer(self) -> tuple[float, float] | None: ...


def set_signal(signal: Signal) -> None:
    """Set ``signal`` unless it is done (set already, or an asyncio future cancelled)."""
    if not signal.done():
        signal.set_result(None)


def set_signals(waking: list[Waiters]) -> None:
    """Set every signal of ``waking``'s items, in order, and empty it."""
    for waiters in waking:
        try:
            if (signal := waiters.signal) is not None:
                signal.set_result(None)
            if waiters.more_signals:
                for signal in waiters.more_signals:
                    signal.set_result(None)
        except asyncio.InvalidStateError:  # a task that was cancelled has not left yet
            for signal in waiters.signals():
                set_signal(signal)
    waking.clear()


class AsyncioBackend:
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        # Weakly: the loop's watcher is kept in a dictionary keyed weakly by the loop, and a
        # strong reference from it would keep every loop that ever awaited an event alive.
        self._loop = weakref.ref(loop)
        # asyncio's own loops schedule a callback in Python (a ``Handle`` and its run, ~1 µs
        # each): their waiting tasks park (``_AsyncioPark``), and those woken together resume
        # in one callback. uvloop schedules in C, where a future is as quick and cheaper to make.
        self._parks_for_signals = isinstance(loop, asyncio.BaseEventLoop)
        # The parks to resume on the loop's next iteration: held by the loop's callback that
        # resumes them, and only weakly here, so that a loop closed before running it is freed.
        self._batch: Callable[[], _Batch | None] = _no_batch

    def waker(self, callback: Callable[[], object]) -> bool:
        try:
            loop = self._loop()
            if loop is not None:
                loop.call_soon_threadsafe(callback)
                return True
        except RuntimeError:  # the loop was closed
            pass
        return False

    def runs_here(self) -> bool:
        loop = self._loop()
        return loop is not None and asyncio._get_running_loop() is loop

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        loop = self._loop()
        assert loop is not None, "used from its loop only, which is alive then"
        return loop

    def new_signal(self) -> Signal:
        loop = self._loop()
        if self._parks_for_signals:
            return _AsyncioPark(loop, self)  # type: ignore[arg-type]
        return loop.create_future()  # type: ignore[union-attr]

    def new_park(self) -> Park:
        return _AsyncioPark(self._running_loop(), self)

    def set_signals(self, waking: list[Waiters]) -> None:
        """Set every signal of ``waking``'s items, in order, and empty it (loop thread).

        On asyncio's own loops the parks are set here, not through their ``set_result``: two
        calls in Python fewer for each of the 10,000 tasks a fan-out wakes.
        """
        if not self._parks_for_signals:
            set_signals(waking)
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
                elif signal is not None:  # the driving task's flag
                    signal.set_result(None)
                if waiters.more_signals:
                    for signal in waiters.more_signals:
                        if type(signal) is _AsyncioPark:
                            set_result(signal, None)
                            if batch is None:
                                batch = self._batch_to_resume()
                            batch.append(signal)
                        else:  # the driving task's flag
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

    def spawn_system_task(self, function: Callable[[], Awaitable[None]], ended: Callable[[object], None]) -> object:
        """Returns the task, which the caller keeps (asyncio refers to tasks weakly); ``ended(task)``
        is called once it is done, however it ended (a task cancelled before its first step never
        ran ``function``, nor its ``finally``). Kept here, a task that ended after the loop's last
        iteration would keep the loop alive."""
        task: asyncio.Task[None] = self._running_loop().create_task(function())  # type: ignore[arg-type]
        task.add_done_callback(ended)
        return task

    def yield_now(self) -> Awaitable[None]:
        return _yield_to_asyncio()

    async def sleep_in_park(self, park: Park, timeout: float) -> None:
        handle = self._running_loop().call_later(timeout, park.wake_in_callback)
        try:
            await park
        finally:
            handle.cancel()

    def earliest_timer(self) -> tuple[float, float] | None:
        """The loop's earliest live timer on asyncio's own loops: (when, by the loop's clock;
        seconds from now), or ``None`` (none found; uvloop, whose timers are not in reach).

        asyncio rounds the timeout of its sleep up to whole milliseconds (``epoll_wait``), so a
        loop that goes to sleep at any other moment than one of its timers' wakes up to 1 ms
        after its next timer is due. Reads the loop's heap of timers (``_scheduled``, in every
        CPython since 3.4) without changing it; cancelled timers stay in it until the loop drops
        them, so it looks past a few of them, no further.
        """
        if not self._parks_for_signals:
            return None
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


#: A future's own ``set_result``, a park's without its override (``AsyncioBackend.set_signals``).
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
    keeps its task's wake-up (the first done-callback added) to itself and runs it:

    - after ``set_result`` (the loop thread, a task's step included), on the loop's next
      iteration, in one callback with every other park woken meanwhile
      (``AsyncioBackend.resume_soon``): a sweep wakes hundreds of tasks at once;
    - in ``wake_in_callback`` (a loop callback of its own: a waiter thread's poke, the timer
      thread's, a loop timer), right there: one iteration less between the GPU's completion
      and the watcher's driver (it shows in the ``thread`` strategy's latency, which
      ``python -m benchmarks.wake`` measures).

    Otherwise it is the loop's future: done, cancelled and its result as a future's (anyio, for
    one, skips cancelling a task whose future is done), other done-callbacks as a future's.
    The watcher's driver parks on one on uvloop too; its waiting tasks there keep the loop's
    futures.
    """

    __slots__ = ("_backend", "_wakeup", "_wakeup_context")

    def __init__(self, loop: asyncio.AbstractEventLoop, backend: AsyncioBackend) -> None:
        super().__init__(loop=loop)
        self._backend = backend
        # The awaiting task's wake-up and its context: two slots, not a tuple (a fan-out makes
        # and frees 10,000 of them).
        self._wakeup: Callable[[Any], object] | None = None
        self._wakeup_context: contextvars.Context | None = None

    def add_done_callback(self, fn: Callable[[Any], object], *, context: contextvars.Context | None = None) -> None:
        if self._wakeup is not None or self.done():
            super().add_done_callback(fn, context=context)
        else:  # the awaiting task's wake-up
            self._wakeup = fn
            self._wakeup_context = contextvars.copy_context() if context is None else context

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


@types.coroutine
def _yield_to_asyncio() -> Generator[None, None, None]:
    """What ``asyncio.sleep(0)`` does, without its two coroutine frames (the close watch's beat)."""
    yield


class TrioBackend:
    def __init__(self, trio: Any) -> None:
        self._trio = trio
        self._token = trio.lowlevel.current_trio_token()

    def waker(self, callback: Callable[[], object]) -> bool:
        try:
            self._token.run_sync_soon(callback)
        except self._trio.RunFinishedError:
            return False
        return True

    def runs_here(self) -> bool:
        try:
            return self._trio.lowlevel.current_trio_token() is self._token
        except RuntimeError:  # not in a trio run
            return False

    def new_signal(self) -> Signal:
        return _TrioSignal(self._trio.Event())

    def set_signals(self, waking: list[Waiters]) -> None:
        set_signals(waking)

    def new_park(self) -> Park:
        return _TrioSignal(self._trio.Event())

    def spawn_system_task(self, function: Callable[[], Awaitable[None]], ended: Callable[[object], None]) -> object:
        """Returns the task. Never calls ``ended``: trio starts every task it cancels, so
        ``function``'s ``finally`` always runs."""
        return self._trio.lowlevel.spawn_system_task(function)

    def yield_now(self) -> Awaitable[None]:
        return self._trio.lowlevel.checkpoint()  # type: ignore[no-any-return]

    async def sleep_in_park(self, park: Park, timeout: float) -> None:
        with self._trio.move_on_after(timeout):
            await park

    def earliest_timer(self) -> tuple[float, float] | None:
        return None  # trio's deadlines are its runner's own


class _TrioSignal:
    """A trio ``Event`` as a ``Signal`` and a ``Park`` (trio runs a woken task on its next
    batch whoever wakes it)."""

    __slots__ = ("_event",)

    def __init__(self, event: Any) -> None:
        self._event = event

    def set_result(self, result: None, /) -> None:
        self._event.set()

    def wake_in_callback(self) -> None:
        self._event.set()

    def done(self) -> bool:
        return self._event.is_set()  # type: ignore[no-any-return]

    def __await__(self) -> Generator[Any, None, None]:
        return self._event.wait().__await__()  # type: ignore[no-any-return]


def running_asyncio_loop() -> asyncio.AbstractEventLoop | None:
    return asyncio._get_running_loop()


def in_trio_task() -> Any:
    """The trio module if trio runs the calling code, else ``None``.

    Not :func:`in_trio_run`: trio as a guest of an asyncio loop runs its tasks from that loop's
    callbacks, its run active around the host's own tasks too, and trio-asyncio runs asyncio
    code inside trio's tasks. Both say which library runs the code through sniffio's
    ``thread_local.name`` (which trio imports). trio sets it for its whole run, so an asyncio
    task there (``asyncio.run`` called inside a trio task) is asyncio's.
    """
    trio = sys.modules.get("trio")  # never import trio ourselves
    sniffio = sys.modules.get("sniffio")
    if trio is None or getattr(getattr(sniffio, "thread_local", None), "name", None) != "trio":
        return None  # (a half-imported sniffio has no thread_local yet)
    loop = asyncio._get_running_loop()
    if loop is not None and asyncio.current_task(loop) is not None:
        return None
    return trio


def in_trio_run() -> Any:
    """The trio module if this thread is inside ``trio.run``, else ``None``."""
    trio = sys.modules.get("trio")  # never import trio ourselves
    if trio is None:
        return None
    try:
        trio.lowlevel.current_trio_token()
    except (RuntimeError, AttributeError):  # not in trio.run; trio half-imported by another thread
        return None
    return trio
