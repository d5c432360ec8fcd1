"""StreamPool: streams on every device, lent to one task at a time.

An inference server runs each request (or micro-batch) on a stream of its own and wants the
streams spread over its GPUs; when all are busy, new requests should wait without blocking the
loop and without losing their place. Rules this file keeps:

- A lease goes to the device with the most free streams (ties: round robin), or to the device
  the caller names; within a device the most recently returned stream is lent first.
- Waiting is first come, first served: a returned stream is handed straight to the oldest
  waiter that can use it, so nobody barges past a waiter.
- Cancellation loses nothing: a waiter cancelled after a stream was handed to it passes the
  stream on.
- Returning a stream does not wait for its work: the next holder's work runs after it, in
  stream order.
- One pool serves one event loop (asyncio, uvloop or trio); it can be created before the loop runs.
"""

from __future__ import annotations

import itertools
from collections import deque
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, final

import anyio
import anyio.lowlevel

from ._device import Device, check_int
from ._errors import ClosedResourceError
from ._stream import Stream

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterable
    from types import TracebackType


class _Waiter:
    __slots__ = ("device", "ready", "stream")

    def __init__(self, device: Device | None) -> None:
        self.device = device
        self.ready = anyio.Event()
        self.stream: Stream | None = None


@final
class StreamPool:
    """Streams on several devices, lent to one task at a time (``async with pool.stream() as s``).

    Args:
        devices: The devices to spread over (default: every visible device).
        streams_per_device: How many streams each device gets.
        priority: Priority of every stream (see :class:`aiogpu.Stream`; default: the device's).
        nonblocking: Whether the streams skip synchronizing with the legacy default stream
            (default ``True``: a server's streams should not wait on unrelated default-stream work).

    Raises:
        TypeError: An argument has the wrong type.
        ValueError: No devices, a device listed twice, devices of different drivers, or
            ``streams_per_device`` below 1.
    """

    def __init__(
        self,
        devices: Iterable[Device] | None = None,
        *,
        streams_per_device: int = 2,
        priority: int | None = None,
        nonblocking: bool = True,
    ) -> None:
        per_device = check_int("streams_per_device", streams_per_device)
        if per_device < 1:
            raise ValueError(f"streams_per_device must be at least 1, got {per_device}")
        chosen = [Device(ordinal) for ordinal in range(Device.count())] if devices is None else list(devices)
        for device in chosen:
            if not isinstance(device, Device):
                raise TypeError(f"devices must be aiogpu.Device objects, got {device!r}")
        if not chosen:
            raise ValueError("a StreamPool needs at least one device")
        if len(set(chosen)) != len(chosen):
            raise ValueError(f"a device is listed twice: {[device.ordinal for device in chosen]}")
        if len({id(device._driver) for device in chosen}) != 1:
            raise ValueError("the devices belong to different drivers")
        self._devices = tuple(chosen)
        self._free: dict[Device, list[Stream]] = {device: [] for device in chosen}
        self._leased: set[Stream] = set()
        self._waiters: deque[_Waiter] = deque()
        self._turn = itertools.count()
        self._closed = False
        try:
            for device in chosen:
                for _ in range(per_device):
                    self._free[device].append(Stream(device, priority=priority, nonblocking=nonblocking))
        except BaseException:
            self.close()
            raise

    # -- properties ---------------------------------------------------------------------------
    @property
    def devices(self) -> tuple[Device, ...]:
        """The devices the pool spreads over."""
        return self._devices

    @property
    def size(self) -> int:
        """How many streams the pool holds in all."""
        return len(self._leased) + sum(len(free) for free in self._free.values())

    @property
    def in_use(self) -> int:
        """How many streams are lent out now."""
        return len(self._leased)

    @property
    def waiting(self) -> int:
        """How many tasks are waiting for a stream."""
        return len(self._waiters)

    @property
    def is_closed(self) -> bool:
        return self._closed

    # -- leasing ------------------------------------------------------------------------------
    @asynccontextmanager
    async def stream(self, device: Device | None = None) -> AsyncIterator[Stream]:
        """Lend a stream for the ``async with`` block (waiting while none is free).

        Args:
            device: Take a stream of this device (default: the device with the most free streams).

        Raises:
            ValueError: ``device`` is not one of the pool's.
            ClosedResourceError: The pool is (or gets) closed.
        """
        stream = await self.acquire(device)
        try:
            yield stream
        finally:
            self.release(stream)

    async def acquire(self, device: Device | None = None) -> Stream:
        """Take a stream, waiting (without blocking the loop) while none is free; see :meth:`stream`.

        Always a checkpoint. Give the stream back with :meth:`release`.
        """
        self._check_open()
        if device is not None and device not in self._free:
            raise ValueError(f"{device!r} is not one of this pool's devices")
        # Free streams never suit a waiter (returned ones go straight to waiters that can use
        # them), so taking one here passes nobody.
        stream = self._take(device)
        if stream is not None:
            try:
                await anyio.lowlevel.checkpoint()
            except BaseException:
                self.release(stream)
                raise
            return stream
        waiter = _Waiter(device)
        self._waiters.append(waiter)
        try:
            await waiter.ready.wait()
        except BaseException:
            if waiter.stream is not None:
                self.release(waiter.stream)  # handed over just as we were cancelled: pass it on
            elif waiter in self._waiters:  # (close() may have dropped it already)
                self._waiters.remove(waiter)
            raise
        if waiter.stream is None:
            raise ClosedResourceError("the StreamPool was closed while waiting for a stream")
        return waiter.stream

    def release(self, stream: Stream) -> None:
        """Give back a stream from :meth:`acquire` (its work may still be running).

        Raises:
            ValueError: ``stream`` is not lent out by this pool.
        """
        if stream not in self._leased:
            raise ValueError(f"{stream!r} is not lent out by this StreamPool")
        if self._closed:
            self._leased.discard(stream)
            stream.close()
            return
        for waiter in self._waiters:
            if waiter.device is None or waiter.device is stream.device:
                self._waiters.remove(waiter)
                waiter.stream = stream  # stays leased: straight to its next holder
                waiter.ready.set()
                return
        self._leased.discard(stream)
        self._free[stream.device].append(stream)

    def _take(self, device: Device | None) -> Stream | None:
        if device is None:
            most = max(len(free) for free in self._free.values())
            if not most:
                return None
            candidates = [d for d in self._devices if len(self._free[d]) == most]
            device = candidates[next(self._turn) % len(candidates)]
        free = self._free[device]
        if not free:
            return None
        stream = free.pop()
        self._leased.add(stream)
        return stream

    # -- lifetime -----------------------------------------------------------------------------
    def close(self) -> None:
        """Close the free streams now and lent ones when they come back; waiting tasks get
        ``ClosedResourceError``. Idempotent."""
        if self._closed:
            return
        self._closed = True
        for free in self._free.values():
            for stream in free:
                stream.close()
            free.clear()
        waiters, self._waiters = self._waiters, deque()
        for waiter in waiters:
            waiter.ready.set()

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedResourceError("the StreamPool is closed")

    def __enter__(self) -> StreamPool:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def __reduce__(self) -> tuple[object, ...]:
        raise TypeError("a StreamPool cannot be copied or pickled: it owns its streams; share the object itself")

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{self.in_use}/{self.size} in use, {self.waiting} waiting"
        return f"<aiogpu.StreamPool devices={[device.ordinal for device in self._devices]} {state}>"
