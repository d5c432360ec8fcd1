"""The ``thread`` strategy: aiogpu's own threads park in ``cuEventSynchronize``.

Invariants:

- Only threads of this module ever block in a driver call; the loop thread never does.
- One *job* per recording of an event (event object, record generation): every task awaiting
  that recording, on any loop, subscribes to the same job, so one thread serves them all.
- A waiter thread never runs user code, never raises into a loop and never blocks a loop: it
  stores the outcome on each subscriber and schedules a wake-up (``_loop.current_waker``).
- The pool is bounded (``MAX_THREADS``); jobs beyond it queue in FIFO order. Threads exit
  after ``IDLE_SECONDS`` without work, so an idle process holds no waiter threads.
- A cancelled awaiter unsubscribes and returns at once. A job that lost all its subscribers
  before a thread took it is dropped; one already blocked in the driver runs until the GPU
  work completes (the driver wait cannot be interrupted), then frees its thread. The job keeps
  the event's handle alive until then, so a ``close()`` meanwhile is deferred, not unsafe.
- The thread blocks on a ``CU_EVENT_BLOCKING_SYNC`` event, never a spinning one: events that
  are not blocking-sync are mirrored through a per-thread helper stream and blocking event.
"""

from __future__ import annotations

import copy
import os
import threading
from collections import deque
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

import anyio

from .. import _driver
from .._errors import AiogpuError
from .._loop import current_waker

if TYPE_CHECKING:
    from collections.abc import Callable

    from .._device import Device
    from .._driver import Driver
    from . import WaitTarget

MAX_THREADS = 32
IDLE_SECONDS = 10.0


class _Subscriber:
    __slots__ = ("job", "notify", "outcome")

    def __init__(self, notify: Callable[[], None], job: _Job) -> None:
        self.notify = notify
        self.job = job
        self.outcome: BaseException | None = None


class _Job:
    __slots__ = ("key", "subscribers", "target")

    def __init__(self, key: tuple[int, int], target: WaitTarget) -> None:
        self.key = key
        self.target = target
        self.subscribers: list[_Subscriber] = []


@dataclass(frozen=True)
class PoolStatistics:
    """A snapshot of the waiter-thread pool (for tests and diagnostics)."""

    threads: int
    idle_threads: int
    queued_jobs: int
    running_jobs: int
    subscribers: int


class _Helpers:
    """Per-thread helper stream + blocking event per device, to mirror spinning events."""

    def __init__(self) -> None:
        self._by_context: dict[tuple[int, int], tuple[Driver, int, int]] = {}

    def get(self, driver: Driver, device: Device) -> tuple[int, int]:
        key = (id(driver), device._context)
        found = self._by_context.get(key)
        if found is None:
            stream = driver.stream_create(_driver.STREAM_NON_BLOCKING, 0)
            event = driver.event_create(_driver.EVENT_BLOCKING_SYNC | _driver.EVENT_DISABLE_TIMING)
            found = self._by_context[key] = (driver, stream, event)
        return found[1], found[2]

    def close(self) -> None:
        for driver, stream, event in self._by_context.values():
            for destroy, handle in ((driver.event_destroy, event), (driver.stream_destroy, stream)):
                try:
                    destroy(handle)
                except (AiogpuError, RuntimeError):
                    pass
        self._by_context.clear()


def _synchronize(target: WaitTarget, helpers: _Helpers) -> None:
    """Block this (waiter) thread until the target's captured work is complete."""
    driver, device = target._driver, target._device
    if driver.context_get_current() != device._context:
        driver.context_set_current(device._context)
    if target.is_blocking_sync:
        driver.event_synchronize(target._handle)
        return
    stream, mirror = helpers.get(driver, device)
    driver.stream_wait_event(stream, target._handle)
    driver.event_record(mirror, stream)
    driver.event_synchronize(mirror)


class _Pool:
    def __init__(self, max_threads: int, idle_seconds: float) -> None:
        self._max_threads = max_threads
        self._idle_seconds = idle_seconds
        self._lock = threading.Lock()
        self._work = threading.Condition(self._lock)
        self._quiet = threading.Condition(self._lock)  # notified when no job is left
        self._queue: deque[_Job] = deque()
        self._jobs: dict[tuple[int, int], _Job] = {}
        self._threads = 0
        self._idle = 0
        self._stop_idle = False
        self._serial = 0

    def subscribe(self, target: WaitTarget, notify: Callable[[], None]) -> _Subscriber:
        key = (id(target), target._generation)
        with self._lock:
            job = self._jobs.get(key)
            if job is None:
                target._lifetime.acquire()  # released when the job has finished
                job = self._jobs[key] = _Job(key, target)
                self._queue.append(job)
                self._dispatch()
            subscriber = _Subscriber(notify, job)
            job.subscribers.append(subscriber)
        return subscriber

    def unsubscribe(self, subscriber: _Subscriber) -> None:
        with self._lock:
            if subscriber in subscriber.job.subscribers:  # not yet delivered
                subscriber.job.subscribers.remove(subscriber)

    def _dispatch(self) -> None:  # with self._lock held
        if self._idle > len(self._queue) - 1:
            self._work.notify()
        elif self._threads < self._max_threads:
            self._threads += 1
            self._serial += 1
            name = f"aiogpu-waiter-{self._serial}"
            threading.Thread(target=self._run, name=name, daemon=True).start()

    def _next_job(self) -> _Job | None:
        """The next job with someone waiting for it, or ``None`` when this thread should exit."""
        with self._lock:
            while True:
                while self._queue:
                    job = self._queue.popleft()
                    if job.subscribers:
                        return job
                    self._drop(job)  # every awaiter was cancelled before it started
                if self._stop_idle:
                    break
                self._idle += 1
                notified = self._work.wait(self._idle_seconds)
                self._idle -= 1
                if not notified and not self._queue:
                    break
            self._threads -= 1
            self._work.notify_all()  # wake stop_idle_threads()
            return None

    def _drop(self, job: _Job) -> None:  # with self._lock held
        self._forget(job)
        job.target._lifetime.release()

    def _forget(self, job: _Job) -> None:  # with self._lock held
        del self._jobs[job.key]
        if not self._jobs:
            self._quiet.notify_all()

    def _run(self) -> None:
        helpers = _Helpers()
        try:
            while (job := self._next_job()) is not None:
                outcome: BaseException | None = None
                try:
                    _synchronize(job.target, helpers)
                except Exception as exc:  # delivered to every awaiter, never raised here
                    outcome = exc
                with self._lock:
                    self._forget(job)
                    subscribers, job.subscribers = job.subscribers, []  # late unsubscribes: no-ops
                for subscriber in subscribers:
                    subscriber.outcome = outcome
                    subscriber.notify()
                job.target._lifetime.release()
        finally:
            helpers.close()

    def statistics(self) -> PoolStatistics:
        with self._lock:
            return PoolStatistics(
                threads=self._threads,
                idle_threads=self._idle,
                queued_jobs=len(self._queue),
                running_jobs=len(self._jobs) - len(self._queue),
                subscribers=sum(len(job.subscribers) for job in self._jobs.values()),
            )

    def wait_quiet(self, timeout: float) -> bool:
        """Block until no job is queued or running (tests: abandoned jobs have finished)."""
        with self._lock:
            return self._quiet.wait_for(lambda: not self._jobs, timeout)

    def stop_idle_threads(self, timeout: float = 5.0) -> None:
        """Make idle threads exit now (tests use it to count threads); busy ones stay."""
        with self._lock:
            self._stop_idle = True
            self._work.notify_all()
            self._work.wait_for(lambda: self._idle == 0, timeout)
            self._stop_idle = False


_pool_lock = threading.Lock()
_the_pool: _Pool | None = None


def pool() -> _Pool:
    """The process's waiter pool, created on first use (``import aiogpu`` starts no thread)."""
    global _the_pool
    with _pool_lock:
        if _the_pool is None:
            _the_pool = _Pool(MAX_THREADS, IDLE_SECONDS)
        return _the_pool


def _forget_pool_in_child() -> None:
    global _the_pool
    _the_pool = None  # its threads do not exist in a forked child


os.register_at_fork(after_in_child=_forget_pool_in_child)


async def wait(target: WaitTarget) -> None:
    done = anyio.Event()
    subscriber = pool().subscribe(target, partial(current_waker(), done.set))
    try:
        await done.wait()
    except BaseException:
        pool().unsubscribe(subscriber)
        raise
    if subscriber.outcome is not None:
        raise copy.copy(subscriber.outcome)
