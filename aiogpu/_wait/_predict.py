"""When will the work behind an event finish? Learned per stream from the waits that came before.

Work on one stream runs in order, and a service tends to enqueue the same kinds of work on the
same stream, so "time from the start of this recording's work to its completion" is a useful
guess: the wake engine sleeps until just before the predicted completion and watches closely
only from there (CUDA.jl and NVIDIA's cuda-async spin briefly; gpu-async-reactor sleeps to a
predicted deadline). A recording's work starts when it was recorded or when the recording
before it on the stream completed, whichever is later.

An observation is a bracket: the work was still pending at ``lower`` (the last query that
said so) and done by ``upper`` (when it was seen). A narrow bracket (a close watch) is exact: a
shorter duration replaces the estimate (waking early is the safe error), a longer one moves it
by a moving average. A wide one whose ``lower`` is past the estimate says
the work took longer: the estimate moves halfway to the bracket's middle. A wide one that does
not contradict the estimate means we looked too late — the work may have finished long before —
so the estimate shrinks, by a step that doubles while that keeps happening: waking early costs
a little CPU, waking late costs latency.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

_ALPHA = 0.3
_FIRST_SHRINK = 0.02
_MAX_SHRINK = 0.5
_MAX_STREAMS = 4096
#: A bracket this narrow counts as an exact completion time.
EXACT_WITHIN = 50e-6


class Predictor:
    """The learned duration of one stream's recordings (seconds), or ``None`` before any."""

    __slots__ = ("_shrink", "estimate")

    def __init__(self) -> None:
        self.estimate: float | None = None
        self._shrink = _FIRST_SHRINK

    def observe(self, lower: float, upper: float) -> None:
        """The work was pending ``lower`` seconds after it started and done by ``upper``."""
        estimate = self.estimate
        if estimate is None:
            self.estimate = upper
        elif upper - lower <= EXACT_WITHIN:  # seen closely: shorter at once, longer gradually
            self.estimate = upper if upper < estimate else estimate + _ALPHA * (upper - estimate)
            self._shrink = _FIRST_SHRINK
        elif lower >= estimate:
            self.estimate = estimate + 0.5 * ((lower + upper) / 2 - estimate)
            self._shrink = _FIRST_SHRINK
        else:
            self.estimate = max(lower, min(estimate, upper) * (1 - self._shrink))
            self._shrink = min(2 * self._shrink, _MAX_SHRINK)


_lock = threading.Lock()
_predictors: OrderedDict[object, Predictor] = OrderedDict()


def forget(key: object) -> None:
    """Drop what was learned about stream ``key`` (it was destroyed; its handle may be reused)."""
    with _lock:
        _predictors.pop(key, None)


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
