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
- ``Backend.look_each_iteration``: run a callback on the loop's next iteration, ahead of the
  tasks made ready meanwhile, where a park woken in it resumes its task right there (the
  watcher's look at parked waits while the loop is busy: ``_busy``).

One module per loop, as anyio's ``_backends``: ``_asyncio`` (asyncio's public API only),
``_trio``, and ``_asyncio_private``, the one module that reads asyncio's internals: its parks
run on every asyncio loop (uvloop's included) as long as the first task wake-up one keeps looks
as expected, and on asyncio's own loops whose internals pass a check (``supports``) it also
parks waiting tasks and reads the loop's timers. Setting ``AIOGPU_PUBLIC_ASYNCIO=1`` in the
environment makes every loop created afterwards use the public one.

Which library runs the calling code is what trio says through sniffio (``in_trio_task``), read
defensively: trio or sniffio may be half-imported by another thread.
"""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any

from ._base import Backend as Backend  # noqa: TC001 (the engine's name for it)
from ._base import Park as Park
from ._base import Signal as Signal
from ._base import Waiters as Waiters
from ._base import set_signal as set_signal
from ._base import set_signals as set_signals

#: Set to anything but ``""`` or ``"0"``: asyncio's own loops get the public backend too (read
#: as each loop's backend is made).
PUBLIC_ASYNCIO_VARIABLE = "AIOGPU_PUBLIC_ASYNCIO"


def asyncio_backend(loop: asyncio.AbstractEventLoop) -> Backend:
    """The backend for ``loop`` (made once per loop): the private one where the environment
    allows it and ``loop``'s internals pass its check, else the public one."""
    from . import _asyncio, _asyncio_private

    if os.environ.get(PUBLIC_ASYNCIO_VARIABLE, "") in ("", "0"):
        return _asyncio_private.PrivateAsyncioBackend(loop, own_loop=_asyncio_private.supports(loop))
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
