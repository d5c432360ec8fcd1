"""aiogpu.testing's instruments pick their implementation by the device's driver.

The production driver door has no test instruments: a ``CudaDriver`` device gets the CUDA
kernels of ``aiogpu.testing``, a ``SimulatedDriver`` device its own simulated ones, and any other
driver a clear ``TypeError``. (The CUDA kernels themselves run in tests/gpu.)
"""

from __future__ import annotations

import gc
import weakref

import pytest

import aiogpu
from aiogpu import _driver
from aiogpu.testing import Latch, SimulatedDriver, launch_fault, launch_spin
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
