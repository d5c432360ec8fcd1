"""The simulated GPU's state: contexts, in-order streams of operations, events, gates.

Plain records, with no behaviour of their own: the machine (:mod:`._machine`) reads and
changes them, always under the driver's one lock. Also the one way errors are made here, so
that simulated errors read as the real driver's (:func:`driver_error`).
"""

from __future__ import annotations

import time
from collections import deque
from typing import TYPE_CHECKING

from ..._driver import STREAM_NON_BLOCKING, cuda_error, result_code

if TYPE_CHECKING:
    from ..._errors import CudaError
    from ._memory import Allocation


def as_result(result: int | str) -> int:
    """A ``CUresult`` value from a member, an int or a name like ``"CUDA_ERROR_ILLEGAL_ADDRESS"``."""
    if isinstance(result, str):
        return result_code(result)
    return int(result)


def driver_error(name: str, func: str, explanation: str | None = None) -> CudaError:
    """The :class:`~aiogpu.CudaError` the real driver's ``func`` raises with result ``name``."""
    return cuda_error(result_code(name), func, explanation)


class Gate:
    """Something a test or latch opens: held work completes once released."""

    __slots__ = ("error", "released_at")

    def __init__(self) -> None:
        self.released_at: float | None = None
        self.error: int | None = None


class Op:
    """One operation on a stream; which fields are set says what kind it is."""

    __slots__ = ("after", "copy", "done_at", "duration", "fault", "gate", "host_call", "memory", "seq")

    def __init__(self, seq: int) -> None:
        self.seq = seq
        self.duration: float | None = None
        self.gate: Gate | None = None
        self.after: tuple[SimStream, Op] | None = None  # (other stream, the op it waits for)
        self.fault: int | None = None
        self.host_call: tuple[int, int] | None = None  # (C function, argument): a host function
        self.copy: tuple[int, int, int] | None = None  # (destination, source, bytes): a memcpy
        self.memory: tuple[Allocation, Allocation] | None = None  # a memcpy's, kept alive until it ran
        self.done_at: float | None = None


class SimContext:
    """A device's primary context, with its legacy default stream and its sticky error."""

    def __init__(self, handle: int, ordinal: int) -> None:
        self.handle = handle
        self.ordinal = ordinal
        self.error: int | None = None
        self.faults_pending = 0  # queued ops that will fault: only then must queries look around
        self.default_stream = SimStream(0, self, 0, 0)


class SimStream:
    """A stream: operations run in order; ``head_started`` is when the first one began."""

    def __init__(self, handle: int, context: SimContext, flags: int, priority: int) -> None:
        self.handle = handle
        self.context = context
        self.flags = flags
        self.priority = priority
        self.ops: deque[Op] = deque()
        self.enqueued = 0  # seq of the last enqueued op
        self.completed = 0  # seq of the last completed op
        self.head_started = 0.0
        self.last_done_at = time.monotonic()
        # Synchronizes with the legacy default stream (CUDA's "blocking" streams).
        self.blocking = not flags & STREAM_NON_BLOCKING


class SimEvent:
    """An event: the stream position its last record captured (none: never recorded)."""

    def __init__(self, context: SimContext, flags: int) -> None:
        self.context = context
        self.flags = flags
        self.stream: SimStream | None = None
        self.seq = 0
        self.op: Op | None = None  # the op whose completion completes the event
        self.recorded_at = 0.0
