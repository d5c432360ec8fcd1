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
- One pool serves one event loop at a time (asyncio, uvloop or trio): its waiters wake through
  their loop's primitives, which no other thread may touch. The first loop that acquires or
  releases binds it; another loop may take it over once that loop is closed or its run is over
  (a test's next ``asyncio.run``), or, stopped, has no task waiting and no stream lent; any
  other use from a second loop raises ``RuntimeError`` at once rather than hang a waiter.
"""

from __future__ import annotations

import itertools
import sys
import weakref
from collections import deque
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, final

import anyio
import anyio.lowlevel

from . import _wait
from ._checks import check_int
from ._device import Device
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

    A pool serves one event loop at a time. It may be created before the loop runs; the first
    loop that acquires or releases a stream binds it, and it can move on to another loop once
    that one is over (closed, or its trio run finished), or is stopped with no stream lent and
    no task waiting: so a pool made once can serve one ``asyncio.run`` after another. Used from
    a second loop while the first still runs (two threads, each with its loop), it raises
    ``RuntimeError`` at once: create one pool per loop instead, inside each loop.

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
        self._loop: _BoundLoop | None = None  # the loop whose tasks use the pool now
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

        Raises:
            RuntimeError: Another event loop that is still running uses the pool.
        """
        self._check_loop()
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
            RuntimeError: Another event loop that is still running uses the pool.
        """
        self._check_loop()
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
        ``ClosedResourceError``. Idempotent.

        Raises:
            RuntimeError: Tasks of another event loop, still running, wait for a stream.
        """
        if self._closed:
            return
        if self._waiters:  # they are woken through their loop
            self._check_loop()
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

    def _check_loop(self) -> None:
        """Bind the pool to the calling loop, or raise if another loop still uses it."""
        here = _BoundLoop.current()
        bound = self._loop
        if bound is not None and here is not None and bound.is_loop(here):
            return
        if bound is None or bound.is_over():
            self._waiters.clear()  # only a loop that is over can have left any: gone with it
            self._loop = None if here is None else _BoundLoop(here)
            return
        if not bound.is_running():  # stopped: none of its tasks runs meanwhile
            if here is None:
                return
            if not self._waiters and not self._leased:
                self._loop = _BoundLoop(here)
                return
        where = "outside any event loop" if here is None else f"from {_describe(here)}"
        raise RuntimeError(
            f"{self!r} is used by {_describe(bound.loop())}, which is still running, and is used here {where}. "
            "A StreamPool serves one event loop at a time: create a pool per loop (inside the loop), "
            "or use this one from another loop once the first has finished"
        )

    def __enter__(self) -> StreamPool:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def __reduce__(self) -> tuple[object, ...]:
        raise TypeError("a StreamPool cannot be copied or pickled: it owns its streams; share the object itself")

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{self.in_use}/{self.size} in use, {self.waiting} waiting"
        return f"<aiogpu.StreamPool devices={[device.ordinal for device in self._devices]} {state}>"


class _BoundLoop:
    """The loop a pool is bound to: an asyncio loop (weakly) or a trio run (its token)."""

    __slots__ = ("loop",)

    def __init__(self, loop: object) -> None:
        self.loop: weakref.ref[object] | _Strong = _Strong(loop) if _is_trio_token(loop) else weakref.ref(loop)

    @staticmethod
    def current() -> object | None:
        """The calling code's loop: an asyncio loop or a trio run's token (``None``: no loop)."""
        trio = _wait.in_trio_task()  # first: a trio guest's tasks run inside an asyncio loop's callbacks
        if trio is not None:
            token: object = trio.lowlevel.current_trio_token()
            return token
        return _wait.running_asyncio_loop()

    def is_loop(self, loop: object) -> bool:
        return self.loop() is loop

    def is_over(self) -> bool:
        """Whether the loop can run no task any more (an asyncio loop closed or collected, a
        trio run finished)."""
        loop = self.loop()
        if loop is None:
            return True
        if _is_trio_token(loop):
            try:
                loop.run_sync_soon(_nothing)  # type: ignore[attr-defined]
            except RuntimeError:  # trio.RunFinishedError
                return True
            return False
        return loop.is_closed()  # type: ignore[attr-defined,no-any-return]

    def is_running(self) -> bool:
        loop = self.loop()
        if loop is None:
            return False
        return _is_trio_token(loop) or loop.is_running()  # type: ignore[attr-defined]


class _Strong:
    """A strong reference that reads like a weak one (a trio token: a run's, small, and told
    apart from the next run's by identity)."""

    __slots__ = ("_object",)

    def __init__(self, obj: object) -> None:
        self._object = obj

    def __call__(self) -> object:
        return self._object


def _is_trio_token(loop: object) -> bool:
    trio = sys.modules.get("trio")  # never import trio ourselves: a token means it is imported
    return trio is not None and isinstance(loop, trio.lowlevel.TrioToken)


def _nothing() -> None:
    pass


def _describe(loop: object) -> str:
    if loop is None:
        return "an event loop that is gone"
    if _is_trio_token(loop):
        return f"a trio run (token {id(loop):#x})"
    return f"the asyncio event loop {loop!r} (at {id(loop):#x})"
