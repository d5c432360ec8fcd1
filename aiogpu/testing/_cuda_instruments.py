"""The test instruments on a real GPU: a latch kernel, a spin kernel and a fault kernel.

:mod:`aiogpu.testing`'s ``Latch``, ``launch_spin`` and ``launch_fault`` use this for a device of
a :class:`~aiogpu._driver.CudaDriver`. It is the one module of ``aiogpu.testing`` that calls
``cuda.bindings`` itself (module loading, kernel launches, mapped pinned memory), because the
production driver door carries only what aiogpu itself calls. Rules it keeps:

- every call is checked through the door's :func:`~aiogpu._driver.check`, so its failures read
  as aiogpu's (``CudaError`` with the function's name);
- the context is asked of the driver object, never of ``cuda.bindings`` directly, so a driver
  that refuses every call in a forked child refuses here too; and the instruments themselves
  refuse every call in such a child (their latches' memory is not mapped there);
- kernels load lazily, once per context, and before any stream is held (a module load may
  synchronize the context, which would deadlock behind a held latch).
"""

from __future__ import annotations

import ctypes
import threading
import weakref
from typing import TYPE_CHECKING, Any

from cuda.bindings import driver as cu

from .._driver import check, refuse_after_fork
from . import _kernels

if TYPE_CHECKING:
    from .._driver import CudaDriver

_instruments_lock = threading.Lock()
_instruments: weakref.WeakKeyDictionary[CudaDriver, CudaInstruments] = weakref.WeakKeyDictionary()


def cuda_instruments(driver: CudaDriver) -> CudaInstruments:
    """The instruments of ``driver``'s devices, made on first use."""
    instruments = _instruments.get(driver)
    if instruments is None:
        with _instruments_lock:
            instruments = _instruments.get(driver)
            if instruments is None:
                instruments = _instruments[driver] = CudaInstruments(driver)
    return instruments


class CudaInstruments:
    """Latches, spin and fault kernels on the devices of one :class:`CudaDriver`.

    Handles are ``int`` addresses, as across the driver door: a latch is the host address of
    its 32-bit word of mapped pinned memory.
    """

    def __init__(self, driver: CudaDriver) -> None:
        # Weak: the registry above is keyed by the driver, and a value must not keep its key alive.
        self._driver = weakref.ref(driver)
        self._lock = threading.Lock()
        self._kernels: dict[int, dict[str, Any]] = {}  # context -> kernel name -> CUfunction
        self._latches: dict[int, int] = {}  # host pointer -> device pointer
        refuse_after_fork(self)

    def latch_create(self) -> int:
        """Allocate a closed latch: a zero word the hold kernel polls (mapped pinned memory)."""
        self._kernel(_kernels.SPIN_KERNEL)  # load the test kernels while nothing is held
        flags = cu.CU_MEMHOSTALLOC_DEVICEMAP | cu.CU_MEMHOSTALLOC_PORTABLE
        host = int(check(cu.cuMemHostAlloc, 4, flags))
        ctypes.c_uint32.from_address(host).value = 0
        device = int(check(cu.cuMemHostGetDevicePointer, host, 0))
        with self._lock:
            self._latches[host] = device
        return host

    def latch_block(self, stream: int, latch: int) -> None:
        """Enqueue the hold kernel on ``stream``: it runs until ``latch`` is released."""
        self._launch(_kernels.HOLD_KERNEL, stream, ((self._latches[latch],), (ctypes.c_uint64,)))

    def latch_release(self, latch: int) -> None:
        """Open ``latch``: a host write the hold kernels see through the mapping."""
        ctypes.c_uint32.from_address(latch).value = 1

    def latch_destroy(self, latch: int) -> None:
        """Free ``latch``'s memory; no stream may still be held by it."""
        with self._lock:
            del self._latches[latch]
        check(cu.cuMemFreeHost, latch)

    def launch_spin(self, stream: int, seconds: float) -> None:
        """Enqueue a one-thread kernel that keeps ``stream`` busy for ``seconds``."""
        params = ((int(seconds * 1e9),), (ctypes.c_uint64,))
        self._launch(_kernels.SPIN_KERNEL, stream, params)

    def launch_fault(self, stream: int) -> None:
        """Enqueue a kernel that stores to address 0: ``CUDA_ERROR_ILLEGAL_ADDRESS``."""
        self._launch(_kernels.FAULT_KERNEL, stream, ((0,), (ctypes.c_uint64,)))

    def _launch(self, kernel: str, stream: int, params: tuple[tuple[int], tuple[type]]) -> None:
        check(cu.cuLaunchKernel, self._kernel(kernel), 1, 1, 1, 1, 1, 1, 0, stream, params, 0)

    def _kernel(self, name: str) -> Any:
        """The test kernel ``name`` in the current context, loaded on first use.

        Loading a module may synchronize the whole context, which would deadlock behind a held
        latch: ``latch_create`` loads the kernels before any stream can be held.
        """
        driver = self._driver()
        if driver is None:  # pragma: no cover - a device, which holds its driver, called here
            raise RuntimeError("the CudaDriver of these test instruments was collected")
        context = driver.context_get_current()
        with self._lock:
            kernels = self._kernels.get(context)
            if kernels is None:
                module = check(cu.cuModuleLoadData, _kernels.PTX)
                kernels = {kernel: check(cu.cuModuleGetFunction, module, kernel.encode()) for kernel in _kernels.NAMES}
                load = getattr(cu, "cuFuncLoad", None)  # lazy loading defers the real load to here
                for function in kernels.values():
                    if load is not None:
                        check(load, function)
                self._kernels[context] = kernels
        return kernels[name]
