"""Awaitable transfers between device memory and pooled page-locked host memory.

The pattern servers hand-roll with a thread (vLLM, SGLang): copy results to the host on a side
stream, ordered after the stream that produced them, and await the copy instead of blocking the
loop in ``synchronize()``. Rules this file keeps:

- Copies go through page-locked (pinned) host memory, the only kind a copy can overlap with;
  a :class:`PinnedPool` lends it in power-of-two size classes so a server does not allocate per
  request, and keeps at most ``max_idle_bytes`` of it idle.
- A copy runs on a side stream that first waits, on the device, for the work enqueued so far on
  ``after``: the producer's stream is never blocked and goes on. Each producer stream gets its
  own side stream, so a copy never queues behind another producer's unfinished work.
- A buffer is never reused, nor freed, while a copy into or out of it may still run: a copy
  whose await was cancelled keeps its buffer out of the pool until the GPU is done with it.
- A pool holds nothing of an event loop (copies are awaited through the engine, per loop), so
  one pool may serve several loops, in several threads: its state changes under a lock, never
  held across a driver call that can wait.
"""

from __future__ import annotations

import ctypes
import threading
from typing import TYPE_CHECKING, final

from . import _foreign
from ._device import Device, check_int
from ._errors import ClosedResourceError
from ._stream import Stream
from ._wait import check_strategy

if TYPE_CHECKING:
    from types import TracebackType

    from ._event import Event
    from ._wait import WaitStrategy

_SMALLEST = 4096
_LARGEST = 1 << 40  # far beyond any host's page-locked memory, and within size_t
#: Side streams a pool keeps, one per recent producer stream; the least recently used beyond
#: this is closed (its pending copies still run: destroying a stream does not cancel its work).
SIDE_STREAMS = 16


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
            threading.Thread(target=self._free_when_done, args=(pointer,), name="aiogpu-pinned-free", daemon=True).start()

    def _reap(self) -> None:
        with self._in_flight_lock:
            for pointer, (events, capacity) in list(self._in_flight.items()):
                for event in list(events):
                    try:
                        done = event.is_done
                    except Exception:  # the context failed: the copy will never run
                        done = True
                    if done:
                        events.remove(event)
                        event.close()
                if not events:
                    del self._in_flight[pointer]
                    self._give_back(pointer, capacity)

    def _free_when_done(self, pointer: int) -> None:
        """On a thread, after close: free ``pointer`` once every copy held on it is over."""
        while True:
            with self._in_flight_lock:
                events = self._in_flight[pointer][0]
                if not events:
                    del self._in_flight[pointer]
                    break
                event = events.pop()
            _finish_quietly(event)
        self._free(pointer)

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


def _finish_quietly(event: Event) -> None:
    """Block until a copy is over (or can never run: the context failed); close its event."""
    try:
        event.synchronize()
    except Exception:
        pass
    event.close()


async def copy_to_host(source: object, *, after: Stream, pool: PinnedPool, strategy: WaitStrategy | None = None) -> PinnedBuffer:
    """Copy a device array into pinned host memory and await the copy.

    The copy runs on a side stream of the pool (one per producer stream) once the work enqueued
    on ``after`` so far (which produced ``source``) is done; ``after`` itself is not blocked and
    can take more work.

    Args:
        source: A C-contiguous CUDA array (torch CUDA tensor, CuPy or Numba device array, any
            ``__cuda_array_interface__`` object) or a ``(device_pointer, nbytes)`` pair.
        after: The stream whose work produces ``source``.
        pool: Where the host memory comes from; its device must be ``after``'s.
        strategy: ``"auto"``, ``"poll"``, ``"thread"`` or ``"callback"`` (see
            :meth:`Event.wait`); the default is :func:`aiogpu.get_default_wait_strategy`.

    Returns:
        The host copy; give it back with ``release()`` (or ``with``) when done with it.

    Raises:
        TypeError: ``source`` is not a CUDA array, or ``after``/``pool`` have the wrong type.
        ValueError: The array is not contiguous or is empty, or ``pool`` is for another device.
        CudaError: The copy (or the work before it) failed.

    Cancellation:
        Returns promptly; the copy may still run, and its memory stays out of the pool until
        it has.
    """
    array = _foreign.describe_array(source)
    _check_transfer(after, pool, array, strategy)
    buffer = pool.take(array.nbytes)
    await _copy(pool, after, buffer.pointer, array.pointer, array.nbytes, buffer, strategy, owned=True)
    return buffer


async def copy_to_device(
    destination: object, source: object, *, after: Stream, pool: PinnedPool, strategy: WaitStrategy | None = None
) -> None:
    """Copy host bytes into a device array and await the copy.

    ``source`` is staged through the pool's pinned memory unless it is a :class:`PinnedBuffer`
    already. The copy runs on a side stream of the pool (one per producer stream) after the work
    enqueued on ``after`` so far (which may still be using ``destination``).

    Args:
        destination: A writable, C-contiguous CUDA array or ``(device_pointer, nbytes)``.
        source: Any bytes-like object (``bytes``, ``memoryview``, a NumPy array...) or a
            :class:`PinnedBuffer`, of exactly ``destination``'s size.
        after: The stream whose earlier work must finish before ``destination`` is overwritten.
        pool: Staging memory and the side stream; its device must be ``after``'s.
        strategy: ``"auto"``, ``"poll"``, ``"thread"`` or ``"callback"`` (see
            :meth:`Event.wait`); the default is :func:`aiogpu.get_default_wait_strategy`.

    Raises:
        TypeError: Wrong argument types.
        ValueError: Sizes differ, the destination is read-only or not contiguous.
        CudaError: The copy (or the work before it) failed.

    Cancellation:
        Returns promptly; the copy may still run. Staging memory, or a :class:`PinnedBuffer`
        passed as ``source``, goes back to the pool only once the copy is done.
    """
    array = _foreign.describe_array(destination)
    if array.readonly:
        raise ValueError("the destination CUDA array is read-only")
    _check_transfer(after, pool, array, strategy)
    if isinstance(source, PinnedBuffer):
        if source._pool is None:
            raise ClosedResourceError("the source PinnedBuffer was given back to its pool")
        if source.nbytes != array.nbytes:
            raise ValueError(f"the source has {source.nbytes} bytes, the destination {array.nbytes}")
        await _copy(pool, after, array.pointer, source.pointer, array.nbytes, source, strategy, owned=False)
        return
    try:
        data = memoryview(source).cast("B")  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(f"the source must be bytes-like or a PinnedBuffer, got {type(source).__name__}") from None
    if data.nbytes != array.nbytes:
        raise ValueError(f"the source has {data.nbytes} bytes, the destination {array.nbytes}")
    staging = pool.take(array.nbytes)
    staging.view()[:] = data
    await _copy(pool, after, array.pointer, staging.pointer, array.nbytes, staging, strategy, owned=True)
    staging.release()


def _check_transfer(after: Stream, pool: PinnedPool, array: _foreign.DeviceArray, strategy: object) -> None:
    """Refuse bad arguments before anything is taken or enqueued."""
    if strategy is not None:
        check_strategy(strategy)
    if not isinstance(pool, PinnedPool):
        raise TypeError(f"pool must be an aiogpu.PinnedPool, got {pool!r}")
    pool._check_producer(after)
    if array.nbytes == 0:
        raise ValueError("the CUDA array is empty: nothing to copy")


async def _copy(
    pool: PinnedPool,
    after: Stream,
    destination: int,
    source: int,
    nbytes: int,
    buffer: PinnedBuffer,
    strategy: WaitStrategy | None,
    *,
    owned: bool,
) -> None:
    """Enqueue the copy on ``after``'s side stream after ``after``'s work so far, and await it.

    ``owned``: ``buffer`` was taken for this copy (given back if the copy cannot be enqueued).
    """
    try:
        side = pool.side_stream(after)
        side.wait_for(after)
        with after.device._activated():
            after.device._driver.memcpy_async(destination, source, nbytes, side.handle)
        done = side.record()
    except BaseException:  # not enqueued, or the context failed: no copy will touch the memory
        if owned:
            buffer.release()
        raise
    try:
        await done.wait(strategy=strategy)
    except BaseException:
        pool._hold_until_done(done, buffer)
        raise
    done.close()
