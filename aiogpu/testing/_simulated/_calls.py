"""The simulated driver's calls: the ``Driver`` interface aiogpu calls, and the instruments.

Each public method is one driver call, named as in :class:`aiogpu._driver.Driver`, with the
checks and errors of the real call; then the simulated test instruments that
``aiogpu.testing``'s ``Latch``, ``launch_spin`` and ``launch_fault`` use on a simulated device.
Every call takes the one lock (``_changed``) around the state it touches, so the driver may be
called from any thread.
"""

from __future__ import annotations

import time

from ..._driver import (
    DEFAULT_STREAM_HANDLES,
    EVENT_BLOCKING_SYNC,
    EVENT_DISABLE_TIMING,
    EVENT_INTERPROCESS,
    IPC_HANDLE_SIZE,
    result_code,
)
from ._machine import Machine
from ._model import Gate, Op, SimEvent, SimStream, driver_error


class DriverCalls(Machine):
    """The ``Driver`` interface aiogpu's layers call, on the simulated machine.

    Tests drive the simulated GPU through :class:`~aiogpu.testing.SimulatedDriver`'s own
    methods instead.
    """

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

    def context_get_current(self) -> int:
        return self._current_handle()

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
            raise driver_error("CUDA_ERROR_INVALID_CONTEXT", "cuCtxPopCurrent")
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
            self._streams[handle] = SimStream(handle, context, flags, min(max(priority, highest), lowest))
            return handle

    def stream_destroy(self, stream: int) -> None:
        with self._changed:
            if stream not in DEFAULT_STREAM_HANDLES and stream not in self._streams:
                self._violations += 1
            if stream in DEFAULT_STREAM_HANDLES or stream not in self._streams:  # default streams are not destroyable
                raise driver_error("CUDA_ERROR_INVALID_HANDLE", "cuStreamDestroy")
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
                raise driver_error("CUDA_ERROR_INVALID_VALUE", "cuMemHostAlloc")
            return self._memory.register(nbytes, "host", "cuMemHostAlloc").start

    def host_free(self, pointer: int) -> None:
        with self._changed:
            allocation = self._memory.at(pointer)
            if allocation is None or allocation.kind != "host":
                self._violations += 1  # freed twice, or never allocated here
                raise driver_error("CUDA_ERROR_INVALID_VALUE", "cuMemFreeHost")
            self._memory.unregister(pointer, "cuMemFreeHost")

    def memcpy_async(self, destination: int, source: int, nbytes: int, stream: int) -> None:
        with self._changed:
            sim_stream = self._stream(stream, "cuMemcpyAsync")
            self._check_context(sim_stream.context, "cuMemcpyAsync")
            if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0:
                raise driver_error("CUDA_ERROR_INVALID_VALUE", "cuMemcpyAsync")
            memory = (
                self._memory.holding(destination, nbytes, "cuMemcpyAsync"),
                self._memory.holding(source, nbytes, "cuMemcpyAsync"),
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
                raise driver_error("CUDA_ERROR_INVALID_VALUE", "cuEventCreate")
            handle = self._next_handle()
            self._events[handle] = SimEvent(context, flags)
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
                raise driver_error("CUDA_ERROR_INVALID_HANDLE", "cuEventRecord")
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
                    raise driver_error("CUDA_ERROR_INVALID_HANDLE", "cuEventElapsedTime")
                if not self._event_done(sim_event, time.monotonic(), "cuEventElapsedTime"):
                    raise driver_error("CUDA_ERROR_NOT_READY", "cuEventElapsedTime")
                done_at = sim_event.op.done_at if sim_event.op is not None else None
                times.append(sim_event.recorded_at if done_at is None else done_at)
            return (times[1] - times[0]) * 1000.0

    def ipc_get_event_handle(self, event: int) -> bytes:
        with self._changed:
            sim_event = self._event(event, "cuIpcGetEventHandle")
            if not sim_event.flags & EVENT_INTERPROCESS:
                raise driver_error("CUDA_ERROR_INVALID_VALUE", "cuIpcGetEventHandle")
            return b"aiogpu-simulated".ljust(16, b"\0") + event.to_bytes(8, "little") + bytes(IPC_HANDLE_SIZE - 24)

    def ipc_open_event_handle(self, data: bytes) -> int:
        with self._changed:
            self._current_context("cuIpcOpenEventHandle")
            original = self._events.get(int.from_bytes(data[16:24], "little")) if data.startswith(b"aiogpu-simulated") else None
            if original is None:
                raise driver_error("CUDA_ERROR_INVALID_VALUE", "cuIpcOpenEventHandle")
            handle = self._next_handle()
            self._events[handle] = original  # both handles name one underlying event, as across processes
            return handle

    # -- Driver: host functions (the callback strategy) ----------------------------------------
    def launch_host_function(self, stream: int, function: int, argument: int) -> None:
        with self._changed:
            sim_stream = self._stream(stream, "cuLaunchHostFunc")
            self._check_context(sim_stream.context, "cuLaunchHostFunc")
            self._enqueue(sim_stream).host_call = (function, argument)
            self._advance(sim_stream, time.monotonic())  # an idle stream runs it at once

    # -- aiogpu.testing's instruments (Latch, launch_spin, launch_fault), not the Driver's ------
    def latch_create(self) -> int:
        with self._changed:
            handle = self._next_handle()
            self._latches[handle] = Gate()
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
            op.fault = result_code("CUDA_ERROR_ILLEGAL_ADDRESS")
            op_context = self._stream(stream, "cuLaunchKernel").context
            op_context.faults_pending += 1

    def _launch_stream(self, stream: int) -> Op:
        context = self._current_context("cuLaunchKernel")
        sim_stream = self._stream(stream, "cuLaunchKernel")
        if sim_stream.context is not context:
            raise driver_error("CUDA_ERROR_INVALID_HANDLE", "cuLaunchKernel")
        return self._enqueue(sim_stream)
