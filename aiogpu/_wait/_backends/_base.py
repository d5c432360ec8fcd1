"""The interface every loop backend implements, and setting the signals of a sweep
(``_backends``' docstring says what each part is for)."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Generator


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
    def look_each_iteration(self, callback: Callable[[], object]) -> bool: ...


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
