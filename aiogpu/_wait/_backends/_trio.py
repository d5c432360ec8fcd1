"""trio: signals and parks are trio ``Event``s, the waker is the run's ``TrioToken``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._base import set_signals

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Generator

    from ._base import Park, Signal, Waiters


class TrioBackend:
    def __init__(self, trio: Any) -> None:
        self._trio = trio
        self._token = trio.lowlevel.current_trio_token()

    def waker(self, callback: Callable[[], object]) -> bool:
        try:
            self._token.run_sync_soon(callback)
        except self._trio.RunFinishedError:
            return False
        return True

    def runs_here(self) -> bool:
        try:
            return self._trio.lowlevel.current_trio_token() is self._token
        except RuntimeError:  # not in a trio run
            return False

    def new_signal(self) -> Signal:
        return _TrioSignal(self._trio.Event())

    def set_signals(self, waking: list[Waiters]) -> None:
        set_signals(waking)

    def new_park(self) -> Park:
        return _TrioSignal(self._trio.Event())

    def spawn_system_task(self, function: Callable[[], Awaitable[None]], ended: Callable[[object], None]) -> object:
        """Returns the task. Never calls ``ended``: trio starts every task it cancels, so
        ``function``'s ``finally`` always runs."""
        return self._trio.lowlevel.spawn_system_task(function)

    def yield_now(self) -> Awaitable[None]:
        return self._trio.lowlevel.checkpoint()  # type: ignore[no-any-return]

    async def sleep_in_park(self, park: Park, timeout: float) -> None:
        with self._trio.move_on_after(timeout):
            await park

    def earliest_timer(self) -> tuple[float, float] | None:
        return None  # trio's deadlines are its runner's own

    def look_each_iteration(self, callback: Callable[[], object]) -> bool:
        return False  # a trio run schedules no callbacks of ours: its batches run tasks only


class _TrioSignal:
    """A trio ``Event`` as a ``Signal`` and a ``Park`` (trio runs a woken task on its next
    batch whoever wakes it)."""

    __slots__ = ("_event",)

    def __init__(self, event: Any) -> None:
        self._event = event

    def set_result(self, result: None, /) -> None:
        self._event.set()

    def wake_in_callback(self) -> None:
        self._event.set()

    def done(self) -> bool:
        return self._event.is_set()  # type: ignore[no-any-return]

    def __await__(self) -> Generator[Any, None, None]:
        return self._event.wait().__await__()  # type: ignore[no-any-return]
