"""Instruments that drive a device deterministically, on the GPU and the simulator alike.

``Latch`` holds streams until the test releases it (on a GPU: a one-thread kernel that spins
until a word in mapped pinned host memory is set, so a held stream is busy the way real work
makes it, and other streams run on; simulated: held work). ``launch_spin``
keeps a stream busy for a given time; ``launch_fault`` makes the device fault. Each picks the
implementation for its device's driver (the CUDA kernels of :mod:`._cuda_instruments` for a
``CudaDriver``, the simulated driver's own instruments otherwise), so tests written with them
run unchanged on both. The production driver interface carries none of this.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Protocol, final, runtime_checkable

from .._driver import CudaDriver
from .._errors import AiogpuError, ClosedResourceError
from .._stream import Stream
from ._cuda_instruments import cuda_instruments
from ._simulated import SimulatedDriver

if TYPE_CHECKING:
    from types import TracebackType

    from .._device import Device
    from .._driver import Driver
    from .._event import Event


@runtime_checkable
class Instruments(Protocol):
    """What the instruments need on a device: handles are ``int`` addresses, as across the
    driver door, and calls need the device's context current, as driver calls do."""

    def latch_create(self) -> int: ...
    def latch_block(self, stream: int, latch: int) -> None: ...
    def latch_release(self, latch: int) -> None: ...
    def latch_destroy(self, latch: int) -> None: ...
    def launch_spin(self, stream: int, seconds: float) -> None: ...
    def launch_fault(self, stream: int) -> None: ...


def instruments_for(driver: Driver) -> Instruments:
    """The instruments for devices of ``driver``: CUDA kernels for a ``CudaDriver``; a driver
    with instruments of its own (``SimulatedDriver``) is its own."""
    if isinstance(driver, SimulatedDriver):  # first: the cheap check for the common case
        return driver
    if isinstance(driver, CudaDriver):
        return cuda_instruments(driver)
    if isinstance(driver, Instruments):
        return driver
    raise TypeError(f"aiogpu.testing's instruments need a device of a CudaDriver or a SimulatedDriver, got one of {driver!r}")


# A latch's memory may only be freed once every stream it held has moved past it (the GPU
# reads it until then). Closed latches wait here until their markers complete.
_graveyard_lock = threading.Lock()
_graveyard: list[tuple[Latch, list[Event]]] = []


def _bury(latch: Latch, markers: list[Event]) -> None:
    with _graveyard_lock:
        _graveyard.append((latch, markers))
        pending = list(_graveyard)
        _graveyard.clear()
    keep = []
    for buried, buried_markers in pending:
        if all(_passed(marker) for marker in buried_markers):
            for marker in buried_markers:
                marker.close()
            buried._destroy()
        else:
            keep.append((buried, buried_markers))
    with _graveyard_lock:
        _graveyard.extend(keep)


def _passed(marker: Event) -> bool:
    try:
        return marker.is_done
    except AiogpuError:  # the context is lost: nothing runs any more
        return True


@final
class Latch:
    """Hold work on streams until :meth:`release`: a deterministic "still busy" GPU.

    ``with Latch(device) as latch:`` releases on exit, so a failing test never leaves a stream
    blocked. Queue well under ~1,000 operations behind a held stream: beyond that the launch
    call itself blocks the host until the latch opens. On a GPU each held stream runs one
    single-thread kernel until the release: a data-center GPU runs at most 128 kernels at once
    (some embedded ones 16), so hold fewer streams than that when other work must run
    meanwhile; and a GPU that drives a display ends kernels that run for more than a few seconds
    (its watchdog, a sticky error), so hold streams only briefly there.

    Args:
        device: The device whose streams it will hold.
    """

    def __init__(self, device: Device) -> None:
        self._device = device
        self._instruments = instruments_for(device._driver)
        with device._activated():
            self._handle = self._instruments.latch_create()
        self._markers: list[Event] = []
        self._closed = False

    @property
    def device(self) -> Device:
        """The device whose streams the latch can hold."""
        return self._device

    def block(self, stream: Stream) -> None:
        """Make work enqueued on ``stream`` after this call wait until the latch is released."""
        if self._closed:
            raise ValueError("the latch is closed")
        if not isinstance(stream, Stream) or stream.device is not self._device:
            raise ValueError(f"expected an aiogpu.Stream of {self._device!r}, got {stream!r}")
        if stream.is_closed:
            raise ClosedResourceError(f"{stream!r} is closed")
        with self._device._activated():  # the hold kernel is loaded per context
            self._instruments.latch_block(stream.handle, self._handle)
        self._markers.append(stream.record())

    def release(self) -> None:
        """Let every stream held by this latch go on. Idempotent."""
        if not self._closed:
            self._instruments.latch_release(self._handle)

    def __reduce__(self) -> tuple[object, ...]:
        raise TypeError("a Latch cannot be copied or pickled: it owns its handle; share the object itself")

    def close(self) -> None:
        """Release the latch and free it once no stream can still be reading it. Idempotent."""
        if self._closed:
            return
        self.release()
        self._closed = True
        _bury(self, self._markers)

    def _destroy(self) -> None:
        try:
            self._instruments.latch_destroy(self._handle)
        except (AiogpuError, RuntimeError):
            pass

    def __enter__(self) -> Latch:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


def launch_spin(stream: Stream, seconds: float) -> None:
    """Enqueue a kernel that keeps ``stream`` busy for ``seconds`` of device time."""
    if not isinstance(stream, Stream):
        raise TypeError(f"expected an aiogpu.Stream, got {stream!r}")
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 0 <= seconds <= 3600:
        raise ValueError(f"seconds must be a number between 0 and 3600, got {seconds!r}")
    instruments = instruments_for(stream.device._driver)
    with stream.device._activated():
        instruments.launch_spin(stream.handle, float(seconds))


def launch_fault(stream: Stream) -> None:
    """Enqueue a kernel that stores to an unmapped address: ``CUDA_ERROR_ILLEGAL_ADDRESS``.

    The error is sticky: the device's context is unusable for the rest of the process, so
    on a real GPU run this in a child process.
    """
    if not isinstance(stream, Stream):
        raise TypeError(f"expected an aiogpu.Stream, got {stream!r}")
    instruments = instruments_for(stream.device._driver)
    with stream.device._activated():
        instruments.launch_fault(stream.handle)
