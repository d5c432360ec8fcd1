"""A pytest plugin: test code that awaits the GPU on a machine without one.

Enable it in your ``conftest.py`` (or with ``-p aiogpu.testing.pytest_plugin``)::

    pytest_plugins = ["aiogpu.testing.pytest_plugin"]

Fixtures:

``simulated_gpu``
    A :class:`~aiogpu.testing.SimulatedDriver`, installed for the test: ``aiogpu.Device(n)``
    anywhere in the code under test means a simulated device. Configure it with the
    ``simulated_gpu`` marker, whose keyword arguments go to ``SimulatedDriver``::

        @pytest.mark.simulated_gpu(devices=2, record_latency=0.005)

    Inject failures with ``simulated_gpu.fail_next_record()`` or
    ``simulated_gpu.launch(stream, error=...)``; hold work with ``simulated_gpu.launch(stream)``.

    To test a timeout path (a GPU that is stuck), hold the work of every event record until
    the test releases it, whichever stream the code under test records on::

        @pytest.mark.simulated_gpu(hold_recordings=True)
        async def test_timeout(simulated_gpu):
            ...  # every await on a recorded event stays pending
            simulated_gpu.release_recordings()  # now they complete, and later ones are not held

    (or call ``simulated_gpu.hold_recordings()`` during the test). After the test the fixture
    releases what is still held, then checks that no handle was destroyed twice or while in use.
``simulated_device``
    ``aiogpu.Device(0)`` of that driver.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from ._simulated import SimulatedDriver

if TYPE_CHECKING:
    from collections.abc import Iterator

    import aiogpu


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "simulated_gpu(**options): options for the simulated_gpu fixture's SimulatedDriver "
        "(devices=, record_latency=, hold_recordings=, priority_range=, forbid_blocking_on_event_loop=)",
    )


@pytest.fixture
def simulated_gpu(request: pytest.FixtureRequest) -> Iterator[SimulatedDriver]:
    """A simulated CUDA driver that plain ``aiogpu.Device(n)`` uses during the test."""
    marker = request.node.get_closest_marker("simulated_gpu")
    options = dict(marker.kwargs) if marker is not None else {}
    if marker is not None and marker.args:
        raise TypeError("the simulated_gpu marker takes keyword arguments only, for example devices=2")
    driver = SimulatedDriver(**options)
    with driver.installed():
        try:
            yield driver
        finally:
            driver.release_recordings()  # nothing the test left held keeps a thread or task waiting
    violations = driver.statistics().lifetime_violations
    assert violations == 0, f"{violations} CUDA handle(s) destroyed twice or while in use"


@pytest.fixture
def simulated_device(simulated_gpu: SimulatedDriver) -> aiogpu.Device:
    """Device 0 of the ``simulated_gpu`` driver."""
    return simulated_gpu.device(0)
