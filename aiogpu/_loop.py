"""Wake the current event loop from another thread, without blocking that thread.

Foreign threads (aiogpu's waiter threads) may only *schedule* a call on the loop: never run
user code, never raise, never block. ``anyio.from_thread.run_sync`` is not an option here: it
waits until the loop has run the call. asyncio and uvloop get ``loop.call_soon_threadsafe``,
trio gets ``TrioToken.run_sync_soon``; a loop that has closed meanwhile is ignored, because the
task that wanted the wake-up is gone with it.
"""

from __future__ import annotations

import asyncio
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable

    Waker = Callable[[Callable[[], object]], None]


def current_waker() -> Waker:
    """Return a thread-safe, non-blocking "run this soon on the loop running now"."""
    trio = sys.modules.get("trio")  # never import trio ourselves
    if trio is not None:
        try:
            token = trio.lowlevel.current_trio_token()
        except RuntimeError:  # not inside trio.run
            pass
        else:
            run_finished = trio.RunFinishedError

            def wake_trio(callback: Callable[[], object]) -> None:
                try:
                    token.run_sync_soon(callback)
                except run_finished:
                    pass

            return wake_trio

    loop = asyncio.get_running_loop()

    def wake_asyncio(callback: Callable[[], object]) -> None:
        try:
            loop.call_soon_threadsafe(callback)
        except RuntimeError:  # the loop was closed
            pass

    return wake_asyncio
