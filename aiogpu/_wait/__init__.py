"""The wake engine: how a task learns, without blocking the loop, that GPU work finished.

Strategies (``WaitStrategy``):

``"poll"``
    Query the event (``cuEventQuery``, ~2 µs) on the loop thread: between every other task's
    turn for the first 100 µs, then with sleeps growing from 0.25 ms to 2 ms. No threads.
    Completion is noticed up to ~2 ms late once the sleeps start (asyncio timers cannot sleep
    under ~1 ms), and each poll costs one driver call on the loop.
``"thread"``
    A bounded pool of aiogpu's own threads parks in ``cuEventSynchronize`` on a blocking-sync
    event (no CPU burnt while waiting) and wakes the loop thread-safely. Many tasks awaiting one
    recording share one thread. Wake-up costs an OS thread hand-off (tens to a few hundred µs).

The caller (``Event.wait``) has already checkpointed, checked the event and queried it once;
a strategy is only entered for work that is still pending, and must (1) return once the
work is complete, (2) raise ``CudaError`` if the driver reports a failure, (3) return promptly
when cancelled, leaving the GPU work and the event untouched and nothing behind that outlives
the GPU work.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal, Protocol, get_args

from . import _poll, _thread

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from .._device import Device
    from .._driver import Driver
    from .._lifetime import HandleLifetime

WaitStrategy = Literal["poll", "thread"]
STRATEGIES: tuple[str, ...] = get_args(WaitStrategy)


class WaitTarget(Protocol):
    """What a strategy needs to know about the event it waits for."""

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
    def is_blocking_sync(self) -> bool: ...


_IMPLEMENTATIONS: dict[str, Callable[[WaitTarget], Awaitable[None]]] = {
    "poll": _poll.wait,
    "thread": _thread.wait,
}
_default: WaitStrategy = "thread"


def _check_strategy(strategy: object) -> WaitStrategy:
    if not isinstance(strategy, str):
        raise TypeError(f"wait strategy must be a str, one of {STRATEGIES}; got {strategy!r}")
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown wait strategy {strategy!r}; expected one of {STRATEGIES}")
    return strategy  # type: ignore[return-value]


def implementation(strategy: WaitStrategy | None) -> Callable[[WaitTarget], Awaitable[None]]:
    """The strategy function for ``strategy`` (``None``: the process-wide default)."""
    return _IMPLEMENTATIONS[_default if strategy is None else _check_strategy(strategy)]


def set_default_wait_strategy(strategy: WaitStrategy) -> None:
    """Set the strategy ``await event`` uses when the call does not name one.

    Args:
        strategy: ``"poll"`` or ``"thread"``; see the README's "Wait strategies" section.

    Raises:
        TypeError: ``strategy`` is not a string.
        ValueError: ``strategy`` is not a known strategy.
    """
    global _default
    _default = _check_strategy(strategy)


def get_default_wait_strategy() -> WaitStrategy:
    """The strategy ``await event`` uses when the call does not name one (initially ``"thread"``)."""
    return _default
