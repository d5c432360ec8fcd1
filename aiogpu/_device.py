"""Device: one CUDA device and its primary context.

The primary context is the one the CUDA runtime, torch, CuPy and cuda.core share, so objects
made by aiogpu and by those libraries interoperate. One ``Device`` object exists per driver
and ordinal, for the life of the driver; it retains the primary context once and never
releases it, as the CUDA runtime does: releasing the last reference would destroy the context
and, with it, handles that other objects and aiogpu's waiter threads still hold. aiogpu never
leaves its context current behind the user's back: creation calls push it and pop it again
(see :meth:`Device._activated`).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, final

from . import _driver
from ._checks import check_int as check_int  # (``_transfer`` imports it from here)
from ._errors import CudaUnavailableError

if TYPE_CHECKING:
    from ._driver import Driver
    from ._event import Event
    from ._stream import Stream

_devices_lock = threading.Lock()


def _devices_of(driver: Driver) -> dict[int, Device]:
    """The driver's devices by ordinal, kept on the driver so they live and die with it."""
    devices: dict[int, Device] | None = getattr(driver, "_aiogpu_devices", None)
    if devices is None:
        devices = {}
        driver._aiogpu_devices = devices  # type: ignore[attr-defined]
    return devices


@final
class Device:
    """A CUDA device, by ordinal, with its primary context retained.

    ``Device(0) is Device(0)``: one object per device (and driver). Creating it initializes
    the driver; ``import aiogpu`` alone never does.

    Args:
        ordinal: The device number, as CUDA counts them (after ``CUDA_VISIBLE_DEVICES``).
        driver: The driver to use. The default is the real CUDA driver, unless a test installed
            a simulated one (:meth:`aiogpu.testing.SimulatedDriver.installed`).

    Raises:
        TypeError: ``ordinal`` is not an int.
        ValueError: No device has that ordinal.
        CudaUnavailableError: There is no NVIDIA driver or no device.
    """

    __slots__ = ("__weakref__", "_context", "_default_stream", "_driver", "_name", "_ordinal")

    _driver: Driver
    _ordinal: int
    _context: int
    _name: str
    _default_stream: Stream | None

    def __new__(cls, ordinal: int = 0, *, driver: Driver | None = None) -> Device:
        ordinal = check_int("device ordinal", ordinal)
        driver = _check_driver(driver)
        with _devices_lock:
            devices = _devices_of(driver)
            device = devices.get(ordinal)
            if device is None:
                device = devices[ordinal] = cls._open(driver, ordinal)
        return device

    @classmethod
    def _open(cls, driver: Driver, ordinal: int) -> Device:
        driver.init()
        count = driver.device_count()
        if count == 0:
            raise CudaUnavailableError("the CUDA driver reports no devices: check nvidia-smi and CUDA_VISIBLE_DEVICES")
        if not 0 <= ordinal < count:
            raise ValueError(
                f"device ordinal {ordinal} is out of range: this machine has {count} CUDA "
                f"device{'s' if count > 1 else ''} (valid ordinals: 0 to {count - 1})"
            )
        self = object.__new__(cls)
        self._driver = driver
        self._ordinal = ordinal
        self._name = driver.device_name(ordinal)
        self._context = driver.primary_context_retain(ordinal)
        self._default_stream = None
        return self

    @staticmethod
    def count(*, driver: Driver | None = None) -> int:
        """How many CUDA devices this process can see (0 if there is no driver or device).

        Raises:
            TypeError: ``driver`` is not an aiogpu driver.
        """
        driver = _check_driver(driver)
        try:
            driver.init()
            return driver.device_count()
        except CudaUnavailableError:
            return 0

    @property
    def ordinal(self) -> int:
        """The device number."""
        return self._ordinal

    @property
    def name(self) -> str:
        """The device's marketing name, for example ``"NVIDIA H100 80GB HBM3"``."""
        return self._name

    @property
    def driver_name(self) -> str:
        """``"cuda"`` for the real driver, ``"simulated"`` for ``aiogpu.testing``'s."""
        return self._driver.name

    @property
    def default_stream(self) -> Stream:
        """The device's legacy default stream (the one torch and CuPy use unless told otherwise)."""
        if self._default_stream is None or self._default_stream.is_closed:
            from ._stream import Stream

            self._default_stream = Stream._borrow(self, 0, owner=None)
        return self._default_stream

    @property
    def stream_priority_range(self) -> tuple[int, int]:
        """``(lowest, highest)`` stream priorities; numerically *lower* is a higher priority."""
        with self._activated():
            return self._driver.stream_priority_range()

    def set_current(self) -> None:
        """Make this device's primary context current on the calling thread (``cuCtxSetCurrent``).

        aiogpu does not need this — it makes its context current wherever it has to — but
        code that mixes in raw driver calls may.
        """
        self._driver.context_set_current(self._context)

    def create_stream(self, *, priority: int | None = None, nonblocking: bool = False) -> Stream:
        """A new stream on this device; see :class:`aiogpu.Stream`."""
        from ._stream import Stream

        return Stream(self, priority=priority, nonblocking=nonblocking)

    def create_event(self, *, timing: bool = False, blocking_sync: bool = False, interprocess: bool = False) -> Event:
        """A new, unrecorded event on this device; see :class:`aiogpu.Event`."""
        from ._event import Event

        return Event(self, timing=timing, blocking_sync=blocking_sync, interprocess=interprocess)

    def _activated(self) -> _Activation:
        """Make the primary context current for the block, restoring what was current before."""
        return _Activation(self)

    def __repr__(self) -> str:
        return f"<aiogpu.Device {self._ordinal} {self._name!r} driver={self._driver.name}>"

    def __reduce__(self) -> tuple[object, ...]:
        if self._driver is not _driver.default_driver():
            raise TypeError(f"{self!r} cannot be pickled: only devices of the default driver can be")
        return (Device, (self._ordinal,))


class _Activation:
    """``Device._activated()``'s block. A class, not a ``contextmanager`` generator: it runs for
    every event created, and a generator's machinery would add to the cost of each
    (``benchmarks/host_costs.py`` measures event creation)."""

    __slots__ = ("_device", "_pushed")

    def __init__(self, device: Device) -> None:
        self._device = device
        self._pushed = False

    def __enter__(self) -> None:
        device = self._device
        if device._driver.context_get_current() != device._context:
            device._driver.context_push(device._context)
            self._pushed = True

    def __exit__(self, *exc_info: object) -> None:
        if self._pushed:
            self._pushed = False
            self._device._driver.context_pop()


def _check_driver(driver: object) -> Driver:
    """``driver``, or the process's default driver for ``None``; ``TypeError`` if not a driver."""
    if driver is None:
        return _driver.default_driver()
    if not all(callable(getattr(driver, name, None)) for name in ("init", "device_count", "event_query", "stream_create")):
        raise TypeError(f"driver must implement aiogpu's driver interface (CudaDriver, SimulatedDriver), got {driver!r}")
    return driver  # type: ignore[return-value]
