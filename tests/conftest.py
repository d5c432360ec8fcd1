"""Shared fixtures: devices (simulated always, the GPU where there is one), strategies, loops.

Loops: pytest-asyncio runs the asyncio-marked tests on asyncio and uvloop (through its
``pytest_asyncio_loop_factories`` hook), those of ``PUBLIC_ASYNCIO_MODULES`` also on asyncio
with aiogpu held to asyncio's public API; anyio's plugin runs the trio variants. The contract
suite (``tests/contract.py``) is written once and collected by both.

GPU tests (``@pytest.mark.gpu``, and the ``gpu`` parameter of the ``device`` fixture) are
skipped with a reason where no GPU is usable; ``--require-gpu`` turns that into a failure.
"""

from __future__ import annotations

import asyncio
import functools
from typing import TYPE_CHECKING

import pytest

import aiogpu
from aiogpu._wait import _backends, _thread
from aiogpu.testing import SimulatedDriver

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Mapping

try:
    import uvloop
except ImportError:  # pragma: no cover - uvloop is in the test extra on Linux
    uvloop = None


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--require-gpu",
        action="store_true",
        help="fail instead of skipping the gpu tests when no usable GPU is found",
    )


@functools.cache
def gpu_unavailable_reason() -> str | None:
    """``None`` if a real GPU is usable here, else why not."""
    try:
        count = aiogpu.Device.count()
    except aiogpu.AiogpuError as exc:
        return str(exc)
    return None if count > 0 else "no NVIDIA driver or CUDA device on this machine"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not any(item.get_closest_marker("gpu") for item in items):
        return
    reason = gpu_unavailable_reason()
    if reason is None:
        return
    if config.getoption("--require-gpu"):
        raise pytest.UsageError(f"--require-gpu was given, but no GPU is usable: {reason}")
    skip = pytest.mark.skip(reason=f"no usable GPU: {reason}")
    for item in items:
        if item.get_closest_marker("gpu"):
            item.add_marker(skip)


#: The test modules whose asyncio tests run a third time, on asyncio's own loop with aiogpu held
#: to asyncio's public API (``asyncio-public``): the fallback that must work on every Python.
PUBLIC_ASYNCIO_MODULES = frozenset({"test_contract_asyncio.py", "test_park.py", "test_loop_timers.py"})


def public_asyncio_loop() -> asyncio.AbstractEventLoop:
    """asyncio's own loop; ``_public_asyncio_lane`` makes aiogpu use the public backend on it."""
    return asyncio.new_event_loop()


def pytest_asyncio_loop_factories(
    config: pytest.Config, item: pytest.Item
) -> Mapping[str, Callable[[], asyncio.AbstractEventLoop]]:
    factories: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {"asyncio": asyncio.new_event_loop}
    if uvloop is not None:
        factories["uvloop"] = uvloop.new_event_loop
    if item.path.name in PUBLIC_ASYNCIO_MODULES:
        factories["asyncio-public"] = public_asyncio_loop
    return factories


@pytest.fixture(autouse=True)
def _public_asyncio_lane(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """On the ``asyncio-public`` loop, aiogpu's backends are made as ``AIOGPU_PUBLIC_ASYNCIO=1``
    makes them: asyncio's public API only."""
    callspec = getattr(request.node, "callspec", None)
    if callspec is not None and callspec.params.get("_asyncio_loop_factory") is public_asyncio_loop:
        monkeypatch.setenv(_backends.PUBLIC_ASYNCIO_VARIABLE, "1")


@pytest.fixture
def sim() -> Iterator[SimulatedDriver]:
    """A fresh two-device simulated driver that refuses to block an event loop thread.

    After the test, no handle may have been destroyed twice or while in use.
    """
    driver = SimulatedDriver(devices=2, forbid_blocking_on_event_loop=True)
    yield driver
    assert driver.statistics().lifetime_violations == 0


@pytest.fixture(params=["simulated", pytest.param("gpu", marks=pytest.mark.gpu)])
def device(request: pytest.FixtureRequest, sim: SimulatedDriver) -> aiogpu.Device:
    """Device 0 of the simulated driver, and of the real GPU where one is usable."""
    if request.param == "simulated":
        return sim.device(0)
    return aiogpu.Device(0)


@pytest.fixture
def second_device(device: aiogpu.Device) -> aiogpu.Device:
    """Device 1 of the same driver as ``device`` (skips on a one-GPU machine)."""
    if aiogpu.Device.count(driver=device._driver) < 2:
        pytest.skip("needs two devices")
    return aiogpu.Device(1, driver=device._driver)


@pytest.fixture(params=["auto", "poll", "thread", "callback"])
def strategy(request: pytest.FixtureRequest) -> aiogpu.WaitStrategy:
    return request.param  # type: ignore[no-any-return]


@pytest.fixture(autouse=True)
def _no_leaked_waits() -> Iterator[None]:
    """After every test, no task is still subscribed to a waiter thread."""
    yield
    statistics = _thread.pool().statistics()
    assert statistics.subscribers == 0, f"a wait leaked its subscription: {statistics}"
