"""SimulatedStatistics: what a simulated driver counts, for assertions about leaks and waits."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SimulatedStatistics:
    """Counts kept by a :class:`SimulatedDriver`, for assertions about leaks and waits.

    Attributes:
        live_events: Event handles created and not destroyed.
        live_streams: Stream handles created and not destroyed (default streams excluded).
        live_latches: Latches created and not destroyed.
        live_host_buffers: Page-locked host buffers allocated and not freed.
        live_device_buffers: Device memory from :meth:`SimulatedDriver.allocate` not freed.
        lifetime_violations: Handles destroyed twice, or destroyed while a thread was
            synchronizing on them (undefined behaviour on a real GPU; aiogpu must never do it).
        spin_synchronizations: Synchronize calls that had to wait and spun (an event without the
            blocking-sync flag).
        blocking_synchronizations: Synchronize calls (event or stream) that had to wait and slept.
    """

    live_events: int
    live_streams: int
    live_latches: int
    live_host_buffers: int
    live_device_buffers: int
    lifetime_violations: int
    spin_synchronizations: int
    blocking_synchronizations: int
