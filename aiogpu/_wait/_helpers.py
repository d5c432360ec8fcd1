"""Helper streams for the ``callback`` strategy: where the doorbell's host functions run.

A host function enqueued on the user's stream would wait for everything enqueued there since
the event was recorded, and would hold up that stream's later work while it runs. So each
watched stream gets a private non-blocking helper stream that waits for the event
(``cuStreamWaitEvent``) and then runs the host function: it rings as soon as the event's work
is done and delays nobody. Helper streams are reused once idle; one given back with work still
pending (its wait was abandoned) is destroyed instead, which CUDA allows: its resources go once
that work completes.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from .. import _driver
from .._errors import AiogpuError

if TYPE_CHECKING:
    from .._device import Device
    from .._driver import Driver
    from ._doorbell import Doorbell


class HelperStream:
    __slots__ = ("device", "driver", "handle")

    def __init__(self, driver: Driver, device: Device, handle: int) -> None:
        self.driver = driver
        self.device = device
        self.handle = handle

    def ring_after(self, event: int, doorbell: Doorbell) -> None:
        self.driver.stream_wait_event(self.handle, event)
        self.driver.launch_host_function(self.handle, doorbell.function, doorbell.address)


_lock = threading.Lock()
_idle: dict[tuple[int, int], list[HelperStream]] = {}


def take(driver: Driver, device: Device) -> HelperStream:
    with _lock:
        idle = _idle.get((id(driver), device._context))
        if idle:
            return idle.pop()
    with device._activated():
        return HelperStream(driver, device, driver.stream_create(_driver.STREAM_NON_BLOCKING, 0))


def give_back(helper: HelperStream) -> None:
    try:
        if helper.driver.stream_query(helper.handle):
            with _lock:
                _idle.setdefault((id(helper.driver), helper.device._context), []).append(helper)
            return
        helper.driver.stream_destroy(helper.handle)
    except (AiogpuError, RuntimeError):  # a lost context: nothing to reuse
        pass
