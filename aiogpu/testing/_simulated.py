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
"""

from __future__ import annotations

import bisect
import ctypes
import itertools
import math
import threading
import time
import weakref
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, final

from .. import _driver
from .._driver import (
    DEFAULT_STREAM_HANDLES,
    EVENT_BLOCKING_SYNC,
    EVENT_DISABLE_TIMING,
    EVENT_INTERPROCESS,
    IPC_HANDLE_SIZE,
    STREAM_NON_BLOCKING,
    cuda_error,
)
from .._errors import ClosedResourceError
from .._wait._backends import in_trio_run, running_asyncio_loop

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from types import TracebackType

    from .._device import Device
    from .._stream import Stream

_NOT_READY = "CUDA_ERROR_NOT_READY"
_PER_THREAD_STREAM = 2  # CU_STREAM_PER_THREAD; 0 and CU_STREAM_LEGACY (1) name the legacy default stream


def _code(result: int | str) -> int:
    """A ``CUresult`` value from a member, an int or a name like ``"CUDA_ERROR_ILLEGAL_ADDRESS"``."""
    if isinstance(result, str):
        return _driver.result_code(result)
    return int(result)


class _Gate:
    """Something a test or latch opens: held work completes once released."""

    __slots__ = ("error", "released_at")

    def __init__(self) -> None:
        self.released_at: float | None = None
        self.error: int | None = None


class _Op:
    __slots__ = ("after", "copy", "done_at", "duration", "fault", "gate", "host_call", "memory", "seq")

    def __init__(self, seq: int) -> None:
        self.seq = seq
        self.duration: float | None = None
        self.gate: _Gate | None = None
        self.after: tuple[_Stream, _Op] | None = None  # (other stream, the op it waits for)
        self.fault: int | None = None
        self.host_call: tuple[int, int] | None = None  # (C function, argument): a host function
        self.copy: tuple[int, int, int] | None = None  # (destination, source, bytes): a memcpy
        self.memory: tuple[_Allocation, _Allocation] | None = None  # a memcpy's, kept alive until it ran
        self.done_at: float | None = None


class _Context:
    def __init__(self, handle: int, ordinal: int) -> None:
        self.handle = handle
        self.ordinal = ordinal
        self.error: int | None = None
        self.faults_pending = 0  # queued ops that will fault: only then must queries look around
        self.default_stream = _Stream(0, self, 0, 0)


class _Stream:
    def __init__(self, handle: int, context: _Context, flags: int, priority: int) -> None:
        self.handle = handle
        self.context = context
        self.flags = flags
        self.priority = priority
        self.ops: deque[_Op] = deque()
        self.enqueued = 0  # seq of the last enqueued op
        self.completed = 0  # seq of the last completed op
        self.head_started = 0.0
        self.last_done_at = time.monotonic()
        # Synchronizes with the legacy default stream (CUDA's "blocking" streams).
        self.blocking = not flags & STREAM_NON_BLOCKING


class _Event:
    def __init__(self, context: _Context, flags: int) -> None:
        self.context = context
        self.flags = flags
        self.stream: _Stream | None = None
        self.seq = 0
        self.op: _Op | None = None  # the op whose completion completes the event
        self.recorded_at = 0.0


class _Allocation:
    """Memory the simulated driver handed out: page-locked host memory or device memory.

    Simulated device memory is host memory too; copies touch it through ``ctypes.memmove``,
    so the driver refuses any range outside a live allocation (as a GPU does) rather than
    let a bad pointer crash the process.
    """

    __slots__ = ("buffer", "end", "kind", "start")

    def __init__(self, buffer: ctypes.Array[ctypes.c_char], kind: str) -> None:
        self.buffer = buffer  # kept by pending copies too: memory is never reused under one
        self.start = ctypes.addressof(buffer)
        self.end = self.start + len(buffer)
        self.kind = kind  # "host" (cuMemHostAlloc) or "device" (cuMemAlloc)


@final
class SimulatedBuffer:
    """Simulated device memory from :meth:`SimulatedDriver.allocate`: a CUDA array of bytes.

    Pass it wherever aiogpu takes a CUDA array (``copy_to_host``, ``copy_to_device``): it has
    ``__cuda_array_interface__`` (a C-contiguous ``uint8`` array of :attr:`nbytes`). A test
    reads and writes its contents with :meth:`view`, which a GPU would not allow.
    ``with`` frees it, as does collecting it (as torch frees a tensor's memory); after
    :meth:`free`, copies that name it fail with ``CudaError``.
    """

    __slots__ = ("__weakref__", "_allocation", "_device", "_finalizer", "_nbytes", "_pointer")

    def __init__(self, driver: _SimulatedDriverCore, allocation: _Allocation, device: int) -> None:
        self._allocation: _Allocation | None = allocation
        self._pointer = allocation.start
        self._nbytes = allocation.end - allocation.start
        self._device = device
        self._finalizer = weakref.finalize(self, driver._unregister, allocation.start, "cuMemFree")
        self._finalizer.atexit = False  # nothing to give back to a process that exits

    @property
    def pointer(self) -> int:
        """The simulated device address."""
        return self._pointer

    @property
    def nbytes(self) -> int:
        """The size in bytes."""
        return self._nbytes

    @property
    def device(self) -> int:
        """The ordinal of the device it belongs to."""
        return self._device

    @property
    def __cuda_array_interface__(self) -> dict[str, object]:
        return {"data": (self._pointer, False), "shape": (self._nbytes,), "typestr": "|u1", "strides": None, "version": 3}

    def view(self) -> memoryview:
        """The memory's bytes, writable, for a test to fill or check.

        Raises:
            ClosedResourceError: The memory was freed.
        """
        allocation = self._allocation
        if allocation is None:
            raise ClosedResourceError("the SimulatedBuffer was freed")
        return memoryview(allocation.buffer).cast("B")

    def free(self) -> None:
        """Give the memory back (``cuMemFree``). Idempotent; copies still pending complete."""
        self._allocation = None
        self._finalizer()  # once: later calls do nothing

    def __enter__(self) -> SimulatedBuffer:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.free()

    def __repr__(self) -> str:
        state = "freed" if self._allocation is None else f"{self._nbytes} bytes"
        return f"<aiogpu.testing.SimulatedBuffer device={self._device} {state} at {self._pointer:#x}>"


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


class SimulatedWork:
    """GPU work launched with :meth:`SimulatedDriver.launch`; held work waits for :meth:`release`."""

    def __init__(self, driver: SimulatedDriver, stream: _Stream, op: _Op) -> None:
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
        self._open(_code(error))

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


class _SimulatedDriverCore:
    """The ``Driver`` interface aiogpu's layers call, and the machine behind it.

    Its public methods are the driver calls (``event_record``, ``memcpy_async``...), named as in
    ``aiogpu._driver.Driver``; tests drive the simulated GPU through :class:`SimulatedDriver`'s
    own methods instead. Every method takes the one lock (``_changed``) around the state it
    touches, so the driver may be called from any thread.
    """

    name = "simulated"

    def __init__(
        self, devices: int, priority_range: tuple[int, int], forbid_blocking_on_event_loop: bool, record_latency: float
    ) -> None:
        self._record_latency = record_latency
        self._faults_to_inject: list[int] = []  # CUresults for the next records' work
        self._record_gate: _Gate | None = None  # holds the work of every record while set
        self._changed = threading.Condition(threading.RLock())
        self._next_handle = itertools.count(0x7000_0000, 0x10).__next__
        self._contexts = [_Context(self._next_handle(), ordinal) for ordinal in range(devices)]
        self._context_by_handle = {context.handle: context for context in self._contexts}
        self._streams: dict[int, _Stream] = {}
        self._events: dict[int, _Event] = {}
        self._latches: dict[int, _Gate] = {}
        # Memory a copy may touch: page-locked host buffers (``host_alloc``) and simulated device
        # memory (``SimulatedDriver.allocate``), by start address; ``_memory_starts`` sorted.
        self._memory: dict[int, _Allocation] = {}
        self._memory_starts: list[int] = []
        self._busy: set[_Stream] = set()  # streams with pending ops, handles destroyed or not
        self._priority_range = priority_range
        self._forbid_blocking = forbid_blocking_on_event_loop
        self._spins = 0
        self._sleeps = 0
        self._blocked = 0  # threads inside a synchronize call right now
        self._synchronizing: dict[int, int] = {}  # event handle -> threads synchronizing on it
        self._violations = 0
        self._current = threading.local()
        _driver.refuse_after_fork(self)  # CUDA cannot be used in a forked child: neither can this

    # -- Driver: devices and contexts -------------------------------------------------------
    def init(self) -> None:
        pass

    def device_count(self) -> int:
        return len(self._contexts)

    def device_name(self, ordinal: int) -> str:
        self._device_context(ordinal, "cuDeviceGetName")
        return f"Simulated GPU {ordinal}"

    def primary_context_retain(self, ordinal: int) -> int:
        return self._device_context(ordinal, "cuDevicePrimaryCtxRetain").handle

    def _stack(self) -> list[int]:
        stack: list[int] | None = getattr(self._current, "stack", None)
        if stack is None:
            stack = self._current.stack = []
        return stack

    def context_get_current(self) -> int:
        stack = self._stack()
        return stack[-1] if stack else 0

    def context_set_current(self, context: int) -> None:
        stack = self._stack()
        if context == 0:
            if stack:
                stack.pop()
            return
        self._context(context, "cuCtxSetCurrent")
        if stack:
            stack[-1] = context
        else:
            stack.append(context)

    def context_push(self, context: int) -> None:
        self._context(context, "cuCtxPushCurrent")
        self._stack().append(context)

    def context_pop(self) -> None:
        stack = self._stack()
        if not stack:
            raise cuda_error(_driver.result_code("CUDA_ERROR_INVALID_CONTEXT"), "cuCtxPopCurrent")
        stack.pop()

    def context_device(self, context: int) -> int:
        return self._context(context, "cuCtxGetDevice").ordinal

    # -- Driver: streams ----------------------------------------------------------------------
    def stream_priority_range(self) -> tuple[int, int]:
        self._current_context("cuCtxGetStreamPriorityRange")
        return self._priority_range

    def stream_create(self, flags: int, priority: int) -> int:
        with self._changed:
            context = self._current_context("cuStreamCreateWithPriority")
            lowest, highest = self._priority_range
            handle = self._next_handle()
            self._streams[handle] = _Stream(handle, context, flags, min(max(priority, highest), lowest))
            return handle

    def stream_destroy(self, stream: int) -> None:
        with self._changed:
            if stream not in DEFAULT_STREAM_HANDLES and stream not in self._streams:
                self._violations += 1
            if stream in DEFAULT_STREAM_HANDLES or stream not in self._streams:  # default streams are not destroyable
                raise cuda_error(_driver.result_code("CUDA_ERROR_INVALID_HANDLE"), "cuStreamDestroy")
            del self._streams[stream]

    def stream_context(self, stream: int) -> int:
        with self._changed:
            return self._stream(stream, "cuStreamGetCtx").context.handle

    def stream_priority(self, stream: int) -> int:
        with self._changed:
            return self._stream(stream, "cuStreamGetPriority").priority

    def stream_flags(self, stream: int) -> int:
        with self._changed:
            return self._stream(stream, "cuStreamGetFlags").flags

    def stream_query(self, stream: int) -> bool:
        with self._changed:
            sim_stream = self._stream(stream, "cuStreamQuery")
            return self._stream_idle(sim_stream, time.monotonic(), "cuStreamQuery")

    def stream_synchronize(self, stream: int) -> None:
        with self._changed:
            sim_stream = self._stream(stream, "cuStreamSynchronize")
            self._block(
                "cuStreamSynchronize", spin=False, done=lambda now: self._stream_idle(sim_stream, now, "cuStreamSynchronize")
            )

    def stream_wait_event(self, stream: int, event: int) -> None:
        with self._changed:
            sim_stream = self._stream(stream, "cuStreamWaitEvent")
            sim_event = self._event(event, "cuStreamWaitEvent")
            self._check_context(sim_stream.context, "cuStreamWaitEvent")
            self._sync_with_legacy(sim_stream)  # an operation even when there is nothing to wait for
            if sim_event.stream is not None and sim_event.op is not None:
                self._append(sim_stream).after = (sim_event.stream, sim_event.op)

    # -- Driver: host memory and copies ------------------------------------------------------
    def host_alloc(self, nbytes: int) -> int:
        with self._changed:
            self._current_context("cuMemHostAlloc")
            if nbytes <= 0:
                raise cuda_error(_driver.result_code("CUDA_ERROR_INVALID_VALUE"), "cuMemHostAlloc")
            return self._register(nbytes, "host", "cuMemHostAlloc").start

    def host_free(self, pointer: int) -> None:
        with self._changed:
            allocation = self._memory.get(pointer)
            if allocation is None or allocation.kind != "host":
                self._violations += 1  # freed twice, or never allocated here
                raise cuda_error(_driver.result_code("CUDA_ERROR_INVALID_VALUE"), "cuMemFreeHost")
            self._unregister(pointer, "cuMemFreeHost")

    def memcpy_async(self, destination: int, source: int, nbytes: int, stream: int) -> None:
        with self._changed:
            sim_stream = self._stream(stream, "cuMemcpyAsync")
            self._check_context(sim_stream.context, "cuMemcpyAsync")
            if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0:
                raise cuda_error(_driver.result_code("CUDA_ERROR_INVALID_VALUE"), "cuMemcpyAsync")
            memory = (
                self._allocation_of(destination, nbytes, "cuMemcpyAsync"),
                self._allocation_of(source, nbytes, "cuMemcpyAsync"),
            )
            op = self._enqueue(sim_stream)
            op.copy = (destination, source, nbytes)
            op.memory = memory
            self._advance(sim_stream, time.monotonic())

    # -- Driver: events -----------------------------------------------------------------------
    def event_create(self, flags: int) -> int:
        with self._changed:
            context = self._current_context("cuEventCreate")
            if flags & EVENT_INTERPROCESS and not flags & EVENT_DISABLE_TIMING:
                raise cuda_error(_driver.result_code("CUDA_ERROR_INVALID_VALUE"), "cuEventCreate")
            handle = self._next_handle()
            self._events[handle] = _Event(context, flags)
            return handle

    def event_destroy(self, event: int) -> None:
        with self._changed:
            if event not in self._events or self._synchronizing.get(event):
                self._violations += 1
            self._event(event, "cuEventDestroy")
            del self._events[event]

    def event_record(self, event: int, stream: int) -> None:
        with self._changed:
            sim_event = self._event(event, "cuEventRecord")
            sim_stream = self._stream(stream, "cuEventRecord")
            self._check_context(sim_stream.context, "cuEventRecord")
            if sim_event.context is not sim_stream.context:
                raise cuda_error(_driver.result_code("CUDA_ERROR_INVALID_HANDLE"), "cuEventRecord")
            self._inject(sim_stream)
            self._sync_with_legacy(sim_stream)  # a record is an operation too
            now = time.monotonic()
            self._advance(sim_stream, now)
            sim_event.stream = sim_stream
            sim_event.seq = sim_stream.enqueued
            sim_event.op = sim_stream.ops[-1] if sim_stream.ops else None
            sim_event.recorded_at = now
            self._changed.notify_all()

    def event_query(self, event: int) -> bool:
        with self._changed:
            sim_event = self._event(event, "cuEventQuery")
            return self._event_done(sim_event, time.monotonic(), "cuEventQuery")

    def event_synchronize(self, event: int) -> None:
        with self._changed:
            sim_event = self._event(event, "cuEventSynchronize")
            spin = not sim_event.flags & EVENT_BLOCKING_SYNC
            self._synchronizing[event] = self._synchronizing.get(event, 0) + 1
            try:
                self._block(
                    "cuEventSynchronize", spin=spin, done=lambda now: self._event_done(sim_event, now, "cuEventSynchronize")
                )
            finally:
                self._synchronizing[event] -= 1

    def event_elapsed_time(self, start: int, end: int) -> float:
        with self._changed:
            times = []
            for handle in (start, end):
                sim_event = self._event(handle, "cuEventElapsedTime")
                if sim_event.flags & EVENT_DISABLE_TIMING or sim_event.stream is None:
                    raise cuda_error(_driver.result_code("CUDA_ERROR_INVALID_HANDLE"), "cuEventElapsedTime")
                if not self._event_done(sim_event, time.monotonic(), "cuEventElapsedTime"):
                    raise cuda_error(_driver.result_code(_NOT_READY), "cuEventElapsedTime")
                done_at = sim_event.op.done_at if sim_event.op is not None else None
                times.append(sim_event.recorded_at if done_at is None else done_at)
            return (times[1] - times[0]) * 1000.0

    def ipc_get_event_handle(self, event: int) -> bytes:
        with self._changed:
            sim_event = self._event(event, "cuIpcGetEventHandle")
            if not sim_event.flags & EVENT_INTERPROCESS:
                raise cuda_error(_driver.result_code("CUDA_ERROR_INVALID_VALUE"), "cuIpcGetEventHandle")
            return b"aiogpu-simulated".ljust(16, b"\0") + event.to_bytes(8, "little") + bytes(IPC_HANDLE_SIZE - 24)

    def ipc_open_event_handle(self, data: bytes) -> int:
        with self._changed:
            self._current_context("cuIpcOpenEventHandle")
            original = self._events.get(int.from_bytes(data[16:24], "little")) if data.startswith(b"aiogpu-simulated") else None
            if original is None:
                raise cuda_error(_driver.result_code("CUDA_ERROR_INVALID_VALUE"), "cuIpcOpenEventHandle")
            handle = self._next_handle()
            self._events[handle] = original  # both handles name one underlying event, as across processes
            return handle

    # -- Driver: test instruments -------------------------------------------------------------
    def latch_create(self) -> int:
        with self._changed:
            handle = self._next_handle()
            self._latches[handle] = _Gate()
            return handle

    def latch_block(self, stream: int, latch: int) -> None:
        with self._changed:
            sim_stream = self._stream(stream, "cuLaunchKernel")
            self._enqueue(sim_stream).gate = self._latches[latch]

    def latch_release(self, latch: int) -> None:
        with self._changed:
            gate = self._latches[latch]
            if gate.released_at is None:
                gate.released_at = time.monotonic()
                self._advance_all()
                self._changed.notify_all()

    def latch_destroy(self, latch: int) -> None:
        with self._changed:
            del self._latches[latch]

    def launch_spin(self, stream: int, seconds: float) -> None:
        with self._changed:
            self._launch_stream(stream).duration = seconds

    def launch_fault(self, stream: int) -> None:
        with self._changed:
            op = self._launch_stream(stream)
            op.fault = _driver.result_code("CUDA_ERROR_ILLEGAL_ADDRESS")
            op_context = self._stream(stream, "cuLaunchKernel").context
            op_context.faults_pending += 1

    def launch_host_function(self, stream: int, function: int, argument: int) -> None:
        with self._changed:
            sim_stream = self._stream(stream, "cuLaunchHostFunc")
            self._check_context(sim_stream.context, "cuLaunchHostFunc")
            self._enqueue(sim_stream).host_call = (function, argument)
            self._advance(sim_stream, time.monotonic())  # an idle stream runs it at once

    def _advance_all(self) -> None:
        """Run what can run now everywhere, so that host functions fire without being asked."""
        now = time.monotonic()
        for stream in list(self._busy):
            self._advance(stream, now)

    def _inject(self, stream: _Stream) -> None:
        """Enqueue the configured record latency and any fault waiting to be injected (lock held)."""
        if self._faults_to_inject:
            op = self._enqueue(stream)
            op.fault = self._faults_to_inject.pop(0)
            stream.context.faults_pending += 1
        if self._record_latency:
            self._enqueue(stream).duration = self._record_latency
        if self._record_gate is not None:
            self._enqueue(stream).gate = self._record_gate

    def _launch_stream(self, stream: int) -> _Op:
        context = self._current_context("cuLaunchKernel")
        sim_stream = self._stream(stream, "cuLaunchKernel")
        if sim_stream.context is not context:
            raise cuda_error(_driver.result_code("CUDA_ERROR_INVALID_HANDLE"), "cuLaunchKernel")
        return self._enqueue(sim_stream)

    # -- the machine ---------------------------------------------------------------------------
    def _register(self, nbytes: int, kind: str, func: str) -> _Allocation:
        """Allocate ``nbytes`` of simulated memory and track it (lock held)."""
        try:
            allocation = _Allocation(ctypes.create_string_buffer(nbytes), kind)
        except (MemoryError, OverflowError):
            raise cuda_error(_driver.result_code("CUDA_ERROR_OUT_OF_MEMORY"), func) from None
        self._memory[allocation.start] = allocation
        bisect.insort(self._memory_starts, allocation.start)
        return allocation

    def _unregister(self, start: int, func: str) -> None:
        with self._changed:
            if self._memory.pop(start, None) is None:
                raise cuda_error(_driver.result_code("CUDA_ERROR_INVALID_VALUE"), func)
            del self._memory_starts[bisect.bisect_left(self._memory_starts, start)]

    def _allocation_of(self, pointer: int, nbytes: int, func: str) -> _Allocation:
        """The live allocation that holds ``[pointer, pointer + nbytes)`` (lock held); a pointer
        outside every one gets ``CUDA_ERROR_INVALID_VALUE``, as from a GPU."""
        if isinstance(pointer, int) and not isinstance(pointer, bool):
            index = bisect.bisect_right(self._memory_starts, pointer) - 1
            if index >= 0:
                allocation = self._memory[self._memory_starts[index]]
                if pointer + nbytes <= allocation.end and (nbytes or pointer < allocation.end):
                    return allocation
        raise cuda_error(
            _driver.result_code("CUDA_ERROR_INVALID_VALUE"),
            func,
            f"invalid argument: {nbytes} bytes at {_address(pointer)} are not inside memory this simulated "
            "driver allocated (SimulatedDriver.allocate, a PinnedPool's buffers)",
        )

    def _device_context(self, ordinal: int, func: str) -> _Context:
        if not 0 <= ordinal < len(self._contexts):
            raise cuda_error(_driver.result_code("CUDA_ERROR_INVALID_DEVICE"), func)
        return self._contexts[ordinal]

    def _context(self, handle: int, func: str) -> _Context:
        context = self._context_by_handle.get(handle)
        if context is None:
            raise cuda_error(_driver.result_code("CUDA_ERROR_INVALID_CONTEXT"), func)
        return context

    def _current_context(self, func: str) -> _Context:
        current = self.context_get_current()
        if not current:
            raise cuda_error(_driver.result_code("CUDA_ERROR_INVALID_CONTEXT"), func)
        context = self._context(current, func)
        self._check_context(context, func)
        return context

    def _check_context(self, context: _Context, func: str) -> None:
        """Raise the context's sticky error, after letting its streams run up to now."""
        if context.error is None and context.faults_pending:  # a fault on any stream is seen from all
            now = time.monotonic()
            for stream in [busy for busy in self._busy if busy.context is context]:
                self._advance(stream, now)
        if context.error is not None:
            raise cuda_error(context.error, func)

    def _stream(self, handle: int, func: str, context: _Context | None = None) -> _Stream:
        if handle in DEFAULT_STREAM_HANDLES:
            if context is None:
                current = self.context_get_current()
                if not current:
                    raise cuda_error(_driver.result_code("CUDA_ERROR_INVALID_CONTEXT"), func)
                context = self._context(current, func)
            if handle == _PER_THREAD_STREAM:
                return self._per_thread_stream(context)
            return context.default_stream
        stream = self._streams.get(handle)
        if stream is None:
            raise cuda_error(_driver.result_code("CUDA_ERROR_INVALID_HANDLE"), func)
        return stream

    def _per_thread_stream(self, context: _Context) -> _Stream:
        streams: dict[_Context, _Stream] | None = getattr(self._current, "per_thread_streams", None)
        if streams is None:
            streams = self._current.per_thread_streams = {}
        stream = streams.get(context)
        if stream is None:
            stream = streams[context] = _Stream(_PER_THREAD_STREAM, context, 0, 0)
        return stream

    def _event(self, handle: int, func: str) -> _Event:
        event = self._events.get(handle)
        if event is None:
            raise cuda_error(_driver.result_code("CUDA_ERROR_INVALID_HANDLE"), func)
        return event

    def _enqueue(self, stream: _Stream) -> _Op:
        """Append an operation to ``stream``, behind the implicit waits of the legacy default
        stream (lock held)."""
        self._sync_with_legacy(stream)
        return self._append(stream)

    def _sync_with_legacy(self, stream: _Stream) -> None:
        """Queue the waits CUDA adds before an operation on ``stream``: on the legacy default
        stream, for each blocking stream's queued work; on a blocking stream, for the legacy
        default stream's."""
        legacy = stream.context.default_stream
        if stream is legacy:
            others = [other for other in self._busy if other.context is stream.context and other.blocking and other is not legacy]
        elif stream.blocking:
            others = [legacy]
        else:
            return
        for other in others:
            if other.ops:
                self._append(stream).after = (other, other.ops[-1])

    def _append(self, stream: _Stream) -> _Op:
        now = time.monotonic()
        self._advance(stream, now)
        if not stream.ops:
            stream.head_started = now
        stream.enqueued += 1
        op = _Op(stream.enqueued)
        stream.ops.append(op)
        self._busy.add(stream)
        self._changed.notify_all()
        return op

    def _advance(self, stream: _Stream, now: float, visiting: frozenset[_Stream] = frozenset()) -> None:
        """Complete the ops at the head of ``stream`` that are done by ``now``.

        ``visiting`` holds the streams already being advanced further up: a stream waiting on
        one of them sees it as it stands (streams waiting on each other in turn are fine in
        CUDA, since each wait captured the other's past).
        """
        context = stream.context
        while stream.ops and context.error is None:
            op = stream.ops[0]
            start = stream.head_started
            if op.fault is not None:
                context.error = op.fault
                self._changed.notify_all()
                return
            if op.duration is not None:
                done_at: float | None = start + op.duration if now >= start + op.duration else None
            elif op.copy is not None:
                destination, source, nbytes = op.copy
                ctypes.memmove(destination, source, nbytes)  # simulated device memory is host memory
                done_at = start
            elif op.host_call is not None:
                function, argument = op.host_call
                _HOST_FUNCTION(function)(argument)  # C code: no GIL, no driver calls (as in CUDA)
                done_at = start
            elif op.gate is not None:
                released = op.gate.released_at
                if released is not None and op.gate.error is not None:
                    context.error = op.gate.error
                    self._changed.notify_all()
                    return
                done_at = None if released is None else max(start, released)
            else:
                assert op.after is not None
                other, captured = op.after
                if other.completed < captured.seq and other not in visiting and other is not stream:
                    self._advance(other, now, visiting | {stream})
                done_at = None if captured.done_at is None else max(start, captured.done_at)
            if done_at is None:
                return
            stream.ops.popleft()
            op.memory = None  # an event may keep the op: not the memory
            op.done_at = done_at
            stream.completed = op.seq
            stream.last_done_at = stream.head_started = done_at
        if not stream.ops:
            self._busy.discard(stream)

    def _event_done(self, event: _Event, now: float, func: str) -> bool:
        self._check_context(event.context, func)
        if event.stream is None:
            return True  # never recorded: CUDA reports an empty event as complete
        self._advance(event.stream, now)
        self._check_context(event.context, func)
        return event.stream.completed >= event.seq

    def _stream_idle(self, stream: _Stream, now: float, func: str) -> bool:
        self._check_context(stream.context, func)
        self._advance(stream, now)
        self._check_context(stream.context, func)
        return not stream.ops

    def _block(self, func: str, *, spin: bool, done: Callable[[float], bool]) -> None:
        """Wait (lock held) until ``done(now)``; it raises on a context error."""
        if done(time.monotonic()):
            return
        if self._forbid_blocking and _running_event_loop():
            raise RuntimeError(f"SimulatedDriver: {func} would block a thread that is running an event loop")
        if spin:
            self._spins += 1
        else:
            self._sleeps += 1
        self._blocked += 1
        self._changed.notify_all()
        try:
            while not done(time.monotonic()):
                if spin:  # burn the thread like a spinning CUDA wait, without holding the lock
                    self._changed.release()
                    try:
                        time.sleep(0)
                    finally:
                        self._changed.acquire()
                else:
                    self._changed.wait(self._next_deadline())
        finally:
            self._blocked -= 1

    def _next_deadline(self) -> float | None:
        """Seconds until the earliest timed op at a stream head could complete (None: none)."""
        now = time.monotonic()
        for stream in list(self._busy):  # pop work that is done, wherever nobody asked yet
            completed = stream.completed
            self._advance(stream, now)
            if stream.completed != completed:
                return 0.0  # something finished since the caller looked: look again at once
        deadlines = [s.head_started + s.ops[0].duration - now for s in self._busy if s.ops[0].duration is not None]
        return min(max(0.0, min(deadlines)), threading.TIMEOUT_MAX) if deadlines else None


class SimulatedDriver(_SimulatedDriverCore):
    """A pure-Python CUDA driver with CUDA's semantics, for testing without a GPU.

    Use ``sim.device(n)`` for an :class:`aiogpu.Device` on it, or ``with sim.installed():``
    to make plain ``aiogpu.Device(n)`` use it (to test code that creates its own devices).
    Drive the simulated GPU with :meth:`launch`: work that completes after ``seconds`` or,
    held, when the test calls :meth:`SimulatedWork.release`; or work that faults. For code
    that enqueues no simulated work itself (a service under test), :meth:`fail_next_record`,
    :meth:`hold_recordings` and ``record_latency`` act on the work each event record captures.
    :meth:`allocate` gives simulated device memory for copies; :meth:`statistics` counts live
    handles and misuse.

    The methods listed as inherited from ``_SimulatedDriverCore`` are the driver interface
    aiogpu itself calls; tests do not need them.

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
        from .._device import Device

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
        fault = None if error is None else _code(error)
        with self._changed:
            sim_stream = self._stream(stream.handle, "launch", self._contexts[stream.device.ordinal])
            op = self._enqueue(sim_stream)
            if fault is not None:
                op.fault = fault
                sim_stream.context.faults_pending += 1
            elif seconds is None:
                op.gate = _Gate()
            else:
                op.duration = float(seconds)
            return SimulatedWork(self, sim_stream, op)

    def fail_next_record(self, error: int | str = "CUDA_ERROR_ILLEGAL_ADDRESS") -> None:
        """Make the work captured by the next event record, on any stream, fault with ``error``.

        For code that never calls :meth:`launch` (a service under test): the fault is sticky,
        as on a GPU, so the context stays unusable for the rest of the simulation.
        """
        code = _code(error)
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
                self._record_gate = _Gate()

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
            memory = self._register(nbytes, "device", "cuMemAlloc")
            return SimulatedBuffer(self, memory, device)

    def statistics(self) -> SimulatedStatistics:
        """Live handles and synchronize counts, for leak and behaviour assertions."""
        with self._changed:
            kinds = [allocation.kind for allocation in self._memory.values()]
            return SimulatedStatistics(
                live_events=len(self._events),
                live_streams=len(self._streams),
                live_latches=len(self._latches),
                live_host_buffers=kinds.count("host"),
                live_device_buffers=kinds.count("device"),
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


_HOST_FUNCTION = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


def _check_seconds(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:
        raise ValueError(f"{name} must be a finite non-negative number of seconds, got {value!r}")
    return float(value)


def _address(pointer: object) -> str:
    return f"{pointer:#x}" if isinstance(pointer, int) and not isinstance(pointer, bool) else repr(pointer)


def _running_event_loop() -> bool:
    return running_asyncio_loop() is not None or in_trio_run() is not None
