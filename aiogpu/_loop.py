"""The little that differs between asyncio (and uvloop) and trio, behind one small interface.

- ``Signal``: a one-shot wake-up a task can await, set from the loop thread: future-like
  (``set_result(None)``, ``done()``), so that on asyncio it is the loop's own future, with
  nothing around it (10,000 of them are set in a fan-out).
- ``Backend.waker``: a thread-safe, non-blocking "run this soon on the loop". Foreign threads
  (aiogpu's waiter and timer threads) may only *schedule* a call on the loop: never run user
  code, never raise, never block. ``anyio.from_thread.run_sync`` is not an option: it waits
  until the loop has run the call. A loop that has closed meanwhile is ignored: the task that
  wanted the wake-up is gone with it.
- ``Backend.spawn_system_task``: a background task that belongs to the loop, not to a user task.

Which library runs the calling code is what trio says through sniffio (``in_trio_task``), read
defensively: trio or sniffio may be half-imported by another thread.
"""

from __future__ import annotations

import asyncio
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


class Backend(Protocol):
    def waker(self, callback: Callable[[], object]) -> None: ...
    def new_signal(self) -> Signal: ...
    def spawn_system_task(self, function: Callable[[], Awaitable[None]], ended: Callable[[object], None]) -> object: ...
    def yield_now(self) -> Awaitable[None]: ...
    async def wait_signal(self, signal: Signal, timeout: float) -> None: ...


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
        return self._loop().create_future()  # type: ignore[union-attr]  # (on every wait: no call more)

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

    async def wait_signal(self, signal: Signal, timeout: float) -> None:
        handle = self._running_loop().call_later(timeout, set_signal, signal)
        try:
            await signal
        finally:
            handle.cancel()


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

    def spawn_system_task(self, function: Callable[[], Awaitable[None]], ended: Callable[[object], None]) -> object:
        """Returns the task. Never calls ``ended``: trio starts every task it cancels, so
        ``function``'s ``finally`` always runs."""
        return self._trio.lowlevel.spawn_system_task(function)

    def yield_now(self) -> Awaitable[None]:
        return self._trio.lowlevel.checkpoint()  # type: ignore[no-any-return]

    async def wait_signal(self, signal: Signal, timeout: float) -> None:
        with self._trio.move_on_after(timeout):
            await signal


class _TrioSignal:
    """A trio ``Event`` as a ``Signal``."""

    __slots__ = ("_event",)

    def __init__(self, event: Any) -> None:
        self._event = event

    def set_result(self, result: None, /) -> None:
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
