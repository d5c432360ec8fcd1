"""How a task learns, without blocking its loop, that GPU work finished: the wait strategies.

``"auto"`` (the default)
    Watches closely on the loop thread where completion is near — right after the wait
    starts, and from just before the completion predicted from the stream's recent waits —
    and otherwise sleeps: until the prediction on a precise timer thread, or, with nothing to
    predict, until one waiter thread, querying such streams' oldest waits in turn with growing
    pauses, sees one done. Near busy-spin latency at a fraction of its CPU.
``"poll"``
    The same close watch with no thread at all: between watches it sleeps on the loop's own
    timers, which cannot sleep under ~1 ms, so it watches for longer (more CPU) to keep the
    latency low.
``"thread"``
    Nothing on the loop but the wake-up: a waiter thread sleeps until just before the
    predicted completion and watches closely itself, or else queries with growing pauses
    (blocks in ``cuEventSynchronize`` only on an event recorded as blocking-sync); then it
    wakes the loop thread-safely. Neither ``auto``, ``poll`` nor ``thread`` enqueues anything
    on the GPU.
``"callback"``
    Nothing on the loop and no waiter thread in the driver: the GPU itself rings a doorbell
    through a CUDA host function that is C code (``sem_post``), never Python, so it cannot
    deadlock on the GIL (``_doorbell``). Host functions never run after a sticky context error,
    so the watcher's back-off queries double as the watchdog that turns one into ``CudaError``.
    A pending host function holds up device work added to other streams later (``_helpers``).

All four share one watcher per loop (``_watcher``), which queries only the oldest pending
wait of each stream (``_sweep``), so ten thousand waits cost about as much as the streams
they are on. ``Event.wait`` is this module's ``wait`` coroutine itself: it checks the event,
queries it once (done: a checkpoint and nothing more) and otherwise joins or opens the
watcher's entry for that recording, which keeps the handle alive while pending. The rules that pick between the
strategies' behaviours live in ``_policy`` (its ``WATCH_UNPREDICTED``, ``LEAD`` and
``COLD_POLL`` tables), measured in ``benchmarks/wake.py``.

The engine's rooms, each with one job: ``_recording`` (what it keeps on an event),
``_entries`` (per awaited recording and per stream), ``_sweep`` (query each stream's oldest
wait, complete in order), ``_plan`` (how each head is watched), ``_watcher`` (drive, park, hand
over), ``_registry`` (one watcher per loop), ``_policy`` (every tunable and pure planner).
The watcher is one class in three layers, ``Sweep`` < ``Planner`` < ``Watcher``, so that the
wake-up path calls its methods with no hop between objects. This module is the engine's whole
face to the rest of aiogpu: nothing outside ``_wait`` imports its private modules.
"""

from __future__ import annotations

import copy
import time

from . import _holds, _predict
from ._backends import in_trio_run as in_trio_run
from ._backends import in_trio_task as in_trio_task
from ._backends import running_asyncio_loop as running_asyncio_loop
from ._entries import Entry, joinable
from ._recording import Recording as Recording  # noqa: TC001 (``Event``'s base type)
from ._recording import is_own_stream_key as is_own_stream_key
from ._recording import own_stream_key as own_stream_key
from ._registry import current
from ._strategy import OFF_LOOP
from ._strategy import STRATEGIES as STRATEGIES
from ._strategy import WaitStrategy as WaitStrategy
from ._strategy import check_strategy as check_strategy
from ._strategy import get_default_wait_strategy as get_default_wait_strategy
from ._strategy import set_default_wait_strategy as set_default_wait_strategy
from ._watcher import DriverFlag

closed = _holds.closed  # ``Event.close``


def pending() -> list[Entry]:
    """What the running loop's tasks are waiting for, oldest wait first (``aiogpu.pending_waits``).

    Raises:
        RuntimeError: No asyncio, uvloop or trio loop is running in this thread.
    """
    return current().pending()


def forget_stream(key: object) -> None:
    """Drop what the engine learned about the stream ``key`` names (it was destroyed, and its
    handle may be reused)."""
    _predict.forget(key)


async def wait(target: Recording, *, strategy: WaitStrategy | None = None) -> None:
    """Wait until the captured work has completed, without blocking the event loop.

    Always a checkpoint, even if the work is already done. ``await event`` is the same as
    ``await event.wait()``.

    Args:
        strategy: ``"auto"``, ``"poll"``, ``"thread"`` or ``"callback"`` (see the user guide's
            "Wait strategies and how to choose"); the default is :func:`aiogpu.get_default_wait_strategy`.

    Raises:
        EventStateError: The event was never recorded.
        CudaError: The captured work failed, for example with ``CUDA_ERROR_ILLEGAL_ADDRESS``
            from an earlier kernel; every task awaiting the event gets it.
        ClosedResourceError: The event was closed.

    Cancellation:
        Returns promptly with every strategy (the ``thread`` strategy does not wait for
        the GPU). The GPU work and the event are untouched: the event can be awaited
        again. Nothing is leaked; a waiter thread already waiting for the work returns
        to the pool at its next query (or, parked on a blocking-sync event, when the work
        completes).
    """
    # This is ``Event.wait`` itself (one coroutine frame per waiting task, the engine's: every
    # frame more is resumed on every wake-up, 10,000 times in a fan-out).
    mode = check_strategy(strategy)
    target._check_recorded("await")
    watcher = current()
    entry = joinable(target, watcher)
    # Recorded behind a wait this loop watches on the same stream: it is pending too.
    behind = entry is None and watcher.follows_pending(target)
    if entry is None:  # nobody waits for this recording yet: is it done already?
        held = _holds.hold(target, watcher)  # by the entry from here on (``_entries.let_go``)
        try:
            done = not behind and target._driver.event_query(target._handle)
            if not done and mode not in OFF_LOOP and not watcher.running:  # short work, idle watcher
                if await watcher.spin_ahead(target):
                    _holds.let_go(target, held)
                    return  # it yielded before it saw the work done: checkpointed
                entry = joinable(target, watcher)  # others may have started waiting meanwhile
                if entry is not None:
                    _holds.let_go(target, held)  # held by that entry already
        except BaseException:
            _holds.let_go(target, held)
            raise
        if done:
            _holds.let_go(target, held)
            await watcher.backend.yield_now()  # a checkpoint even when already done
            return
    driving = not watcher.running
    signal = DriverFlag() if driving else watcher.backend.new_signal()
    if entry is None:
        now = time.perf_counter()
        entry = Entry(watcher, target, mode, now, held)
        target._waiting = entry
        entry.join(signal)  # before it is planned: a head without waiters is skipped
        watcher.enqueue(entry, now)
    else:
        entry.join(signal)
    try:
        if not driving:
            if not behind:  # a wait behind a watched one changes no plan: no sweep for it
                watcher.poke()
            await signal  # a park or the loop's future itself: no frame more on the wake-up
        else:  # nobody watches: this task does, so its own wake-up costs no hand-off
            await watcher.drive(signal)
    except BaseException:
        watcher.leave(entry, signal)
        raise
    if entry.error is not None:
        raise copy.copy(entry.error)
