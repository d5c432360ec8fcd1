"""Simulated memory: page-locked host buffers, device memory, and the checks copies pass.

Simulated device memory is host memory too; copies touch it through ``ctypes.memmove``, so the
driver refuses any range outside a live allocation (as a GPU does) rather than let a bad
pointer crash the process.
"""

from __future__ import annotations

import bisect
import ctypes
import weakref
from typing import TYPE_CHECKING, final

from ..._errors import ClosedResourceError
from ._model import driver_error

if TYPE_CHECKING:
    import threading
    from types import TracebackType


class Allocation:
    """Memory the simulated driver handed out: page-locked host memory or device memory."""

    __slots__ = ("buffer", "end", "kind", "start")

    def __init__(self, buffer: ctypes.Array[ctypes.c_char], kind: str) -> None:
        self.buffer = buffer  # kept by pending copies too: memory is never reused under one
        self.start = ctypes.addressof(buffer)
        self.end = self.start + len(buffer)
        self.kind = kind  # "host" (cuMemHostAlloc) or "device" (cuMemAlloc)


class MemoryMap:
    """The live allocations of one simulated driver, by start address.

    Memory a copy may touch: page-locked host buffers (``host_alloc``) and simulated device
    memory (``SimulatedDriver.allocate``). Calls marked "lock held" expect the driver's lock,
    which :meth:`unregister` takes itself (a buffer's finalizer calls it from any thread).
    """

    def __init__(self, lock: threading.Condition) -> None:
        self._lock = lock
        self._by_start: dict[int, Allocation] = {}
        self._starts: list[int] = []  # sorted

    def register(self, nbytes: int, kind: str, func: str) -> Allocation:
        """Allocate ``nbytes`` of simulated memory and track it (lock held)."""
        try:
            allocation = Allocation(ctypes.create_string_buffer(nbytes), kind)
        except (MemoryError, OverflowError):
            raise driver_error("CUDA_ERROR_OUT_OF_MEMORY", func) from None
        self._by_start[allocation.start] = allocation
        bisect.insort(self._starts, allocation.start)
        return allocation

    def unregister(self, start: int, func: str) -> None:
        """Forget the allocation at ``start``; copies still pending keep its memory."""
        with self._lock:
            if self._by_start.pop(start, None) is None:
                raise driver_error("CUDA_ERROR_INVALID_VALUE", func)
            del self._starts[bisect.bisect_left(self._starts, start)]

    def at(self, start: int) -> Allocation | None:
        """The live allocation that starts at ``start`` (lock held)."""
        return self._by_start.get(start)

    def count(self, kind: str) -> int:
        """How many live allocations of ``kind`` there are (lock held)."""
        return sum(allocation.kind == kind for allocation in self._by_start.values())

    def holding(self, pointer: int, nbytes: int, func: str) -> Allocation:
        """The live allocation that holds ``[pointer, pointer + nbytes)`` (lock held); a pointer
        outside every one gets ``CUDA_ERROR_INVALID_VALUE``, as from a GPU."""
        if isinstance(pointer, int) and not isinstance(pointer, bool):
            index = bisect.bisect_right(self._starts, pointer) - 1
            if index >= 0:
                allocation = self._by_start[self._starts[index]]
                if pointer + nbytes <= allocation.end and (nbytes or pointer < allocation.end):
                    return allocation
        raise driver_error(
            "CUDA_ERROR_INVALID_VALUE",
            func,
            f"invalid argument: {nbytes} bytes at {_address(pointer)} are not inside memory this simulated "
            "driver allocated (SimulatedDriver.allocate, a PinnedPool's buffers)",
        )


def _address(pointer: object) -> str:
    return f"{pointer:#x}" if isinstance(pointer, int) and not isinstance(pointer, bool) else repr(pointer)


@final
class SimulatedBuffer:
    """Simulated device memory from :meth:`SimulatedDriver.allocate`: a CUDA array of bytes.

    Pass it wherever aiogpu takes a CUDA array (``copy_to_host``, ``copy_to_device``): it has
    ``__cuda_array_interface__`` (a C-contiguous ``uint8`` array of :attr:`nbytes`). A test
    reads and writes its contents with :meth:`view`, which a GPU would not allow.
    ``with`` frees it, as does collecting it (as torch frees a tensor's memory); after
    :meth:`free`, copies that name it fail with ``CudaError``.
    """

    __slots__ = ("__weakref__", "_allocation", "_device", "_finalizer", "_nbytes", "_pointer")

    def __init__(self, memory: MemoryMap, allocation: Allocation, device: int) -> None:
        self._allocation: Allocation | None = allocation
        self._pointer = allocation.start
        self._nbytes = allocation.end - allocation.start
        self._device = device
        self._finalizer = weakref.finalize(self, memory.unregister, allocation.start, "cuMemFree")
        self._finalizer.atexit = False  # nothing to give back to a process that exits

    @property
    def pointer(self) -> int:
        """The simulated device address."""
        return self._pointer

    @property
    def nbytes(self) -> int:
        """The size in bytes."""
        return self._nbytes

    @property
    def device(self) -> int:
        """The ordinal of the device it belongs to."""
        return self._device

    @property
    def __cuda_array_interface__(self) -> dict[str, object]:
        return {"data": (self._pointer, False), "shape": (self._nbytes,), "typestr": "|u1", "strides": None, "version": 3}

    def view(self) -> memoryview:
        """The memory's bytes, writable, for a test to fill or check.

        Raises:
            ClosedResourceError: The memory was freed.
        """
        allocation = self._allocation
        if allocation is None:
            raise ClosedResourceError("the SimulatedBuffer was freed")
        return memoryview(allocation.buffer).cast("B")

    def free(self) -> None:
        """Give the memory back (``cuMemFree``). Idempotent; copies still pending complete."""
        self._allocation = None
        self._finalizer()  # once: later calls do nothing

    def __enter__(self) -> SimulatedBuffer:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.free()

    def __repr__(self) -> str:
        state = "freed" if self._allocation is None else f"{self._nbytes} bytes"
        return f"<aiogpu.testing.SimulatedBuffer device={self._device} {state} at {self._pointer:#x}>"
