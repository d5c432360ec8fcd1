"""Test aiogpu code without a GPU, and drive a real GPU deterministically in tests.

- :class:`SimulatedDriver` is a pure-Python CUDA driver with CUDA's stream and event semantics;
  everything in aiogpu runs on it unchanged (``sim.device(0)``, or ``with sim.installed():``).
- :class:`Latch`, :func:`launch_spin` and :func:`launch_fault` hold, occupy or fault a device,
  real or simulated, so tests never need ``sleep()`` to "let the GPU finish".
"""

from __future__ import annotations

from ._instruments import Latch as Latch
from ._instruments import launch_fault as launch_fault
from ._instruments import launch_spin as launch_spin
from ._simulated import SimulatedBuffer as SimulatedBuffer
from ._simulated import SimulatedDriver as SimulatedDriver
from ._simulated import SimulatedStatistics as SimulatedStatistics
from ._simulated import SimulatedWork as SimulatedWork

__all__ = (
    "Latch",
    "SimulatedBuffer",
    "SimulatedDriver",
    "SimulatedStatistics",
    "SimulatedWork",
    "launch_fault",
    "launch_spin",
)

for _name in __all__:
    globals()[_name].__module__ = __name__
del _name
