"""One object per process, made on first use, made anew in a forked child.

aiogpu's process-wide helpers (waiter pool, timer, doorbell, armer, pinned-memory freer) own
threads (``_daemon``), and threads do not survive ``fork()``: a child must not inherit the
parent's objects, which would believe their threads exist. ``import aiogpu`` makes none of them.
"""

from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING, Generic, TypeVar

if TYPE_CHECKING:
    from collections.abc import Callable

T = TypeVar("T")


class PerProcess(Generic[T]):
    def __init__(self, factory: Callable[[], T]) -> None:
        self._factory = factory
        self._lock = threading.Lock()
        self._value: T | None = None
        os.register_at_fork(after_in_child=self._forget)

    def get(self) -> T:
        value = self._value  # made already: no lock (the timer's is asked for at every precise park)
        if value is not None:
            return value
        with self._lock:
            if self._value is None:
                self._value = self._factory()
            return self._value

    def _forget(self) -> None:
        self._lock = threading.Lock()  # it may have been held by a thread that is gone
        self._value = None
