"""The little that differs between asyncio (and uvloop) and trio, behind one small interface.

- ``Signal``: a one-shot wake-up a task can await, set from the loop thread: future-like
  (``set_result(None)``, ``done()``). ``Backend.set_signals`` sets a sweep's worth at once.
- ``Backend.waker``: a thread-safe, non-blocking "run this soon on the loop". Foreign threads
  (aiogpu's waiter and timer threads) may only *schedule* a call on the loop: never run user
  code, never raise, never block. ``anyio.from_thread.run_sync`` is not an option: it waits
  until the loop has run the call. A loop that has closed meanwhile is ignored (``False``): the
  task that wanted the wake-up is gone with it. ``Backend.runs_here``: whether the calling code
  runs on the loop (its thread, inside its run).
- ``Backend.spawn_system_task``: a background task that belongs to the loop, not to a user task.
- ``Backend.earliest_timer``: the loop's own earliest timer, where the loop rounds its sleeps
  and its timers are in reach: the watcher has it kept on time (``Watcher._keep_loop_timer``).
- ``Park``: where the task that drives a watcher sleeps. A ``Signal`` that can also be woken
  from a loop callback outside every task (``wake_in_callback``: a thread's poke, a timer).

One module per loop, as anyio's ``_backends``: ``_asyncio`` (asyncio's public API only: every
asyncio loop, uvloop's included), ``_trio``, and ``_asyncio_private``, the one module that
reads asyncio's internals, for asyncio's own loops only, and only where a check of those
internals on that loop passes (``asyncio_backend``). Setting ``AIOGPU_PUBLIC_ASYNCIO=1`` in the
environment makes every loop created afterwards use the public one.

Which library runs the calling code is what trio says through sniffio (``in_trio_task``), read
defensively: trio or sniffio may be half-imported by another thread.
"""

from __future__ import annotations

import asyncio
import os
import sys
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Generator

#: Set to anything but ``""`` or ``"0"``: asyncio's own loops get the public backend too (read
#: as each loop's backend is made).
PUBLIC_ASYNCIO_VARIABLE = "AIOGPU_PUBLIC_ASYNCIO"


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


def asyncio_backend(loop: asyncio.AbstractEventLoop) -> Backend:
    """The backend for ``loop`` (made once per loop): the private one where the environment
    allows it and ``loop``'s internals pass its check, else the public one."""
    from . import _asyncio, _asyncio_private

    if os.environ.get(PUBLIC_ASYNCIO_VARIABLE, "") in ("", "0") and _asyncio_private.supports(loop):
        return _asyncio_private.PrivateAsyncioBackend(loop)
    return _asyncio.AsyncioBackend(loop)


def trio_backend(trio: Any) -> Backend:
    """The backend for the running trio run (made once per run)."""
    from ._trio import TrioBackend

    return TrioBackend(trio)


def running_asyncio_loop() -> asyncio.AbstractEventLoop | None:
    """The asyncio loop running in this thread, or ``None``.

    ``asyncio.get_running_loop`` is looked up at each call: trio-asyncio replaces it."""
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


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
    loop = running_asyncio_loop()
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
