"""The driver ``aiogpu.Device(n)`` uses unless given one: the real one, or one a test installed."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from ._cuda import CudaDriver

if TYPE_CHECKING:
    from ._protocol import Driver

_default_lock = threading.Lock()
_default: Driver | None = None


def default_driver() -> Driver:
    """The driver ``aiogpu.Device(n)`` uses: the real one unless a test installed another."""
    global _default
    with _default_lock:
        if _default is None:
            _default = CudaDriver()
        return _default


def swap_default_driver(driver: Driver | None) -> Driver | None:
    """Install ``driver`` as the default (``None``: the real one again); return the previous."""
    global _default
    with _default_lock:
        previous, _default = _default, driver
        return previous
