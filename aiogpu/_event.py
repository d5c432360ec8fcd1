"""Event: a marker in a stream's work that the host can query, time, share and await.

``Event`` offers what the CUDA driver's ``cuEvent*`` calls, cuda.core's ``Event``,
``torch.cuda.Event`` and MAX's ``DeviceEvent`` offer, plus ``await``. Rules it keeps:

- Plain methods never block, except :meth:`Event.synchronize`, which says so.
- Awaiting is a checkpoint even when the work is already done (trio's rule).
- An event that was never recorded is an error to await, query or time: CUDA reports it as
  complete, which turns a forgotten ``record()`` into a silent wrong answer (vLLM #37601).
- ``repr`` makes no driver call.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, final

from . import _foreign, _wait
from ._checks import check_flag
from ._device import Device
from ._driver import EVENT_BLOCKING_SYNC, EVENT_DISABLE_TIMING, EVENT_INTERPROCESS, IPC_HANDLE_SIZE
from ._errors import EventStateError
from ._lifetime import HandleLifetime
from ._wait import Recording

if TYPE_CHECKING:
    from collections.abc import Generator
    from types import TracebackType

    from ._stream import Stream


@final
@dataclass(frozen=True)
class IpcEventHandle:
    """A picklable handle to an interprocess event, for :meth:`Event.from_ipc_handle`.

    Attributes:
        data: The driver's 64-byte ``CUipcEventHandle``.
        device: Ordinal of the device the event lives on, in the exporting process.
        pid: The exporting process (CUDA cannot reopen a handle in the process that made it).
    """

    data: bytes
    device: int
    pid: int

    def __post_init__(self) -> None:
        if not isinstance(self.data, bytes) or len(self.data) != IPC_HANDLE_SIZE:
            raise ValueError(f"IpcEventHandle.data must be {IPC_HANDLE_SIZE} bytes, got {self.data!r:.40}")
        for name in ("device", "pid"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise TypeError(f"IpcEventHandle.{name} must be a non-negative int, got {value!r}")


class EventRecorder:
    """What :meth:`Event.record` records on: the base of ``aiogpu.Stream``, defined here so that
    events need not import streams (streams import events)."""

    __slots__ = ()

    def _record_event(self, event: Event) -> None:
        raise NotImplementedError


@final
class Event(Recording):
    """A CUDA event: records a point in a stream's work; awaitable from async code.

    ``Event(device, ...)`` creates an unrecorded event; :meth:`record` (or
    :meth:`Stream.record`) captures a stream's work so far, and re-recording captures anew.
    ``await event`` returns when the captured work has completed, without blocking the event
    loop.

    Args:
        device: The device the event belongs to (default: ``Device(0)``).
        timing: Record timestamps so :meth:`elapsed_time` works (costs a little per record).
        blocking_sync: Make :meth:`synchronize` put the thread to sleep instead of spinning
            (``CU_EVENT_BLOCKING_SYNC``): less CPU, more wake-up latency.
        interprocess: Allow sharing with other processes (:meth:`ipc_handle`); requires
            ``timing=False``.

    Raises:
        TypeError: An argument has the wrong type.
        ValueError: ``interprocess=True`` together with ``timing=True``.
    """

    # The wake engine's state is the base type's (``_wait.Recording``): its device, driver,
    # handle, lifetime and recordings.
    __slots__ = ("__weakref__", "_flags", "_owner")

    _flags: int
    _owner: object  # an adopted event's owner, kept alive while the wrapper is open

    def __init__(
        self,
        device: Device | None = None,
        *,
        timing: bool = False,
        blocking_sync: bool = False,
        interprocess: bool = False,
    ) -> None:
        if device is None:
            device = Device(0)
        elif not isinstance(device, Device):
            raise TypeError(f"device must be an aiogpu.Device, got {device!r}")
        timing = check_flag("timing", timing)
        blocking_sync = check_flag("blocking_sync", blocking_sync)
        interprocess = check_flag("interprocess", interprocess)
        if interprocess and timing:
            raise ValueError(
                "an interprocess event cannot record timing (CUDA requires timing disabled on "
                "interprocess events): pass timing=False"
            )
        flags = (
            (0 if timing else EVENT_DISABLE_TIMING)
            | (EVENT_BLOCKING_SYNC if blocking_sync else 0)
            | (EVENT_INTERPROCESS if interprocess else 0)
        )
        with device._activated():
            handle = device._driver.event_create(flags)
        self._setup(device, handle, flags, recorded=False)

    def _setup(self, device: Device, handle: int, flags: int, *, recorded: bool, owner: object = None) -> None:
        self._device = device
        self._driver = device._driver
        self._handle = handle
        self._owner = owner
        self._flags = flags
        self._begin(recorded=recorded)
        destroy = device._driver.event_destroy if owner is None else None  # never destroy a borrowed event
        self._lifetime = HandleLifetime(self, "Event", handle, destroy)

    @classmethod
    def adopt(cls, obj: object, *, device: Device | None = None) -> Event:
        """Wrap an event owned by another library, without copying it or taking ownership.

        Accepts a ``torch.cuda.Event``, a ``cupy.cuda.Event``, a cuda.core ``Event``, a Numba
        event (``numba.cuda.event()``), a ``cuda.bindings.driver.CUevent`` or a raw ``CUevent``
        address. The result is awaitable
        and can be queried, synchronized, timed and recorded like any Event; aiogpu keeps
        ``obj`` alive while the wrapper is open and never destroys the event (``close()``
        only lets go of it). Records made through the owner are seen too: a wait is for
        whatever the event captured last.

        An adopted event counts as recorded: aiogpu cannot tell, and CUDA reports a never
        recorded event as complete — except a torch event, which torch creates only at its
        first ``record()``.

        Args:
            obj: The event to adopt. An aiogpu Event is returned as is.
            device: The device the event belongs to. Required where ``obj`` does not say
                (CuPy and Numba events, ``CUevent`` and raw addresses); must match where it does.

        Raises:
            TypeError: ``obj`` is not an event, or ``device`` is not a Device.
            ValueError: ``device`` is missing where needed, or disagrees with ``obj``'s.
            EventStateError: A torch event that was never recorded.
        """
        if isinstance(obj, Event):
            return obj
        if device is not None and not isinstance(device, Device):
            raise TypeError(f"device must be an aiogpu.Device, got {device!r}")
        foreign = _foreign.describe_event(obj)
        if not foreign.recorded:
            raise EventStateError(
                f"cannot adopt {type(obj).__name__}: it was never recorded (torch creates the CUDA event "
                "at its first record()); record it first"
            )
        if device is None:
            if foreign.device is None:
                raise ValueError(f"{type(obj).__name__} does not say which device it belongs to: pass device=")
            device = Device(foreign.device)
        elif foreign.device is not None and foreign.device != device.ordinal:
            raise ValueError(f"the event belongs to device {foreign.device}, not device {device.ordinal}")
        event = object.__new__(cls)
        event._setup(device, foreign.handle, foreign.flags, recorded=True, owner=obj)
        return event

    @property
    def is_owned(self) -> bool:
        """Whether aiogpu created this event (and destroys it on close) rather than adopted it."""
        return self._lifetime.owns_handle

    # -- properties ---------------------------------------------------------------------------
    @property
    def device(self) -> Device:
        """The device the event belongs to."""
        return self._device

    @property
    def handle(self) -> int:
        """The ``CUevent`` address, for other CUDA libraries. aiogpu keeps ownership."""
        return self._handle

    @property
    def is_timing_enabled(self) -> bool:
        """Whether the event records timestamps (``timing=True``)."""
        return not self._flags & EVENT_DISABLE_TIMING

    @property
    def is_blocking_sync(self) -> bool:
        """Whether :meth:`synchronize` sleeps (``True``) or spins (``False``)."""
        return bool(self._flags & EVENT_BLOCKING_SYNC)

    @property
    def is_ipc_enabled(self) -> bool:
        """Whether the event can be shared with other processes."""
        return bool(self._flags & EVENT_INTERPROCESS)

    @property
    def is_recorded(self) -> bool:
        """Whether the event has been recorded at least once (imported IPC events count as recorded)."""
        return self._recorded

    @property
    def is_closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._lifetime.closed

    @property
    def is_done(self) -> bool:
        """Whether all work captured by the last record has completed. Never blocks.

        Raises:
            EventStateError: The event was never recorded.
            CudaError: The captured work failed (for example a kernel fault).
            ClosedResourceError: The event is closed.
        """
        self._check_recorded("query")
        return self._driver.event_query(self._handle)

    # -- operations ---------------------------------------------------------------------------
    def record(self, stream: Stream | None = None) -> None:
        """Capture the work enqueued on ``stream`` so far (default: the device's default stream).

        Re-recording replaces what the event captured; waits already pending may finish for
        either recording.

        Raises:
            TypeError: ``stream`` is not an :class:`aiogpu.Stream`.
            ValueError: ``stream`` belongs to another device.
        """
        self._lifetime.check_open()
        if stream is None:
            stream = self._device.default_stream
        elif not isinstance(stream, EventRecorder):
            raise TypeError(
                f"record() expects an aiogpu.Stream, got {stream!r}; adopt foreign streams with aiogpu.Stream.adopt(obj)"
            )
        stream._record_event(self)

    def synchronize(self) -> None:
        """Block the calling thread until the captured work has completed.

        This **blocks**: never call it on an event loop thread — ``await event`` instead. It
        spins unless the event was created with ``blocking_sync=True``.

        Raises:
            EventStateError: The event was never recorded.
            CudaError: The captured work failed.
        """
        self._check_recorded("synchronize")
        self._lifetime.acquire()
        try:
            self._driver.event_synchronize(self._handle)
        finally:
            self._lifetime.release()

    def elapsed_time(self, end: Event) -> float:
        """Milliseconds of GPU time between this event and ``end`` (~0.5 µs resolution).

        ``end - start`` is the same as ``start.elapsed_time(end)``.

        Raises:
            TypeError: ``end`` is not an Event.
            ValueError: The events are on different devices.
            EventStateError: Either event was created without ``timing=True``, was never
                recorded, or has not completed yet.
        """
        if not isinstance(end, Event):
            raise TypeError(f"elapsed_time() expects an aiogpu.Event, got {end!r}")
        for which, event in (("start", self), ("end", end)):
            event._lifetime.check_open()
            if not event.is_timing_enabled:
                raise EventStateError(f"elapsed_time: the {which} event was created without timing; create it with timing=True")
            event._check_recorded("time")
        if end._device is not self._device:
            raise ValueError(
                f"elapsed_time: the events are on different devices ({self._device.ordinal} and {end._device.ordinal})"
            )
        for which, event in (("start", self), ("end", end)):
            if not event._driver.event_query(event._handle):
                raise EventStateError(f"elapsed_time: the {which} event has not completed yet: await it first")
        return self._driver.event_elapsed_time(self._handle, end._handle)

    def __sub__(self, start: Event) -> float:
        if not isinstance(start, Event):
            return NotImplemented
        return start.elapsed_time(self)

    # ``wait(*, strategy=None)`` is the wake engine's coroutine itself, docstring and all: a
    # wake-up then resumes no frame of the event's own (10,000 of them in a fan-out).
    wait = _wait.wait

    def __await__(self) -> Generator[Any, None, None]:
        return self.wait().__await__()

    # -- interprocess -------------------------------------------------------------------------
    def ipc_handle(self) -> IpcEventHandle:
        """Export the event for another process (see :meth:`from_ipc_handle`).

        Raises:
            EventStateError: The event was not created with ``interprocess=True``, or was never
                recorded (the importer would see it as complete).
        """
        self._lifetime.check_open()
        if not self.is_ipc_enabled:
            raise EventStateError("ipc_handle: the event was not created with interprocess=True")
        self._check_recorded("export")
        with self._device._activated():
            data = self._driver.ipc_get_event_handle(self._handle)
        return IpcEventHandle(data, self._device.ordinal, os.getpid())

    @classmethod
    def from_ipc_handle(cls, handle: IpcEventHandle, device: Device | None = None) -> Event:
        """Open an event exported by another process with :meth:`ipc_handle`.

        The imported event counts as recorded (the exporter records it); it can be awaited,
        queried and recorded, but not timed.

        Args:
            handle: What :meth:`ipc_handle` returned in the exporting process.
            device: The device to open it on (default: the exporter's device ordinal).

        Raises:
            TypeError: ``handle`` is not an :class:`IpcEventHandle`.
            ValueError: The handle was exported by this very process.
        """
        if not isinstance(handle, IpcEventHandle):
            raise TypeError(f"from_ipc_handle() expects an aiogpu.IpcEventHandle, got {handle!r:.80}")
        if handle.pid == os.getpid():
            raise ValueError("this IPC handle was exported by this process, where CUDA cannot open it: use the original Event")
        if device is None:
            device = Device(handle.device)
        elif not isinstance(device, Device):
            raise TypeError(f"device must be an aiogpu.Device, got {device!r}")
        with device._activated():
            raw = device._driver.ipc_open_event_handle(handle.data)
        event = object.__new__(cls)
        event._setup(device, raw, EVENT_INTERPROCESS | EVENT_DISABLE_TIMING, recorded=True)
        return event

    def __reduce__(self) -> tuple[object, ...]:
        if not self.is_ipc_enabled:
            raise TypeError("only interprocess events can be pickled: create it with interprocess=True")
        return (Event.from_ipc_handle, (self.ipc_handle(),))

    # -- lifetime -----------------------------------------------------------------------------
    def close(self) -> None:
        """Destroy the event. Idempotent; pending waits keep the handle alive until they end.

        Called from another thread than the loop that first awaited the event, the handle is
        destroyed on that loop's next iteration (at once if the loop is closed)."""
        if self._lifetime.close():
            # No wait joins its entry any more. Held, it would keep the waiting tasks' loop alive
            # after the loop was closed with them pending (its futures refer to it).
            self._waiting = None
            _wait.closed(self)

    def __enter__(self) -> Event:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._lifetime.closed else "recorded" if self._recorded else "unrecorded"
        if not self._lifetime.owns_handle:
            state += " adopted"
        options = "".join(
            f" {name}"
            for name, on in (
                ("timing", self.is_timing_enabled),
                ("blocking_sync", self.is_blocking_sync),
                ("interprocess", self.is_ipc_enabled),
            )
            if on
        )
        return f"<aiogpu.Event device={self._device.ordinal} handle={self._handle:#x} {state}{options}>"
