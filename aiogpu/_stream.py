"""Stream: an in-order queue of GPU work, owned by aiogpu or adopted from another library.

Streams aiogpu creates are destroyed by :meth:`Stream.close`; adopted ones (``Stream.adopt``,
``Device.default_stream``) are borrowed: aiogpu keeps their owner object alive and never
destroys them. The default-stream handles (0, 1, 2) mean "the default stream of whichever
context is current", so operations on them make the stream's device current first.

``wait_for`` orders work on the device (``cuStreamWaitEvent``); ``wait_idle`` waits on the
host. aiogpu keeps "wait" for host-side awaiting and ``wait_for`` for device-side ordering.
"""

from __future__ import annotations

import itertools
import threading
import weakref
from contextlib import nullcontext
from typing import TYPE_CHECKING, final

from . import _foreign, _wait
from ._checks import check_flag, check_int
from ._device import Device
from ._driver import DEFAULT_STREAM_HANDLES, EVENT_INTERPROCESS, PER_THREAD_STREAM, STREAM_NON_BLOCKING, default_driver
from ._event import Event, EventRecorder
from ._lifetime import HandleLifetime

if TYPE_CHECKING:
    from contextlib import AbstractContextManager
    from types import TracebackType

    from ._driver import Driver
    from ._wait import WaitStrategy


_thread_serials = itertools.count()
#: Held from the driver's record call until its sequence number is taken: two threads recording
#: on one stream must get sequence numbers in the order the stream got their recordings (the
#: wake engine completes a stream's waits in sequence order, and infers "done" from later ones).
_recording = threading.Lock()


class _ThreadSerial(threading.local):
    """This thread's number, never another's (thread idents are reused once a thread exits): it
    tells apart the per-thread default streams of different threads."""

    def __init__(self) -> None:
        self.value = next(_thread_serials)


_this_thread = _ThreadSerial()


#: ``Stream._context()`` of a stream that is not a default stream (``nullcontext`` is reusable).
_NOTHING_TO_ACTIVATE = nullcontext()
#: Serial numbers of the streams aiogpu creates (``Stream._wait_key``).
_created = itertools.count(1)
#: The Stream objects alive, by wait key, so that what the engine knows by key (the stream of
#: a pending wait: ``aiogpu.pending_waits``) can be named as the Stream it came from.
_by_wait_key: weakref.WeakValueDictionary[tuple[int, int, int], Stream] = weakref.WeakValueDictionary()


def stream_of(event: Event) -> Stream | None:
    """The live Stream ``event`` was last recorded on; ``None`` for an event on a queue of its
    own (recorded by its owner, or interprocess) or a Stream no longer referred to."""
    stream_key = event._stream_key
    if not isinstance(stream_key, tuple) or _wait.is_own_stream_key(stream_key):
        return None
    if len(stream_key) == 4:  # ``(device, handle, "thread", thread)``: a per-thread default stream
        stream_key = (stream_key[0], stream_key[1], 0)
    return _by_wait_key.get(stream_key)


@final
class Stream(EventRecorder):
    """A CUDA stream: GPU work in submission order.

    ``Stream(device, ...)`` creates a stream that aiogpu owns; :meth:`adopt` wraps one that
    another library owns. ``__cuda_stream__`` lets torch, CuPy and cuda.core use aiogpu
    streams.

    Args:
        device: The device (default: ``Device(0)``).
        priority: Scheduling priority; numerically lower is higher priority, within
            :attr:`Device.stream_priority_range`. Default: the lowest priority.
        nonblocking: Do not synchronize with the legacy default stream
            (``CU_STREAM_NON_BLOCKING``).

    Raises:
        TypeError: An argument has the wrong type.
        ValueError: ``priority`` is outside the device's range.
    """

    __slots__ = ("__weakref__", "_device", "_driver", "_handle", "_lifetime", "_owner", "_wait_key")

    _device: Device
    _driver: Driver
    _handle: int
    _lifetime: HandleLifetime
    _owner: object
    #: Identifies the stream to the wake engine, which queues waits per stream and relies on
    #: each queue completing in order. CUDA reuses a destroyed stream's address at once, so a
    #: stream aiogpu creates is told apart from every earlier one by a serial number; wrappers
    #: of the same foreign stream share its key (and what the engine learned about it).
    _wait_key: tuple[int, int, int]

    def __init__(self, device: Device | None = None, *, priority: int | None = None, nonblocking: bool = False) -> None:
        if device is None:
            device = Device(0)
        elif not isinstance(device, Device):
            raise TypeError(f"device must be an aiogpu.Device, got {device!r}")
        flags = STREAM_NON_BLOCKING if check_flag("nonblocking", nonblocking) else 0
        driver = device._driver
        with device._activated():
            lowest, highest = driver.stream_priority_range()
            priority = lowest if priority is None else check_int("priority", priority)
            if not highest <= priority <= lowest:
                raise ValueError(
                    f"stream priority must be between {highest} (highest) and {lowest} (lowest) on this device, got {priority}"
                )
            handle = driver.stream_create(flags, priority)
        self._device = device
        self._driver = driver
        self._handle = handle
        self._owner = None
        self._wait_key = (id(device), handle, next(_created))
        self._lifetime = HandleLifetime(self, "Stream", handle, driver.stream_destroy)
        _by_wait_key[self._wait_key] = self

    @classmethod
    def _borrow(cls, device: Device, handle: int, owner: object) -> Stream:
        self = object.__new__(cls)
        self._device = device
        self._driver = device._driver
        self._handle = handle
        self._owner = owner  # keeps the foreign stream alive as long as we use it
        self._wait_key = (id(device), handle, 0)
        self._lifetime = HandleLifetime(self, "Stream", handle, None)
        _by_wait_key[self._wait_key] = self
        return self

    @classmethod
    def adopt(cls, obj: object, *, device: Device | None = None) -> Stream:
        """Wrap a stream owned by someone else, without taking ownership.

        Accepts any object with ``__cuda_stream__`` (torch, CuPy, Numba, cuda.core streams,
        ``cuda.bindings.driver.CUstream``) or a raw ``CUstream`` address. aiogpu keeps ``obj``
        alive while the returned Stream is open and never destroys the stream.

        Args:
            obj: The stream to adopt. An aiogpu Stream is returned as is.
            device: The device it belongs to. Found from the stream's context when omitted;
                required for the default-stream handles 0, 1 and 2, which mean "the default
                stream of whichever device is current".

        Raises:
            TypeError: ``obj`` is not a stream.
            ValueError: The stream belongs to a non-primary context, or not to ``device``; or it
                is a default-stream handle and ``device`` is missing.
        """
        if isinstance(obj, Stream):
            return obj
        if device is not None and not isinstance(device, Device):
            raise TypeError(f"device must be an aiogpu.Device, got {device!r}")
        handle = _foreign.stream_handle(obj)
        driver = device._driver if device is not None else default_driver()
        driver.init()
        if handle in DEFAULT_STREAM_HANDLES:
            if device is None:  # torch and CuPy report every device's default stream as 0
                raise ValueError(
                    f"stream handle {handle} means the default stream of whichever device is current: pass device= to say which"
                )
            return cls._borrow(device, handle, obj)
        context = driver.stream_context(handle)
        owner_device = Device(driver.context_device(context), driver=driver)
        if context != owner_device._context:
            raise ValueError(
                f"stream {handle:#x} belongs to a CUDA context that is not device "
                f"{owner_device.ordinal}'s primary context; aiogpu works with primary contexts "
                "(the ones torch, CuPy, cuda.core and the CUDA runtime use)"
            )
        if device is not None and device is not owner_device:
            raise ValueError(f"stream {handle:#x} belongs to device {owner_device.ordinal}, not device {device.ordinal}")
        return cls._borrow(owner_device, handle, obj)

    # -- properties ---------------------------------------------------------------------------
    @property
    def device(self) -> Device:
        """The device the stream belongs to."""
        return self._device

    @property
    def handle(self) -> int:
        """The ``CUstream`` address (0 for the legacy default stream)."""
        return self._handle

    @property
    def is_owned(self) -> bool:
        """Whether aiogpu created this stream (and destroys it on close) rather than adopted it."""
        return self._lifetime.owns_handle

    @property
    def is_closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._lifetime.closed

    @property
    def priority(self) -> int:
        """The stream's priority (numerically lower is higher)."""
        self._lifetime.check_open()
        with self._context():
            return self._driver.stream_priority(self._handle)

    @property
    def is_nonblocking(self) -> bool:
        """Whether the stream does not synchronize with the legacy default stream."""
        self._lifetime.check_open()
        with self._context():
            return bool(self._driver.stream_flags(self._handle) & STREAM_NON_BLOCKING)

    @property
    def is_idle(self) -> bool:
        """Whether all work enqueued so far has completed. Never blocks.

        Raises:
            CudaError: Enqueued work failed.
        """
        self._lifetime.check_open()
        with self._context():
            return self._driver.stream_query(self._handle)

    # -- operations ---------------------------------------------------------------------------
    def record(
        self,
        event: Event | None = None,
        *,
        timing: bool = False,
        blocking_sync: bool = False,
        interprocess: bool = False,
    ) -> Event:
        """Record an event capturing the work enqueued so far, and return it.

        ``await stream.record()`` waits for everything enqueued until now.

        Args:
            event: An existing event to (re-)record. Default: a new event with the options.
            timing: Options for the new event; see :class:`aiogpu.Event`.
            blocking_sync: Options for the new event.
            interprocess: Options for the new event.

        Raises:
            TypeError: ``event`` is not an :class:`aiogpu.Event`.
            ValueError: Options were given with an existing event, or ``event`` belongs to
                another device.
        """
        if event is None:
            event = Event(self._device, timing=timing, blocking_sync=blocking_sync, interprocess=interprocess)
        elif timing or blocking_sync or interprocess:
            raise ValueError("event options apply to a new event: pass either an event or options")
        self._record_event(event)
        return event

    def _record_event(self, event: Event) -> None:
        if not isinstance(event, Event):
            raise TypeError(f"expected an aiogpu.Event, got {event!r}")
        self._lifetime.check_open()
        event._lifetime.check_open()
        if event._device is not self._device:
            raise ValueError(
                f"cannot record an event of device {event._device.ordinal} on a stream of device "
                f"{self._device.ordinal}: CUDA records events on streams of their own device"
            )
        key: object = self._wait_key
        if self._handle == PER_THREAD_STREAM:  # each thread's own stream: they complete in no common order
            key = (*self._wait_key[:2], "thread", _this_thread.value)
        if event._owner is not None or event._flags & EVENT_INTERPROCESS:
            # Its owner, or another process, may re-record it behind our back: then it says nothing
            # about this stream's other work (nor they about it). A queue of its own.
            key = _wait.own_stream_key(event)
        with _recording, self._context():
            self._driver.event_record(event._handle, self._handle)
            event._mark_recorded(key)

    def wait_for(self, other: Event | Stream | Device) -> None:
        """Make work enqueued on this stream from now on wait, on the device, for ``other``.

        Never blocks the host. ``other`` may be an event (its last recording), a stream (all
        work enqueued on it so far) or a device (its default stream), of any device.

        Raises:
            TypeError: ``other`` is none of those.
            EventStateError: ``other`` is an event that was never recorded.
        """
        self._lifetime.check_open()
        if isinstance(other, Device):
            other = other.default_stream
        if isinstance(other, Stream):
            with other.record() as marker:
                self._wait_event(marker)
        elif isinstance(other, Event):
            other._check_recorded("wait for")
            self._wait_event(other)
        else:
            raise TypeError(f"wait_for() expects an aiogpu Event, Stream or Device, got {other!r}")

    def _wait_event(self, event: Event) -> None:
        with self._context():
            self._driver.stream_wait_event(self._handle, event._handle)

    def synchronize(self) -> None:
        """Block the calling thread until all work enqueued so far has completed.

        This **blocks**: on an event loop, ``await stream.wait_idle()`` instead.

        Raises:
            CudaError: Enqueued work failed.
        """
        self._lifetime.acquire()
        try:
            with self._context():
                self._driver.stream_synchronize(self._handle)
        finally:
            self._lifetime.release()

    async def wait_idle(self, *, strategy: WaitStrategy | None = None) -> None:
        """Wait until all work enqueued so far has completed, without blocking the event loop.

        Work enqueued after the call starts is not waited for. Always a checkpoint.

        Args:
            strategy: ``"auto"``, ``"poll"``, ``"thread"`` or ``"callback"`` (see
                :meth:`Event.wait`); the default is :func:`aiogpu.get_default_wait_strategy`.

        Raises:
            CudaError: Enqueued work failed.
            ClosedResourceError: The stream is closed.

        Cancellation:
            As :meth:`Event.wait`: returns promptly and leaves the GPU work untouched.
        """
        with self.record(blocking_sync=True) as marker:
            await marker.wait(strategy=strategy)

    def __cuda_stream__(self) -> tuple[int, int]:
        """The CUDA stream protocol (version 0), so cuda.core, torch and CuPy accept this stream."""
        self._lifetime.check_open()
        return (0, self._handle)

    # -- lifetime -----------------------------------------------------------------------------
    def close(self) -> None:
        """Destroy the stream if aiogpu owns it; release an adopted one. Idempotent.

        Work already enqueued still runs to completion (``cuStreamDestroy`` semantics).
        """
        if self.is_owned and not self._lifetime.closed:
            _wait.forget_stream(self._wait_key)
        self._lifetime.close()
        self._owner = None

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def _context(self) -> AbstractContextManager[None]:
        # Default-stream handles resolve through the current context: make ours current.
        return self._device._activated() if self._handle in DEFAULT_STREAM_HANDLES else _NOTHING_TO_ACTIVATE

    def __reduce__(self) -> tuple[object, ...]:
        raise TypeError("an aiogpu.Stream cannot be copied or pickled: it holds a CUDA stream handle; share the object itself")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Stream):
            return NotImplemented
        return self._device is other._device and self._handle == other._handle

    def __hash__(self) -> int:
        return hash((id(self._device), self._handle))

    def __repr__(self) -> str:
        state = "closed" if self._lifetime.closed else ("owned" if self.is_owned else "borrowed")
        return f"<aiogpu.Stream device={self._device.ordinal} handle={self._handle:#x} {state}>"
