"""How a task learns, without blocking its loop, that GPU work finished: the wait strategies.

``"auto"`` (the default)
    Watches closely on the loop thread where completion is near — right after the wait
    starts, and from just before the completion predicted from the stream's recent waits —
    and otherwise sleeps: until the prediction on a precise timer thread, or, with nothing to
    predict, in a waiter thread blocked in the driver. Near busy-spin latency at a fraction of
    its CPU.
``"poll"``
    The same close watch with no thread at all: between watches it sleeps on the loop's own
    timers, which cannot sleep under ~1 ms, so it watches for longer (more CPU) to keep the
    latency low.
``"thread"``
    Nothing on the loop but the wake-up: a waiter thread sleeps until just before the
    predicted completion and watches closely itself, or blocks in ``cuEventSynchronize`` on a
    blocking-sync event; then it wakes the loop thread-safely.
``"callback"``
    Nothing on the loop and no waiter thread in the driver: the GPU itself rings a doorbell
    through a CUDA host function that is C code (``sem_post``), never Python, so it cannot
    deadlock on the GIL (``_doorbell``). Host functions never run after a sticky context error,
    so the watcher's back-off queries double as the watchdog that turns one into ``CudaError``.

All four share one watcher per loop (``_watcher``), which queries only the oldest pending
wait of each stream, so ten thousand waits cost about as much as the streams they are on.
``Event.wait`` has already checkpointed, checked and queried the event once; a strategy is only
entered for work that is still pending. The rule that picks between the strategies' behaviours
lives in ``_watcher`` (its ``WATCH_UNPREDICTED``, ``LEAD`` and ``COLD_POLL`` tables), measured
in ``benchmarks/wake.py``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, Protocol, get_args

from . import _watcher

if TYPE_CHECKING:
    from collections.abc import Coroutine

    from .._device import Device
    from .._driver import Driver
    from .._lifetime import HandleLifetime

WaitStrategy = Literal["auto", "poll", "thread", "callback"]
STRATEGIES: tuple[str, ...] = get_args(WaitStrategy)


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


_default: WaitStrategy = "auto"


def check_strategy(strategy: object) -> WaitStrategy:
    """``strategy`` if it names a strategy (``None``: the process-wide default)."""
    if strategy is None:
        return _default
    if not isinstance(strategy, str):
        raise TypeError(f"wait strategy must be a str, one of {STRATEGIES}; got {strategy!r}")
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown wait strategy {strategy!r}; expected one of {STRATEGIES}")
    return strategy  # type: ignore[return-value]


def wait(target: WaitTarget, strategy: WaitStrategy) -> Coroutine[Any, Any, None]:
    """Wait (the work is pending) until ``target``'s work completes; raise ``CudaError`` on failure.

    Returns the watcher's coroutine itself: no frame of its own to resume on every wake-up.
    """
    return _watcher.current().wait(target, strategy)


def set_default_wait_strategy(strategy: WaitStrategy) -> None:
    """Set the strategy ``await event`` uses when the call does not name one.

    Args:
        strategy: ``"auto"``, ``"poll"``, ``"thread"`` or ``"callback"``; see the README's
            "Wait strategies".

    Raises:
        TypeError: ``strategy`` is not a string.
        ValueError: ``strategy`` is not a known strategy.
    """
    global _default
    if strategy is None:
        raise TypeError(f"wait strategy must be a str, one of {STRATEGIES}; got None")
    _default = check_strategy(strategy)


def get_default_wait_strategy() -> WaitStrategy:
    """The strategy ``await event`` uses when the call does not name one (initially ``"auto"``)."""
    return _default
