"""Recording: what the wake engine keeps on an event, the base type of ``aiogpu.Event``.

Rules this file keeps:

1. It imports nothing above the engine (only ``_errors``): ``Event`` subclasses it, and the
   engine annotates with it, so the engine never imports the event module and no import
   circle runs through them.
2. Its state lives in slots on the event itself: the engine reads it on every query and
   every completion, and a slot is the cheapest attribute Python has.
3. A recording is identified by ``_generation``: a wait is for the recording the event held
   when it started, and completes for that one whatever the event records next.
"""

from __future__ import annotations

import itertools
import time
from typing import TYPE_CHECKING

from .._errors import EventStateError

if TYPE_CHECKING:
    from .._device import Device
    from .._driver import Driver
    from .._lifetime import HandleLifetime
    from ._entries import Entry

#: Process-wide order of recordings: streams complete in this order.
_record_sequence = itertools.count()


def own_stream_key(recording: Recording) -> tuple[str, int]:
    """The stream key of an event queued on its own: never recorded, or recorded by another
    owner or process, its recordings say nothing about any stream's other work (nor it of
    theirs). Every other key is a stream's (``Stream``'s ``_wait_key``)."""
    return ("event", id(recording))


def is_own_stream_key(key: object) -> bool:
    """Whether ``key`` is an ``own_stream_key``, which names no stream."""
    return isinstance(key, tuple) and key[0] == "event"


class Recording:
    """An event's engine state: which handle, which recording, on which stream, and who waits."""

    __slots__ = (
        "_device",
        "_driver",
        "_generation",
        "_handle",
        "_home_closing",
        "_home_uses",
        "_lifetime",
        "_record_sequence",
        "_recorded",
        "_recorded_at",
        "_stream_key",
        "_waiting",
    )

    _device: Device
    _driver: Driver
    _handle: int
    _lifetime: HandleLifetime
    _recorded: bool
    _generation: int  # how many times recorded: a wait is for one recording
    _stream_key: object  # the stream of the last recording: the wake engine queues per stream
    _recorded_at: float  # time.perf_counter() of the last recording
    _record_sequence: int  # process-wide order of recordings (streams complete in this order)
    _waiting: Entry | None  # the engine's entry that new waits for this recording join
    _home_uses: int  # pending waits of its home loop, which only that loop's thread counts (``_holds``)
    _home_closing: bool  # closed while some were pending: the last one lets go of the handle

    if TYPE_CHECKING:

        @property
        def is_blocking_sync(self) -> bool:
            """Whether the event was created blocking-sync (the event says: ``Event``)."""

    def _begin(self, *, recorded: bool) -> None:
        """Set the state of a new event: ``recorded`` or not, on a queue of its own until it is."""
        self._recorded = recorded
        self._generation = 0
        self._stream_key = own_stream_key(self)
        self._recorded_at = time.perf_counter()
        self._record_sequence = next(_record_sequence)
        self._waiting = None
        self._home_uses = 0
        self._home_closing = False

    def _mark_recorded(self, stream_key: object) -> None:
        """The event was just recorded on the stream of ``stream_key``."""
        self._recorded = True
        self._generation += 1
        self._waiting = None  # no wait joins the last recording's entry: let go of it (``close``)
        self._stream_key = stream_key
        self._recorded_at = time.perf_counter()
        self._record_sequence = next(_record_sequence)

    def _check_recorded(self, action: str) -> None:
        """Raise unless the event is open and was recorded: CUDA reports a never recorded
        event as complete, which would turn a forgotten ``record()`` into a wrong answer."""
        self._lifetime.check_open()
        if not self._recorded:
            raise EventStateError(
                f"cannot {action} an event that was never recorded (CUDA would report it as "
                "complete): call event.record(stream) or stream.record() first"
            )
