"""Waits that take too long, for a server's health check to see.

A wait on work that never finishes (a kernel spinning forever, a stream waiting on an event
nobody records) never raises: CUDA has no such error. vLLM #42897 is an engine stuck that way
while its health check kept answering 200. :func:`pending_waits` lists what the running loop's
tasks wait for and for how long; :func:`watch_for_hangs` reports each wait that passes a
threshold, once.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NoReturn

import anyio

from . import _wait
from ._checks import check_seconds
from ._stream import stream_of

if TYPE_CHECKING:
    from collections.abc import Callable

    from ._device import Device
    from ._event import Event
    from ._stream import Stream

logger = logging.getLogger("aiogpu")


@dataclass(frozen=True)
class PendingWait:
    """A recording of an event that tasks of the running loop are waiting for.

    A snapshot, as :func:`pending_waits` saw it.

    Attributes:
        event: The event the tasks await.
        stream: The :class:`aiogpu.Stream` the event was recorded on; ``None`` where aiogpu
            does not know it: an adopted event recorded by its owner, an interprocess event
            (another process may record it), or a Stream object no longer referred to.
        device: The event's device.
        age: Seconds since the first of its tasks began waiting.
        waiters: How many tasks wait for it.
        strategy: The wait strategy watching it: ``"auto"``, ``"poll"``, ``"thread"`` or
            ``"callback"``.
    """

    event: Event
    stream: Stream | None
    device: Device
    age: float
    waiters: int
    strategy: str
    _key: int = field(default=0, repr=False, compare=False, kw_only=True)  # the wait's serial: reported once


def pending_waits() -> list[PendingWait]:
    """What the running loop's tasks are waiting for, oldest wait first.

    Raises:
        RuntimeError: No asyncio, uvloop or trio loop is running in this thread.
    """
    now = time.perf_counter()  # the engine's clock
    waits = []
    for entry in _wait.pending():
        event: Event = entry.target  # type: ignore[assignment]
        stream = stream_of(event)
        waits.append(PendingWait(event, stream, event.device, now - entry.started, entry.waiters, entry.mode, _key=entry.serial))
    return waits


def _log_hang(wait: PendingWait) -> None:
    handle = None if wait.stream is None else wait.stream.handle
    stream = "a stream aiogpu does not know" if handle is None else f"stream {handle:#x}"
    logger.warning(
        "a GPU wait has been pending for %.1f s: %s on %s of device %d (%d waiting tasks, strategy %r)",
        wait.age,
        repr(wait.event),
        stream,
        wait.device.ordinal,
        wait.waiters,
        wait.strategy,
        # Plain values only: handlers that pickle records (QueueHandler, SocketHandler) cannot
        # pickle an Event.
        extra={
            "aiogpu_event": repr(wait.event),
            "aiogpu_stream": handle,
            "aiogpu_device": wait.device.ordinal,
            "aiogpu_age": wait.age,
            "aiogpu_waiters": wait.waiters,
            "aiogpu_strategy": wait.strategy,
        },
    )


async def watch_for_hangs(
    threshold: float, *, on_hang: Callable[[PendingWait], object] | None = None, interval: float | None = None
) -> NoReturn:
    """Report every wait of the running loop that stays pending longer than ``threshold``, once.

    Run it as a task for the life of the loop (it returns only by cancellation). By default a
    report is a ``WARNING`` record on the ``"aiogpu"`` logger, with the wait's details as plain
    attributes: ``aiogpu_event`` (its repr), ``aiogpu_stream`` (the ``CUstream`` handle, or
    ``None``), ``aiogpu_device`` (the ordinal), ``aiogpu_age``, ``aiogpu_waiters`` and
    ``aiogpu_strategy``. Pass ``on_hang`` to do something else, for example to make the health
    check fail. To look without reporting, call :func:`pending_waits`.

    Args:
        threshold: Seconds a wait may stay pending before it is reported.
        on_hang: Called with each :class:`PendingWait` that passes the threshold (on the loop:
            it must not block). An exception it raises ends the watch.
        interval: Seconds between looks (default: a quarter of ``threshold``).

    Raises:
        TypeError: ``threshold``, ``interval`` or ``on_hang`` has the wrong type.
        ValueError: ``threshold`` or ``interval`` is not a positive finite number.
    """
    threshold = check_seconds("threshold", threshold)
    interval = threshold / 4 if interval is None else check_seconds("interval", interval)
    if on_hang is not None and not callable(on_hang):
        raise TypeError(f"on_hang must be callable, got {on_hang!r}")
    report = _log_hang if on_hang is None else on_hang
    reported: set[int] = set()
    while True:
        await anyio.sleep(interval)
        waits = pending_waits()
        reported.intersection_update(wait._key for wait in waits)  # forget waits that ended
        for wait in waits:
            if wait.age >= threshold and wait._key not in reported:
                reported.add(wait._key)
                report(wait)
