"""asyncio and uvloop through asyncio's public API only.

Signals are the loop's futures; the park is a future too, woken by whoever sets it (a thread's
``call_soon_threadsafe``, a loop timer), its task resumed by the loop on its next iteration as
any future's. This is what every asyncio loop gets unless ``_asyncio_private`` takes over, and
it must stay correct on every Python version: nothing here reads a private attribute.
"""

from __future__ import annotations

import asyncio
import types
import weakref
from typing import TYPE_CHECKING

from ._base import set_signals

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Generator

    from ._base import Park, Signal, Waiters


class AsyncioBackend:
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        # Weakly: the loop's watcher is kept in a dictionary keyed weakly by the loop, and a
        # strong reference from it would keep every loop that ever awaited an event alive.
        self._loop = weakref.ref(loop)

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
        try:
            return asyncio.get_running_loop() is self._loop()
        except RuntimeError:  # no loop runs in this thread
            return False

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        loop = self._loop()
        assert loop is not None, "used from its loop only, which is alive then"
        return loop

    def new_signal(self) -> Signal:
        return self._running_loop().create_future()

    def new_park(self) -> Park:
        return FuturePark(loop=self._running_loop())

    def set_signals(self, waking: list[Waiters]) -> None:
        """Set every signal of ``waking``'s items, in order, and empty it (loop thread)."""
        set_signals(waking)

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
        """``None``: no public API tells a loop's next timer."""
        return None

    def look_each_iteration(self, callback: Callable[[], object]) -> bool:
        """``False``: a future woken from a loop callback resumes its task only after the tasks
        made ready before it, so looking from one would not wake a task any sooner."""
        return False


class FuturePark(asyncio.Future[None]):
    """A future that can be woken from a loop callback: its task resumes on the loop's next
    iteration, as a future's does."""

    __slots__ = ()

    def wake_in_callback(self) -> None:
        if not self.done():
            self.set_result(None)


@types.coroutine
def _yield_to_asyncio() -> Generator[None, None, None]:
    """What ``asyncio.sleep(0)`` does (a bare yield: the task runs again on the loop's next
    iteration), without its two coroutine frames (the close watch's beat)."""
    yield
