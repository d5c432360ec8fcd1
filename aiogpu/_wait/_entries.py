"""What the watcher keeps per awaited recording (``Entry``) and per stream (``Queue``).

Rules this file keeps:

1. Many tasks of one loop awaiting one recording share one entry, which the event holds
   while new waits may join it (``joinable``): forgetting it on completion is a store into
   the event the sweep has at hand, not a lookup in a table of thousands.
2. An entry, not each waiting task, keeps the event's handle alive through a ``close()``
   while it is pending (``_holds``), and lets go of it once (``let_go``).
3. An entry holds nothing it does not need on the wake-up path: every object more is a cache
   miss more per completed wait in a fan-out.
"""

from __future__ import annotations

import itertools
import math
import operator
from collections import deque
from typing import TYPE_CHECKING

from . import _holds, _predict

if TYPE_CHECKING:
    from ._backends import Signal
    from ._recording import Recording
    from ._strategy import WaitStrategy
    from ._thread import Subscriber
    from ._watcher import Watcher

_entry_serials = itertools.count()
#: Orders entries by when their first waits started (``Entry.serial``).
started_order = operator.attrgetter("serial")


class Entry:
    """One recording of one event that tasks of this loop are waiting for.

    It holds no reference to the recording's time or sequence number: those are the event's
    own (``_recorded_at``, ``_record_sequence``), read there while the event still holds this
    recording (``generation``: ``Sweep.enqueue``, ``Planner._new_head``). Each is an object of
    its own, untouched from the recording until the entry is freed as its task ends, so holding
    them would cost two cache misses per completed wait, which a fan-out of waits on events of
    their own pays thousands of times (``benchmarks/wake.py``'s fan-outs time this path).
    """

    __slots__ = (
        "error",
        "generation",
        "held",
        "mode",
        "more_signals",
        "serial",
        "signal",
        "started",
        "target",
        "waiters",
        "watcher",
    )

    def __init__(self, watcher: Watcher, target: Recording, mode: WaitStrategy, now: float, held: int) -> None:
        self.watcher = watcher
        self.target = target
        # The entry, not each waiting task, keeps the handle alive through a close() while it is
        # pending (``_holds``): let go of once, when it completes or its last task leaves.
        self.held = held
        self.mode = mode
        self.started = now  # time.perf_counter() when the first task began waiting (hang reports)
        self.serial = next(_entry_serials)  # tells this wait from the others (hang reports); orders wake-ups
        self.generation = target._generation
        # The waiting tasks' signals: the first in a slot, any more in a dict (an ordered set
        # with O(1) removal). Most recordings have one waiting task, and a dict of one costs a
        # cache miss more per completed recording (``Sweep._wake``).
        self.signal: Signal | None = None
        self.more_signals: dict[Signal, None] | None = None
        self.waiters = 0  # how many tasks wait for it: none left, it is abandoned
        self.error: BaseException | None = None

    def join(self, signal: Signal) -> None:
        if self.signal is None:
            self.signal = signal
        else:
            if self.more_signals is None:
                self.more_signals = {}
            self.more_signals[signal] = None
        self.waiters += 1

    def leave(self, signal: Signal) -> None:
        if self.signal is signal:
            self.signal = None
        elif self.more_signals is not None and signal in self.more_signals:
            del self.more_signals[signal]
        else:
            return
        self.waiters -= 1

    def signals(self) -> list[Signal]:
        first = [] if self.signal is None else [self.signal]
        return first + list(self.more_signals or ())


class Queue:
    """The pending entries of one stream, oldest first, and how the head is being watched."""

    __slots__ = (
        "backoff",
        "backstop",
        "backstop_index",
        "early_backoff",
        "early_poll",
        "entries",
        "expected",
        "key",
        "last_query",
        "late",
        "next_look",
        "next_poll",
        "predictor",
        "previous_done",
        "progressed",
        "spaced_from",
        "start",
        "tail_pending",
        "unlearned",
        "watch_from",
        "watch_until",
    )

    def __init__(self, key: object) -> None:
        self.key = key
        self.entries: deque[Entry] = deque()
        self.predictor = _predict.for_stream(key)
        self.previous_done = 0.0
        self.progressed = False  # the last sweep completed some of it: more is likely done soon
        self.tail_pending = False  # its last burst found work pending (``Sweep._burst``)
        self.backstop: Subscriber | None = None
        self.backstop_index = 0  # the head's position among the events its waiter thread queries
        self.start = self.watch_from = self.watch_until = self.next_poll = self.last_query = 0.0
        self.backoff = self.early_backoff = self.early_poll = 0.0
        # ``auto``'s watch of a predicted head (``_policy.auto_look``): the predicted completion
        # (``inf`` when nothing is predicted or the strategy is another), when its close watch
        # starts to space its queries, its next look (until then, sweeps leave it alone) and how
        # late it may be seen done.
        self.expected = self.spaced_from = math.inf
        self.next_look = self.late = 0.0
        self.unlearned: tuple[float, float] | None = None  # (pending, done) not yet told the predictor


def joinable(target: Recording, watcher: Watcher) -> Entry | None:
    """The entry a new wait of ``watcher``'s loop for ``target``'s current recording joins.

    The event holds the entry tasks join (``_waiting``), not a dictionary of the watcher's:
    forgetting it when it completes is then a store into an object the sweep has at hand, not
    a hash and a lookup in a table of thousands, each a cache miss away. It holds one loop's
    entry at a time: a wait of another loop for the same recording opens an entry of its own
    and takes the place, so waits of several loops for one event share less, never wrongly
    (each entry completes on its own).
    """
    entry = target._waiting
    if entry is not None and entry.watcher is watcher and entry.generation == target._generation:
        return entry
    return None


def forget(entry: Entry) -> None:
    """No task joins ``entry`` from now on."""
    target = entry.target
    if target._waiting is entry:
        target._waiting = None


def let_go(entry: Entry) -> None:
    """The entry lets go of what keeps its event's handle alive (once)."""
    held = entry.held
    if held:
        entry.held = _holds.NOTHING
        _holds.let_go(entry.target, held)
