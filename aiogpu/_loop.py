"""The little that differs between asyncio (and uvloop) and trio, behind one small interface.

- ``Signal``: a one-shot wake-up a task can await; set from the loop thread.
- ``Backend.waker``: a thread-safe, non-blocking "run this soon on the loop". Foreign threads
  (aiogpu's waiter and timer threads) may only *schedule* a call on the loop: never run user
  code, never raise, never block. ``anyio.from_thread.run_sync`` is not an option: it waits
  until the loop has run the call. A loop that has closed meanwhile is ignored: the task that
  wanted the wake-up is gone with it.
- ``Backend.spawn_system_task``: a background task that belongs to the loop, not to a user task.

asyncio is tested first: trio may be half-imported by another thread, and asking it about
the current run would then fail.
"""

from __future__ import annotations

import asyncio
import sys
import types
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Generator


class Signal(Protocol):
    def set(self) -> None: ...
    def is_set(self) -> bool: ...
    def wait(self) -> Awaitable[None]: ...


class Backend(Protocol):
    def waker(self, callback: Callable[[], object]) -> None: ...
    def new_signal(self) -> Signal: ...
    def spawn_system_task(self, function: Callable[[], Awaitable[None]]) -> None: ...
    def yield_now(self) -> Awaitable[None]: ...
    async def wait_signal(self, signal: Signal, timeout: float) -> None: ...


class _FutureSignal:
    __slots__ = ("_future",)

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._future: asyncio.Future[None] = loop.create_future()

    def set(self) -> None:
        if not self._future.done():
            self._future.set_result(None)

    def is_set(self) -> bool:
        return self._future.done()

    def wait(self) -> asyncio.Future[None]:
        return self._future  # awaited directly: one coroutine frame less per wake-up


class AsyncioBackend:
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._tasks: set[asyncio.Task[None]] = set()  # strong references to system tasks

    def waker(self, callback: Callable[[], object]) -> None:
        try:
            self._loop.call_soon_threadsafe(callback)
        except RuntimeError:  # the loop was closed
            pass

    def new_signal(self) -> Signal:
        return _FutureSignal(self._loop)

    def spawn_system_task(self, function: Callable[[], Awaitable[None]]) -> None:
        task: asyncio.Task[None] = self._loop.create_task(function())  # type: ignore[arg-type]
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def yield_now(self) -> Awaitable[None]:
        return _yield_to_asyncio()

    async def wait_signal(self, signal: Signal, timeout: float) -> None:
        handle = self._loop.call_later(timeout, signal.set)
        try:
            await signal.wait()
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
        return self._trio.Event()  # type: ignore[no-any-return]

    def spawn_system_task(self, function: Callable[[], Awaitable[None]]) -> None:
        self._trio.lowlevel.spawn_system_task(function)

    def yield_now(self) -> Awaitable[None]:
        return self._trio.lowlevel.checkpoint()  # type: ignore[no-any-return]

    async def wait_signal(self, signal: Signal, timeout: float) -> None:
        with self._trio.move_on_after(timeout):
            await signal.wait()


def running_asyncio_loop() -> asyncio.AbstractEventLoop | None:
    return asyncio._get_running_loop()


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
