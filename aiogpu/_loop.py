"""The little that differs between asyncio (and uvloop) and trio, behind one small interface.

- ``Signal``: a one-shot wake-up a task can await, set from the loop thread: future-like
  (``set_result(None)``, ``done()``). On asyncio's own loops a park (below), whose tasks woken
  together resume in one callback (10,000 of them are set in a fan-out); on uvloop the loop's
  own future, with nothing around it.
- ``Backend.waker``: a thread-safe, non-blocking "run this soon on the loop". Foreign threads
  (aiogpu's waiter and timer threads) may only *schedule* a call on the loop: never run user
  code, never raise, never block. ``anyio.from_thread.run_sync`` is not an option: it waits
  until the loop has run the call. A loop that has closed meanwhile is ignored: the task that
  wanted the wake-up is gone with it.
- ``Backend.spawn_system_task``: a background task that belongs to the loop, not to a user task.
- ``Park``: where the task that drives a watcher sleeps. A ``Signal`` that can also be woken
  from a loop callback outside every task (``wake_in_callback``: a thread's poke, a timer), and
  on asyncio and uvloop then resumes its task right there (``_AsyncioPark``).

Which library runs the calling code is what trio says through sniffio (``in_trio_task``), read
defensively: trio or sniffio may be half-imported by another thread.
"""

from __future__ import annotations

import asyncio
import contextvars
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


class Backend(Protocol):
    def waker(self, callback: Callable[[], object]) -> None: ...
    def new_signal(self) -> Signal: ...
    def new_park(self) -> Park: ...
    def spawn_system_task(self, function: Callable[[], Awaitable[None]], ended: Callable[[object], None]) -> object: ...
    def yield_now(self) -> Awaitable[None]: ...
    async def sleep_in_park(self, park: Park, timeout: float) -> None: ...


def set_signal(signal: Signal) -> None:
    """Set ``signal`` unless it is done (set already, or an asyncio future cancelled)."""
    if not signal.done():
        signal.set_result(None)


class AsyncioBackend:
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        # Weakly: the loop's watcher is kept in a dictionary keyed weakly by the loop, and a
        # strong reference from it would keep every loop that ever awaited an event alive.
        self._loop = weakref.ref(loop)
        self._tasks: set[asyncio.Task[None]] = set()  # strong references to system tasks
        # asyncio's own loops schedule a callback in Python (a ``Handle`` and its run, ~1 µs
        # each): their waiting tasks park (``_AsyncioPark``), and those woken together resume
        # in one callback. uvloop schedules in C, where a future is as quick and cheaper to make.
        self._parks_for_signals = isinstance(loop, asyncio.BaseEventLoop)
        self._to_resume: list[_AsyncioPark] = []

    def waker(self, callback: Callable[[], object]) -> None:
        try:
            loop = self._loop()
            if loop is not None:
                loop.call_soon_threadsafe(callback)
        except RuntimeError:  # the loop was closed
            pass

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

    def resume_soon(self, park: _AsyncioPark) -> None:
        """Resume ``park``'s task on the loop's next iteration, in one callback with every other
        park woken until then (loop thread)."""
        to_resume = self._to_resume
        to_resume.append(park)
        if len(to_resume) == 1:
            park._loop.call_soon(self._resume_parked)

    def _resume_parked(self) -> None:
        to_resume, self._to_resume = self._to_resume, []
        position = 0
        try:
            for position, park in enumerate(to_resume, 1):  # noqa: B007 (read if a task raises)
                wakeup = park._wakeup  # ``_resume`` written out: once per woken task
                if wakeup is not None:  # (else cancelled meanwhile: its wake-up is scheduled already)
                    park._wakeup = None
                    wakeup[1].run(wakeup[0], park)
        except BaseException:  # KeyboardInterrupt in a task: the others still resume, later
            rest = to_resume[position:]
            if rest:
                if not self._to_resume:
                    rest[0]._loop.call_soon(self._resume_parked)
                self._to_resume[:0] = rest
            raise

    def spawn_system_task(self, function: Callable[[], Awaitable[None]], ended: Callable[[object], None]) -> object:
        """Returns the task; ``ended(task)`` is called once it is done, however it ended (a task
        cancelled before its first step never ran ``function``, nor its ``finally``)."""
        task: asyncio.Task[None] = self._running_loop().create_task(function())  # type: ignore[arg-type]
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
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


_PENDING, _WOKEN, _CANCELLED = range(3)


class _AsyncioPark:
    """Where one asyncio task waits to be woken: a future of the duck-typed kind asyncio's tasks
    accept (``asyncio.isfuture``), which resumes its task itself rather than scheduling a
    callback that does.

    A future's ``set_result`` schedules its task's wake-up, a callback of its own (on asyncio's
    own loops a ``Handle``, made and run in Python), run on the loop's next iteration. A park
    instead holds its task's wake-up and runs it:

    - from ``set_result`` (the loop thread, a task's step included), on the loop's next
      iteration, in one callback with every other park woken meanwhile
      (``AsyncioBackend.resume_soon``): a sweep wakes hundreds of tasks at once;
    - from ``wake_in_callback`` (a loop callback of its own: a waiter thread's poke, the timer
      thread's, a loop timer), right there: one iteration less between the GPU's completion
      and the watcher's driver (an asyncio iteration after the loop slept costs ~6 µs).

    ``await`` yields it through a tuple's iterator, not a generator: no frame of its own to
    resume on the wake-up. Cancelled (``Task.cancel``), it behaves as a future does.
    """

    __slots__ = ("_asyncio_future_blocking", "_backend", "_cancel_message", "_loop", "_state", "_wakeup")

    def __init__(self, loop: asyncio.AbstractEventLoop, backend: AsyncioBackend) -> None:
        self._loop = loop
        self._backend = backend
        self._asyncio_future_blocking = False  # True while a task is to park on it (the protocol)
        self._state = _PENDING
        self._wakeup: tuple[Callable[[Any], object], contextvars.Context] | None = None

    def set_result(self, result: None, /) -> None:
        if self._state != _PENDING:
            raise asyncio.InvalidStateError("the park was woken already")
        self._state = _WOKEN
        if self._wakeup is not None:  # else whoever awaits it finds it done
            to_resume = self._backend._to_resume  # ``resume_soon`` written out: once per woken task
            to_resume.append(self)
            if len(to_resume) == 1:
                self._loop.call_soon(self._backend._resume_parked)

    def wake_in_callback(self) -> None:
        if self._state != _PENDING:
            return
        self._state = _WOKEN
        if self._wakeup is None:
            return
        if asyncio.current_task(self._loop) is not None:  # not in a callback of its own after all
            self._backend.resume_soon(self)
        else:
            self._resume()

    def _resume(self) -> None:
        wakeup = self._wakeup
        if wakeup is not None:  # (else cancelled meanwhile: its wake-up is scheduled already)
            self._wakeup = None
            callback, context = wakeup
            context.run(callback, self)

    def done(self) -> bool:
        return self._state != _PENDING

    def __await__(self) -> Generator[Any, None, None]:
        if self._state != _PENDING:
            self.result()
            return iter(())  # type: ignore[return-value]
        if self._wakeup is not None:
            raise RuntimeError("only one task may await a park")
        self._asyncio_future_blocking = True
        return iter((self,))  # type: ignore[return-value]  # the task calls add_done_callback, and result() when woken

    # -- the rest of the future protocol, as asyncio's tasks use it ---------------------------
    def get_loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    def add_done_callback(self, callback: Callable[[Any], object], *, context: contextvars.Context | None = None) -> None:
        context = contextvars.copy_context() if context is None else context
        if self._state != _PENDING:
            self._loop.call_soon(callback, self, context=context)
        else:
            self._wakeup = (callback, context)  # one task's: ``__await__`` refuses a second

    def remove_done_callback(self, callback: Callable[[Any], object]) -> int:
        if self._wakeup is not None and self._wakeup[0] == callback:
            self._wakeup = None
            return 1
        return 0

    def cancel(self, msg: object = None) -> bool:
        """What ``Task.cancel`` calls on what its task awaits: the task resumes with ``CancelledError``."""
        if self._state != _PENDING:
            return False
        self._state = _CANCELLED
        self._cancel_message = msg
        if self._wakeup is not None:
            callback, context = self._wakeup
            self._wakeup = None
            self._loop.call_soon(callback, self, context=context)
        return True

    def cancelled(self) -> bool:
        return self._state == _CANCELLED

    def result(self) -> None:
        if self._state == _CANCELLED:
            raise asyncio.CancelledError(*(() if self._cancel_message is None else (self._cancel_message,)))
        if self._state == _PENDING:
            raise asyncio.InvalidStateError("the park was not woken yet")

    def exception(self) -> BaseException | None:
        self.result()
        return None


@types.coroutine
def _yield_to_asyncio() -> Generator[None, None, None]:
    """What ``asyncio.sleep(0)`` does, without its two coroutine frames (the close watch's beat)."""
    yield


class TrioBackend:
    def __init__(self, trio: Any) -> None:
        self._trio = trio
        self._token = trio.lowlevel.current_trio_token()

    def waker(self, callback: Callable[[], object]) -> None:
        try:
            self._token.run_sync_soon(callback)
        except self._trio.RunFinishedError:
            pass

    def new_signal(self) -> Signal:
        return _TrioSignal(self._trio.Event())

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
