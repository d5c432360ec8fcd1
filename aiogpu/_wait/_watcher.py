"""The wake engine: one watcher per event loop sees every pending wait of that loop.

Rules this file keeps:

1. Work on one stream completes in order. Waits are queued per stream (the stream the event
   was recorded on) and only the oldest pending wait of each stream is queried, so a sweep
   costs O(streams), not O(waiters); when it completes, the next ones are checked at once,
   and after two in a row the newest, then by galloping and bisection: a wait that is done
   means every wait before it on the stream is (k done cost O(log k) queries, not one each). A stream whose last sweep completed
   something is watched closely on the next beat too: more of it tends to finish meanwhile. A
   sweep wakes the tasks it found done oldest wait first, across its streams; one that has
   woken ``SWEEP_WAKE_BUDGET`` tasks yields before the next stream, so they run while the GPU
   finishes the rest; the next sweep starts where it stopped.
2. One task at a time drives the watcher (sweeps, plans, sleeps); the other waiting tasks park
   on a ``Signal`` it sets. Many tasks awaiting one recording share one entry. The driver is
   the first waiting task when nobody drives — it stops when its own wait is over, so a lone
   wait is woken with no hand-off between tasks — and otherwise a system task of the loop.
   While only one stream has waits, its close watch asks about its head at each beat and
   nothing else (again and again for up to ``IDLE_SPIN`` when the loop came straight back),
   and completes it in a few steps (learning from it waits for the stream's next wait): the
   wake-up path of a lone wait is the one that decides its latency. A lone wait on work
   predicted to finish within ``SPIN_AHEAD`` skips all of it: it yields once and watches right
   where it started.
3. Where to watch from is the strategy's choice, per stream queue (the head's strategy):
   ``auto`` watches closely on the loop (query, yield, query...) near the completion — right
   after the wait starts, and from just before the predicted completion (``_predict``) — and
   otherwise parks: on the precise timer thread until the predicted time (waking the loop in
   a few beats before it after a long sleep: ``WARM_SPAN``), or, when nothing is predicted,
   on one waiter thread (``_thread``'s watch) that queries the heads of all such streams in
   turn (at most ``AUTO_WATCH_MAX``; the rest are queried on the back-off schedule) and wakes
   the loop at the first one done. ``poll`` does the same with loop
   timers only (no thread at all), so it parks coarsely and watches for longer. ``thread``
   never watches on the loop: a waiter thread sleeps until just before the predicted
   completion, watches closely itself, else queries with growing pauses, and pokes the loop.
4. Every cold queue is also queried on a back-off schedule, so a waiter thread that is queued
   behind a saturated pool, or a host-side hazard, costs latency, never a hang.
5. Query failures (``CudaError``, for example a sticky kernel fault) are delivered to every
   waiter of that stream; nothing raised here reaches the loop.
"""

from __future__ import annotations

import copy
import itertools
import math
import operator
import random
import time
import weakref
from collections import deque
from typing import TYPE_CHECKING, Any

from . import _backends, _doorbell, _helpers, _holds, _predict, _thread, _timer
from ._strategy import WaitStrategy, check_strategy

if TYPE_CHECKING:
    import asyncio
    from collections.abc import Callable, Generator

    from . import WaitTarget
    from ._backends import Backend, Park, Signal, Waiters

#: Strategies that never watch on the loop: a thread or the driver tells the loop when to look.
_OFF_LOOP = ("callback", "thread")

#: After a wait starts with nothing predicted: how long to watch closely before parking.
WATCH_UNPREDICTED = {"auto": 100e-6, "poll": 2e-3, "thread": 0.0, "callback": 0.0}
#: After a stream completed a wait, watch its next one closely for this long whatever the
#: prediction says: a stream that is completing work tends to complete more (fan-out).
WATCH_AFTER_PROGRESS = {"auto": 100e-6, "poll": 100e-6, "thread": 0.0, "callback": 0.0}
#: How long before the predicted completion close watching starts (covers wake-up jitter:
#: the timer thread's ~50-100 µs, the loop timers' ~1 ms).
LEAD = {"auto": 250e-6, "poll": 1.5e-3, "thread": 150e-6, "callback": 0.0}
#: ``auto`` also learns how late its precise wake-ups arrive (timer thread, then the loop
#: thread waking from idle: hundreds of µs after a few ms asleep) and starts
#: watching that much earlier: the largest of the last ``LATENESS_WINDOW`` wake-ups, but never
#: more than ``LATENESS_SHARE`` of the predicted duration (the CPU that costs).
LATENESS_WINDOW = 32
#: Later than this is the loop being busy (a long callback), not the wake-up being slow: ignored.
LATENESS_MAX = 2e-3
LATENESS_SHARE = 0.15
#: Parked queues are queried at least this often (first, then doubling to the cap). For
#: ``callback`` this is the watchdog: host functions never run after a sticky context error.
COLD_POLL = {"auto": (1e-3, 10e-3), "poll": (0.25e-3, 2e-3), "thread": (1e-3, 10e-3), "callback": (1e-3, 10e-3)}
#: Each back-off interval is stretched or shrunk at random by up to this share, so that a wait
#: left pending does not wake the loop in lockstep with another periodic timer. Without it,
#: anyio's ``wait_all_tasks_blocked`` (which looks every 100 ms, the loop waking on whole
#: milliseconds) can find the watcher just woken, poll after poll, for seconds on end.
COLD_POLL_JITTER = 0.2
#: A back-off query before a predicted completion is made only this long before the close watch
#: at the latest: the loop's timers fire late (asyncio rounds a timeout up to whole ms), and one
#: that fires past the watch's start delays the wake-up by as much (``benchmarks/wake.py``'s p99).
EARLY_POLL_SLACK = 2e-3


#: ``auto`` parks the unpredicted heads of at most this many streams on its one waiter thread;
#: the others are queried on the back-off schedule (the thread's wake-up makes the loop sweep
#: them all). A round of queries costs a few µs a stream, up to a round a millisecond while the
#: work stays pending: the cap bounds that thread's CPU. One thread, not one per stream: work
#: released on many streams at once completes on several at once, and as many threads, each
#: seeing its own completion, fight the waking loop for the GIL and delay the first wake-up
#: (``benchmarks/wake.py``'s fan-outs time this path).
AUTO_WATCH_MAX = 16
#: Queues of streams with nothing pending kept for their next wait (a stream's queue holds its
#: predictor and when its last work finished).
KEEP_IDLE_QUEUES = 64


#: During a close watch, when the loop came back from a yield within ``IDLE_BEAT`` (nothing else
#: was ready to run), the head is queried again and again for up to ``IDLE_SPIN`` before the
#: next yield: a loop iteration costs a few µs (``select(0)`` and the loop's bookkeeping), which
#: a lone wait would otherwise add to its wake-up, half an iteration on average. Other tasks
#: wait at most ``IDLE_SPIN`` for their turn, and only when none was ready a moment ago.
IDLE_BEAT = 15e-6
IDLE_SPIN = 20e-6
#: A wait that starts while the watcher is idle, on a stream whose work is predicted to finish
#: within ``SPIN_AHEAD``, yields once (its checkpoint) and is then watched right there, query
#: after query until ``IDLE_SPIN`` past the prediction, instead of through an entry, a plan and
#: a first yield: for ~20 µs of work, setting those up costs more than the work has left.
SPIN_AHEAD = 50e-6
#: A precise park (``auto``) longer than ``WARM_SPAN + WARM_BEAT`` wakes the loop ``WARM_SPAN``
#: before its time and then every ``WARM_BEAT`` until it (each beat a sweep and a plan): on a VM, a thread
#: asleep for milliseconds can wake milliseconds late, one asleep for a few hundred µs seldom
#: does, and the same holds for the loop woken by a timely poke. The beats trade a little CPU
#: for a p99 that a late wake-up no longer sets; beats closer together, or starting earlier,
#: cost more CPU for no better p99 (``benchmarks/wake.py``'s 5 ms workload measures both).
WARM_SPAN = 0.8e-3
WARM_BEAT = 0.4e-3
#: A sweep that has woken this many waiting tasks leaves the queues it has not reached for the
#: next beat (they go first then) and yields: the woken tasks run while the GPU finishes the
#: rest. Without it, a released fan-out of thousands of waits completes everything in one
#: sweep that lasts as long as the GPU work, and the first task resumes only after it.
#: 1,024 rather than 256: a loop behind the GPU completes whole streams at once, and the more
#: streams one sweep takes in, the nearer the tasks it wakes oldest first lie to each other in
#: memory (``_wake_oldest_first``; 256 takes in about two streams of a 10,000 x 64 fan-out).
SWEEP_WAKE_BUDGET = 1024
#: The loop's own timers due within this while the watcher parks are kept on time
#: (``_keep_loop_timer``); one due later is at most a tenth of its wait late.
KEEP_TIMER_HORIZON = 10e-3
#: A kept timer's wake-up is asked for this long after it is due: asyncio runs a timer only once
#: its clock has reached it, and sleeps a whole millisecond more if woken a moment before.
KEEP_TIMER_MARGIN = 10e-6


def _back_off(now: float, backoff: float, mode: WaitStrategy) -> tuple[float, float]:
    """The next back-off query (``backoff`` from now, jittered) and the pause after it."""
    return now + backoff * random.uniform(1 - COLD_POLL_JITTER, 1 + COLD_POLL_JITTER), min(2 * backoff, COLD_POLL[mode][1])


def _warm_beat(now: float, wake_at: float) -> float:
    """When a precise park should wake the loop: ``WARM_SPAN`` before ``wake_at`` after a long
    sleep, then every ``WARM_BEAT`` until ``wake_at`` (the last beat up to half a beat longer,
    rather than a sliver)."""
    left = wake_at - now
    if left <= 1.5 * WARM_BEAT:
        return wake_at
    if left > WARM_SPAN + WARM_BEAT:
        return wake_at - WARM_SPAN
    return now + WARM_BEAT


def _watch_past_prediction(estimate: float) -> float:
    return max(100e-6, 0.25 * estimate)


_entry_serials = itertools.count()
_started_order = operator.attrgetter("serial")  # of the entries' first waits


class _DriverFlag:
    """The signal of a waiting task that drives the watcher: it checks it between beats and
    never awaits it (cheaper than a future or a trio event on the wake-up path)."""

    __slots__ = ("_set",)

    def __init__(self) -> None:
        self._set = False

    def set_result(self, result: None, /) -> None:
        self._set = True

    def done(self) -> bool:
        return self._set

    def __await__(self) -> Generator[Any, None, None]:
        raise RuntimeError("a driving task never awaits its own signal")


class _Entry:
    """One recording of one event that tasks of this loop are waiting for.

    It holds no reference to the recording's time or sequence number: those are the event's
    own (``_recorded_at``, ``_record_sequence``), read there while the event still holds this
    recording (``generation``: ``_enqueue``, ``_new_head``). Each is an object of its own,
    untouched from the recording until the entry is freed as its task ends, so holding them
    would cost two cache misses per completed wait, which a fan-out of waits on events of
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

    def __init__(self, watcher: Watcher, target: WaitTarget, mode: WaitStrategy, now: float, held: int) -> None:
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
        # cache miss more per completed recording (``_wake``).
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


class _Queue:
    """The pending entries of one stream, oldest first, and how the head is being watched."""

    __slots__ = (
        "backoff",
        "backstop",
        "backstop_index",
        "early_backoff",
        "early_poll",
        "entries",
        "key",
        "last_query",
        "momentum_until",
        "next_poll",
        "predictor",
        "previous_done",
        "progressed",
        "start",
        "unlearned",
        "watch_from",
        "watch_until",
    )

    def __init__(self, key: object) -> None:
        self.key = key
        self.entries: deque[_Entry] = deque()
        self.predictor = _predict.for_stream(key)
        self.previous_done = 0.0
        self.progressed = False  # the last sweep completed some of it: more is likely done soon
        self.backstop: _thread.Subscriber | None = None
        self.backstop_index = 0  # the head's position among the events its waiter thread queries
        self.start = self.watch_from = self.watch_until = self.momentum_until = self.next_poll = self.last_query = 0.0
        self.backoff = self.early_backoff = self.early_poll = 0.0
        self.unlearned: tuple[float, float] | None = None  # (pending, done) not yet told the predictor


class Watcher:
    def __init__(self, backend: Backend) -> None:
        self._backend = backend
        # How the events this loop awaited first refer to it as their home (``_holds``): weakly,
        # and always through this one reference, which tells it apart by identity.
        self.weak_self = weakref.ref(self)
        self._queues: dict[object, _Queue] = {}  # streams with pending waits
        self._idle_queues: dict[object, _Queue] = {}  # streams waited on lately, oldest first
        self._running = False
        self._system_task: object = None  # the system task driving the watcher, until it stops it
        self._parked: Park | None = None  # where the driving task sleeps, while it does
        self._listening = False  # to the doorbell
        self._lateness: deque[float] = deque(maxlen=LATENESS_WINDOW)  # of precise wake-ups (s)
        self._lateness_max = 0.0  # the largest of them: read by every ``auto`` head's plan
        self._auto_watched: set[_Queue] = set()  # queues whose ``auto`` head the watch queries
        self._woken = 0  # waiting tasks woken by the current sweep
        self._waking: list[Waiters] = []  # completed, their tasks not yet woken (``_wake``)
        # The last burst search found its stream's newest wait done: the loop is behind the GPU
        # (a released backlog), so the next stream with a backlog is asked about its newest first.
        self._behind = False
        self._kept_timer: float | None = None  # the loop timer last kept on time (when, by the loop's clock)
        self._registration: _Registration | None = None  # how the asyncio registry holds it (``current``)

    # -- the waiting task's side (``wait`` below) ---------------------------------------------
    def pending(self) -> list[_Entry]:
        """The recordings this loop's tasks are waiting for, oldest wait first."""
        waited = (entry for queue in self._queues.values() for entry in queue.entries if entry.waiters)
        return sorted(waited, key=lambda entry: entry.started)

    def _leave(self, entry: _Entry, signal: Signal) -> None:
        entry.leave(signal)
        if not entry.waiters:
            self._forget(entry)  # the queue drops it lazily
            _let_go(entry)  # never queried again: abandoned entries are skipped unasked

    def _enqueue(self, entry: _Entry, now: float) -> None:
        """Queue ``entry`` in record order (waits may start in any order; streams complete in
        order). An entry whose event was recorded again since compares by its new recording:
        out of place, it is dropped from the queue unasked all the same (``_sweep_queue``)."""
        key = entry.target._stream_key
        queue = self._queues.get(key)
        if queue is None:
            queue = self._idle_queues.pop(key) if key in self._idle_queues else _Queue(key)
            self._queues[key] = queue
        entries = queue.entries
        position = len(entries)
        sequence = entry.target._record_sequence
        while position and entries[position - 1].target._record_sequence > sequence:
            position -= 1
        entries.insert(position, entry)
        if position == 0:
            self._new_head(queue, now)

    async def _spin_ahead(self, target: WaitTarget) -> bool:
        """If the target's stream's work is predicted to finish within ``SPIN_AHEAD``: yield once
        (the wait's checkpoint), then query until it is done or ``IDLE_SPIN`` past the
        prediction. Returns whether it was seen done; nothing yields after that, so the wake-up
        costs no loop iteration."""
        queue = self._idle_queues.get(target._stream_key)
        if queue is None or queue.predictor.estimate is None:
            return False
        now = time.perf_counter()
        finish = max(target._recorded_at, queue.previous_done) + queue.predictor.estimate
        if finish - now > SPIN_AHEAD:
            return False
        give_up = max(finish, now) + IDLE_SPIN
        await self._backend.yield_now()
        query, handle = target._driver.event_query, target._handle
        while not query(handle):
            if time.perf_counter() > give_up:
                return False
        return True

    # -- the watcher task ---------------------------------------------------------------------
    async def _drive(self, until: Signal | None) -> None:
        """Sweep, plan and sleep until no wait is left, or until ``until`` is set.

        ``until`` is the signal of a waiting task that drives the watcher itself: it stops
        once its own wait is over and hands what is left to the system task.
        """
        checkpointed = False
        look = until is None  # a waiting task saw its work pending a moment ago: plan first
        while self._queues:
            if look:
                cut = self._sweep(time.perf_counter())
                if until is not None and until.done():
                    break
                if not self._queues:
                    break
                if cut:  # let the woken tasks run, then sweep the streams it did not reach
                    await self._backend.yield_now()
                    checkpointed = True
                    continue
            look = True
            now = time.perf_counter()
            wake_at, precise = self._plan(now)
            if wake_at > now:
                await self._park(now, wake_at, precise)
            elif len(self._queues) == 1:
                if await self._watch_only_queue(next(iter(self._queues.values()))) and until is not None and until.done():
                    return  # its own wait is over: straight back to the task (the close watch checkpointed)
            else:
                await self._backend.yield_now()
            checkpointed = True
        if until is not None and not checkpointed:  # a wait is always a checkpoint
            await self._backend.yield_now()
        # The system task must stop right after seeing no queue left: a wait that started
        # during a yield here would see the watcher running and be left without a driver.

    async def _watch_only_queue(self, queue: _Queue) -> bool:
        """The close watch of a lone stream, lean: query its head at every beat, and nothing else.

        Completes the head and returns ``True`` once it is seen done (the wake-up path: a few
        steps, not a sweep); returns ``False`` as soon as anything a full sweep must handle
        happens (another stream's wait, a new head, the head abandoned or re-recorded, a failed
        query) or the watch ends.
        """
        head = queue.entries[0]
        target = head.target
        query, handle, generation = target._driver.event_query, target._handle, head.generation
        watch_until = max(queue.watch_until, queue.momentum_until)
        queues, entries = self._queues, queue.entries
        yield_now, clock = self._backend.yield_now, time.perf_counter
        now = clock()
        while True:
            yielded_at = now
            await yield_now()
            if len(queues) != 1 or not entries or entries[0] is not head or not head.waiters:
                return False
            if target._generation != generation:
                return False
            now = clock()
            if now > watch_until and not queue.progressed:
                return False
            spin_until = now + IDLE_SPIN if now - yielded_at < IDLE_BEAT else now
            try:
                while not (done := query(handle)):
                    queue.last_query = now  # asked at ``now``: pending
                    now = clock()
                    if now >= spin_until:
                        break
            except Exception:  # the sweep asks again and delivers the error
                return False
            if done:
                break
            queue.progressed = False
        self._complete(head)  # first: what the waiting tasks are waiting for
        self._wake()
        entries.popleft()
        start = queue.start  # learned when the stream's next wait is planned: off the wake-up path
        queue.unlearned = (max(start, queue.last_query) - start, now - start)
        queue.previous_done = now
        if entries:
            self._new_head(queue, now, after_progress=True)
        else:
            self._retire(queue)
        return True

    def _hand_over(self) -> None:
        """A waiting task stops driving: the system task takes over what is left (unless the loop
        is gone: its coroutine is being collected with the loop's other tasks, ``_abandon``)."""
        if self._queues:
            if self._backend.runs_here():
                task = self._backend.spawn_system_task(self._run, self._system_task_ended)
                if self._running:  # (an eager task may have found everything done, and stopped it)
                    self._system_task = task
                return
            self._abandon()
        self._stop()

    def _system_task_ended(self, task: object) -> None:
        """``_run`` stops the watcher however it ends, unless it never ran: cancelled before its
        first step (a "cancel every other task" at shutdown, between the hand-over and that step).
        Do what it would have done then, or every later wait on this loop would hang."""
        if task is self._system_task:
            self._fail_all(RuntimeError("the event loop is shutting down"))
            self._stop()

    async def _run(self) -> None:
        try:
            await self._drive(until=None)
        except BaseException as exc:  # cancelled with its loop, or a bug: nobody may hang
            self._fail_all(exc if isinstance(exc, Exception) else RuntimeError("the event loop is shutting down"))
            if not isinstance(exc, Exception):
                raise
        finally:
            self._stop()

    def _start(self) -> None:
        """A waiting task starts driving: from now on the loop keeps the watcher (``_Registration``)."""
        self._running = True
        if self._registration is not None:
            self._registration.idle = None

    def _stop(self) -> None:
        self._running = False
        self._system_task = None
        for queue in self._queues.values():
            self._drop_backstop(queue)
        if self._listening:
            self._listening = False
            _doorbell.doorbell().ignore(self._poke_threadsafe)
        if self._registration is not None:  # nothing is pending: it refers to nothing of its loop
            self._registration.idle = self

    def _sweep(self, now: float) -> bool:
        """Sweep the queues in order until ``SWEEP_WAKE_BUDGET`` tasks are woken. Returns whether
        it stopped before some queues; those it swept then go to the back, so the next sweep
        takes it up where it stopped."""
        self._woken = 0
        queues = self._queues
        order = list(queues.values())
        swept = []
        for position, queue in enumerate(order, 1):
            self._sweep_queue(queue, now)
            if not queue.entries:
                self._retire(queue)
            else:
                swept.append(queue.key)
            if self._woken >= SWEEP_WAKE_BUDGET and position < len(order):
                for key in swept:
                    queues[key] = queues.pop(key)
                self._wake_oldest_first()
                return True
        self._wake_oldest_first()
        return False

    def _retire(self, queue: _Queue) -> None:
        """Nothing is pending on the queue's stream: keep the queue for its next wait."""
        self._drop_backstop(queue)
        del self._queues[queue.key]
        self._idle_queues[queue.key] = queue
        if len(self._idle_queues) > KEEP_IDLE_QUEUES:
            del self._idle_queues[next(iter(self._idle_queues))]

    def _sweep_queue(self, queue: _Queue, now: float) -> None:
        """Complete the queue's done entries, oldest first; plan its new head once at the end.

        A burst (two done in a row) asks about the newest entry next, then bisects: a wait found
        done means everything recorded before it on the stream is done too, so a backlog of
        thousands costs a dozen queries, not one each. While the loop is behind the GPU, a
        backlog's newest entry is asked first (``_all_done``).
        """
        entries = queue.entries
        popped = completed = False
        stale: list[_Entry] = []  # re-recorded entries, queued anew once this queue is swept
        tail_asked = False
        known_pending: _Entry | None = None  # asked during the burst search: not asked again
        in_a_row = 0
        while entries:
            entry = entries[0]
            if not entry.waiters:
                entries.popleft()  # every task waiting for it left
                popped = True
                continue
            target = entry.target
            if target._generation != entry.generation:
                entries.popleft()  # re-recorded: it now waits for the new recording
                stale.append(entry)
                popped = True
                continue
            backstop = queue.backstop
            try:
                if (
                    not popped
                    and backstop is not None
                    and backstop.detected_at
                    and backstop.outcome is None
                    and backstop.done_index == queue.backstop_index
                ):
                    done = True  # the head's waiter thread saw it complete: no need to ask again
                elif entry is known_pending:
                    done = False
                elif self._behind and not tail_asked and len(entries) > 2 and self._all_done(queue, now, stale):
                    completed = popped = True  # every entry, learning from the head: the loop ends
                    continue
                else:
                    done = target._driver.event_query(target._handle)
                if done and in_a_row and not tail_asked and len(entries) > 2:
                    tail_asked = True
                    last, pending = self._last_done(entries)
                    self._behind = pending is None
                    if pending is not None:
                        known_pending = entries[pending]
                    if last:
                        self._complete_oldest(queue, last + 1, stale)
                        in_a_row += last + 1
                        continue
            except Exception as exc:
                self._fail_queue(queue, exc)
                break
            if not done:
                queue.last_query = now
                break
            entries.popleft()
            if not completed:  # only the head's bracket says when work finished
                self._learn(queue, now)
                completed = True
            popped = True
            in_a_row += 1
            self._complete(entry)
        if completed:
            queue.previous_done = now
        queue.progressed = completed
        if popped and entries:
            self._new_head(queue, now, after_progress=completed)
        for entry in stale:
            self._rekey(entry, now)

    def _all_done(self, queue: _Queue, now: float, stale: list[_Entry]) -> bool:
        """While the loop is behind the GPU: ask the queue's newest entry first, and complete
        every entry if it is done (one query for the stream, not the head's, the next one's and
        then the newest's). Found pending, it ends the guess: one query wasted.

        The guess pays because in a released fan-out most streams are done before the sweep
        reaches them, and each query saved is a driver call of a few µs
        (``benchmarks/wake.py``'s fan-outs time this path).
        """
        entries = queue.entries
        newest = entries[-1]
        target = newest.target
        if not newest.waiters or target._generation != newest.generation:
            return False  # not waited for as recorded: the usual search sorts it out
        if not target._driver.event_query(target._handle):
            self._behind = False
            return False
        self._learn(queue, now)
        self._complete_oldest(queue, len(entries), stale)
        return True

    @staticmethod
    def _last_done(entries: deque[_Entry]) -> tuple[int, int | None]:
        """The position of the newest entry known done, given that the oldest is, and of the
        entry found pending right after it (``None`` if none was asked): the sweep need not
        ask that one again. Entries between the two are not waited for as recorded.

        Asks the newest entry still waited for as recorded (a released backlog: one query),
        then gallops from the oldest and bisects: O(log k) queries for k done. Raises
        ``CudaError`` as a query does.
        """

        def asked(position: int) -> bool:
            target = entries[position].target
            return target._driver.event_query(target._handle)

        def valid(position: int) -> bool:  # waited for, and not re-recorded since
            entry = entries[position]
            return bool(entry.waiters) and entry.target._generation == entry.generation

        done = 0
        newest = len(entries) - 1
        while newest > done and not valid(newest):
            newest -= 1
        if newest == done or asked(newest):
            return len(entries) - 1, None  # what is after it no one waits for as recorded
        pending = newest
        step = 1  # gallop from the oldest (1, 3, 7, 15... ahead): a stream that is finishing
        while done + step < pending:  # work one by one has only a few done, so a few queries
            probe = done + step
            while probe < pending and not valid(probe):
                probe += 1
            if probe == pending:
                break
            if not asked(probe):
                pending = probe
                break
            done = probe
            step *= 2
        while pending - done > 1:
            middle = probe = (done + pending) // 2
            while probe > done and not valid(probe):
                probe -= 1
            if probe == done:
                probe = middle + 1
                while probe < pending and not valid(probe):
                    probe += 1
                if probe == pending:
                    break
            if asked(probe):
                done = probe
            else:
                pending = probe
        return done, pending

    def _complete_oldest(self, queue: _Queue, count: int, stale: list[_Entry]) -> None:
        """The ``count`` oldest entries are done (a later recording on their stream is).

        Completes most entries in a fan-out, so ``_complete`` is written out here: a Python
        call per entry is a visible share of waking thousands of waits on events of their own
        (``benchmarks/wake.py``'s fan-outs time this path).
        """
        entries = queue.entries
        waking = self._waking
        woken = 0
        for _ in range(count):
            entry = entries.popleft()
            if not entry.waiters:
                continue
            target = entry.target
            if target._generation != entry.generation:
                stale.append(entry)
                continue
            if target._waiting is entry:
                target._waiting = None
            woken += entry.waiters
            waking.append(entry)
            held = entry.held
            if held == _HOME:  # ``_holds.let_go``, written out
                entry.held = _NOTHING
                uses = target._home_uses - 1
                target._home_uses = uses
                if not uses and target._home_closing:
                    _holds.leave_home(target)
            elif held:
                entry.held = _NOTHING
                target._lifetime.release()
        self._woken += woken

    def _plan(self, now: float) -> tuple[float, bool]:
        """When to look next (``<= now``: at once), and whether a precise wake-up is needed.

        Waiter threads (backstops) are started only when the loop is about to sleep: while it
        watches any queue closely, its sweeps look at every queue anyway.
        """
        queues = self._queues.values()
        for queue in queues:
            if queue.entries[0].mode not in _OFF_LOOP and (
                queue.progressed or queue.watch_from <= now <= queue.watch_until or now <= queue.momentum_until
            ):
                self._drop_auto_watch()
                return now, False
        wake_at, precise = math.inf, False
        parked_auto = []
        for queue in queues:
            mode = queue.entries[0].mode
            if mode not in _OFF_LOOP and now < queue.watch_from:
                # Asked on the back-off schedule meanwhile: a prediction can be far too long (one
                # long piece of work on the stream, then short ones: seconds late otherwise).
                if now >= queue.early_poll:  # it was just queried by the sweep: back off
                    queue.early_poll, queue.early_backoff = _back_off(now, queue.early_backoff, mode)
                early = queue.early_poll + EARLY_POLL_SLACK < queue.watch_from  # a late timer cannot delay the watch
                look_at, look_precisely = (queue.early_poll, False) if early else (queue.watch_from, mode == "auto")
                if look_at < wake_at:
                    wake_at, precise = look_at, look_precisely
                continue
            if mode == "auto":
                parked_auto.append(queue)
            elif mode == "thread" and queue.backstop is None:
                self._start_backstop(queue, None)
            if now >= queue.next_poll:  # it was just queried by the sweep: back off
                queue.next_poll, queue.backoff = _back_off(now, queue.backoff, mode)
            if queue.next_poll < wake_at:
                wake_at, precise = queue.next_poll, False
        if parked_auto:
            self._watch_auto(parked_auto)
        return wake_at, precise

    async def _park(self, now: float, wake_at: float, precise: bool) -> None:
        if precise:
            beat_at = _warm_beat(now, wake_at)
            self._keep_loop_timer(beat_at)
        else:  # on a loop timer, which fires up to a whole millisecond late
            self._keep_loop_timer(wake_at + 1e-3, unless_only_poll=True)
        park = self._parked = self._backend.new_park()
        handle = None
        try:
            if precise:
                handle = _timer.timer().call_at(beat_at, self._poke_threadsafe)
                await park
                late = time.perf_counter() - wake_at
                if 0 <= late <= LATENESS_MAX:  # woken by the timer (a beat or the last), not by a completion or a new wait
                    self._lateness.append(late)
                    self._lateness_max = max(self._lateness)
            else:
                await self._backend.sleep_in_park(park, wake_at - now)
        finally:
            self._parked = None
            if handle is not None:
                _timer.timer().cancel(handle)

    def _keep_loop_timer(self, wake_at: float, *, unless_only_poll: bool = False) -> None:
        """The loop is about to sleep, awake since a moment of the watcher's choosing (a thread's
        poke, a close watch, a sweep): if its earliest timer is due before the watcher wakes it
        at ``wake_at`` (and within ``KEEP_TIMER_HORIZON``), have the timer thread wake the loop
        just after that timer is due. ``unless_only_poll``: not while only ``poll`` waits are
        pending, since ``poll`` starts no thread. Only while waits are pending: the wake-up that
        ends the last one leaves the loop's next sleep as asyncio rounds it.

        asyncio rounds its sleeps up to whole milliseconds (``AsyncioBackend.earliest_timer``),
        so a timer due a fraction of a millisecond after the loop went to sleep fires up to
        1 ms late. Once per timer: woken at a timer's time, the loop sleeps to its next one as
        it would without aiogpu. It costs a thread wake-up per timer and keeps the application's
        own timers prompt instead of up to a millisecond late (``benchmarks/wake.py``'s ticker
        probe measures the lag, ``poll``'s rows the lag without it).
        """
        timer = self._backend.earliest_timer()
        if timer is None:
            return
        when, delay = timer
        due = time.perf_counter() + delay  # the loop's clock may not be this one
        if when == self._kept_timer or not 0 < delay <= KEEP_TIMER_HORIZON or due >= wake_at:
            return
        if unless_only_poll and all(queue.entries[0].mode == "poll" for queue in self._queues.values()):
            return
        self._kept_timer = when
        _timer.timer().call_at(due + KEEP_TIMER_MARGIN, self._wake_loop_threadsafe)

    def runs_here(self) -> bool:
        """Whether the calling code runs on this watcher's loop (its thread, inside its run)."""
        return self._backend.runs_here()

    def call_soon_threadsafe(self, callback: Callable[[], object]) -> bool:
        """Run ``callback`` on the loop soon (any thread); ``False`` if the loop is gone."""
        return self._backend.waker(callback)

    def _wake_loop_threadsafe(self) -> None:
        self._backend.waker(_nothing)

    def _poke(self) -> None:
        """Look again now (loop thread, a task's step: a new wait)."""
        if self._parked is not None:
            _backends.set_signal(self._parked)

    def _poke_in_callback(self) -> None:
        """Look again now, from a loop callback of its own (a thread saw a completion, a timer
        fired): on asyncio and uvloop the driving task resumes in this callback, not on the loop's
        next iteration."""
        if self._parked is not None:
            self._parked.wake_in_callback()

    def _poke_threadsafe(self) -> bool:
        """Look again soon (any thread); ``False`` if the loop is gone."""
        return self._backend.waker(self._poke_in_callback)

    # -- per-queue bookkeeping ----------------------------------------------------------------
    def _new_head(self, queue: _Queue, now: float, *, after_progress: bool = False) -> None:
        """Plan how to watch the queue's (new) oldest entry."""
        if queue.backstop is not None:
            self._drop_backstop(queue)
        if queue.unlearned is not None:
            queue.predictor.observe(*queue.unlearned)
            queue.unlearned = None
        head = queue.entries[0]
        mode = head.mode
        # The head holds the event's current recording: a new or re-queued entry, or the one a
        # sweep stopped at, which it asked about after dropping every re-recorded one before it.
        queue.start = max(head.target._recorded_at, queue.previous_done)
        queue.last_query = 0.0
        queue.backoff = queue.early_backoff = COLD_POLL[mode][0]
        queue.early_poll = now + queue.early_backoff
        estimate = queue.predictor.estimate
        if estimate is None:
            queue.watch_from, queue.watch_until = now, now + WATCH_UNPREDICTED[mode]
        else:
            expected = queue.start + estimate
            lead = LEAD[mode]
            if mode == "auto" and self._lateness_max:
                lead += min(self._lateness_max, LATENESS_SHARE * estimate)
            queue.watch_from = expected - lead
            queue.watch_until = expected + _watch_past_prediction(estimate)

        queue.progressed = after_progress
        queue.momentum_until = now + WATCH_AFTER_PROGRESS[mode] if after_progress else 0.0
        queue.next_poll = max(now, queue.watch_until, queue.momentum_until) + queue.backoff
        if mode == "thread":
            self._start_backstop(queue, queue.watch_from if estimate is not None else None)
        elif mode == "callback":
            self._ring_when_done(queue)

    def _learn(self, queue: _Queue, now: float) -> None:
        """Tell the predictor when the head was last seen pending and when it was seen done."""
        pending, done = max(queue.start, queue.last_query), now
        backstop = queue.backstop
        if backstop is not None and backstop.detected_at:  # a waiter thread may have seen more
            pending = max(pending, backstop.pending_at)
            if backstop.done_index == queue.backstop_index:
                done = min(done, backstop.detected_at)
        queue.predictor.observe(pending - queue.start, done - queue.start)

    def _drop_auto_watch(self) -> None:
        """The loop watches closely, and its sweeps see every queue: ``auto``'s waiter thread
        would only add wake-ups (and GIL hand-offs) now. ``thread`` queues keep theirs."""
        if self._auto_watched:
            self._drop_backstop(next(iter(self._auto_watched)))

    def _watch_auto(self, parked: list[_Queue]) -> None:
        """Park the heads of ``auto`` queues that nothing predicts (or whose prediction ran out)
        on one waiter thread that queries them in turn (a watch); a new watch when one of them
        is not in a live one (a watch that saw a completion has ended)."""
        wanted = [queue for queue in parked if queue.entries[0].waiters][:AUTO_WATCH_MAX]
        if all(queue.backstop is not None and not queue.backstop.detected_at for queue in wanted):
            return
        self._drop_auto_watch()
        if not wanted:  # every waiter left: the next sweep drops them (their handles may be gone)
            return
        targets = tuple(queue.entries[0].target for queue in wanted)
        watch = _thread.pool().watch_any(targets, self._poke_threadsafe)
        for index, queue in enumerate(wanted):
            queue.backstop, queue.backstop_index = watch, index
        self._auto_watched.update(wanted)

    def _start_backstop(self, queue: _Queue, spin_from: float | None) -> None:
        """A waiter thread of its own for a ``thread`` queue's head."""
        if not queue.entries[0].waiters:
            return  # every waiter left: the next sweep drops it (its handle may be gone)
        queue.backstop = _thread.pool().subscribe(queue.entries[0].target, self._poke_threadsafe, spin_from)
        queue.backstop_index = 0

    def _ring_when_done(self, queue: _Queue) -> None:
        """Make the GPU ring the doorbell once the head's work is done (a host function)."""
        if not queue.entries[0].waiters:
            return  # every waiter left: the next sweep drops it (its handle may be gone)
        if not self._listening:
            self._listening = True
            _doorbell.doorbell().listen(self._poke_threadsafe)
        _helpers.arm(queue.entries[0].target, _doorbell.doorbell(), self._poke_threadsafe)

    def _drop_backstop(self, queue: _Queue) -> None:
        """Stop the queue's waiter thread; for an ``auto`` queue, the whole watch (``_plan``
        starts a new one for the heads still parked)."""
        backstop = queue.backstop
        if backstop is not None:
            if not backstop.detected_at:  # a job that ended has forgotten its subscribers already
                _thread.pool().unsubscribe(backstop)
            queue.backstop = None
            if queue in self._auto_watched:
                for member in self._auto_watched:
                    member.backstop = None
                self._auto_watched.clear()

    def _rekey(self, entry: _Entry, now: float) -> None:
        target = entry.target
        self._forget(entry)
        entry.generation = target._generation
        # Unless a wait for the new recording started its own, or the event is closed (no wait
        # joins it, and holding the entry would keep this loop alive if it were dropped).
        if _joinable(target, self) is None and not target._lifetime.closed:
            target._waiting = entry
        self._enqueue(entry, now)

    @staticmethod
    def _forget(entry: _Entry) -> None:
        """No task joins ``entry`` from now on (on the wake path: the event is at hand there)."""
        target = entry.target
        if target._waiting is entry:
            target._waiting = None

    # -- outcomes -----------------------------------------------------------------------------
    def _complete(self, entry: _Entry) -> None:
        """The entry's work is done (or failed): its tasks are woken at the next ``_wake``.

        ``_forget`` written out: this runs once per completed recording, 10,000 times in a
        fan-out of waits on events of their own, where it and letting go of the handle as
        calls are a visible share of the wake-up (``_complete_oldest``, which completes most
        of them, writes out both)."""
        target = entry.target
        if target._waiting is entry:
            target._waiting = None
        self._woken += entry.waiters
        self._waking.append(entry)
        _let_go(entry)

    def _wake(self) -> None:
        """Wake the tasks of the entries completed since the last call, in that order.

        On asyncio's own loops the tasks woken here resume together in one callback on the
        loop's next iteration (their signals are parks: ``_loop._AsyncioPark``), not one
        scheduled callback each (``AsyncioBackend.set_signals``).
        """
        self._backend.set_signals(self._waking)

    def _wake_oldest_first(self) -> None:
        """``_wake``, the sweep's completed entries sorted into the order their waits started,
        not the order the sweep found them in (stream by stream).

        Tasks tend to lie in memory in the order their waits started: a server's requests each
        make a task, an event and a wait in turn, round robin over its streams, and the tasks of
        one stream lie far apart. Woken stream by stream, each task's wake-up touched memory far
        from the last one's. Sorted, consecutive wake-ups touch nearby memory; the sort pays
        together with a large ``SWEEP_WAKE_BUDGET`` (a sweep that takes in whole streams has
        more wake-ups to put in order), and neither pays as much alone (``benchmarks/wake.py``'s
        fan-outs with an event for each waiter time this path). The lone wait's close watch wakes
        its one entry through ``_wake``: nothing to sort.
        """
        if len(self._waking) > 1:
            self._waking.sort(key=_started_order)
        self._wake()

    def _fail_queue(self, queue: _Queue, error: BaseException) -> None:
        for entry in queue.entries:
            entry.error = error
            self._complete(entry)
        queue.entries.clear()
        self._wake()

    def _fail_all(self, error: BaseException) -> None:
        """Fail every pending wait with ``error`` (``_abandon`` them off the loop)."""
        if not self._backend.runs_here():
            self._abandon()
            return
        for queue in list(self._queues.values()):
            self._fail_queue(queue, error)
            self._drop_backstop(queue)
        self._queues.clear()

    def _abandon(self) -> None:
        """The loop is gone: the driving coroutine is being closed as it is collected with a loop
        dropped with waits pending, none of whose tasks runs again. Let go of their events and
        wake nobody. This runs in a finalizer, on whichever thread the collector interrupted,
        maybe inside one of aiogpu's locks: it takes none. A waiter thread ends its job at its
        next query, the doorbell forgets the watcher at its next ring (a second at the most),
        and the timer thread pokes it in vain."""
        for queue in self._queues.values():
            for entry in queue.entries:
                self._forget(entry)
                _let_go(entry)
            if queue.backstop is not None:
                queue.backstop.abandon()
        self._queues.clear()
        self._auto_watched.clear()


def _nothing() -> None:
    """A loop callback that only wakes the loop (its timers run on the same iteration)."""


def _joinable(target: WaitTarget, watcher: Watcher) -> _Entry | None:
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


_NOTHING, _HOME = _holds.NOTHING, _holds.HOME


def _let_go(entry: _Entry) -> None:
    held = entry.held
    if held:
        entry.held = _NOTHING
        _holds.let_go(entry.target, held)


async def wait(target: WaitTarget, *, strategy: WaitStrategy | None = None) -> None:
    """Wait until the captured work has completed, without blocking the event loop.

    Always a checkpoint, even if the work is already done. ``await event`` is the same as
    ``await event.wait()``.

    Args:
        strategy: ``"auto"``, ``"poll"``, ``"thread"`` or ``"callback"`` (see the user guide's
            "Wait strategies and how to choose"); the default is :func:`aiogpu.get_default_wait_strategy`.

    Raises:
        EventStateError: The event was never recorded.
        CudaError: The captured work failed, for example with ``CUDA_ERROR_ILLEGAL_ADDRESS``
            from an earlier kernel; every task awaiting the event gets it.
        ClosedResourceError: The event was closed.

    Cancellation:
        Returns promptly with every strategy (the ``thread`` strategy does not wait for
        the GPU). The GPU work and the event are untouched: the event can be awaited
        again. Nothing is leaked; a waiter thread already waiting for the work returns
        to the pool at its next query (or, parked on a blocking-sync event, when the work
        completes).
    """
    # This is ``Event.wait`` itself (one coroutine frame per waiting task, the engine's: every
    # frame more is resumed on every wake-up, 10,000 times in a fan-out).
    mode = check_strategy(strategy)
    target._check_recorded("await")
    watcher = current()
    entry = _joinable(target, watcher)
    if entry is None:  # nobody waits for this recording yet: is it done already?
        held = _holds.hold(target, watcher)  # by the entry from here on (``_let_go``)
        try:
            done = target._driver.event_query(target._handle)
            if not done and mode not in _OFF_LOOP and not watcher._running:  # short work, idle watcher
                if await watcher._spin_ahead(target):
                    _holds.let_go(target, held)
                    return  # it yielded before it saw the work done: checkpointed
                entry = _joinable(target, watcher)  # others may have started waiting meanwhile
                if entry is not None:
                    _holds.let_go(target, held)  # held by that entry already
        except BaseException:
            _holds.let_go(target, held)
            raise
        if done:
            _holds.let_go(target, held)
            await watcher._backend.yield_now()  # a checkpoint even when already done
            return
    driving = not watcher._running
    signal = _DriverFlag() if driving else watcher._backend.new_signal()
    if entry is None:
        now = time.perf_counter()
        entry = _Entry(watcher, target, mode, now, held)
        target._waiting = entry
        entry.join(signal)  # before it is planned: a head without waiters is skipped
        watcher._enqueue(entry, now)
    else:
        entry.join(signal)
    try:
        if not driving:
            watcher._poke()
            await signal  # a park or the loop's future itself: no frame more on the wake-up
        else:  # nobody watches: this task does, so its own wake-up costs no hand-off
            watcher._start()
            try:
                await watcher._drive(until=signal)
            finally:
                watcher._hand_over()
    except BaseException:
        watcher._leave(entry, signal)
        raise
    if entry.error is not None:
        raise copy.copy(entry.error)


class _Registration:
    """How the registry of asyncio loops' watchers holds one: strongly while it is idle, when it
    refers to nothing of its loop (only to what it learned: predictions, lateness), and weakly
    while waits are pending. It then refers to its loop (the waiting tasks' futures, the driving
    task), and the loop to it: the driving task is in the loop's ready queue, behind one of its
    timers, or about to be poked by aiogpu's timer or a waiter thread. Held strongly then, a loop
    dropped with waits pending (closed without cancelling its tasks) would never be collected,
    nor its tasks, nor the events they waited for: a weak dictionary's value must not refer to
    its key."""

    __slots__ = ("idle", "watcher")

    def __init__(self, watcher: Watcher) -> None:
        self.watcher = watcher.weak_self
        self.idle: Watcher | None = watcher


_asyncio_watchers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Registration] = weakref.WeakKeyDictionary()
#: The last (loop, watcher) looked up, both weakly (the watcher refers to its loop): spares the
#: dictionary lookup, and keeps neither a closed loop nor what its watcher refers to alive.
_last_asyncio: tuple[weakref.ref[asyncio.AbstractEventLoop], weakref.ref[Watcher]] | None = None
_trio_watcher_var: object = None


def current() -> Watcher:
    """The watcher of the running loop (per loop: never shared between loops)."""
    global _last_asyncio
    trio = _backends.in_trio_task()  # first: a trio guest's tasks run inside an asyncio loop's callbacks
    loop = _backends.running_asyncio_loop() if trio is None else None
    if loop is not None:
        last = _last_asyncio
        if last is not None and last[0]() is loop and (cached := last[1]()) is not None:
            return cached
        registration = _asyncio_watchers.get(loop)
        watcher = None if registration is None else registration.watcher()
        if watcher is None:
            watcher = Watcher(_backends.asyncio_backend(loop))
            watcher._registration = _asyncio_watchers[loop] = _Registration(watcher)
        _last_asyncio = (weakref.ref(loop), watcher.weak_self)
        return watcher
    if trio is None:
        raise RuntimeError("aiogpu waits need a running asyncio, uvloop or trio event loop")
    global _trio_watcher_var
    if _trio_watcher_var is None:
        _trio_watcher_var = trio.lowlevel.RunVar("aiogpu_watcher")
    run_var = _trio_watcher_var
    try:
        return run_var.get()  # type: ignore[attr-defined,no-any-return]
    except LookupError:
        watcher = Watcher(_backends.trio_backend(trio))
        run_var.set(watcher)  # type: ignore[attr-defined]
        return watcher
