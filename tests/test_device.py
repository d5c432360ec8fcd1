"""Device: ordinals, identity, the primary context, and what happens without a driver."""

from __future__ import annotations

import pickle

import pytest
from cuda.bindings import driver as cu

import aiogpu
from aiogpu import _driver
from aiogpu.testing import SimulatedDriver


def test_one_object_per_device(sim: SimulatedDriver) -> None:
    assert sim.device(0) is aiogpu.Device(0, driver=sim)
    assert sim.device(0) is not sim.device(1)
    assert sim.device(1).ordinal == 1
    assert sim.device(1).name == "Simulated GPU 1"
    assert sim.device(0).driver_name == "simulated"
    assert repr(sim.device(1)) == "<aiogpu.Device 1 'Simulated GPU 1' driver=simulated>"


@pytest.mark.parametrize("ordinal", [2, -1])
def test_out_of_range_ordinal(sim: SimulatedDriver, ordinal: int) -> None:
    with pytest.raises(
        ValueError, match=rf"device ordinal {ordinal} is out of range: this machine has 2 CUDA devices \(valid ordinals: 0 to 1\)"
    ):
        aiogpu.Device(ordinal, driver=sim)


@pytest.mark.parametrize("ordinal", ["0", 1.0, True, None])
def test_ordinal_must_be_an_int(sim: SimulatedDriver, ordinal: object) -> None:
    with pytest.raises(TypeError, match="device ordinal must be an int"):
        aiogpu.Device(ordinal, driver=sim)  # type: ignore[arg-type]


def test_no_devices(sim: SimulatedDriver) -> None:
    empty = SimulatedDriver(devices=0)
    assert aiogpu.Device.count(driver=empty) == 0
    with pytest.raises(aiogpu.CudaUnavailableError, match="no devices"):
        aiogpu.Device(0, driver=empty)


def test_count(sim: SimulatedDriver) -> None:
    assert aiogpu.Device.count(driver=sim) == 2


def test_installed_driver_is_the_default(sim: SimulatedDriver) -> None:
    with sim.installed():
        assert aiogpu.Device(1) is sim.device(1)
        assert aiogpu.Device.count() == 2
    assert _driver.default_driver() is not sim


def test_creation_pushes_and_pops_the_context(sim: SimulatedDriver) -> None:
    device = sim.device(1)
    assert sim.context_get_current() == 0
    with aiogpu.Stream(device), aiogpu.Event(device):
        pass
    assert sim.context_get_current() == 0  # aiogpu left nothing current behind
    sim.device(0).set_current()
    with aiogpu.Stream(device):
        pass
    assert sim.context_get_current() == sim.device(0)._context


def test_devices_live_as_long_as_their_driver(sim: SimulatedDriver) -> None:
    import gc
    import weakref

    fresh = SimulatedDriver(devices=1)
    device = weakref.ref(fresh.device(0))
    gc.collect()
    assert device() is fresh.device(0)  # kept while the driver lives: its context stays retained
    del fresh
    gc.collect()
    assert device() is None


def test_pickles_by_ordinal(sim: SimulatedDriver) -> None:
    with sim.installed():
        assert pickle.loads(pickle.dumps(sim.device(1))) is sim.device(1)


def test_missing_driver_gives_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(flags: int) -> None:
        from cuda.pathfinder import DynamicLibNotFoundError

        raise DynamicLibNotFoundError('"cuda" is an NVIDIA driver library and can only be found via system search')

    monkeypatch.setattr(cu, "cuInit", missing)
    with pytest.raises(aiogpu.CudaUnavailableError, match=r"no NVIDIA driver found.*aiogpu\.testing\.SimulatedDriver") as info:
        _driver.CudaDriver().init()
    assert info.value.__cause__ is not None
    assert aiogpu.Device.count(driver=_driver.CudaDriver()) == 0


def test_no_device_gives_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cu, "cuInit", lambda flags: (cu.CUresult.CUDA_ERROR_NO_DEVICE,))
    with pytest.raises(aiogpu.CudaUnavailableError, match="CUDA_ERROR_NO_DEVICE.*CUDA_VISIBLE_DEVICES"):
        _driver.CudaDriver().init()
