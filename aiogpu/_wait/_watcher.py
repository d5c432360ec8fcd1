"""The watcher: one per event loop, driving the sweep and the plans of every pending wait there.

Rules this file keeps:

1. One task at a time drives the watcher (sweeps, plans, sleeps); the other waiting tasks park
   on a ``Signal`` it sets. The driver is the first waiting task when nobody drives — it stops
   when its own wait is over, so a lone wait is woken with no hand-off between tasks — and
   otherwise a system task of the loop (``hand_over``).
2. While only one stream has waits, its close watch asks about its head at each beat and
   nothing else (again and again for up to ``IDLE_SPIN`` when the loop came straight back),
   and completes it in a few steps (learning from it waits for the stream's next wait): the
   wake-up path of a lone wait is the one that decides its latency. A lone wait on work
   predicted to finish within ``SPIN_AHEAD`` skips all of it: it yields once and watches right
   where it started (``spin_ahead``).
3. A precise park (``auto``) has the timer thread wake the loop once, at its time; the loop's
   own timers due while it parks are kept on time (``_keep_loop_timer``). While the loop is
   busy, a parked driver is also looked at from the loop itself, once per iteration (``_busy``).
4. Nothing raised here reaches the loop, and no wait hangs: however the driving task ends, the
   waits left are failed or handed over.
"""

from __future__ import annotations

import time
import weakref
from typing import TYPE_CHECKING, Any

from . import _backends, _doorbell, _entries, _policy, _timer
from ._busy import BusyLook
from ._plan import Planner
from ._strategy import OFF_LOOP

if TYPE_CHECKING:
    from collections.abc import Callable, Generator

    from ._backends import Backend, Park, Signal
    from ._entries import Entry, Queue
    from ._recording import Recording
    from ._registry import Registration


class DriverFlag:
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


def _nothing() -> None:
    """A loop callback that only wakes the loop (its timers run on the same iteration)."""


class Watcher(Planner):
    """The watcher of one loop. What a waiting task calls: ``running``, ``spin_ahead``,
    ``enqueue``, ``poke``, ``drive`` and ``leave``; the rest runs inside ``drive``."""

    def __init__(self, backend: Backend) -> None:
        super().__init__(backend)
        # How the events this loop awaited first refer to it as their home (``_holds``): weakly,
        # and always through this one reference, which tells it apart by identity.
        self.weak_self = weakref.ref(self)
        self.running = False  # a task drives it: a new wait parks on a signal
        self._system_task: object = None  # the system task driving the watcher, until it stops it
        self._parked: Park | None = None  # where the driving task sleeps, while it does
        self._busy = BusyLook(backend, self._look_at_parked)  # looks while a busy loop keeps threads out
        self._kept_timer: float | None = None  # the loop timer last kept on time (when, by the loop's clock)
        self.registration: Registration | None = None  # how the asyncio registry holds it (``_registry``)

    # -- the waiting task's side (``_wait.wait``) ---------------------------------------------
    def leave(self, entry: Entry, signal: Signal) -> None:
        """A task stops waiting for ``entry`` (cancelled): the last one abandons it."""
        entry.leave(signal)
        if not entry.waiters:
            _entries.forget(entry)  # the queue drops it lazily
            _entries.let_go(entry)  # never queried again: abandoned entries are skipped unasked

    async def spin_ahead(self, target: Recording) -> bool:
        """If the target's stream's work is predicted to finish within ``SPIN_AHEAD``: yield once
        (the wait's checkpoint), then query until it is done or ``IDLE_SPIN`` past the
        prediction. Returns whether it was seen done; nothing yields after that, so the wake-up
        costs no loop iteration."""
        queue = self._idle_queues.get(target._stream_key)
        if queue is None or queue.predictor.estimate is None:
            return False
        now = time.perf_counter()
        finish = max(target._recorded_at, queue.previous_done) + queue.predictor.estimate
        if finish - now > _policy.SPIN_AHEAD:
            return False
        give_up = max(finish, now) + _policy.IDLE_SPIN
        await self.backend.yield_now()
        query, handle = target._driver.event_query, target._handle
        while not query(handle):
            if time.perf_counter() > give_up:
                return False
        return True

    def poke(self) -> None:
        """Look again now (loop thread, a task's step: a new wait)."""
        if self._parked is not None:
            _backends.set_signal(self._parked)

    async def drive(self, until: Signal | None) -> None:
        """Sweep, plan and sleep until no wait is left, or until ``until`` is set.

        ``until`` is the signal of a waiting task that drives the watcher itself: it stops
        once its own wait is over and hands what is left to the system task.
        """
        if until is not None:
            self._start()
        try:
            checkpointed = False
            look = until is None  # a waiting task saw its work pending a moment ago: plan first
            while self._queues:
                if look:
                    cut = self._sweep(time.perf_counter())
                    if (until is not None and until.done()) or not self._queues:
                        break
                    if cut:  # let the woken tasks run, then sweep the streams it did not reach
                        await self.backend.yield_now()
                        checkpointed = True
                        continue
                look = True
                now = time.perf_counter()
                wake_at, precise = self._plan(now)
                if wake_at > now:
                    await self._park(now, wake_at, precise)
                elif len(self._queues) == 1 and self._beats(queue := next(iter(self._queues.values())), now):
                    if await self._watch_only_queue(queue) and until is not None and until.done():
                        return  # its own wait is over: straight back to the task (the close watch checkpointed)
                else:
                    await self.backend.yield_now()
                checkpointed = True
            if until is not None and not checkpointed:  # a wait is always a checkpoint
                await self.backend.yield_now()
            # The system task must stop right after seeing no queue left: a wait that started
            # during a yield here would see the watcher running and be left without a driver.
        finally:
            if until is not None:
                self._hand_over()

    # -- the close watch of a lone stream -----------------------------------------------------
    @staticmethod
    def _beats(queue: Queue, now: float) -> bool:
        """Whether the queue's head is watched at every beat now: just after progress, or in its
        close watch, short of where ``auto`` spaces its queries (``_policy.auto_look``). A
        spaced query that fell due between a sweep and its plan is left to the next sweep."""
        return queue.progressed or queue.watch_from <= now <= min(queue.watch_until, queue.spaced_from)

    async def _watch_only_queue(self, queue: Queue) -> bool:
        """The close watch of a lone stream, lean: query its head at every beat, and nothing else.

        Completes the head and returns ``True`` once it is seen done (the wake-up path: a few
        steps, not a sweep); returns ``False`` as soon as anything a full sweep must handle
        happens (another stream's wait, a new head, the head abandoned or re-recorded, a failed
        query) or the watch ends.
        """
        head = queue.entries[0]
        target = head.target
        query, handle, generation = target._driver.event_query, target._handle, head.generation
        watch_from, watch_until = queue.watch_from, min(queue.watch_until, queue.spaced_from)  # (``_beats``)
        queues, entries = self._queues, queue.entries
        yield_now, clock = self.backend.yield_now, time.perf_counter
        idle_beat, idle_spin = _policy.IDLE_BEAT, _policy.IDLE_SPIN
        now = clock()
        while True:
            yielded_at = now
            await yield_now()
            if len(queues) != 1 or not entries or entries[0] is not head or not head.waiters:
                return False
            if target._generation != generation:
                return False
            now = clock()
            if not (queue.progressed or watch_from <= now <= watch_until):
                return False
            spin_until = now + idle_spin if now - yielded_at < idle_beat else now
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
        self._complete_oldest(queue, 1, None)  # first: what the waiting tasks are waiting for
        self._wake()
        start = queue.start  # learned when the stream's next wait is planned: off the wake-up path
        queue.unlearned = (max(start, queue.last_query) - start, now - start)
        queue.previous_done = now
        if entries:
            self._new_head(queue, now, after_progress=True)
        else:
            self._retire(queue)
        return True

    # -- who drives ---------------------------------------------------------------------------
    def _start(self) -> None:
        """A waiting task starts driving: from now on the loop keeps the watcher (``_registry``)."""
        self.running = True
        if self.registration is not None:
            self.registration.idle = None

    def _hand_over(self) -> None:
        """A waiting task stops driving: the system task takes over what is left (unless the loop
        is gone: its coroutine is being collected with the loop's other tasks, ``_abandon``)."""
        if self._queues:
            if self.backend.runs_here():
                task = self.backend.spawn_system_task(self._run, self._system_task_ended)
                if self.running:  # (an eager task may have found everything done, and stopped it)
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
            await self.drive(None)
        except BaseException as exc:  # cancelled with its loop, or a bug: nobody may hang
            self._fail_all(exc if isinstance(exc, Exception) else RuntimeError("the event loop is shutting down"))
            if not isinstance(exc, Exception):
                raise
        finally:
            self._stop()

    def _stop(self) -> None:
        self.running = False
        self._system_task = None
        for queue in self._queues.values():
            self._drop_backstop(queue)
        if self._listening:
            self._listening = False
            _doorbell.doorbell().ignore(self._poke_threadsafe)
        if self.registration is not None:  # nothing is pending: it refers to nothing of its loop
            self.registration.idle = self

    # -- sleeping -----------------------------------------------------------------------------
    async def _park(self, now: float, wake_at: float, precise: bool) -> None:
        if precise:
            self._keep_loop_timer(wake_at)
        else:  # on a loop timer, which fires up to a whole millisecond late
            self._keep_loop_timer(wake_at + _policy.LOOP_TIMER_SLACK, unless_only_poll=True)
        park = self._parked = self.backend.new_park()
        parked_at = self._busy.park(self._watches_on_loop)
        handle = None
        try:
            if precise:
                handle = _timer.timer().call_at(wake_at, self._poke_threadsafe)
                await park
            else:
                await self.backend.sleep_in_park(park, wake_at - now)
        finally:
            self._parked = None
            self._busy.resumed(parked_at)
            if handle is not None:
                _timer.timer().cancel(handle)

    def _watches_on_loop(self) -> bool:
        """Whether some parked wait is watched on the loop (``auto``, ``poll``)."""
        return any(queue.entries[0].mode not in OFF_LOOP for queue in self._queues.values())

    def _look_at_parked(self) -> bool:
        """From a loop callback while the driver is parked on a busy loop: wake it if the head
        of a stream watched on the loop (``auto``, ``poll``) is done, or its query fails (the
        sweep then delivers the error). Returns whether it woke the driver (or it is awake)."""
        park = self._parked
        if park is None:
            return True
        now = time.perf_counter()
        for queue in self._queues.values():
            head = queue.entries[0]
            if head.mode in OFF_LOOP or not head.waiters or queue.next_look > now:
                continue
            target = head.target
            try:
                done = target._driver.event_query(target._handle)
            except Exception:
                done = True
            if done:
                park.wake_in_callback()
                return True
        return False

    def _keep_loop_timer(self, wake_at: float, *, unless_only_poll: bool = False) -> None:
        """The loop is about to sleep, awake since a moment of the watcher's choosing (a thread's
        poke, a close watch, a sweep): if its earliest timer is due before the watcher wakes it
        at ``wake_at`` (and within ``KEEP_TIMER_HORIZON``), have the timer thread wake the loop
        just after that timer is due. ``unless_only_poll``: not while only ``poll`` waits are
        pending, since ``poll`` starts no thread. Only while waits are pending: the wake-up that
        ends the last one leaves the loop's next sleep as asyncio rounds it.

        asyncio rounds its sleeps up to whole milliseconds (``PrivateAsyncioBackend.earliest_timer``),
        so a timer due a fraction of a millisecond after the loop went to sleep fires up to
        1 ms late. Once per timer: woken at a timer's time, the loop sleeps to its next one as
        it would without aiogpu. It costs a thread wake-up per timer and keeps the application's
        own timers prompt instead of up to a millisecond late (``benchmarks/wake.py``'s ticker
        probe measures the lag, ``poll``'s rows the lag without it).
        """
        timer = self.backend.earliest_timer()
        if timer is None:
            return
        when, delay = timer
        due = time.perf_counter() + delay  # the loop's clock may not be this one
        if when == self._kept_timer or not 0 < delay <= _policy.KEEP_TIMER_HORIZON or due >= wake_at:
            return
        if unless_only_poll and all(queue.entries[0].mode == "poll" for queue in self._queues.values()):
            return
        self._kept_timer = when
        _timer.timer().call_at(due + _policy.KEEP_TIMER_MARGIN, self._wake_loop_threadsafe)

    # -- waking the loop ----------------------------------------------------------------------
    def runs_here(self) -> bool:
        """Whether the calling code runs on this watcher's loop (its thread, inside its run)."""
        return self.backend.runs_here()

    def call_soon_threadsafe(self, callback: Callable[[], object]) -> bool:
        """Run ``callback`` on the loop soon (any thread); ``False`` if the loop is gone."""
        return self.backend.waker(callback)

    def _wake_loop_threadsafe(self) -> None:
        self.backend.waker(_nothing)

    def _poke_in_callback(self) -> None:
        """Look again now, from a loop callback of its own (a thread saw a completion, a timer
        fired): on asyncio and uvloop the driving task resumes in this callback, not on the loop's
        next iteration."""
        if self._parked is not None:
            self._parked.wake_in_callback()

    def _poke_threadsafe(self) -> bool:
        """Look again soon (any thread); ``False`` if the loop is gone."""
        return self.backend.waker(self._poke_in_callback)

    # -- endings ------------------------------------------------------------------------------
    def _fail_all(self, error: BaseException) -> None:
        """Fail every pending wait with ``error`` (``_abandon`` them off the loop)."""
        if not self.backend.runs_here():
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
                _entries.forget(entry)
                _entries.let_go(entry)
            if queue.backstop is not None:
                queue.backstop.abandon()
        self._queues.clear()
        self._auto_watched.clear()
