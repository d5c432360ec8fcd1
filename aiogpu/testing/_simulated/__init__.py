"""SimulatedDriver: CUDA's stream and event semantics in pure Python, below the driver door.

It implements the same ``Driver`` interface as the real ``CudaDriver``, so every layer above
(devices, streams, events, the wake strategies) runs unchanged on it. What it models:

- devices with primary contexts; a per-thread current-context stack; creating events or
  streams, launching work and the default-stream handles 0/1/2 need the right current context;
- in-order streams of operations: timed work, work held until released, cross-stream waits
  (``cuStreamWaitEvent``), faults;
- events capturing a stream's position at record time (an unrecorded event is complete, as in
  CUDA), re-recording, timing, IPC handles (opened in the same process: a stand-in for another);
- sticky context errors: after a fault every call in that context returns the error;
- the legacy default stream (handles 0 and ``CU_STREAM_LEGACY``): an operation put on it waits
  for the work queued before it on every blocking stream of its context, and an operation put
  on a blocking stream waits for the work queued before it on the legacy default stream.
  ``CU_STREAM_PER_THREAD`` is a stream of each thread's own that synchronizes the same way;
  non-blocking streams synchronize with neither;
- spinning versus blocking-sync ``cuEventSynchronize`` (counted in :meth:`statistics`).

What it does not model: real concurrency between streams beyond "each stream runs in order",
and what the hardware adds (for example, pending host functions delaying other streams' work).

Time is the host's monotonic clock; work is evaluated lazily whenever the driver is asked,
so no background thread exists.

Its rooms: :mod:`._model` (the state: contexts, streams, operations, events), :mod:`._machine`
(lookups, queueing and the clock that completes work), :mod:`._calls` (the driver calls and
the simulated test instruments), :mod:`._memory` (allocations and ``SimulatedBuffer``),
:mod:`._statistics` and :mod:`._simulator` (``SimulatedDriver``, the test-facing class, and
``SimulatedWork``). This module only re-exports.
"""

from __future__ import annotations

from ._memory import SimulatedBuffer as SimulatedBuffer
from ._simulator import SimulatedDriver as SimulatedDriver
from ._simulator import SimulatedWork as SimulatedWork
from ._statistics import SimulatedStatistics as SimulatedStatistics
