"""Waits that take too long, for a server's health check to see.

A wait on work that never finishes (a kernel spinning forever, a stream waiting on an event
nobody records) never raises: CUDA has no such error. vLLM #42897 is an engine stuck that way
while its health check kept answering 200. :func:`pending_waits` lists what the running loop's
tasks wait for and for how long; :func:`watch_for_hangs` reports each wait that passes a
threshold, once.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NoReturn

import anyio

from ._wait import _watcher

if TYPE_CHECKING:
    from collections.abc import Callable

    from ._device import Device
    from ._event import Event

logger = logging.getLogger("aiogpu")


@dataclass(frozen=True)
class PendingWait:
    """A recording of an event that tasks of the running loop are waiting for."""

    event: Event
    #: The ``CUstream`` the event was recorded on (``None`` for an adopted event recorded by its owner).
    stream: int | None
    device: Device
    #: Seconds since the first of its tasks began waiting.
    age: float
    #: How many tasks wait for it.
    waiters: int
    #: The wait strategy watching it.
    strategy: str
    _key: int = field(repr=False, compare=False)  # the wait's serial number: reported once


def pending_waits() -> list[PendingWait]:
    """What the running loop's tasks are waiting for, oldest wait first.

    Raises:
        RuntimeError: No asyncio, uvloop or trio loop is running in this thread.
    """
    now = time.perf_counter()  # the engine's clock
    waits = []
    for entry in _watcher.current().pending():
        event: Event = entry.target  # type: ignore[assignment]
        stream_key = entry.target._stream_key
        stream = stream_key[1] if isinstance(stream_key, tuple) and stream_key[0] != "event" else None
        waits.append(PendingWait(event, stream, event.device, now - entry.started, entry.waiters, entry.mode, entry.serial))
    return waits


def _log_hang(wait: PendingWait) -> None:
    stream = "its owner's stream" if wait.stream is None else f"stream {wait.stream:#x}"
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
            "aiogpu_stream": wait.stream,
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
    attributes (``aiogpu_event`` (its repr), ``aiogpu_stream``, ``aiogpu_device``, ``aiogpu_age``,
    ``aiogpu_waiters``, ``aiogpu_strategy``); pass ``on_hang`` to do something else, for example
    to make the health check fail. To look without reporting, call :func:`pending_waits`.

    Args:
        threshold: Seconds a wait may stay pending before it is reported.
        on_hang: Called with each :class:`PendingWait` that passes the threshold (on the loop:
            it must not block). An exception it raises ends the watch.
        interval: Seconds between looks (default: a quarter of ``threshold``).

    Raises:
        TypeError: ``threshold``, ``interval`` or ``on_hang`` has the wrong type.
        ValueError: ``threshold`` or ``interval`` is not a positive finite number.
    """
    threshold = _check_seconds("threshold", threshold)
    interval = threshold / 4 if interval is None else _check_seconds("interval", interval)
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


def _check_seconds(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number of seconds, got {value!r}")
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a positive finite number of seconds, got {value!r}")
    return float(value)
