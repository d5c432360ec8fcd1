"""Which watcher serves the running loop: one per loop, never shared between loops.

Rules this file keeps:

1. An asyncio loop's watcher is found through a dictionary keyed weakly by the loop; a trio
   run's through a ``RunVar``. No module-global loop, future or task.
2. The registry never keeps a loop alive: it holds a watcher strongly only while nothing is
   pending, when the watcher refers to nothing of its loop (``Registration``).
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING

from . import _backends
from ._watcher import Watcher

if TYPE_CHECKING:
    import asyncio


class Registration:
    """How the registry of asyncio loops' watchers holds one: strongly while it is idle, when it
    refers to nothing of its loop (only to what it learned: predictions), and weakly
    while waits are pending. It then refers to its loop (the waiting tasks' futures, the driving
    task), and the loop to it: the driving task is in the loop's ready queue, behind one of its
    timers, or about to be poked by aiogpu's timer or a waiter thread. Held strongly then, a loop
    dropped with waits pending (closed without cancelling its tasks) would never be collected,
    nor its tasks, nor the events they waited for: a weak dictionary's value must not refer to
    its key."""

    __slots__ = ("idle", "watcher")

    def __init__(self, watcher: Watcher) -> None:
        self.watcher = watcher.weak_self
        self.idle: Watcher | None = watcher


_asyncio_watchers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Registration] = weakref.WeakKeyDictionary()
#: The last (loop, watcher) looked up, both weakly (the watcher refers to its loop): spares the
#: dictionary lookup, and keeps neither a closed loop nor what its watcher refers to alive.
_last_asyncio: tuple[weakref.ref[asyncio.AbstractEventLoop], weakref.ref[Watcher]] | None = None
_trio_watcher_var: object = None


def current() -> Watcher:
    """The watcher of the running loop (per loop: never shared between loops)."""
    global _last_asyncio
    trio = _backends.in_trio_task()  # first: a trio guest's tasks run inside an asyncio loop's callbacks
    loop = _backends.running_asyncio_loop() if trio is None else None
    if loop is not None:
        last = _last_asyncio
        if last is not None and last[0]() is loop and (cached := last[1]()) is not None:
            return cached
        registration = _asyncio_watchers.get(loop)
        watcher = None if registration is None else registration.watcher()
        if watcher is None:
            watcher = Watcher(_backends.asyncio_backend(loop))
            watcher.registration = _asyncio_watchers[loop] = Registration(watcher)
        _last_asyncio = (weakref.ref(loop), watcher.weak_self)
        return watcher
    if trio is None:
        raise RuntimeError("aiogpu waits need a running asyncio, uvloop or trio event loop")
    global _trio_watcher_var
    if _trio_watcher_var is None:
        _trio_watcher_var = trio.lowlevel.RunVar("aiogpu_watcher")
    run_var = _trio_watcher_var
    try:
        return run_var.get()  # type: ignore[attr-defined,no-any-return]
    except LookupError:
        watcher = Watcher(_backends.trio_backend(trio))
        run_var.set(watcher)  # type: ignore[attr-defined]
        return watcher
