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
wait of each stream, so ten thousand waits cost about as much as the streams they are on.
``Event.wait`` is the watcher's ``wait`` coroutine itself: it checks the event, queries it once
(done: a checkpoint and nothing more) and otherwise joins or opens the watcher's entry for that
recording, which keeps the handle alive while pending. The rule that picks between the
strategies' behaviours lives in ``_watcher`` (its ``WATCH_UNPREDICTED``, ``LEAD`` and
``COLD_POLL`` tables), measured in ``benchmarks/wake.py``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from . import _holds, _watcher
from ._strategy import STRATEGIES as STRATEGIES
from ._strategy import WaitStrategy as WaitStrategy
from ._strategy import check_strategy as check_strategy
from ._strategy import get_default_wait_strategy as get_default_wait_strategy
from ._strategy import set_default_wait_strategy as set_default_wait_strategy

if TYPE_CHECKING:
    from .._device import Device
    from .._driver import Driver
    from .._lifetime import HandleLifetime


class WaitTarget(Protocol):
    """What the engine needs to know about the event it waits for."""

    @property
    def _driver(self) -> Driver: ...
    @property
    def _device(self) -> Device: ...
    @property
    def _handle(self) -> int: ...
    @property
    def _lifetime(self) -> HandleLifetime: ...
    @property
    def _generation(self) -> int: ...
    @property
    def _stream_key(self) -> object: ...
    @property
    def _recorded_at(self) -> float: ...
    @property
    def _record_sequence(self) -> int: ...
    @property
    def is_blocking_sync(self) -> bool: ...
    def _check_recorded(self, action: str) -> None: ...

    _waiting: _watcher._Entry | None  # set by the engine: the entry new waits for this recording join
    _home_uses: int  # pending waits of the event's home loop (``_holds``)
    _home_closing: bool  # closed while some were pending: the last one lets go of the home's use


wait = _watcher.wait  # ``Event.wait``
closed = _holds.closed  # ``Event.close``
