"""Fixtures of the GPU lane: device 0 of the real GPU, and asyncio as the default anyio backend.

Every test under ``tests/gpu`` is marked ``gpu``: skipped where no GPU is usable, failing
instead with ``--require-gpu`` (see ``tests/conftest.py``).
"""

from __future__ import annotations

import pytest

import aiogpu
from aiogpu.testing import launch_spin


@pytest.fixture(scope="session")
def gpu() -> aiogpu.Device:
    """Device 0 of the real GPU, with aiogpu's test kernels already loaded.

    Loading a kernel may synchronize the whole context (CUDA's lazy loading), which would
    deadlock behind a held ``Latch``: load them once here, before any test holds a stream.
    """
    device = aiogpu.Device(0)
    with aiogpu.Stream(device) as stream:
        launch_spin(stream, 0)
        stream.synchronize()
    return device


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
