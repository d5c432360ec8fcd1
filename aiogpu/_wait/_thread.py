"""The waiter-thread pool: aiogpu's own threads wait for GPU work so that loops never block.

Invariants:

- Only threads of this module wait for GPU work on a loop's behalf. Of aiogpu's other threads
  (all started through ``_daemon``), the timer and the doorbell never call the driver; the
  armer and the pinned-memory freer call it off every loop, for calls that may block
  (creating a stream, freeing pinned memory), but only query completions.
- One *job* per recording of an event (event object, record generation): every subscriber to
  that recording, from any loop, shares it. A *watch* (``watch_any``) of several events is a
  job of its own for one subscriber: a thread queries them in turn and ends at the first one
  done (a loop's unpredicted ``auto`` waits, one per stream: one thread to wake when work is
  released on many streams at once, not one per stream fighting the loop for the GIL); a
  watch of one event is that recording's job.
- A job may first sleep until ``spin_from``, poke its loops once if it slept (``_rouse``) and
  watch the event closely for a while (the predicted completion is near): query after query,
  or, for a wait that may be seen done late (work queued on a busy stream), a query each
  ``spacing`` and no poke before the one that counts. Otherwise, or if that watch runs out,
  it blocks in ``cuEventSynchronize`` if the event is
  ``CU_EVENT_BLOCKING_SYNC``, and else queries it with pauses growing from ``POLL_FIRST`` to
  ``POLL_MAX`` in between (about 1,000 queries a second at most), so it never spins in the
  driver.
- A job enqueues nothing on the GPU. A helper stream that waits for the event and then records
  a blocking-sync event would do the same with no polling, but pending helpers hold up other
  work: two of them can stall the work that other code later puts on the legacy default stream
  and on blocking streams, and a few more every stream, until the awaited work finishes.
- A thread never runs user code, never raises into a loop and never blocks a loop: it records
  when and how it saw the completion on each subscriber and calls its ``notify`` (which only
  schedules a wake-up on a loop).
- Bounded: at most ``MAX_THREADS`` threads serve jobs that someone still waits for. A polled
  job whose subscribers all left (cancelled waits) ends at its next poll. One blocked in
  ``cuEventSynchronize`` (a blocking-sync event) keeps its thread until the GPU work completes
  — that wait cannot be interrupted — but does not count against the bound, so abandoned waits
  cannot starve new ones; ``HARD_MAX_THREADS`` caps the total. Jobs beyond the
  bound queue in FIFO order (the wake engine polls their events meanwhile). A job keeps its
  event's handle alive until it ends, so a ``close()`` meanwhile is deferred, not unsafe.
- Threads exit after ``IDLE_SECONDS`` without work: an idle process holds no waiter threads
  (``_daemon`` starts, names and retires them).
"""

from __future__ import annotations

import functools
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .._daemon import IDLE_SECONDS, Daemon
from .._per_process import PerProcess

if TYPE_CHECKING:
    from collections.abc import Callable

    from .._daemon import Next
    from ._recording import Recording

MAX_THREADS = 32
HARD_MAX_THREADS = 256
SPIN_SECONDS = 1e-3  # how long a thread watches closely around a predicted completion
POLL_FIRST = 50e-6  # a thread's first pause between queries of an event that is not blocking-sync
POLL_MAX = 1e-3  # each pause doubles, up to this
#: Before a predicted completion: a query after 1 ms, then pauses doubling up to 10 ms.
EARLY_POLL_FIRST, EARLY_POLL_MAX = 1e-3, 10e-3


class Subscriber:
    """One party interested in a job; ``notify`` is called (from the job's thread) when it ends."""

    __slots__ = ("detected_at", "done_index", "job", "notify", "outcome", "pending_at")

    def __init__(self, notify: Callable[[], object], job: _Job) -> None:
        self.notify = notify
        self.job = job
        self.outcome: BaseException | None = None
        self.pending_at = 0.0  # time.perf_counter() when the thread last saw the work pending
        self.detected_at = 0.0  # time.perf_counter() when the thread saw the completion
        self.done_index = -1  # which of the job's events it saw done (a watch's position)

    def abandon(self) -> None:
        """Leave the job without the pool's lock (``unsubscribe`` takes it): for a finalizer, which
        may run on a thread that holds it. The job's thread ends it at its next query, or the
        pool drops it unstarted."""
        self.job.subscribers.pop(self, None)  # atomic


class _Job:
    __slots__ = ("has_thread", "key", "running", "spacing", "spin_from", "subscribers", "targets")

    def __init__(self, key: tuple[object, int], targets: tuple[Recording, ...], spin_from: float | None) -> None:
        self.key = key
        self.targets = targets  # a recording's job has one; a watch, one per stream
        self.spin_from = spin_from
        # The pause between the close watch's queries (0: none, it spins): the least of what its
        # subscribers asked for, each the lateness its wait is allowed.
        self.spacing = 0.0
        self.running = False
        # A thread serves it, or one was woken or started for it as it was queued: not one
        # waiting behind a saturated pool (the loop asks about its event meanwhile).
        self.has_thread = False
        self.subscribers: dict[Subscriber, None] = {}  # insertion-ordered set: O(1) removal


@dataclass(frozen=True)
class PoolStatistics:
    """A snapshot of the waiter-thread pool (for tests and diagnostics)."""

    threads: int
    idle_threads: int
    queued_jobs: int
    running_jobs: int
    abandoned_jobs: int
    subscribers: int


def _release_targets(job: _Job) -> None:
    for target in job.targets:
        target._lifetime.release()


def _release_dropped(dropped: list[_Job]) -> None:
    while dropped:  # no loop variable: the thread may idle next
        _release_targets(dropped.pop())


def _notify(subscribers: list[Subscriber]) -> None:
    for subscriber in subscribers:
        try:
            subscriber.notify()
        except Exception:  # notify only schedules; never let it kill the thread
            pass


class _Pool:
    def __init__(self, max_threads: int, hard_max_threads: int, idle_seconds: float) -> None:
        self._max_threads = max_threads
        self._hard_max_threads = hard_max_threads
        self._daemon = Daemon("aiogpu-waiter", self._take, idle_seconds=idle_seconds, precise=True, numbered=True)
        self._lock = self._daemon.lock
        self._quiet = threading.Condition(self._lock)  # notified: no job left
        self._queue: deque[_Job] = deque()
        self._jobs: dict[tuple[object, int], _Job] = {}
        self._watches = 0

    def subscribe(
        self, target: Recording, notify: Callable[[], object], spin_from: float | None = None, spacing: float = 0.0
    ) -> Subscriber:
        """Have a thread wait for ``target``'s current recording and call ``notify`` once it is
        done. ``spin_from``: its predicted completion is near from then on; ``spacing``: how
        late the subscriber may see it done, so that the close watch queries that far apart
        rather than spinning."""
        key = (id(target), target._generation)
        with self._lock:
            job = self._jobs.get(key)
            if job is None:
                job = self._queue_job(key, (target,), spin_from)
                job.spacing = spacing
            else:
                job.spacing = min(job.spacing, spacing)
            subscriber = Subscriber(notify, job)
            job.subscribers[subscriber] = None
        return subscriber

    def watch_any(self, targets: tuple[Recording, ...], notify: Callable[[], object]) -> Subscriber:
        """One thread queries ``targets`` in turn, with growing pauses, and ends at the first one
        done (``done_index``), or at its next round once unsubscribed; shared with nobody.

        A watch of one event is that recording's job (``subscribe``): it may block in the
        driver on a blocking-sync event, and a loop that drops its watch and starts another
        of the same event joins it again rather than tying up one blocked thread more. A watch
        of several only polls (a thread blocked in the driver could not let go)."""
        if len(targets) == 1:
            return self.subscribe(targets[0], notify)
        with self._lock:
            self._watches += 1
            job = self._queue_job(("watch", self._watches), targets, None)
            subscriber = Subscriber(notify, job)
            job.subscribers[subscriber] = None
        return subscriber

    def _queue_job(self, key: tuple[object, int], targets: tuple[Recording, ...], spin_from: float | None) -> _Job:
        retained: list[Recording] = []
        try:
            for target in targets:  # the subscribing waits hold them; released when the job ends
                target._lifetime.retain()
                retained.append(target)
        except BaseException:
            for target in retained:
                target._lifetime.release()
            raise
        job = self._jobs[key] = _Job(key, targets, spin_from)
        self._queue.append(job)
        job.has_thread = self._dispatch()
        return job

    def unsubscribe(self, subscriber: Subscriber) -> None:
        with self._lock:
            job = subscriber.job
            job.subscribers.pop(subscriber, None)
            if job.running and not job.subscribers and self._queue:
                self._dispatch()  # an abandoned job no longer counts: maybe start a queued one

    def _serving(self) -> int:  # with self._lock held: threads on jobs someone waits for
        return sum(1 for job in self._jobs.values() if job.running and job.subscribers)

    def _dispatch(self) -> bool:  # with self._lock held: whether a thread will take the queue's newest job
        daemon = self._daemon
        if daemon.waiting >= len(self._queue):
            daemon.notify()
        elif daemon.threads < self._hard_max_threads and self._serving() < self._max_threads:
            daemon.start()
        else:
            return False
        return True

    def _take(self) -> Next:  # with self._lock held: the next job someone waits for
        dropped: list[_Job] = []
        while self._queue:
            job = self._queue.popleft()
            if job.subscribers:
                job.running = job.has_thread = True
                return functools.partial(self._serve, job, dropped)
            self._forget(job)  # every subscriber left before it started
            dropped.append(job)
        if dropped:  # let go of their events before idling (a closed one is destroyed then)
            return functools.partial(_release_dropped, dropped)
        return None

    def _forget(self, job: _Job) -> None:  # with self._lock held
        del self._jobs[job.key]
        if not self._jobs:
            self._quiet.notify_all()

    def _serve(self, job: _Job, dropped: list[_Job]) -> None:
        _release_dropped(dropped)  # outside the lock: the release may destroy the event
        outcome: BaseException | None = None
        seen: tuple[float, int] | None = (0.0, -1)
        try:
            seen = self._wait_for(job) if len(job.targets) == 1 else self._wait_for_any(job)
        except Exception as exc:  # delivered to every subscriber, never raised here
            outcome = exc
        if seen is None:  # every subscriber left: the job is forgotten already
            _release_targets(job)
            return
        pending_at, done_index = seen
        detected_at = time.perf_counter()
        with self._lock:
            self._forget(job)
            subscribers = list(job.subscribers)
            job.subscribers.clear()  # late unsubscribes become no-ops
        try:
            for subscriber in subscribers:
                subscriber.outcome = outcome
                subscriber.detected_at = detected_at
                subscriber.pending_at = pending_at
                subscriber.done_index = done_index
            _notify(subscribers)
        finally:
            _release_targets(job)

    def _wait_for(self, job: _Job) -> tuple[float, int] | None:
        """Block this (waiter) thread until the job's work is complete, or until nobody waits
        for it any more (then ``None``; noticed between polls only).

        Returns when the work was last seen pending (``time.perf_counter()``; 0.0 if never),
        and 0: the position of the event seen done.
        """
        (target,) = job.targets
        driver, device = target._driver, target._device
        query, handle = driver.event_query, target._handle
        pending_at = 0.0
        if job.spin_from is not None:
            # Until the predicted completion, a query on a growing pause: the prediction can be
            # far too long (a long piece of work on the stream, then short ones), and a job
            # nobody waits for any more frees its thread at its next query.
            pause, slept = EARLY_POLL_FIRST, False
            while (delay := job.spin_from - time.perf_counter()) > 0:
                time.sleep(min(delay, pause))
                slept = True
                if query(handle):
                    return pending_at, 0
                pending_at = time.perf_counter()
                if self._let_go(job):
                    return None
                pause = min(2 * pause, EARLY_POLL_MAX)
            if slept and not job.spacing:  # (a loop that may see it done late needs no rousing)
                self._rouse(job)
            give_up = time.perf_counter() + SPIN_SECONDS
            while (now := time.perf_counter()) < give_up:
                if query(handle):
                    return pending_at, 0
                pending_at = now
                if job.spacing:
                    if self._let_go(job):
                        return None
                    time.sleep(job.spacing)
        if target.is_blocking_sync:
            if driver.context_get_current() != device._context:
                driver.context_set_current(device._context)
            driver.event_synchronize(handle)
            return pending_at, 0
        pause = max(POLL_FIRST, job.spacing)
        while not query(handle):
            pending_at = time.perf_counter()
            if self._let_go(job):
                return None
            time.sleep(pause)
            pause = min(2 * pause, POLL_MAX)
        return pending_at, 0

    def _wait_for_any(self, job: _Job) -> tuple[float, int] | None:
        """``_wait_for`` for a watch: a round of queries, one per event, then a pause growing as
        ``_wait_for``'s, until one is seen done. When each was last seen pending: no later than
        the start of the round before."""
        queries = [(target._driver.event_query, target._handle) for target in job.targets]
        pending_at = 0.0
        pause = POLL_FIRST
        while True:
            round_at = time.perf_counter()
            for index, (query, handle) in enumerate(queries):
                if query(handle):
                    return pending_at, index
            pending_at = round_at
            if self._let_go(job):
                return None
            time.sleep(pause)
            pause = min(2 * pause, POLL_MAX)

    def _let_go(self, job: _Job) -> bool:
        """End a polled job that nobody waits for any more (under the lock, so nobody joins it
        meanwhile): its thread is free at once instead of polling until the work completes."""
        if job.subscribers:  # the common case, without the lock
            return False
        with self._lock:
            if job.subscribers:
                return False
            self._forget(job)
        return True

    def _rouse(self, job: _Job) -> None:
        """Wake the job's loops as the close watch starts, before the completion: each looks,
        finds the work pending and sleeps again, briefly, so the wake-up that counts comes
        quicker. A loop thread asleep for long wakes slowly, more slowly the longer it slept;
        one just woken and asleep again briefly wakes fast. It costs a few per cent more CPU
        per wait for a lower median wake-up (``benchmarks/wake.py`` measures both)."""
        with self._lock:
            subscribers = list(job.subscribers)
        _notify(subscribers)

    def statistics(self) -> PoolStatistics:
        with self._lock:
            running = [job for job in self._jobs.values() if job.running]
            return PoolStatistics(
                threads=self._daemon.threads,
                idle_threads=self._daemon.waiting,
                queued_jobs=len(self._queue),
                running_jobs=len(running),
                abandoned_jobs=sum(1 for job in running if not job.subscribers),
                subscribers=sum(len(job.subscribers) for job in self._jobs.values()),
            )

    def wait_quiet(self, timeout: float) -> bool:
        """Block until no job is queued or running (tests: abandoned jobs have finished)."""
        with self._lock:
            return self._quiet.wait_for(lambda: not self._jobs, timeout)

    def stop_idle_threads(self, timeout: float = 5.0) -> None:
        """Make idle threads exit now (tests use it to count threads); busy ones stay."""
        self._daemon.stop_idle(lambda: self._daemon.threads == sum(job.running for job in self._jobs.values()), timeout)


#: The process's waiter pool, created on first use (``import aiogpu`` starts no thread).
pool = PerProcess(lambda: _Pool(MAX_THREADS, HARD_MAX_THREADS, IDLE_SECONDS)).get
