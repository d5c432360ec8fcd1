"""The sweep: query the oldest pending wait of each stream and complete what is done, in order.

Rules this file keeps:

1. Work on one stream completes in order. Waits are queued per stream (the stream the event
   was recorded on) and only the oldest pending wait of each stream is queried, so a sweep
   costs O(streams), not O(waiters); when it completes, the next ones are checked at once,
   and after two in a row the newest (unless the stream's last burst found work pending),
   then by galloping and bisection: a wait that is done means every wait before it on the
   stream is (k done cost O(log k) queries, not one each). A stream whose last sweep
   completed something is watched closely on the next beat too (more of it tends to finish
   meanwhile), unless its new head may be seen done late.
2. A head that ``auto`` watches spaced (``_policy.auto_look``) is asked only once its look is
   due, unless a sweep completed something: from then on, and in the next sweep, every head
   is asked (work released at once completes on many streams at once), but for a head that
   may be seen done late (``_policy.late_allowed``) and is not yet predicted done: under a
   sustained load something completes at almost every sweep, and asking every head each time
   would be most of the loop's work.
3. A head that may be seen done late and that a waiter thread of its own watches (``thread``)
   is left to it until it saw it done or its back-off query is due, unless no thread took it.
4. A sweep wakes the tasks it found done oldest wait first, across its streams; one that has
   woken ``SWEEP_WAKE_BUDGET`` tasks yields before the next stream, so they run while the GPU
   finishes the rest; the next sweep starts where it stopped.
5. Completing a wait happens in one place, ``Sweep._complete_oldest``: the lone wait's close
   watch, the sweep and a failed query all complete through it.
6. Query failures (``CudaError``, for example a sticky kernel fault) are delivered to every
   waiter of that stream; nothing raised here reaches the loop.
7. How to watch a queue's new head is not decided here: ``_new_head`` and ``_drop_backstop``
   are the planner's (``_plan``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import _entries, _holds, _policy
from ._entries import Queue

if TYPE_CHECKING:
    from collections import deque

    from ._backends import Backend, Waiters
    from ._entries import Entry
    from ._recording import Recording

_NOTHING, _HOME = _holds.NOTHING, _holds.HOME


class Sweep:
    """The pending waits of one loop, queued per stream, and completing them in order."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self._queues: dict[object, Queue] = {}  # streams with pending waits
        self._idle_queues: dict[object, Queue] = {}  # streams waited on lately, oldest first
        self._woken = 0  # waiting tasks woken by the current sweep
        self._waking: list[Waiters] = []  # completed, their tasks not yet woken (``_wake``)
        # A sweep completed something: the next one asks every head, spaced ones too (work
        # released at once on many streams completes on several at once).
        self._progress = False
        # The last burst search found its stream's newest wait done: the loop is behind the GPU
        # (a released backlog), so the next stream with a backlog is asked about its newest first.
        self._behind = False

    # -- what the watcher decides -------------------------------------------------------------
    def _new_head(self, queue: Queue, now: float, *, after_progress: bool = False) -> None:
        """Plan how to watch the queue's (new) oldest entry."""
        raise NotImplementedError

    def _drop_backstop(self, queue: Queue) -> None:
        """Stop whatever watches the queue's head off the loop."""
        raise NotImplementedError

    # -- queues -------------------------------------------------------------------------------
    def pending(self) -> list[Entry]:
        """The recordings this loop's tasks are waiting for, oldest wait first."""
        waited = (entry for queue in self._queues.values() for entry in queue.entries if entry.waiters)
        return sorted(waited, key=lambda entry: entry.started)

    def follows_pending(self, target: Recording) -> bool:
        """Whether the target's stream has a wait queued here whose recording came before the
        target's and that is watched (the queue's head, still waited for as recorded): the
        target's work completes after it, and a sweep that finds it done asks about the waits
        behind it at once. A new wait for the target then needs neither a driver query of its
        own nor a sweep: the watcher's plans, which are about heads only, stay as they are.
        Under a steady load, with many tasks waiting on each busy stream, most waits start so."""
        queue = self._queues.get(target._stream_key)  # (a pending queue is never empty)
        if queue is None:
            return False
        head = queue.entries[0]
        recording = head.target  # still recorded as queued, so on the target's stream
        return (
            bool(head.waiters)
            and recording._generation == head.generation
            and recording._record_sequence < target._record_sequence
        )

    def enqueue(self, entry: Entry, now: float) -> None:
        """Queue ``entry`` in record order (waits may start in any order; streams complete in
        order). An entry whose event was recorded again since compares by its new recording:
        out of place, it is dropped from the queue unasked all the same (``_sweep_queue``)."""
        key = entry.target._stream_key
        queue = self._queues.get(key)
        if queue is None:
            queue = self._idle_queues.pop(key) if key in self._idle_queues else Queue(key)
            self._queues[key] = queue
        entries = queue.entries
        position = len(entries)
        sequence = entry.target._record_sequence
        while position and entries[position - 1].target._record_sequence > sequence:
            position -= 1
        entries.insert(position, entry)
        if position == 0:
            self._new_head(queue, now)

    def _rekey(self, entry: Entry, now: float) -> None:
        """Queue a re-recorded ``entry`` anew, for the event's new recording."""
        target = entry.target
        _entries.forget(entry)
        entry.generation = target._generation
        # Unless a wait for the new recording started its own, or the event is closed (no wait
        # joins it, and holding the entry would keep this loop alive if it were dropped).
        if _entries.joinable(target, entry.watcher) is None and not target._lifetime.closed:
            target._waiting = entry
        self.enqueue(entry, now)

    def _retire(self, queue: Queue) -> None:
        """Nothing is pending on the queue's stream: keep the queue for its next wait."""
        self._drop_backstop(queue)
        del self._queues[queue.key]
        self._idle_queues[queue.key] = queue
        if len(self._idle_queues) > _policy.KEEP_IDLE_QUEUES:
            del self._idle_queues[next(iter(self._idle_queues))]

    def _learn(self, queue: Queue, now: float) -> None:
        """Tell the predictor when the head was last seen pending and when it was seen done."""
        pending, done = max(queue.start, queue.last_query), now
        backstop = queue.backstop
        if backstop is not None and backstop.detected_at:  # a waiter thread may have seen more
            pending = max(pending, backstop.pending_at)
            if backstop.done_index == queue.backstop_index:
                done = min(done, backstop.detected_at)
        queue.predictor.observe(pending - queue.start, done - queue.start)

    # -- sweeping -----------------------------------------------------------------------------
    def _sweep(self, now: float) -> bool:
        """Sweep the queues in order until ``SWEEP_WAKE_BUDGET`` tasks are woken. Returns whether
        it stopped before some queues; those it swept then go to the back, so the next sweep
        takes it up where it stopped."""
        self._woken = 0
        queues = self._queues
        order = list(queues.values())
        swept = []
        budget = _policy.SWEEP_WAKE_BUDGET
        every_head, self._progress = self._progress, False
        for position, queue in enumerate(order, 1):
            due = queue.next_look <= now or (every_head and not (queue.late and queue.expected > now))  # (rule 2)
            if due or ((backstop := queue.backstop) is not None and (backstop.detected_at or not backstop.job.has_thread)):
                self._sweep_queue(queue, now)  # (rule 3: a head left to its waiter thread is asked once it tells)
                if queue.progressed:
                    every_head = self._progress = True
            if not queue.entries:
                self._retire(queue)
            else:
                swept.append(queue.key)
            if self._woken >= budget and position < len(order):
                for key in swept:
                    queues[key] = queues.pop(key)
                self._wake_oldest_first()
                return True
        self._wake_oldest_first()
        return False

    def _sweep_queue(self, queue: Queue, now: float) -> None:
        """Complete the queue's done entries, oldest first; plan its new head once at the end.

        A burst (two done in a row) asks about the newest entry next, then bisects: a wait found
        done means everything recorded before it on the stream is done too, so a backlog of
        thousands costs a dozen queries, not one each. While the loop is behind the GPU, a
        backlog's newest entry is asked first (``_all_done``).
        """
        entries = queue.entries
        popped = completed = False
        stale: list[Entry] = []  # re-recorded entries, queued anew once this queue is swept
        known_pending: Entry | None = None  # asked during the burst search: not asked again
        tail_asked, in_a_row = False, 0
        while entries:
            entry = entries[0]
            target = entry.target
            if not entry.waiters or target._generation != entry.generation:
                entries.popleft()  # every task waiting for it left, or re-recorded: it now waits
                if entry.waiters:  # for the new recording, and is queued anew
                    stale.append(entry)
                popped = True
                continue
            try:
                if not popped and queue.backstop is not None and self._backstop_saw_head_done(queue):
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
                    last, known_pending = self._burst(queue, stale)
                    if last:
                        in_a_row += last + 1
                        continue
            except Exception as exc:
                self._fail_queue(queue, exc)
                break
            if not done:
                queue.last_query = now
                break
            if not completed:  # only the head's bracket says when work finished
                self._learn(queue, now)
                completed = True
            popped = True
            in_a_row += 1
            self._complete_oldest(queue, 1, None)
        if completed:
            queue.previous_done = now
        queue.progressed = completed
        if popped and entries:
            self._new_head(queue, now, after_progress=completed)
        for entry in stale:
            self._rekey(entry, now)

    @staticmethod
    def _backstop_saw_head_done(queue: Queue) -> bool:
        """Whether the head's waiter thread saw it complete."""
        backstop = queue.backstop
        if backstop is None or backstop.outcome is not None:
            return False
        return bool(backstop.detected_at) and backstop.done_index == queue.backstop_index

    def _burst(self, queue: Queue, stale: list[Entry]) -> tuple[int, Entry | None]:
        """Two done in a row: find the newest entry done (``last_done``) and complete the head
        and every entry up to it. Returns its position and the entry found pending after it.
        The newest entry is asked first unless the last burst found work pending: on a stream
        that keeps work queued, that query would be wasted at every burst."""
        entries = queue.entries
        last, pending = last_done(entries, newest_first=not queue.tail_pending)
        self._behind = pending is None
        queue.tail_pending = pending is not None
        known_pending = None if pending is None else entries[pending]
        if last:
            self._complete_oldest(queue, last + 1, stale)
        return last, known_pending

    def _all_done(self, queue: Queue, now: float, stale: list[Entry]) -> bool:
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

    # -- outcomes -----------------------------------------------------------------------------
    def _complete_oldest(self, queue: Queue, count: int, stale: list[Entry] | None) -> None:
        """The ``count`` oldest entries are done (or failed): pop them and have their tasks
        woken at the next ``_wake``. Skips the abandoned ones; ``stale`` collects the ones
        re-recorded since (``None``: the caller asked about their current recording).

        The only place a wait completes. It runs once per completed recording, 10,000 times in
        a fan-out of waits on events of their own, so forgetting the entry and ``_holds.let_go``
        are written out here: a Python call per entry is a visible share of the wake-up
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
            if target._generation != entry.generation and stale is not None:
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

    def _wake(self) -> None:
        """Wake the tasks of the entries completed since the last call, in that order.

        On asyncio's own loops (where ``_backends._asyncio_private`` serves them) the tasks
        woken here resume together in one callback on the loop's next iteration (their signals
        are parks), not one scheduled callback each (``PrivateAsyncioBackend.set_signals``).
        """
        self.backend.set_signals(self._waking)

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
            self._waking.sort(key=_entries.started_order)
        self._wake()

    def _fail_queue(self, queue: Queue, error: BaseException) -> None:
        """Deliver ``error`` to every task waiting on the queue's stream."""
        for entry in queue.entries:
            entry.error = error
        self._complete_oldest(queue, len(queue.entries), None)
        self._wake()


def last_done(entries: deque[Entry], newest_first: bool = True) -> tuple[int, int | None]:
    """The position of the newest entry known done, given that the oldest is, and of the
    entry found pending right after it (``None`` if none was asked): the sweep need not
    ask that one again. Entries between the two are not waited for as recorded.

    With ``newest_first``, asks the newest entry still waited for as recorded first (a released
    backlog: one query); then gallops from the oldest and bisects: O(log k) queries for k done.
    Raises ``CudaError`` as a query does.
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
    if newest == done or (newest_first and asked(newest)):
        return len(entries) - 1, None  # what is after it no one waits for as recorded
    pending = newest if newest_first else newest + 1  # (newest + 1: past every entry asked)
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
    if pending > newest:  # every entry waited for as recorded is done
        return len(entries) - 1, None
    return done, pending
