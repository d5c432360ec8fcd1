"""How each stream's oldest wait is watched: closely on the loop, by a thread, or by the GPU.

Rules this file keeps:

1. Where to watch from is the strategy's choice, per stream queue (the head's strategy):
   ``auto`` watches closely on the loop (query, yield, query...) near the completion — right
   after the wait starts, and from just before the predicted completion (``_predict``) — and
   otherwise parks: on the precise timer thread until its next look (``_policy.auto_look``:
   at halves of the time left to the prediction, then spaced queries past it, for work long
   or late enough that a query a beat is not needed), or, when nothing is predicted, on one
   waiter thread (``_thread``'s watch) that queries the heads of all such streams in turn (at
   most ``AUTO_WATCH_MAX``; the rest are queried on the back-off schedule) and wakes the loop
   at the first one done. The sweeps leave a spaced head alone until its look is due.
   ``poll`` does the same with loop timers only (no thread at all), so it parks coarsely and
   watches for longer. ``thread`` never watches on the loop: a waiter thread sleeps until
   just before the predicted completion, watches closely itself, else queries with growing
   pauses, and pokes the loop. ``callback`` has the GPU ring the doorbell (``_doorbell``,
   ``_helpers``).
2. Every cold queue is also queried on a back-off schedule, so a waiter thread that is queued
   behind a saturated pool, or a host-side hazard, costs latency, never a hang.
3. The numbers come from ``_policy``'s planners; this file only carries their plans out on
   the queues and starts or stops what watches off the loop.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from . import _doorbell, _helpers, _policy, _thread
from ._strategy import OFF_LOOP
from ._sweep import Sweep

if TYPE_CHECKING:
    from ._backends import Backend
    from ._entries import Queue


class Planner(Sweep):
    """The sweep's queues, and how each head is watched until it is done."""

    def __init__(self, backend: Backend) -> None:
        super().__init__(backend)
        self._listening = False  # to the doorbell
        self._auto_watched: set[Queue] = set()  # queues whose ``auto`` head the watch queries

    def _poke_threadsafe(self) -> bool:
        """Look again soon (any thread); ``False`` if the loop is gone (the watcher's)."""
        raise NotImplementedError

    def _new_head(self, queue: Queue, now: float, *, after_progress: bool = False) -> None:
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
        queue.start = start = max(head.target._recorded_at, queue.previous_done)
        queue.last_query = 0.0
        estimate = queue.predictor.estimate
        auto_estimate = estimate if mode == "auto" else None
        queue.late = late = 0.0 if estimate is None else _policy.late_allowed(start - head.started, mode)
        queue.watch_from, queue.watch_until, queue.next_poll, backoff = _policy.plan_head(mode, start, estimate, now, late)
        queue.backoff = queue.early_backoff = backoff
        queue.early_poll = now + backoff
        # After a completion, the next beat asks again (more tends to finish meanwhile), unless
        # the new head may be seen late: its work is queued, and the sweep found it pending.
        queue.progressed = after_progress and not late
        queue.next_look = 0.0
        if auto_estimate is not None:
            queue.expected = start + auto_estimate
            queue.spaced_from = _policy.spaced_from(queue.expected, auto_estimate, queue.watch_from, late)
        else:
            queue.expected = queue.spaced_from = math.inf
        if mode == "thread":
            self._start_backstop(queue, queue.watch_from if estimate is not None else None, late)
        elif mode == "callback":
            self._ring_when_done(queue)

    def _plan(self, now: float) -> tuple[float, bool]:
        """When to look next (``<= now``: at once), and whether a precise wake-up is needed.

        Waiter threads (backstops) are started only when the loop is about to sleep: while it
        watches any queue closely, its sweeps look at every queue anyway.
        """
        queues = self._queues.values()
        off_loop = OFF_LOOP
        wake_at, precise = math.inf, False
        for queue in queues:
            if queue.entries[0].mode in off_loop:
                continue
            if queue.expected < math.inf and not queue.progressed:  # ``auto``, predicted
                last_query = max(queue.last_query, queue.start)
                estimate = queue.expected - queue.start
                look, look_precisely = _policy.auto_look(
                    now, queue.expected, estimate, (queue.watch_from, queue.watch_until), last_query, queue.late
                )
                if look > now:
                    # The sweeps leave it alone until then (a loop timer may fire a little early).
                    queue.next_look = look if look_precisely else look - _policy.LOOP_TIMER_SLACK
                    if look < wake_at:
                        wake_at, precise = look, look_precisely
                    continue
            elif not queue.progressed and not queue.watch_from <= now <= queue.watch_until:
                continue
            self._drop_auto_watch()
            return now, False
        parked_auto = []
        for queue in queues:
            if queue.expected < math.inf:
                continue  # ``auto``, predicted: planned above
            mode = queue.entries[0].mode
            if mode not in off_loop and now < queue.watch_from:
                # Asked on the back-off schedule meanwhile: a prediction can be far too long (one
                # long piece of work on the stream, then short ones: seconds late otherwise).
                if now >= queue.early_poll:  # it was just queried by the sweep: back off
                    queue.early_poll, queue.early_backoff = _policy.back_off(now, queue.early_backoff, mode)
                look_at = _policy.early_look(queue.early_poll, queue.watch_from)
                if look_at < wake_at:
                    wake_at, precise = look_at, False
                continue
            if mode == "auto":
                parked_auto.append(queue)
            elif mode == "thread" and queue.backstop is None:
                self._start_backstop(queue, None)
            if now >= queue.next_poll:  # it was just queried by the sweep: back off
                queue.next_poll, queue.backoff = _policy.back_off(now, queue.backoff, mode)
                if queue.backstop is not None and mode == "thread" and queue.late:
                    queue.next_look = queue.next_poll
            if queue.next_poll < wake_at:
                wake_at, precise = queue.next_poll, False
        if parked_auto:
            self._watch_auto(parked_auto)
        return wake_at, precise

    def _drop_auto_watch(self) -> None:
        """The loop watches closely, and its sweeps see every queue: ``auto``'s waiter thread
        would only add wake-ups (and GIL hand-offs) now. ``thread`` queues keep theirs."""
        if self._auto_watched:
            self._drop_backstop(next(iter(self._auto_watched)))

    def _watch_auto(self, parked: list[Queue]) -> None:
        """Park the heads of ``auto`` queues that nothing predicts on one waiter thread that
        queries them in turn (a watch); a new watch when one of them is not in a live one (a
        watch that saw a completion has ended)."""
        wanted = [queue for queue in parked if queue.entries[0].waiters][: _policy.AUTO_WATCH_MAX]
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

    def _start_backstop(self, queue: Queue, spin_from: float | None, late: float = 0.0) -> None:
        """A waiter thread of its own for a ``thread`` queue's head. A head that may be seen done
        ``late`` is left to it (``Sweep._sweep``) until it saw the head done or the head's
        back-off query is due; any other is asked by every sweep too (work released at once
        completes on many streams at once, and one thread's poke has the loop see them all)."""
        if not queue.entries[0].waiters:
            return  # every waiter left: the next sweep drops it (its handle may be gone)
        queue.backstop = _thread.pool().subscribe(queue.entries[0].target, self._poke_threadsafe, spin_from, late)
        queue.backstop_index = 0
        if late:
            queue.next_look = queue.next_poll

    def _ring_when_done(self, queue: Queue) -> None:
        """Make the GPU ring the doorbell once the head's work is done (a host function)."""
        if not queue.entries[0].waiters:
            return  # every waiter left: the next sweep drops it (its handle may be gone)
        if not self._listening:
            self._listening = True
            _doorbell.doorbell().listen(self._poke_threadsafe)
        _helpers.arm(queue.entries[0].target, _doorbell.doorbell(), self._poke_threadsafe)

    def _drop_backstop(self, queue: Queue) -> None:
        """Stop the queue's waiter thread; for an ``auto`` queue, the whole watch (``_plan``
        starts a new one for the heads still parked)."""
        backstop = queue.backstop
        if backstop is not None:
            if not backstop.detected_at:  # a job that ended has forgotten its subscribers already
                _thread.pool().unsubscribe(backstop)
            queue.backstop = None
            queue.next_look = 0.0  # nothing watches it off the loop: every sweep asks
            if queue in self._auto_watched:
                for member in self._auto_watched:
                    member.backstop = None
                self._auto_watched.clear()
