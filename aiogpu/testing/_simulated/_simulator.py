"""SimulatedDriver, the test-facing face of the simulated GPU, and the work it launches.

Its own methods are what a test uses: devices, installing it as the default driver, launching
simulated work (:class:`SimulatedWork`), injecting faults and holds into the work that event
records capture, simulated device memory, statistics. The driver interface aiogpu calls is
inherited from :class:`~._calls.DriverCalls`.
"""

from __future__ import annotations

import math
import time
from contextlib import contextmanager
from typing import TYPE_CHECKING

from ... import _driver
from ._calls import DriverCalls
from ._memory import SimulatedBuffer
from ._model import Gate, Op, SimStream, as_result
from ._statistics import SimulatedStatistics

if TYPE_CHECKING:
    from collections.abc import Iterator

    from ..._device import Device
    from ..._stream import Stream


class SimulatedWork:
    """GPU work launched with :meth:`SimulatedDriver.launch`; held work waits for :meth:`release`."""

    def __init__(self, driver: SimulatedDriver, stream: SimStream, op: Op) -> None:
        self._driver = driver
        self._stream = stream
        self._op = op

    @property
    def is_done(self) -> bool:
        """Whether the work has completed (faulted work never completes)."""
        with self._driver._changed:
            self._driver._advance(self._stream, time.monotonic())
            return self._stream.completed >= self._op.seq

    def release(self) -> None:
        """Let held work complete (it still runs after the work before it on its stream)."""
        self._open(None)

    def fail(self, error: int | str = "CUDA_ERROR_ILLEGAL_ADDRESS") -> None:
        """Make held work fault when it runs: a sticky error for its whole context."""
        self._open(as_result(error))

    def _open(self, error: int | None) -> None:
        gate = self._op.gate
        if gate is None:
            raise ValueError("only held work (launched without seconds=) can be released or failed")
        with self._driver._changed:
            if gate.released_at is None:
                gate.error = error
                if error is not None:
                    self._stream.context.faults_pending += 1
                gate.released_at = time.monotonic()
                self._driver._advance_all()
                self._driver._changed.notify_all()


class SimulatedDriver(DriverCalls):
    """A pure-Python CUDA driver with CUDA's semantics, for testing without a GPU.

    Use ``sim.device(n)`` for an :class:`aiogpu.Device` on it, or ``with sim.installed():``
    to make plain ``aiogpu.Device(n)`` use it (to test code that creates its own devices).
    Drive the simulated GPU with :meth:`launch`: work that completes after ``seconds`` or,
    held, when the test calls :meth:`SimulatedWork.release`; or work that faults. For code
    that enqueues no simulated work itself (a service under test), :meth:`fail_next_record`,
    :meth:`hold_recordings` and ``record_latency`` act on the work each event record captures.
    :meth:`allocate` gives simulated device memory for copies; :meth:`statistics` counts live
    handles and misuse.

    The methods listed as inherited from ``DriverCalls`` are the driver interface aiogpu
    itself calls, and the instruments that :class:`~aiogpu.testing.Latch`,
    :func:`~aiogpu.testing.launch_spin` and :func:`~aiogpu.testing.launch_fault` use; tests do
    not call them directly.

    Args:
        devices: Number of simulated devices.
        priority_range: ``(lowest, highest)`` stream priorities, as
            ``cuCtxGetStreamPriorityRange`` reports them.
        forbid_blocking_on_event_loop: Raise ``RuntimeError`` instead of blocking when a
            synchronize call would block a thread that is running an event loop (a bug detector
            for code that must never block its loop).
        record_latency: Seconds of simulated work enqueued before every event record, so code
            that never calls :meth:`launch` (a service under test) still sees GPU work take time.
        hold_recordings: Start with :meth:`hold_recordings` in effect: the work captured by
            every event record waits until :meth:`release_recordings`.

    Raises:
        ValueError: ``devices`` is not a non-negative int, or ``record_latency`` is not a
            finite non-negative number (to hold work until the test says so, use
            ``hold_recordings``).
    """

    def __init__(
        self,
        devices: int = 1,
        *,
        priority_range: tuple[int, int] = (0, -5),
        forbid_blocking_on_event_loop: bool = False,
        record_latency: float = 0.0,
        hold_recordings: bool = False,
    ) -> None:
        if isinstance(devices, bool) or not isinstance(devices, int) or devices < 0:
            raise ValueError(f"devices must be a non-negative int, got {devices!r}")
        if not isinstance(hold_recordings, bool):
            raise TypeError(f"hold_recordings must be a bool, got {hold_recordings!r}")
        if record_latency == math.inf:
            raise ValueError(
                "record_latency must be a finite number of seconds, got inf: to hold recorded work "
                "until the test releases it, pass hold_recordings=True (and call release_recordings())"
            )
        latency = _check_seconds("record_latency", record_latency)
        super().__init__(devices, priority_range, forbid_blocking_on_event_loop, latency)
        if hold_recordings:
            self.hold_recordings()

    def device(self, ordinal: int = 0) -> Device:
        """The :class:`aiogpu.Device` with ``ordinal`` on this simulated driver."""
        from ..._device import Device

        return Device(ordinal, driver=self)

    @contextmanager
    def installed(self) -> Iterator[SimulatedDriver]:
        """Make ``aiogpu.Device(n)`` (and ``Stream.adopt``) use this driver inside the block."""
        previous = _driver.swap_default_driver(self)
        try:
            yield self
        finally:
            _driver.swap_default_driver(previous)

    # -- simulated work -------------------------------------------------------------------
    def launch(self, stream: Stream, seconds: float | None = None, *, error: int | str | None = None) -> SimulatedWork:
        """Enqueue simulated work on ``stream``.

        Args:
            stream: An aiogpu Stream of this driver.
            seconds: Run time once the work reaches the head of its stream; ``None`` holds the
                work until :meth:`SimulatedWork.release` or :meth:`SimulatedWork.fail`.
            error: Make the work fault when it runs, with this ``CUresult`` (name or value).

        Raises:
            ValueError: ``stream`` is not of this driver, ``seconds`` is not a finite
                non-negative number, or ``error`` names no ``CUresult``.
        """
        if stream.device._driver is not self:
            raise ValueError(f"{stream!r} does not belong to this SimulatedDriver")
        if seconds is not None and (
            isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 0 <= seconds < math.inf
        ):
            raise ValueError(f"seconds must be a finite non-negative number or None, got {seconds!r}")
        fault = None if error is None else as_result(error)
        with self._changed:
            sim_stream = self._stream(stream.handle, "launch", self._contexts[stream.device.ordinal])
            op = self._enqueue(sim_stream)
            if fault is not None:
                op.fault = fault
                sim_stream.context.faults_pending += 1
            elif seconds is None:
                op.gate = Gate()
            else:
                op.duration = float(seconds)
            return SimulatedWork(self, sim_stream, op)

    def fail_next_record(self, error: int | str = "CUDA_ERROR_ILLEGAL_ADDRESS") -> None:
        """Make the work captured by the next event record, on any stream, fault with ``error``.

        For code that never calls :meth:`launch` (a service under test): the fault is sticky,
        as on a GPU, so the context stays unusable for the rest of the simulation.
        """
        code = as_result(error)
        with self._changed:
            self._faults_to_inject.append(code)

    def hold_recordings(self) -> None:
        """Hold the work captured by every event record from now on, until :meth:`release_recordings`.

        For code that never calls :meth:`launch` (a service under test): each record, on any
        stream, captures work that does not complete, so ``await`` on the event stays pending
        and the code's timeout path runs, as when a GPU is stuck. Idempotent.
        """
        with self._changed:
            if self._record_gate is None:
                self._record_gate = Gate()

    def release_recordings(self) -> None:
        """Let every recording held by :meth:`hold_recordings` complete, and hold no more.

        Held work then completes in stream order, as released work does. Idempotent; the
        pytest plugin's ``simulated_gpu`` fixture calls it after the test.
        """
        with self._changed:
            gate, self._record_gate = self._record_gate, None
            if gate is not None:
                gate.released_at = time.monotonic()
                self._advance_all()
                self._changed.notify_all()

    # -- simulated memory -----------------------------------------------------------------
    def allocate(self, nbytes: int, *, device: int = 0) -> SimulatedBuffer:
        """Simulated device memory of ``device`` (``cuMemAlloc``), for copies to and from the host.

        Copies (``aiogpu.copy_to_host`` and ``copy_to_device``) on this driver accept only
        memory it allocated: this, and the page-locked host memory of a ``PinnedPool``; any
        other pointer gets ``CudaError`` (``CUDA_ERROR_INVALID_VALUE``), as a GPU does.

        Args:
            nbytes: The size in bytes (at least 1).
            device: The device's ordinal.

        Raises:
            TypeError: ``nbytes`` or ``device`` is not an int.
            ValueError: ``nbytes`` is below 1.
            CudaError: ``device`` is not a device of this driver (``CUDA_ERROR_INVALID_DEVICE``).
        """
        for what, value in (("nbytes", nbytes), ("device", device)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{what} must be an int, got {value!r}")
        if nbytes < 1:
            raise ValueError(f"nbytes must be at least 1, got {nbytes}")
        with self._changed:
            self._device_context(device, "cuMemAlloc")
            memory = self._memory.register(nbytes, "device", "cuMemAlloc")
            return SimulatedBuffer(self._memory, memory, device)

    def statistics(self) -> SimulatedStatistics:
        """Live handles and synchronize counts, for leak and behaviour assertions."""
        with self._changed:
            return SimulatedStatistics(
                live_events=len(self._events),
                live_streams=len(self._streams),
                live_latches=len(self._latches),
                live_host_buffers=self._memory.count("host"),
                live_device_buffers=self._memory.count("device"),
                lifetime_violations=self._violations,
                spin_synchronizations=self._spins,
                blocking_synchronizations=self._sleeps,
            )

    def wait_until_blocked(self, threads: int = 1, timeout: float = 10.0) -> bool:
        """Block until at least ``threads`` threads wait in a synchronize call; False on timeout.

        Lets a test release work only once a waiter thread is really parked in the driver. It
        blocks, so call it from a thread (``await anyio.to_thread.run_sync(sim.wait_until_blocked)``).
        """
        with self._changed:
            return self._changed.wait_for(lambda: self._blocked >= threads, timeout)


def _check_seconds(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:
        raise ValueError(f"{name} must be a finite non-negative number of seconds, got {value!r}")
    return float(value)
