"""When will the work behind an event finish? Learned per stream from the waits that came before.

Work on one stream runs in order, and a service tends to enqueue the same kinds of work on the
same stream, so "time from the start of this recording's work to its completion" is a useful
guess: the wake engine sleeps until just before the predicted completion and watches closely
only from there (CUDA.jl and NVIDIA's cuda-async spin briefly; gpu-async-reactor sleeps to a
predicted deadline). A recording's work starts when it was recorded or when the recording
before it on the stream completed, whichever is later.

Samples are *exact* when the completion was seen by a close watch (within tens of µs) and
*late* otherwise (seen by a sleeping thread or a coarse poll: an upper bound). An exact sample
moves the estimate by a moving average; a late one shrinks it if it is smaller (we woke too
late) and pulls it up halfway otherwise.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

_ALPHA = 0.3
_MAX_STREAMS = 4096


class Predictor:
    """The learned duration of one stream's recordings (seconds), or ``None`` before any."""

    __slots__ = ("estimate",)

    def __init__(self) -> None:
        self.estimate: float | None = None

    def observe(self, duration: float, *, exact: bool) -> None:
        estimate = self.estimate
        if estimate is None:
            self.estimate = duration
        elif exact:
            self.estimate = estimate + _ALPHA * (duration - estimate)
        elif duration < estimate:
            self.estimate = duration
        else:
            self.estimate = estimate + 0.5 * (duration - estimate)


_lock = threading.Lock()
_predictors: OrderedDict[object, Predictor] = OrderedDict()


def for_stream(key: object) -> Predictor:
    """The predictor of the stream ``key`` (most recently used kept; old streams forgotten)."""
    with _lock:
        predictor = _predictors.get(key)
        if predictor is None:
            predictor = _predictors[key] = Predictor()
            if len(_predictors) > _MAX_STREAMS:
                _predictors.popitem(last=False)
        else:
            _predictors.move_to_end(key)
        return predictor
