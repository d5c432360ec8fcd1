"""Page-locked (pinned) host memory for transfers, lent by a pool and reused between requests.

Rules this file keeps:

- A :class:`PinnedPool` lends pinned memory in power-of-two size classes so a server does not
  allocate per request, and keeps at most ``max_idle_bytes`` of it idle.
- A buffer is never reused, nor freed, while a copy into or out of it may still run: a copy
  whose await was cancelled keeps its buffer out of the pool until the GPU is done with it.
  After the pool is closed, one thread of the process frees such memory once the copies are
  over (``freer``): the loop that closed the pool never blocks for them.
- A pool holds nothing of an event loop (copies are awaited through the engine, per loop), so
  one pool may serve several loops, in several threads: its state changes under a lock, never
  held across a driver call that can wait.
- Each producer stream gets its own side stream for the copies ordered after its work, so a
  copy never queues behind another producer's unfinished work.
"""

from __future__ import annotations

import ctypes
import threading
import time
from typing import TYPE_CHECKING, final

from ._daemon import Daemon
from ._device import Device, check_int
from ._errors import ClosedResourceError
from ._per_process import PerProcess
from ._stream import Stream

if TYPE_CHECKING:
    from types import TracebackType

    from ._daemon import Next
    from ._event import Event

_SMALLEST = 4096
_LARGEST = 1 << 40  # far beyond any host's page-locked memory, and within size_t
#: Side streams a pool keeps, one per recent producer stream; the least recently used beyond
#: this is closed (its pending copies still run: destroying a stream does not cancel its work).
SIDE_STREAMS = 16
#: After close, a held buffer's copies are polled after this pause, each next pause doubling up to ``FREE_POLL_MAX``.
FREE_POLL_FIRST, FREE_POLL_MAX = 1e-3, 50e-3


def _size_class(nbytes: int) -> int:
    return max(_SMALLEST, 1 << (nbytes - 1).bit_length())


@final
class PinnedBuffer:
    """Page-locked host memory lent by a :class:`PinnedPool`; give it back with :meth:`release`.

    ``memoryview(buffer)`` (Python 3.12+) or :meth:`view` gives its first :attr:`nbytes` bytes,
    for ``numpy.frombuffer``, ``torch.frombuffer`` or ``bytes``.
    """

    __slots__ = ("_capacity", "_nbytes", "_pointer", "_pool")

    def __init__(self, pool: PinnedPool, pointer: int, capacity: int, nbytes: int) -> None:
        self._pool: PinnedPool | None = pool
        self._pointer = pointer
        self._capacity = capacity
        self._nbytes = nbytes

    @property
    def pointer(self) -> int:
        """The host address (also valid on the device: unified addressing)."""
        return self._pointer

    @property
    def nbytes(self) -> int:
        """The bytes of the transfer (the buffer may be larger: its size class)."""
        return self._nbytes

    def view(self) -> memoryview:
        """The buffer's :attr:`nbytes` bytes, writable. Valid until :meth:`release`."""
        if self._pool is None:
            raise ClosedResourceError("the PinnedBuffer was given back to its pool")
        return memoryview((ctypes.c_char * self._nbytes).from_address(self._pointer)).cast("B")

    def __buffer__(self, flags: int) -> memoryview:
        return self.view()

    def release(self) -> None:
        """Give the memory back to the pool. Idempotent; views taken before must not be used after."""
        pool, self._pool = self._pool, None
        if pool is not None:
            pool._give_back(self._pointer, self._capacity)

    def __enter__(self) -> PinnedBuffer:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.release()

    def __reduce__(self) -> tuple[object, ...]:
        raise TypeError("a PinnedBuffer cannot be copied or pickled: it lends memory that exactly one owner gives back")

    def __repr__(self) -> str:
        state = "released" if self._pool is None else f"{self._nbytes} bytes"
        return f"<aiogpu.PinnedBuffer {state} at {self._pointer:#x}>"


@final
class PinnedPool:
    """Page-locked host buffers for transfers with ``device``, reused between requests.

    Unlike a :class:`StreamPool`, a pool holds nothing of an event loop: one pool may serve
    the copies of several loops at once (threads each running a loop, one ``asyncio.run``
    after another).

    Args:
        device: The device the transfers go to and from (default: ``Device(0)``).
        max_idle_bytes: At most this much returned memory is kept for reuse; more is freed.

    Raises:
        TypeError: An argument has the wrong type.
        ValueError: ``max_idle_bytes`` is negative.
    """

    def __init__(self, device: Device | None = None, *, max_idle_bytes: int = 256 << 20) -> None:
        if device is None:
            device = Device(0)
        elif not isinstance(device, Device):
            raise TypeError(f"device must be an aiogpu.Device, got {device!r}")
        self._max_idle = check_int("max_idle_bytes", max_idle_bytes)
        if self._max_idle < 0:
            raise ValueError(f"max_idle_bytes must be non-negative, got {self._max_idle}")
        self._device = device
        self._idle: dict[int, list[int]] = {}  # size class -> pointers
        self._idle_bytes = 0
        self._in_flight: dict[int, tuple[list[Event], int]] = {}  # pointer -> (its copies' events, capacity)
        self._in_flight_lock = threading.Lock()  # after close, a thread frees what is held here
        self._side_streams: dict[tuple[int, int, int], Stream] = {}  # producer's wait key -> side stream
        self._lock = threading.Lock()  # around the idle memory and the side streams: loops in several threads
        self._closed = False

    @property
    def device(self) -> Device:
        return self._device

    @property
    def idle_bytes(self) -> int:
        """Bytes of returned memory kept for reuse."""
        return self._idle_bytes

    def take(self, nbytes: int) -> PinnedBuffer:
        """Lend a buffer of at least ``nbytes`` bytes (reused where one is idle)."""
        self._check_open()
        nbytes = check_int("nbytes", nbytes)
        if not 0 < nbytes <= _LARGEST:
            raise ValueError(f"nbytes must be positive and at most {_LARGEST} (1 TiB), got {nbytes}")
        self._reap()
        capacity = _size_class(nbytes)
        with self._lock:
            idle = self._idle.get(capacity)
            pointer = idle.pop() if idle else None
            if pointer is not None:
                self._idle_bytes -= capacity
        if pointer is None:
            with self._device._activated():
                pointer = self._device._driver.host_alloc(capacity)
        return PinnedBuffer(self, pointer, capacity, nbytes)

    def side_stream(self, after: Stream) -> Stream:
        """The stream that copies ordered after ``after``'s work run on (created on first use).

        Copies after the same producer run in order on one side stream; copies after different
        producers run on different side streams and do not wait for each other. The pool keeps
        the side streams of the 16 producers used last: an older one is closed (its copies still
        run), and that producer gets a new side stream next time.
        """
        self._check_open()
        self._check_producer(after)
        key = after._wait_key
        with self._lock:
            side = self._side_streams.pop(key, None)
            if side is None:
                side = Stream(self._device, nonblocking=True)
                if len(self._side_streams) >= SIDE_STREAMS:
                    oldest = next(iter(self._side_streams))
                    self._side_streams.pop(oldest).close()
            self._side_streams[key] = side  # most recently used last
        return side

    def _check_producer(self, after: object) -> None:
        if not isinstance(after, Stream):
            raise TypeError(f"after must be an aiogpu.Stream (adopt foreign streams with Stream.adopt), got {after!r}")
        if after.device is not self._device:
            raise ValueError(f"the pool is for device {self._device.ordinal}, the stream for device {after.device.ordinal}")

    def _give_back(self, pointer: int, capacity: int) -> None:
        with self._lock:
            keep = not self._closed and self._idle_bytes + capacity <= self._max_idle
            if keep:
                self._idle.setdefault(capacity, []).append(pointer)
                self._idle_bytes += capacity
        if not keep:
            self._free(pointer)

    def _hold_until_done(self, event: Event, buffer: PinnedBuffer) -> None:
        """A copy's await was cancelled: keep its memory out of use until the GPU is done."""
        pointer, capacity = buffer._pointer, buffer._capacity
        buffer._pool = None  # the caller's buffer is gone; the pool takes it back when safe
        # Copies of the same memory may run on different side streams (one per producer), in
        # any order: the memory comes back once every one of them is done.
        with self._in_flight_lock:
            events = self._in_flight.setdefault(pointer, ([], capacity))[0]
            events.append(event)
            first = len(events) == 1
        if self._closed and first:  # nobody will reap it, and the loop must not block: a thread frees it
            freer().free_when_done(self, pointer)

    def _reap(self) -> None:
        with self._in_flight_lock:
            for pointer, (events, capacity) in list(self._in_flight.items()):
                _drop_finished(events)
                if not events:
                    del self._in_flight[pointer]
                    self._give_back(pointer, capacity)

    def _free_if_done(self, pointer: int) -> bool:
        """After close: free ``pointer`` if every copy held on it is over; whether it is gone."""
        with self._in_flight_lock:
            held = self._in_flight.get(pointer)
            if held is None:  # ``close`` took it (it came in as the pool closed) and freed it
                return True
            _drop_finished(held[0])
            if held[0]:
                return False
            del self._in_flight[pointer]
        self._free(pointer)
        return True

    def _free(self, pointer: int) -> None:
        with self._device._activated():
            self._device._driver.host_free(pointer)

    def close(self) -> None:
        """Free the idle memory now, and lent buffers when they are given back. Idempotent.

        This **blocks** until copies abandoned by cancelled awaits have finished with their
        memory (so it is never freed under the GPU); there are none unless awaits were cancelled.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
            idle, self._idle, self._idle_bytes = self._idle, {}, 0
            sides, self._side_streams = self._side_streams, {}
        with self._in_flight_lock:
            in_flight, self._in_flight = self._in_flight, {}
        for pointer, (events, _) in in_flight.items():
            for event in events:
                _finish_quietly(event)
            self._free(pointer)
        for pointers in idle.values():
            for pointer in pointers:
                self._free(pointer)
        for side in sides.values():
            side.close()

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedResourceError("the PinnedPool is closed")

    def __reduce__(self) -> tuple[object, ...]:
        raise TypeError("a PinnedPool cannot be copied or pickled: it owns page-locked memory; share the object itself")

    def __enter__(self) -> PinnedPool:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


def _drop_finished(events: list[Event]) -> None:
    """Close and drop the events of copies that are over, or can never run (the context failed)."""
    for event in list(events):
        try:
            done = event.is_done
        except Exception:  # the context failed: the copy will never run
            done = True
        if done:
            events.remove(event)
            event.close()


def _finish_quietly(event: Event) -> None:
    """Block until a copy is over (or can never run: the context failed); close its event."""
    try:
        event.synchronize()
    except Exception:
        pass
    event.close()


class _Freer:
    """Frees the memory closed pools hold for abandoned copies, once the GPU is done with it.

    One thread for every pool of the process (``_daemon``). It polls the copies' events, with
    pauses growing from ``FREE_POLL_FIRST`` to ``FREE_POLL_MAX``, rather than blocking in the
    driver on one: a copy that never ends then holds up no other memory, and an event that is
    not blocking-sync costs no core spinning in ``cuEventSynchronize``."""

    def __init__(self) -> None:
        self._daemon = Daemon("aiogpu-pinned-free", self._take)
        self._done = threading.Condition(self._daemon.lock)  # notified: nothing is held
        self._held: list[tuple[PinnedPool, int]] = []
        self._pause = FREE_POLL_FIRST
        self._due = 0.0  # ``time.monotonic()`` of the next poll

    def free_when_done(self, pool: PinnedPool, pointer: int) -> None:
        """Free ``pointer`` of the closed ``pool`` once every copy it holds there is over."""
        with self._daemon.lock:
            self._held.append((pool, pointer))
            self._pause, self._due = FREE_POLL_FIRST, 0.0
            self._daemon.wake()

    def wait_done(self, timeout: float) -> bool:
        """Block until nothing is held any more (tests); ``False`` if ``timeout`` passed first."""
        with self._daemon.lock:
            return self._done.wait_for(lambda: not self._held, timeout)

    def _take(self) -> Next:  # with the lock held
        if not self._held:
            return None
        delay = self._due - time.monotonic()
        return delay if delay > 0 else self._poll

    def _poll(self) -> None:
        with self._daemon.lock:
            held = list(self._held)
        freed, failed = [], None
        for item in held:
            try:
                if item[0]._free_if_done(item[1]):
                    freed.append(item)
            except Exception as exc:  # the driver refused to free it: nothing more can be done
                freed.append(item)
                failed = exc
        with self._daemon.lock:
            for item in freed:
                self._held.remove(item)
            self._due = time.monotonic() + self._pause
            self._pause = min(2 * self._pause, FREE_POLL_MAX)
            if not self._held:
                self._done.notify_all()
        if failed is not None:
            raise failed  # reported by the thread, which goes on (``_daemon``)


#: The process's freer, made on first use (a forked child makes its own).
freer = PerProcess(_Freer).get
