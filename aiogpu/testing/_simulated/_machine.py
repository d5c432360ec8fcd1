"""The simulated GPU: its state, the lookups driver calls share, and the clock that moves work.

Time is the host's monotonic clock; work is evaluated lazily whenever the driver is asked
(:meth:`Machine._advance`), so no background thread exists. Every method here expects the one
lock (``_changed``, a condition) held; the driver calls in :mod:`._calls` take it.
"""

from __future__ import annotations

import ctypes
import itertools
import threading
import time
from typing import TYPE_CHECKING

from ..._driver import DEFAULT_STREAM_HANDLES, PER_THREAD_STREAM, cuda_error, refuse_after_fork
from ..._wait import in_trio_run, running_asyncio_loop
from ._memory import MemoryMap
from ._model import Gate, Op, SimContext, SimEvent, SimStream, driver_error

if TYPE_CHECKING:
    from collections.abc import Callable

_HOST_FUNCTION = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class Machine:
    """The state of a simulated GPU and the rules that move its work along."""

    name = "simulated"

    def __init__(
        self, devices: int, priority_range: tuple[int, int], forbid_blocking_on_event_loop: bool, record_latency: float
    ) -> None:
        self._record_latency = record_latency
        self._faults_to_inject: list[int] = []  # CUresults for the next records' work
        self._record_gate: Gate | None = None  # holds the work of every record while set
        self._changed = threading.Condition(threading.RLock())
        self._next_handle = itertools.count(0x7000_0000, 0x10).__next__
        self._contexts = [SimContext(self._next_handle(), ordinal) for ordinal in range(devices)]
        self._context_by_handle = {context.handle: context for context in self._contexts}
        self._streams: dict[int, SimStream] = {}
        self._events: dict[int, SimEvent] = {}
        self._latches: dict[int, Gate] = {}
        self._memory = MemoryMap(self._changed)
        self._busy: set[SimStream] = set()  # streams with pending ops, handles destroyed or not
        self._priority_range = priority_range
        self._forbid_blocking = forbid_blocking_on_event_loop
        self._spins = 0
        self._sleeps = 0
        self._blocked = 0  # threads inside a synchronize call right now
        self._synchronizing: dict[int, int] = {}  # event handle -> threads synchronizing on it
        self._violations = 0
        self._current = threading.local()
        refuse_after_fork(self)  # CUDA cannot be used in a forked child: neither can this

    # -- lookups: a handle to its state, or the error the real driver gives ---------------------
    def _stack(self) -> list[int]:
        """This thread's stack of current contexts."""
        stack: list[int] | None = getattr(self._current, "stack", None)
        if stack is None:
            stack = self._current.stack = []
        return stack

    def _current_handle(self) -> int:
        stack = self._stack()
        return stack[-1] if stack else 0

    def _device_context(self, ordinal: int, func: str) -> SimContext:
        if not 0 <= ordinal < len(self._contexts):
            raise driver_error("CUDA_ERROR_INVALID_DEVICE", func)
        return self._contexts[ordinal]

    def _context(self, handle: int, func: str) -> SimContext:
        context = self._context_by_handle.get(handle)
        if context is None:
            raise driver_error("CUDA_ERROR_INVALID_CONTEXT", func)
        return context

    def _current_context(self, func: str) -> SimContext:
        current = self._current_handle()
        if not current:
            raise driver_error("CUDA_ERROR_INVALID_CONTEXT", func)
        context = self._context(current, func)
        self._check_context(context, func)
        return context

    def _check_context(self, context: SimContext, func: str) -> None:
        """Raise the context's sticky error, after letting its streams run up to now."""
        if context.error is None and context.faults_pending:  # a fault on any stream is seen from all
            now = time.monotonic()
            for stream in [busy for busy in self._busy if busy.context is context]:
                self._advance(stream, now)
        if context.error is not None:
            raise cuda_error(context.error, func)

    def _stream(self, handle: int, func: str, context: SimContext | None = None) -> SimStream:
        if handle in DEFAULT_STREAM_HANDLES:
            if context is None:
                current = self._current_handle()
                if not current:
                    raise driver_error("CUDA_ERROR_INVALID_CONTEXT", func)
                context = self._context(current, func)
            if handle == PER_THREAD_STREAM:
                return self._per_thread_stream(context)
            return context.default_stream
        stream = self._streams.get(handle)
        if stream is None:
            raise driver_error("CUDA_ERROR_INVALID_HANDLE", func)
        return stream

    def _per_thread_stream(self, context: SimContext) -> SimStream:
        streams: dict[SimContext, SimStream] | None = getattr(self._current, "per_thread_streams", None)
        if streams is None:
            streams = self._current.per_thread_streams = {}
        stream = streams.get(context)
        if stream is None:
            stream = streams[context] = SimStream(PER_THREAD_STREAM, context, 0, 0)
        return stream

    def _event(self, handle: int, func: str) -> SimEvent:
        event = self._events.get(handle)
        if event is None:
            raise driver_error("CUDA_ERROR_INVALID_HANDLE", func)
        return event

    # -- queueing work ---------------------------------------------------------------------------
    def _enqueue(self, stream: SimStream) -> Op:
        """Append an operation to ``stream``, behind the implicit waits of the legacy default
        stream."""
        self._sync_with_legacy(stream)
        return self._append(stream)

    def _sync_with_legacy(self, stream: SimStream) -> None:
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

    def _append(self, stream: SimStream) -> Op:
        now = time.monotonic()
        self._advance(stream, now)
        if not stream.ops:
            stream.head_started = now
        stream.enqueued += 1
        op = Op(stream.enqueued)
        stream.ops.append(op)
        self._busy.add(stream)
        self._changed.notify_all()
        return op

    def _inject(self, stream: SimStream) -> None:
        """Enqueue the configured record latency and any fault waiting to be injected."""
        if self._faults_to_inject:
            op = self._enqueue(stream)
            op.fault = self._faults_to_inject.pop(0)
            stream.context.faults_pending += 1
        if self._record_latency:
            self._enqueue(stream).duration = self._record_latency
        if self._record_gate is not None:
            self._enqueue(stream).gate = self._record_gate

    # -- the clock: completing work ----------------------------------------------------------------
    def _advance(self, stream: SimStream, now: float, visiting: frozenset[SimStream] = frozenset()) -> None:
        """Complete the ops at the head of ``stream`` that are done by ``now``.

        ``visiting`` holds the streams already being advanced further up: a stream waiting on
        one of them sees it as it stands (streams waiting on each other in turn are fine in
        CUDA, since each wait captured the other's past).
        """
        context = stream.context
        while stream.ops and context.error is None:
            op = stream.ops[0]
            fault = _fault_of(op)
            if fault is not None:
                context.error = fault
                self._changed.notify_all()
                return
            done_at = self._done_at(stream, op, now, visiting)
            if done_at is None:
                return
            stream.ops.popleft()
            op.memory = None  # an event may keep the op: not the memory
            op.done_at = done_at
            stream.completed = op.seq
            stream.last_done_at = stream.head_started = done_at
        if not stream.ops:
            self._busy.discard(stream)

    def _done_at(self, stream: SimStream, op: Op, now: float, visiting: frozenset[SimStream]) -> float | None:
        """When ``op``, at the head of ``stream``, completed (None: not by ``now``); a copy or a
        host function runs here, at once."""
        start = stream.head_started
        if op.duration is not None:
            return start + op.duration if now >= start + op.duration else None
        if op.copy is not None:
            destination, source, nbytes = op.copy
            ctypes.memmove(destination, source, nbytes)  # simulated device memory is host memory
            return start
        if op.host_call is not None:
            function, argument = op.host_call
            _HOST_FUNCTION(function)(argument)  # C code: no GIL, no driver calls (as in CUDA)
            return start
        if op.gate is not None:
            released = op.gate.released_at
            return None if released is None else max(start, released)
        assert op.after is not None
        other, captured = op.after
        if other.completed < captured.seq and other not in visiting and other is not stream:
            self._advance(other, now, visiting | {stream})
        return None if captured.done_at is None else max(start, captured.done_at)

    def _advance_all(self) -> None:
        """Run what can run now everywhere, so that host functions fire without being asked."""
        now = time.monotonic()
        for stream in list(self._busy):
            self._advance(stream, now)

    def _event_done(self, event: SimEvent, now: float, func: str) -> bool:
        self._check_context(event.context, func)
        if event.stream is None:
            return True  # never recorded: CUDA reports an empty event as complete
        self._advance(event.stream, now)
        self._check_context(event.context, func)
        return event.stream.completed >= event.seq

    def _stream_idle(self, stream: SimStream, now: float, func: str) -> bool:
        self._check_context(stream.context, func)
        self._advance(stream, now)
        self._check_context(stream.context, func)
        return not stream.ops

    # -- blocking the calling thread -------------------------------------------------------------
    def _block(self, func: str, *, spin: bool, done: Callable[[float], bool]) -> None:
        """Wait until ``done(now)``; it raises on a context error."""
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


def _fault_of(op: Op) -> int | None:
    """The ``CUresult`` that ``op`` faults with on reaching its stream's head (None: it runs)."""
    if op.fault is not None:
        return op.fault
    gate = op.gate
    return gate.error if gate is not None and gate.released_at is not None else None


def _running_event_loop() -> bool:
    return running_asyncio_loop() is not None or in_trio_run() is not None
