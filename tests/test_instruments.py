"""aiogpu.testing's instruments pick their implementation by the device's driver.

The production driver door has no test instruments: a ``CudaDriver`` device gets the CUDA
kernels of ``aiogpu.testing``, a ``SimulatedDriver`` device its own simulated ones, and any other
driver a clear ``TypeError``. (The CUDA kernels themselves run in tests/gpu.)
"""

from __future__ import annotations

import ctypes
import gc
import weakref
from typing import Any

import pytest
from cuda.bindings import driver as cu

import aiogpu
from aiogpu import _driver
from aiogpu.testing import Latch, SimulatedDriver, _kernels, launch_fault, launch_spin
from aiogpu.testing._cuda_instruments import CudaInstruments
from aiogpu.testing._instruments import instruments_for

INSTRUMENT_CALLS = ("latch_create", "latch_block", "latch_release", "latch_destroy", "launch_spin", "launch_fault")


def test_the_production_door_carries_no_instruments() -> None:
    for call in INSTRUMENT_CALLS:
        assert not hasattr(_driver.CudaDriver, call), call
        assert call not in vars(_driver.Driver), call


def test_a_cuda_driver_gets_one_set_of_cuda_instruments_that_does_not_keep_it_alive() -> None:
    driver = _driver.CudaDriver()
    instruments = instruments_for(driver)
    assert isinstance(instruments, CudaInstruments)
    assert instruments_for(driver) is instruments
    assert instruments_for(_driver.CudaDriver()) is not instruments
    collected = weakref.ref(driver)
    del driver
    gc.collect()
    assert collected() is None


def test_cuda_instruments_refuse_every_call_in_a_forked_child() -> None:
    """A latch's memory is not mapped in a forked child: its release must raise, not write."""
    instruments = instruments_for(_driver.CudaDriver())
    _driver.fail_every_call_after_fork(instruments)  # what the at-fork hook does in the child
    for call in (lambda: instruments.latch_release(0x1000), instruments.latch_create, lambda: instruments.launch_fault(0)):
        with pytest.raises(aiogpu.CudaError, match="CUDA_ERROR_NOT_INITIALIZED.*'spawn'"):
            call()


def test_a_simulated_driver_is_its_own_instruments() -> None:
    sim = SimulatedDriver()
    assert instruments_for(sim) is sim


class NoInstruments:
    """A driver that forwards the driver interface to a simulated one and has no instruments."""

    def __init__(self, driver: SimulatedDriver) -> None:
        self._simulated = driver
        self.name = "bare"

    def __getattr__(self, name: str) -> object:
        if name in INSTRUMENT_CALLS:
            raise AttributeError(name)
        return getattr(self._simulated, name)


def test_a_driver_without_instruments_gets_a_clear_error() -> None:
    device = aiogpu.Device(0, driver=NoInstruments(SimulatedDriver()))  # type: ignore[arg-type]
    with aiogpu.Stream(device) as stream:
        for call in (lambda: Latch(device), lambda: launch_spin(stream, 0), lambda: launch_fault(stream)):
            with pytest.raises(TypeError, match="instruments need a device of a CudaDriver or a SimulatedDriver, got one of"):
                call()
        assert stream.is_idle  # nothing was enqueued


def test_cuda_instruments_load_per_context_and_launch_one_thread_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CUDA path, on stand-ins for the driver functions: which calls, with which arguments."""
    calls: list[tuple[str, tuple[Any, ...]]] = []
    context = [0xC0]
    word = ctypes.create_string_buffer(b"\xff" * 4, 4)  # stands in for the mapped pinned word

    def stand_in(name: str, result: Any = None, *, returns: bool = True) -> None:
        def call(*args: Any) -> tuple[Any, ...]:
            calls.append((name, args))
            value = result(*args) if callable(result) else result
            return (cu.CUresult.CUDA_SUCCESS, value) if returns else (cu.CUresult.CUDA_SUCCESS,)

        call.__name__ = name
        monkeypatch.setattr(cu, name, call, raising=False)

    stand_in("cuCtxGetCurrent", lambda: context[0])
    stand_in("cuModuleLoadData", "module")
    stand_in("cuModuleGetFunction", lambda module, name: f"{module}:{name.decode()}")
    stand_in("cuFuncLoad", returns=False)
    stand_in("cuMemHostAlloc", ctypes.addressof(word))
    stand_in("cuMemHostGetDevicePointer", 0xD0)
    stand_in("cuLaunchKernel", returns=False)
    stand_in("cuMemFreeHost", returns=False)
    driver = _driver.CudaDriver()  # the instruments hold it weakly: a device holds it in use
    instruments = CudaInstruments(driver)

    latch = instruments.latch_create()
    assert latch == ctypes.addressof(word) and word.raw == bytes(4)  # closed
    assert [name for name, _ in calls] == ["cuCtxGetCurrent", "cuModuleLoadData"] + ["cuModuleGetFunction"] * 3 + [
        "cuFuncLoad"
    ] * 3 + ["cuMemHostAlloc", "cuMemHostGetDevicePointer"]
    assert calls[1][1] == (_kernels.PTX,)
    assert calls[-2][1] == (4, cu.CU_MEMHOSTALLOC_DEVICEMAP | cu.CU_MEMHOSTALLOC_PORTABLE)
    assert calls[-1][1] == (latch, 0)
    calls.clear()

    instruments.latch_block(0x5, latch)
    instruments.launch_spin(0x5, 0.25)
    instruments.launch_fault(0x5)
    launches = [args for name, args in calls if name == "cuLaunchKernel"]
    assert [name for name, _ in calls] == ["cuCtxGetCurrent", "cuLaunchKernel"] * 3  # loaded once per context
    for args, (kernel, parameter) in zip(
        launches, [(_kernels.HOLD_KERNEL, 0xD0), (_kernels.SPIN_KERNEL, 250_000_000), (_kernels.FAULT_KERNEL, 0)], strict=True
    ):
        assert args == (f"module:{kernel}", 1, 1, 1, 1, 1, 1, 0, 0x5, ((parameter,), (ctypes.c_uint64,)), 0)

    instruments.latch_release(latch)
    assert word.raw == (1).to_bytes(4, "little")  # open: what the hold kernel polls for
    calls.clear()
    instruments.latch_destroy(latch)
    assert calls == [("cuMemFreeHost", (latch,))]
    with pytest.raises(KeyError):
        instruments.latch_block(0x5, latch)  # destroyed

    context[0] = 0xC1  # another context loads its own module
    calls.clear()
    instruments.launch_spin(0x6, 0)
    assert [name for name, _ in calls].count("cuModuleLoadData") == 1
