"""Choosing a wait strategy: per call and process-wide, with clear errors for bad names."""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import math
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from functools import partial
from types import SimpleNamespace
from typing import Any

import anyio
import anyio.lowlevel
import pytest

import aiogpu
from aiogpu.testing import Latch, SimulatedDriver, SimulatedWork, launch_spin
from tests.helpers import in_waiter_thread, waiter_thread_queries


def test_default_strategy_round_trip() -> None:
    previous = aiogpu.get_default_wait_strategy()
    assert previous == "auto"
    try:
        aiogpu.set_default_wait_strategy("poll")
        assert aiogpu.get_default_wait_strategy() == "poll"
    finally:
        aiogpu.set_default_wait_strategy(previous)


def test_bad_strategy_names() -> None:
    with pytest.raises(
        ValueError, match="unknown wait strategy 'spin'; expected one of \\(.auto., .poll., .thread., .callback.\\)"
    ):
        aiogpu.set_default_wait_strategy("spin")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="wait strategy must be a str"):
        aiogpu.set_default_wait_strategy(None)  # type: ignore[arg-type]


@pytest.mark.anyio
async def test_bad_strategy_in_a_wait_raises_before_waiting(sim: SimulatedDriver) -> None:
    with aiogpu.Stream(sim.device(0)) as stream:
        sim.launch(stream)  # held forever: a wait that started would hang
        event = stream.record()
        with anyio.fail_after(5), pytest.raises(ValueError, match="unknown wait strategy"):
            await event.wait(strategy="busy")  # type: ignore[arg-type]


@pytest.mark.anyio
async def test_thread_strategy_polls_a_spinning_event_with_growing_pauses(
    sim: SimulatedDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Nothing is enqueued on the GPU for it (a helper stream parked on the event stalled other
    # streams' later work on an H100), and the thread never spins in the driver.
    from aiogpu._wait import _thread

    enqueued: list[int] = []
    monkeypatch.setattr(sim, "stream_wait_event", lambda stream, event: enqueued.append(event))
    pauses: list[float] = []  # what the waiter thread asked to sleep (it does sleep that long)

    def noted_sleep(seconds: float) -> None:
        pauses.append(seconds)
        time.sleep(seconds)

    monkeypatch.setattr(_thread, "time", SimpleNamespace(perf_counter=time.perf_counter, sleep=noted_sleep))
    _, reached = waiter_thread_queries(sim, monkeypatch, enough=9)
    with aiogpu.Stream(sim.device(0)) as stream:
        streams_before = sim.statistics().live_streams
        work = sim.launch(stream)
        event = stream.record()  # not blocking-sync
        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                tg.start_soon(partial(event.wait, strategy="thread"))
                assert await anyio.to_thread.run_sync(reached.wait, 10.0)
                assert sim.statistics().live_streams == streams_before
                work.release()
    statistics = sim.statistics()
    assert statistics.spin_synchronizations == statistics.blocking_synchronizations == 0
    assert enqueued == []
    expected = [min(_thread.POLL_FIRST * 2**number, _thread.POLL_MAX) for number in range(8)]
    assert pauses[:8] == pytest.approx(expected), pauses  # 50 µs doubling, up to 1 ms


@pytest.mark.anyio
async def test_a_cancelled_thread_wait_frees_its_polling_thread_before_the_work_completes(
    sim: SimulatedDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    from aiogpu._wait import _thread

    _, polled = waiter_thread_queries(sim, monkeypatch)
    with aiogpu.Stream(sim.device(0)) as stream:
        work = sim.launch(stream)
        event = stream.record()  # not blocking-sync: polled
        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                tg.start_soon(partial(event.wait, strategy="thread"))
                assert await anyio.to_thread.run_sync(polled.wait, 10.0)
                tg.cancel_scope.cancel()
            assert await anyio.to_thread.run_sync(_thread.pool().wait_quiet, 10.0)  # no job left
            assert not event.is_done
            statistics = _thread.pool().statistics()
            assert statistics.running_jobs == statistics.abandoned_jobs == 0
            async with anyio.create_task_group() as tg:  # the same recording can be awaited again
                tg.start_soon(partial(event.wait, strategy="thread"))
                await anyio.wait_all_tasks_blocked()
                work.release()
        assert event.is_done


@pytest.mark.anyio
async def test_thread_strategy_blocks_in_the_driver_on_a_blocking_sync_event(
    sim: SimulatedDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    times, _ = waiter_thread_queries(sim, monkeypatch, enough=1)
    with aiogpu.Stream(sim.device(0)) as stream:
        work = sim.launch(stream)
        event = stream.record(blocking_sync=True)
        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                tg.start_soon(partial(event.wait, strategy="thread"))
                assert await anyio.to_thread.run_sync(sim.wait_until_blocked)
                work.release()
    statistics = sim.statistics()
    assert statistics.spin_synchronizations == 0
    assert statistics.blocking_synchronizations == 1
    assert times == []  # no polling beside it


@contextlib.contextmanager
def _held_work(
    sim: SimulatedDriver, count: int, *, blocking_sync: bool = False
) -> Iterator[tuple[list[SimulatedWork], list[aiogpu.Event]]]:
    """Held work on ``count`` new streams and an event recorded behind each; all released after."""
    streams = [aiogpu.Stream(sim.device(0)) for _ in range(count)]
    works = [sim.launch(stream) for stream in streams]
    try:
        yield works, [stream.record(blocking_sync=blocking_sync) for stream in streams]
    finally:
        for work in works:
            work.release()
        for stream in streams:
            stream.close()


def test_a_watch_ends_at_the_first_of_its_events_done_and_says_which(
    sim: SimulatedDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    from aiogpu._wait import _thread

    pool = _thread.pool()
    _, polled = waiter_thread_queries(sim, monkeypatch, enough=6)  # each event asked twice
    notified = threading.Event()
    with _held_work(sim, 3) as (works, events):
        watch = pool.watch_any(tuple(events), notified.set)
        assert polled.wait(10)
        assert not notified.is_set()
        live = sim.statistics().live_events
        events[0].close()  # the watch holds its handle until it ends
        assert sim.statistics().live_events == live
        works[1].release()
        assert notified.wait(10)
        assert (watch.done_index, watch.outcome) == (1, None)
        assert 0 < watch.pending_at <= watch.detected_at
        assert pool.wait_quiet(10)
        assert sim.statistics().live_events == live - 1  # ended: the closed event is gone
        assert not events[2].is_done


def test_a_watch_nobody_waits_for_ends_before_its_work_does(sim: SimulatedDriver, monkeypatch: pytest.MonkeyPatch) -> None:
    from aiogpu._wait import _thread

    pool = _thread.pool()
    _, polled = waiter_thread_queries(sim, monkeypatch, enough=2)
    notified = threading.Event()
    with _held_work(sim, 2) as (_, events):
        watch = pool.watch_any(tuple(events), notified.set)
        assert polled.wait(10)
        pool.unsubscribe(watch)
        assert pool.wait_quiet(10)  # its thread let go while the work is still held
        assert not notified.is_set()
        assert not any(event.is_done for event in events)


def test_a_watch_of_several_polls_blocking_sync_events_and_can_let_them_go(
    sim: SimulatedDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A loop drops its watch and starts another as its streams come and go: a thread blocked in
    # the driver could not let go, and each new watch would block one thread more.
    from aiogpu._wait import _thread

    pool = _thread.pool()
    _, polled = waiter_thread_queries(sim, monkeypatch, enough=4)
    with _held_work(sim, 2, blocking_sync=True) as (_, events):
        watch = pool.watch_any(tuple(events), lambda: None)
        assert polled.wait(10)
        pool.unsubscribe(watch)
        assert pool.wait_quiet(10)  # let go while the work is still held
        assert sim.statistics().blocking_synchronizations == 0


def _note_watches(monkeypatch: pytest.MonkeyPatch) -> list[list[int]]:
    """The events of each watch started from now on (their handles, sorted)."""
    from aiogpu._wait import _thread

    pool = _thread.pool()
    watched: list[list[int]] = []
    watch_any = pool.watch_any

    def noted(targets: tuple[aiogpu.Event, ...], notify: Callable[[], None]) -> _thread.Subscriber:
        watched.append(sorted(target.handle for target in targets))
        return watch_any(targets, notify)

    monkeypatch.setattr(pool, "watch_any", noted)
    return watched


@pytest.mark.anyio
async def test_auto_parks_unpredicted_waits_on_many_streams_on_one_waiter_thread(
    sim: SimulatedDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Work released on many streams at once completes on several at once: a waiter thread per
    # stream, each seeing its own completion, would fight the waking loop for the GIL.
    from aiogpu._wait import _policy, _thread

    pool = _thread.pool()
    watched = _note_watches(monkeypatch)
    monkeypatch.setitem(_policy.COLD_POLL, "auto", (3600.0, 3600.0))  # only the watch wakes the loop
    with _held_work(sim, 5) as (works, events):
        woken = [anyio.Event() for _ in events]

        async def waiter(index: int) -> None:
            await events[index].wait(strategy="auto")
            woken[index].set()

        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                for index in range(len(events)):
                    tg.start_soon(waiter, index)
                pending = list(range(len(events)))
                for released in (3, 0, 4, 1, 2):
                    await anyio.wait_all_tasks_blocked()
                    assert pool.statistics().subscribers == 1  # one watch, no thread of its own for any
                    assert watched[-1] == sorted(events[index].handle for index in pending)
                    works[released].release()
                    pending.remove(released)
                    await woken[released].wait()
                    assert [index for index, event in enumerate(woken) if not event.is_set()] == pending
        assert pool.wait_quiet(10)


@pytest.mark.anyio
@pytest.mark.slow
async def test_a_held_blocking_sync_wait_keeps_one_waiter_thread_while_other_waits_come_and_go(
    sim: SimulatedDriver,
) -> None:
    # ``Stream.wait_idle`` awaits a blocking-sync marker with ``auto``; each wait on another
    # stream makes the loop drop its watch and start another, and a new thread blocked in the
    # driver each time would keep it until the held work finished: one more thread per wait.
    from aiogpu._wait import _thread

    with _held_work(sim, 1, blocking_sync=True) as (works, events), aiogpu.Stream(sim.device(0)) as other:
        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                tg.start_soon(partial(events[0].wait, strategy="auto"))
                await anyio.wait_all_tasks_blocked()
                for _ in range(10):
                    work = sim.launch(other)
                    event = other.record()
                    async with anyio.create_task_group() as waits:
                        waits.start_soon(partial(event.wait, strategy="auto"))
                        await anyio.wait_all_tasks_blocked()
                        work.release()
                    await anyio.wait_all_tasks_blocked()
                # Watched alone, the held wait blocks in the driver; watched again, it joins that.
                assert sim.statistics().blocking_synchronizations == 1
                works[0].release()
        assert _thread.pool().wait_quiet(10)


@pytest.mark.anyio
async def test_auto_watches_the_streams_waited_on_first_up_to_its_cap(
    sim: SimulatedDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    from aiogpu._wait import _policy

    monkeypatch.setattr(_policy, "AUTO_WATCH_MAX", 2)
    watched = _note_watches(monkeypatch)
    with _held_work(sim, 4) as (works, events):
        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                for event in events:
                    tg.start_soon(partial(event.wait, strategy="auto"))
                    await anyio.wait_all_tasks_blocked()
                assert watched[-1] == sorted(event.handle for event in events[:2])
                for work in works:  # the others are still seen, on the back-off schedule
                    work.release()


@pytest.mark.anyio
async def test_callback_wait_is_woken_by_the_host_function(sim: SimulatedDriver, monkeypatch: pytest.MonkeyPatch) -> None:
    """With the watchdog's polls an hour apart, only the host function can wake the wait."""
    from aiogpu._wait import _policy

    monkeypatch.setitem(_policy.COLD_POLL, "callback", (3600.0, 3600.0))
    with aiogpu.Stream(sim.device(0)) as stream:
        work = sim.launch(stream)
        event = stream.record()
        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                tg.start_soon(partial(event.wait, strategy="callback"))
                await anyio.wait_all_tasks_blocked()
                work.release()  # the simulated host function rings the doorbell


@pytest.mark.anyio
async def test_callback_watchdog_reports_a_fault(sim: SimulatedDriver) -> None:
    """Host functions never run after a context error: the watchdog's query must report it."""
    errors: list[aiogpu.CudaError] = []

    async def waiter(event: aiogpu.Event) -> None:
        try:
            await event.wait(strategy="callback")
        except aiogpu.CudaError as exc:
            errors.append(exc)

    with aiogpu.Stream(sim.device(0)) as stream:
        work = sim.launch(stream)
        event = stream.record()
        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                tg.start_soon(waiter, event)
                await anyio.wait_all_tasks_blocked()
                work.fail("CUDA_ERROR_ILLEGAL_ADDRESS")
    assert [error.name for error in errors] == ["CUDA_ERROR_ILLEGAL_ADDRESS"]


@pytest.mark.anyio
async def test_a_long_predicted_wait_has_the_timer_wake_the_loop_at_the_close_watch(
    sim: SimulatedDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    from aiogpu._wait import _registry, _timer

    asked: list[float] = []  # when the timer thread was asked to poke the watcher
    call_at = _timer.Timer.call_at

    def noted(self: _timer.Timer, when: float, callback: Any) -> int:
        if callback == watcher._poke_threadsafe:  # not a kept loop timer's wake-up
            asked.append(when)
        return call_at(self, when, callback)

    with aiogpu.Stream(sim.device(0)) as stream:
        watcher = _registry.current()
        with anyio.fail_after(10):
            for _ in range(4):  # the stream's work is predicted from here on
                sim.launch(stream, seconds=0.04)
                await stream.record().wait(strategy="auto")
            monkeypatch.setattr(_timer.Timer, "call_at", noted)
            sim.launch(stream, seconds=0.04)
            event = stream.record()
            async with anyio.create_task_group() as tg:
                tg.start_soon(partial(event.wait, strategy="auto"))
                await anyio.wait_all_tasks_blocked()
                watch_from = next(iter(watcher._queues.values())).watch_from
            assert event.is_done
    # The looks before the watch, at halves of the time left (``_policy.auto_look``), come on the
    # loop's own timers but where a late one could delay the watch (once at most: a look within
    # the slack of it is the watch's start); the timer thread wakes the loop for the watch.
    early = [when for when in asked if when <= watch_from]
    assert early[-1] == watch_from
    assert len(early) <= 2


def _asked_from_now_on(sim: SimulatedDriver, monkeypatch: pytest.MonkeyPatch) -> set[int]:
    """The events the simulated driver is asked about from now on (filled in as it is asked)."""
    queried: set[int] = set()
    query = sim.event_query

    def counted(event: int) -> bool:
        queried.add(event)
        return query(event)

    monkeypatch.setattr(sim, "event_query", counted)
    return queried


@pytest.mark.anyio
@pytest.mark.parametrize("strategy", ["auto", "poll", "thread", "callback"])
async def test_a_released_backlog_costs_a_few_queries_and_wakes_only_what_is_done(
    sim: SimulatedDriver, monkeypatch: pytest.MonkeyPatch, strategy: aiogpu.WaitStrategy
) -> None:
    # 300 waits on one stream, the first half behind one held kernel, the rest behind another:
    # releasing the first wakes exactly the first half; releasing the second wakes the rest,
    # and once two in a row are seen done the newest is asked, so the backlog is not queried
    # one by one. (Counted: the events asked about. A close watch asks about its head again
    # and again for as long as it lasts, which depends on the machine's speed.)
    with aiogpu.Stream(sim.device(0)) as stream:
        first_work = sim.launch(stream)
        events = [stream.record() for _ in range(150)]
        second_work = sim.launch(stream)
        events += [stream.record() for _ in range(150)]
        woke: set[int] = set()
        first_half = anyio.Event()

        async def waiter(index: int) -> None:
            await events[index].wait(strategy=strategy)
            woke.add(index)
            if len(woke) == 150:
                first_half.set()

        with anyio.fail_after(20):
            async with anyio.create_task_group() as tg:
                for index in range(len(events)):
                    tg.start_soon(waiter, index)
                await anyio.wait_all_tasks_blocked()
                queried = _asked_from_now_on(sim, monkeypatch)
                first_work.release()
                await first_half.wait()
                assert woke == set(range(150))
                assert not events[150].is_done
                second_work.release()
        assert woke == set(range(300))
        assert len(queried) < 30, f"{len(queried)} events asked about for 300 waits released in two bursts"


@pytest.mark.anyio
@pytest.mark.parametrize("strategy", ["auto", "poll"])
async def test_once_a_backlog_is_found_done_the_next_streams_are_asked_their_newest_first(
    sim: SimulatedDriver, monkeypatch: pytest.MonkeyPatch, strategy: aiogpu.WaitStrategy
) -> None:
    # Eight streams with five waits each, released at once: the first stream swept is asked its
    # head, the next wait and its newest; its newest was done, so the loop is behind the GPU
    # and every other stream is asked its newest alone (one query, not three). Counted: the
    # waits between head and newest asked about (a close watch may ask a head again and again).
    streams = [aiogpu.Stream(sim.device(0)) for _ in range(8)]
    try:
        works = [sim.launch(stream) for stream in streams]
        events = [[stream.record() for _ in range(5)] for stream in streams]
        woke: list[aiogpu.Event] = []

        async def waiter(event: aiogpu.Event) -> None:
            await event.wait(strategy=strategy)
            woke.append(event)

        with anyio.fail_after(20):
            async with anyio.create_task_group() as tg:
                for row in events:
                    for event in row:
                        tg.start_soon(waiter, event)
                await anyio.wait_all_tasks_blocked()
                queried = _asked_from_now_on(sim, monkeypatch)
                for work in works:
                    work.release()
        assert len(woke) == 40
        middles_asked = [sum(event._handle in queried for event in row[1:-1]) for row in events]
        assert sum(1 for asked in middles_asked if asked) <= 1, middles_asked
        assert all(row[-1]._handle in queried for row in events)
    finally:
        for stream in streams:
            stream.close()


@pytest.mark.anyio
@pytest.mark.parametrize("strategy", ["auto", "poll", "thread"])
async def test_a_sweep_that_woke_its_budget_of_tasks_lets_them_run_before_it_goes_on(
    device: aiogpu.Device, monkeypatch: pytest.MonkeyPatch, strategy: aiogpu.WaitStrategy
) -> None:
    # Three streams' waits, two tasks each, all seen done by one sweep: with a budget of two
    # wake-ups, the first task resumes while the other streams' waits are still pending
    # (a released fan-out's first tasks resumed only after its whole, GPU-long sweep before).
    from aiogpu._wait import _policy, _registry

    monkeypatch.setattr(_policy, "SWEEP_WAKE_BUDGET", 2)
    streams = [aiogpu.Stream(device, nonblocking=True) for _ in range(3)]
    try:
        with Latch(device) as latch:
            for stream in streams:
                latch.block(stream)
            events = [stream.record() for stream in streams]
            pending_at_resume: list[int] = []

            async def waiter(event: aiogpu.Event) -> None:
                await event.wait(strategy=strategy)
                pending_at_resume.append(len(_registry.current().pending()))

            with anyio.fail_after(20):
                async with anyio.create_task_group() as tg:
                    for event in events * 2:
                        tg.start_soon(waiter, event)
                    await anyio.wait_all_tasks_blocked()
                    latch.release()
                    while not all(event.is_done for event in events):
                        pass  # no yield: the watcher's next sweep finds all three done
        assert len(pending_at_resume) == 6
        assert pending_at_resume[0] == 2, pending_at_resume  # the first stream's alone was completed
    finally:
        for stream in streams:
            stream.close()


@pytest.mark.asyncio
@pytest.mark.parametrize("strategy", ["auto", "poll", "thread"])
@pytest.mark.slow
async def test_a_sweep_wakes_the_tasks_it_found_done_oldest_wait_first(
    sim: SimulatedDriver, strategy: aiogpu.WaitStrategy
) -> None:
    # Waits started round robin over two streams (A0 B0 A1 B1 A2 B2), all found done by one
    # sweep: their tasks resume in the order the waits started, not stream by stream (A0 A1 A2
    # B0 B1 B2), as tasks lie in memory. (asyncio and uvloop only: trio runs each batch of
    # woken tasks forward or backward at random.)
    streams = [aiogpu.Stream(sim.device(0), nonblocking=True) for _ in range(2)]
    try:
        works = [sim.launch(stream) for stream in streams]
        recorded = [[stream.record() for _ in range(3)] for stream in streams]
        events = [recorded[index % 2][index // 2] for index in range(6)]
        resumed: list[int] = []

        async def waiter(index: int) -> None:
            await events[index].wait(strategy=strategy)
            resumed.append(index)

        with anyio.fail_after(20):
            async with anyio.create_task_group() as tg:
                for index in range(6):  # one at a time: the waits start in this order
                    tg.start_soon(waiter, index)
                    await anyio.wait_all_tasks_blocked()
                for work in works:  # no yield in between: one sweep finds all six done
                    work.release()
        assert resumed == list(range(6))
    finally:
        for stream in streams:
            stream.close()


@pytest.mark.anyio
@pytest.mark.parametrize("strategy", ["auto", "poll"])
async def test_a_sweep_cut_short_is_taken_up_where_it_stopped(
    sim: SimulatedDriver, monkeypatch: pytest.MonkeyPatch, strategy: aiogpu.WaitStrategy
) -> None:
    # Stream A completes one wait and keeps one pending; B and C complete theirs. With a budget
    # of one wake-up per sweep, the sweeps go A, B, C: the streams a cut sweep did not reach
    # come first in the next one, not A's pending wait again and again; and A's task has
    # resumed before C is swept.
    from aiogpu._wait import _policy, _watcher

    monkeypatch.setattr(_policy, "SWEEP_WAKE_BUDGET", 1)
    swept: list[object] = []
    resumed_when_swept: list[int] = []
    sweep_queue = _watcher.Watcher._sweep_queue

    def logged(self: _watcher.Watcher, queue: Any, now: float) -> None:
        swept.append(queue.key)
        resumed_when_swept.append(3 - left)
        sweep_queue(self, queue, now)

    streams = [aiogpu.Stream(sim.device(0), nonblocking=True) for _ in range(3)]
    try:
        works = [sim.launch(stream) for stream in streams]
        events = [stream.record() for stream in streams]
        held = sim.launch(streams[0])
        last = streams[0].record()
        woke = anyio.Event()
        left = 3

        async def waiter(event: aiogpu.Event) -> None:
            nonlocal left
            await event.wait(strategy=strategy)
            left -= 1
            if not left:
                woke.set()

        with anyio.fail_after(20):
            async with anyio.create_task_group() as tg:
                for event in events:  # one at a time: the watcher holds the streams in this order
                    tg.start_soon(waiter, event)
                    await anyio.wait_all_tasks_blocked()
                tg.start_soon(partial(last.wait, strategy=strategy))
                await anyio.wait_all_tasks_blocked()
                monkeypatch.setattr(_watcher.Watcher, "_sweep_queue", logged)
                for work in works:
                    work.release()
                await woke.wait()
                assert swept[:3] == [event._stream_key for event in events], swept
                assert resumed_when_swept[2] >= 1, resumed_when_swept
                held.release()
    finally:
        for stream in streams:
            stream.close()


@pytest.mark.anyio
async def test_a_sweep_cut_short_does_not_make_the_loop_watch_a_lone_stream(
    sim: SimulatedDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A cut sweep is followed by a yield and another sweep, not by a close watch: with one stream
    # left whose work is predicted far off, the loop must not watch it (a ``thread`` wait is
    # never watched on the loop), neither right after the cut nor in the next lone wait.
    from aiogpu._wait import _policy

    monkeypatch.setattr(_policy, "SWEEP_WAKE_BUDGET", 1)
    work_seconds = 0.03
    with aiogpu.Stream(sim.device(0), nonblocking=True) as short, aiogpu.Stream(sim.device(0), nonblocking=True) as long:
        for _ in range(4):  # the long stream's work is predicted from here on
            sim.launch(long, seconds=work_seconds)
            await long.record().wait(strategy="thread")
        held_first = sim.launch(short)
        first = short.record()
        held_second = sim.launch(short)
        second = short.record()
        sim.launch(long, seconds=work_seconds)
        far_off = long.record()
        loop_queries: list[int] = []
        query = sim.event_query

        def counted(event: int) -> bool:
            if event in (far_off.handle, lone.handle) and not in_waiter_thread():
                loop_queries.append(event)
            return query(event)

        lone = aiogpu.Event(sim.device(0))
        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                for event in (first, far_off, second):
                    tg.start_soon(partial(event.wait, strategy="thread"))
                    await anyio.wait_all_tasks_blocked()
                held_first.release()
                await anyio.wait_all_tasks_blocked()
                monkeypatch.setattr(sim, "event_query", counted)
                held_second.release()  # one wake-up: the sweep is cut, the long stream left
            sim.launch(long, seconds=work_seconds)
            lone.record(long)
            await lone.wait(strategy="thread")
        assert far_off.is_done
        assert len(loop_queries) <= 20, f"the loop asked {len(loop_queries)} times"  # watched: hundreds


@pytest.mark.anyio
async def test_a_sweep_asks_about_each_wait_at_most_once(sim: SimulatedDriver, monkeypatch: pytest.MonkeyPatch) -> None:
    # Work finishing a few recordings at a time (as on a busy GPU) is found by the burst
    # search; the wait it found pending is the stream's new head, and the sweep must not ask
    # about it a second time.
    from aiogpu._wait import _watcher

    asked: list[int] | None = None  # during a sweep: the events it asked about
    repeats: list[int] = []
    sweeps_that_asked = 0
    query = sim.event_query
    sweep = _watcher.Watcher._sweep_queue

    def counted(event: int) -> bool:
        if asked is not None:
            if event in asked:
                repeats.append(event)
            asked.append(event)
        return query(event)

    def one_sweep(self: _watcher.Watcher, queue: object, now: float) -> None:
        nonlocal asked, sweeps_that_asked
        asked = []
        try:
            sweep(self, queue, now)  # type: ignore[arg-type]
        finally:
            sweeps_that_asked += len(asked) > 1
            asked = None

    monkeypatch.setattr(_watcher.Watcher, "_sweep_queue", one_sweep)
    with aiogpu.Stream(sim.device(0)) as stream:
        groups = []
        for _ in range(10):
            work = sim.launch(stream)
            groups.append((work, [stream.record() for _ in range(4)]))
        woke: list[aiogpu.Event] = []
        group_woke = [anyio.Event() for _ in groups]

        async def waiter(event: aiogpu.Event, group: int) -> None:
            await event.wait(strategy="poll")
            woke.append(event)
            if len(woke) == 4 * (group + 1):
                group_woke[group].set()

        with anyio.fail_after(20):
            async with anyio.create_task_group() as tg:
                for group, (_, events) in enumerate(groups):
                    for event in events:
                        tg.start_soon(waiter, event, group)
                await anyio.wait_all_tasks_blocked()
                monkeypatch.setattr(sim, "event_query", counted)
                for group, (work, events) in enumerate(groups):
                    work.release()
                    await group_woke[group].wait()
                    assert set(woke[-4:]) == set(events)
    assert sweeps_that_asked, "no sweep found a burst: the test tested nothing"
    assert not repeats, f"asked again within one sweep: {repeats}"


@pytest.mark.anyio
async def test_a_lone_close_watch_still_sees_other_streams_re_recordings_and_faults(
    sim: SimulatedDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A lone wait watched closely asks only about its own event at each beat (its wake-up
    # path). A wait on another stream, a re-recording of the event and a fault must still be
    # seen while that watch runs.
    from aiogpu._wait import _policy

    monkeypatch.setitem(_policy.WATCH_UNPREDICTED, "poll", 3600.0)  # nothing predicted: watch, never park
    asked: dict[int, int] = {}
    query = sim.event_query

    def counted(event: int) -> bool:
        asked[event] = asked.get(event, 0) + 1
        return query(event)

    monkeypatch.setattr(sim, "event_query", counted)

    async def watched_closely(event: aiogpu.Event) -> None:
        """Until the watcher has asked about ``event`` three more times."""
        until = asked.get(event.handle, 0) + 3
        while asked.get(event.handle, 0) < until:
            await anyio.lowlevel.checkpoint()

    device = sim.device(0)
    outcomes: dict[str, str] = {}

    async def waiter(name: str, event: aiogpu.Event) -> None:
        try:
            await event.wait(strategy="poll")
            outcomes[name] = "done"
        except aiogpu.CudaError as error:
            outcomes[name] = error.name

    with aiogpu.Stream(device) as a, aiogpu.Stream(device) as b, aiogpu.Event(device) as event_a:
        held_a = sim.launch(a)
        event_a.record(a)
        held_b = sim.launch(b)
        event_b = b.record()
        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                tg.start_soon(waiter, "a", event_a)
                await watched_closely(event_a)
                tg.start_soon(waiter, "b", event_b)  # another stream: back to whole sweeps
                await watched_closely(event_b)
                held_b.release()
                while "b" not in outcomes:
                    await anyio.lowlevel.checkpoint()
                assert outcomes == {"b": "done"}

                await watched_closely(event_a)  # lone again
                held_again = sim.launch(a)
                event_a.record(a)  # re-recorded while watched: the first work's end wakes no one
                held_a.release()
                await watched_closely(event_a)
                assert not event_a.is_done
                assert outcomes == {"b": "done"}

                held_again.fail()  # a fault while watched reaches the waiting task
        assert outcomes == {"b": "done", "a": "CUDA_ERROR_ILLEGAL_ADDRESS"}
        event_b.close()


@pytest.mark.anyio
async def test_back_off_polls_are_jittered(sim: SimulatedDriver, monkeypatch: pytest.MonkeyPatch) -> None:
    # A wait left pending is polled on a back-off schedule. Were every interval the same, the
    # watcher could wake in lockstep with another periodic timer of the loop: anyio's
    # wait_all_tasks_blocked then kept finding it just woken, for seconds (a flaky test).
    from aiogpu._wait import _policy, _watcher

    monkeypatch.setitem(_policy.COLD_POLL, "poll", (1e-3, 1e-3))
    intervals: list[float] = []
    park = _watcher.Watcher._park

    async def recorded(self: _watcher.Watcher, now: float, wake_at: float, precise: bool) -> None:
        intervals.append(wake_at - now)
        await park(self, now, wake_at, precise)

    monkeypatch.setattr(_watcher.Watcher, "_park", recorded)
    with aiogpu.Stream(sim.device(0)) as stream:
        work = sim.launch(stream)
        event = stream.record()
        with anyio.move_on_after(0.1):
            await event.wait(strategy="poll")
        work.release()
    polls = intervals[1:]  # the first comes straight after the close watch
    assert len(polls) >= 10, intervals
    jitter = _policy.COLD_POLL_JITTER
    assert all((1 - jitter) * 1e-3 <= poll <= (1 + jitter) * 1e-3 for poll in polls), polls
    assert max(polls) - min(polls) > 0.2e-3, polls


async def _queries_per_beat(sim: SimulatedDriver, monkeypatch: pytest.MonkeyPatch, beat_cost: float) -> list[list[float]]:
    """When each query of a lone ``poll`` wait was made, grouped by the watcher's yields to the
    loop (and parks); each yield comes back ``beat_cost`` later at the earliest (as if other
    tasks had run meanwhile)."""
    from aiogpu._wait import _policy, _watcher
    from aiogpu._wait._backends import _asyncio, _trio

    beat = 0
    beats: dict[int, list[float]] = {}
    query = sim.event_query

    def timed(event: int) -> bool:
        beats.setdefault(beat, []).append(time.perf_counter())
        return query(event)

    def slowed(yield_now: Callable[[Any], Awaitable[None]]) -> Callable[[Any], Awaitable[None]]:
        async def slow_yield(backend: Any) -> None:
            nonlocal beat
            beat += 1
            back_at = time.perf_counter() + beat_cost
            await yield_now(backend)
            while time.perf_counter() < back_at:
                pass

        return slow_yield

    park = _watcher.Watcher._park

    async def counted_park(self: _watcher.Watcher, now: float, wake_at: float, precise: bool) -> None:
        nonlocal beat
        beat += 1
        await park(self, now, wake_at, precise)

    for backend in (_asyncio.AsyncioBackend, _trio.TrioBackend):
        monkeypatch.setattr(backend, "yield_now", slowed(backend.yield_now))
    monkeypatch.setattr(_watcher.Watcher, "_park", counted_park)
    # The slowed yields make the loop look busy: its look at parked waits (``_busy``) would add
    # queries of its own to a park's beat. These tests are about the close watch alone.
    monkeypatch.setattr(_policy, "BUSY_SHARE", math.inf)
    with aiogpu.Stream(sim.device(0)) as stream:
        work = sim.launch(stream)
        event = stream.record()
        monkeypatch.setattr(sim, "event_query", timed)
        with anyio.move_on_after(0.005):  # within poll's 2 ms close watch of an unpredicted wait
            await event.wait(strategy="poll")
        monkeypatch.setattr(sim, "event_query", query)
        work.release()
    return [times for number, times in beats.items() if number]  # from the first yield on


@pytest.mark.anyio
async def test_a_close_watch_on_an_idle_loop_asks_again_before_yielding(
    sim: SimulatedDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A loop iteration costs a few µs, half of which a lone wait would add to its wake-up: when
    # nothing else was ready, the close watch asks again at once, for at most IDLE_SPIN.
    from aiogpu._wait import _policy

    # "Came straight back" must not depend on how fast this machine runs a loop iteration (a
    # loaded GPU host took more than 15 µs per trio checkpoint).
    monkeypatch.setattr(_policy, "IDLE_BEAT", 1e-3)
    beats = await _queries_per_beat(sim, monkeypatch, beat_cost=0.0)
    assert max(len(times) for times in beats) > 1, "never asked twice in a beat"
    spans = sorted(times[-1] - times[0] for times in beats if len(times) > 1)
    assert spans[len(spans) // 2] <= _policy.IDLE_SPIN + 5e-6, f"kept the loop for {spans} s"
    # Never the whole 2 ms watch in one go. A preemption of the test machine can stretch a spin
    # now and then, so one beat in ten may run long; the median above catches a watch that
    # spins through in one beat.
    long = [span for span in spans if span >= 1e-3]
    assert len(long) <= max(1, len(spans) // 10), f"kept the loop for {[round(span * 1e6) for span in long]} µs"


@pytest.mark.anyio
async def test_a_close_watch_on_a_busy_loop_yields_after_every_query(
    sim: SimulatedDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    from aiogpu._wait import _policy

    beats = await _queries_per_beat(sim, monkeypatch, beat_cost=2 * _policy.IDLE_BEAT)
    assert len(beats) > 5, beats
    assert all(len(times) == 1 for times in beats), [len(times) for times in beats]


async def _drives_per_wait(sim: SimulatedDriver, monkeypatch: pytest.MonkeyPatch, strategy: str) -> list[int]:
    """Ten waits on 40 µs of work after three that taught the stream's predictor: how many
    times the watcher was driven for each."""
    from aiogpu._wait import _watcher

    drives = 0
    drive = _watcher.Watcher.drive

    async def counted(self: _watcher.Watcher, until: object) -> None:
        nonlocal drives
        drives += 1
        await drive(self, until)  # type: ignore[arg-type]

    results = []
    with aiogpu.Stream(sim.device(0)) as stream, aiogpu.Event(sim.device(0)) as event:
        for number in range(13):
            if number == 3:
                monkeypatch.setattr(_watcher.Watcher, "drive", counted)
            sim.launch(stream, 40e-6)
            event.record(stream)
            drives = 0
            with anyio.fail_after(10):
                await event.wait(strategy=strategy)  # type: ignore[arg-type]
            if number >= 3:
                results.append(drives)
    return results


async def _queries_before_the_watcher(sim: SimulatedDriver, monkeypatch: pytest.MonkeyPatch, strategy: str) -> tuple[int, float]:
    """A wait on held work that the stream's predictor says is about to finish: how many queries
    were made, and how long after the wait started, before the watcher was driven."""
    from aiogpu._wait import _predict, _watcher

    queries: list[float] = []
    query = sim.event_query
    first_drive: tuple[int, float] | None = None
    driven = anyio.Event()
    drive = _watcher.Watcher.drive

    async def noted(self: _watcher.Watcher, until: object) -> None:
        nonlocal first_drive
        if first_drive is None:
            first_drive = (len(queries), time.perf_counter())
            driven.set()
        await drive(self, until)  # type: ignore[arg-type]

    def counted(event: int) -> bool:
        queries.append(time.perf_counter())
        return query(event)

    with aiogpu.Stream(sim.device(0)) as stream, aiogpu.Event(sim.device(0)) as event:
        # The stream's queue and predictor exist. The work is held until its wait has started:
        # on a slow machine, timed work could finish first, and a wait on done work opens no queue.
        for _ in range(3):
            held = sim.launch(stream)
            event.record(stream)
            async with anyio.create_task_group() as tg:
                tg.start_soon(partial(event.wait, strategy=strategy))  # type: ignore[arg-type]
                await anyio.wait_all_tasks_blocked()
                held.release()
        work = sim.launch(stream)
        event.record(stream)
        _predict.for_stream(event._stream_key).estimate = 10e-6  # "about to finish"
        monkeypatch.setattr(_watcher.Watcher, "drive", noted)
        monkeypatch.setattr(sim, "event_query", counted)
        started = time.perf_counter()
        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                tg.start_soon(partial(event.wait, strategy=strategy))  # type: ignore[arg-type]
                await driven.wait()
                work.release()
    assert first_drive is not None
    count, at = first_drive
    return count, at - started


@pytest.mark.anyio
@pytest.mark.parametrize("strategy", ["auto", "poll"])
async def test_short_work_is_watched_where_its_wait_starts(
    sim: SimulatedDriver, monkeypatch: pytest.MonkeyPatch, strategy: str
) -> None:
    # Predicted to finish within SPIN_AHEAD: yield once, then query until done, with no entry,
    # plan or watcher drive (what a lone 20 µs wait would otherwise spend its wake-up on).
    drives = await _drives_per_wait(sim, monkeypatch, strategy)
    assert sum(count == 0 for count in drives) >= 5, drives


@pytest.mark.anyio
async def test_short_work_that_runs_late_falls_back_to_the_watcher_promptly(
    sim: SimulatedDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    from aiogpu._wait import _policy

    # Long enough that a slow yield cannot use the whole spin up before the second query.
    monkeypatch.setattr(_policy, "IDLE_SPIN", 1e-3)
    queries, after = await _queries_before_the_watcher(sim, monkeypatch, "poll")
    assert queries >= 2, queries  # it asked again where the wait started, then handed over
    # Spinning on would last until the work is released (the 10 s limit); the margin is for a
    # machine that preempts the loop for a while, which a CI host shared by several runs does.
    assert after < _policy.SPIN_AHEAD + _policy.IDLE_SPIN + 50e-3, f"spun for {after * 1e6:.0f} µs"


@pytest.mark.anyio
@pytest.mark.parametrize("strategy", ["thread", "callback"])
async def test_off_loop_strategies_never_watch_on_the_loop(
    sim: SimulatedDriver, monkeypatch: pytest.MonkeyPatch, strategy: str
) -> None:
    queries, _ = await _queries_before_the_watcher(sim, monkeypatch, strategy)
    assert queries == 1, queries  # the one every wait starts with


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="timer slack is a Linux setting")
@pytest.mark.anyio
async def test_waiter_and_timer_threads_ask_for_precise_sleeps(sim: SimulatedDriver, monkeypatch: pytest.MonkeyPatch) -> None:
    # Linux ends a thread's sleeps up to 50 µs late by default; these threads sleep until a
    # predicted completion (and the waiter threads pause between queries).
    from aiogpu import _daemon
    from aiogpu._wait import _timer

    libc = ctypes.CDLL(None)
    pr_get_timerslack = 30
    slack: dict[str, int] = {}
    seen = threading.Event()
    query = sim.event_query

    def noted(event: int) -> bool:
        if in_waiter_thread():
            slack["waiter"] = libc.prctl(pr_get_timerslack, 0, 0, 0, 0)
            seen.set()
        return query(event)

    timer_fired = threading.Event()

    def on_timer() -> None:
        slack["timer"] = libc.prctl(pr_get_timerslack, 0, 0, 0, 0)
        timer_fired.set()

    _timer.timer().call_at(0.0, on_timer)
    monkeypatch.setattr(sim, "event_query", noted)
    with aiogpu.Stream(sim.device(0)) as stream:
        work = sim.launch(stream)
        event = stream.record()
        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                tg.start_soon(partial(event.wait, strategy="thread"))
                assert await anyio.to_thread.run_sync(seen.wait, 10.0)
                work.release()
        assert await anyio.to_thread.run_sync(timer_fired.wait, 10.0)
    assert slack == {"waiter": _daemon.TIMER_SLACK_NS, "timer": _daemon.TIMER_SLACK_NS}


async def _thread_wait_pokes(sim: SimulatedDriver, monkeypatch: pytest.MonkeyPatch, estimate: float) -> int:
    """A ``thread`` wait on held work predicted to take ``estimate``: how often its loop was
    poked while the work was pending, once the waiter thread has begun to watch it closely."""
    from aiogpu._wait import _predict, _watcher

    pokes = 0
    poked = threading.Event()
    poke = _watcher.Watcher._poke_in_callback

    def counted(self: _watcher.Watcher) -> None:
        nonlocal pokes
        pokes += 1
        poked.set()
        poke(self)

    _, watching = waiter_thread_queries(sim, monkeypatch)
    with aiogpu.Stream(sim.device(0)) as stream, aiogpu.Event(sim.device(0)) as event:
        for _ in range(3):  # the stream's queue and predictor exist
            sim.launch(stream, 40e-6)
            event.record(stream)
            await event.wait(strategy="thread")
        work = sim.launch(stream)
        event.record(stream)
        _predict.for_stream(event._stream_key).estimate = estimate
        monkeypatch.setattr(_watcher.Watcher, "_poke_in_callback", counted)
        watching.clear()
        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                tg.start_soon(partial(event.wait, strategy="thread"))
                assert await anyio.to_thread.run_sync(watching.wait, 10.0)
                # A poke is scheduled before the watch: given half a second to arrive on a loaded
                # machine (a wait that pokes nobody spends it all).
                await anyio.to_thread.run_sync(poked.wait, 0.5)
                await anyio.wait_all_tasks_blocked()
                pending_pokes = pokes
                work.release()
    return pending_pokes


@pytest.mark.anyio
async def test_a_thread_wait_rouses_its_loop_before_a_long_predicted_completion(
    sim: SimulatedDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A loop asleep for long wakes slowly (+100-190 µs after 1-5 ms on an H100 host): the thread
    # pokes it as its close watch starts, so it is awake when the work completes.
    assert await _thread_wait_pokes(sim, monkeypatch, estimate=50e-3) == 1  # sleeps ~50 ms first, even on a loaded machine


@pytest.mark.anyio
async def test_a_thread_wait_that_starts_watching_at_once_does_not_rouse_its_loop(
    sim: SimulatedDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    from aiogpu._wait import _policy

    # predicted to finish within the thread's lead: it watches closely at once, with no sleep
    assert await _thread_wait_pokes(sim, monkeypatch, estimate=_policy.LEAD["thread"] / 2) == 0


@pytest.mark.anyio
@pytest.mark.parametrize("mode", ["auto", "poll", "thread"])
@pytest.mark.slow
async def test_short_work_after_long_work_on_a_stream_is_not_woken_at_the_long_prediction(
    sim: SimulatedDriver, mode: aiogpu.WaitStrategy
) -> None:
    # One long piece of work teaches the stream's predictor a long duration; the short work
    # after it must still be seen done soon (queried on the back-off schedule meanwhile).
    long = 0.6
    with aiogpu.Stream(sim.device(0)) as stream:
        sim.launch(stream, long)
        with anyio.fail_after(10):
            await stream.record().wait(strategy=mode)
        for _ in range(2):
            sim.launch(stream, 2e-3)
            event = stream.record()
            started = time.perf_counter()
            with anyio.fail_after(10):
                await event.wait(strategy=mode)
            assert time.perf_counter() - started < long / 3
            event.close()


@pytest.mark.anyio
async def test_a_cancelled_thread_wait_sleeping_toward_a_long_prediction_frees_its_thread_soon(sim: SimulatedDriver) -> None:
    from aiogpu._wait import _thread

    with aiogpu.Stream(sim.device(0)) as stream:
        sim.launch(stream, 0.6)
        with anyio.fail_after(10):
            await stream.record().wait(strategy="thread")  # the stream's prediction is now ~0.6 s
        with Latch(sim.device(0)) as latch:
            latch.block(stream)
            event = stream.record()
            with anyio.move_on_after(0.01):
                await event.wait(strategy="thread")
            event.close()  # destroyed once the abandoned job lets go of it
            live = sim.statistics().live_events
            started = time.perf_counter()
            assert await anyio.to_thread.run_sync(_thread.pool().wait_quiet, 10.0)
            assert time.perf_counter() - started < 0.2  # at its next query, not at the ~0.6 s prediction
            assert sim.statistics().live_events == live - 1


def test_a_waiter_thread_that_finds_only_abandoned_jobs_lets_go_of_their_events_before_idling(sim: SimulatedDriver) -> None:
    from aiogpu._wait import _thread

    pool = _thread._Pool(max_threads=1, hard_max_threads=1, idle_seconds=30.0)
    with aiogpu.Stream(sim.device(0)) as stream, Latch(sim.device(0)) as latch:
        latch.block(stream)
        event = stream.record()
        live = sim.statistics().live_events
        event._lifetime.acquire()  # what a wait's entry holds
        pool.unsubscribe(pool.subscribe(event, lambda: None))  # left before a thread took the job
        event._lifetime.release()
        event.close()  # destroyed once the job lets go of it
        deadline = time.perf_counter() + 5
        while sim.statistics().live_events == live and time.perf_counter() < deadline:
            time.sleep(0.001)
        assert sim.statistics().live_events == live - 1  # not after the thread's 30 s idle
        pool.stop_idle_threads()


def test_waits_one_after_another_are_served_by_one_warm_waiter_thread(sim: SimulatedDriver) -> None:
    # A waiter thread stays warm for ``idle_seconds`` after its job and takes the next one: a
    # thread started per wait would add its start-up to every wake-up (CUDA.jl found cold
    # wake-ups dominate the tails).
    from aiogpu._wait import _thread

    pool = _thread._Pool(max_threads=4, hard_max_threads=4, idle_seconds=30.0)
    served_by: set[str] = set()
    query = sim.event_query

    def noted(event: int) -> bool:
        served_by.add(threading.current_thread().name)
        return query(event)

    sim.event_query = noted  # type: ignore[method-assign]
    try:
        with aiogpu.Stream(sim.device(0)) as stream:
            for _ in range(5):
                work = sim.launch(stream)
                event = stream.record()
                event._lifetime.acquire()  # what a wait's entry holds
                woken = threading.Event()
                subscriber = pool.subscribe(event, woken.set)
                work.release()
                assert woken.wait(5), "the waiter thread never saw the work done"
                assert subscriber.outcome is None
                event._lifetime.release()
                deadline = time.perf_counter() + 5
                while pool.statistics().idle_threads < 1 and time.perf_counter() < deadline:
                    time.sleep(0.001)  # the thread going back to idle, not the GPU
                assert pool.statistics() == _thread.PoolStatistics(
                    threads=1, idle_threads=1, queued_jobs=0, running_jobs=0, abandoned_jobs=0, subscribers=0
                )
        assert len(served_by) == 1, served_by
    finally:
        pool.stop_idle_threads()


@pytest.mark.parametrize("spacing", [0.0, 0.5e-3])
def test_a_waiter_thread_spaces_its_close_watch_by_the_lateness_its_wait_allows(
    sim: SimulatedDriver, monkeypatch: pytest.MonkeyPatch, spacing: float
) -> None:
    # A wait queued behind other work may be seen done a little late (``_policy.late_allowed``):
    # its waiter thread asks that far apart instead of spinning, and pokes its loop only once,
    # when it saw the work done, not also as its close watch starts.
    from aiogpu._wait import _thread

    pool = _thread._Pool(max_threads=1, hard_max_threads=1, idle_seconds=30.0)
    asked, enough = waiter_thread_queries(sim, monkeypatch, enough=6)
    pokes: list[float] = []
    done = threading.Event()

    def poked() -> None:
        pokes.append(time.perf_counter())
        if len(asked) >= 6:
            done.set()

    try:
        with aiogpu.Stream(sim.device(0)) as stream:
            work = sim.launch(stream)
            event = stream.record()
            event._lifetime.acquire()  # what a wait's entry holds
            spin_from = time.perf_counter() + 5e-3
            pool.subscribe(event, poked, spin_from=spin_from, spacing=spacing)
            assert enough.wait(5), "the waiter thread stopped asking"
            work.release()
            assert done.wait(5), "the waiter thread never saw the work done"
            event._lifetime.release()
    finally:
        pool.stop_idle_threads()
    watch = [at for at in asked if at >= spin_from][1:5]  # its close watch (after the early polls' last)
    gaps = [later - earlier for earlier, later in itertools.pairwise(watch)]
    if spacing:
        assert len(pokes) == 1
        assert min(gaps) >= spacing * 0.99, gaps
    else:  # it spins, and rouses its loop as the watch starts
        assert len(pokes) == 2
        assert min(gaps) < 0.1e-3, gaps


@pytest.mark.anyio
@pytest.mark.parametrize("strategy", ["auto", "thread"])
async def test_waits_queued_on_busy_streams_cost_a_few_queries_each(
    sim: SimulatedDriver, monkeypatch: pytest.MonkeyPatch, strategy: aiogpu.WaitStrategy
) -> None:
    # A sustained load: 8 streams, each keeping 5 ms kernels queued with four waits behind
    # each, and every task recording again after its wait. Each head was queued for long
    # before its work began, so it may be seen done a little late: it is asked on that
    # schedule, not at every beat of a close watch (``auto``) or a waiter thread's spin
    # (``thread``), and a completion on one stream does not have every other stream's head
    # asked (``thread``: a head is left to its waiter thread). Asked at every beat, with the
    # heads of several streams in their close watch at once, this load cost five to ten times
    # the queries under ``auto``; spinning threads and sweeps asking every head, four times
    # under ``thread``.
    device = sim.device(0)
    streams = [aiogpu.Stream(device) for _ in range(8)]
    events = [[aiogpu.Event(device) for _ in range(128)] for _ in streams]
    asked = 0
    query = sim.event_query

    def counted(event: int) -> bool:
        nonlocal asked
        asked += 1
        return query(event)

    monkeypatch.setattr(sim, "event_query", counted)
    completed = 0

    async def waiter(stream: aiogpu.Stream, event: aiogpu.Event, launches: bool) -> None:
        nonlocal completed
        for _ in range(3):
            if launches:
                launch_spin(stream, 5e-3)
            event.record(stream)
            await event.wait(strategy=strategy)
            completed += 1

    try:
        with anyio.fail_after(20):
            async with anyio.create_task_group() as tg:
                for position in range(128):  # round robin over the streams, as a server launches
                    for stream, stream_events in zip(streams, events, strict=True):
                        tg.start_soon(waiter, stream, stream_events[position], position % 4 == 0)
    finally:
        for stream, stream_events in zip(streams, events, strict=True):
            stream.synchronize()
            for event in stream_events:
                event.close()
            stream.close()
    assert completed == 3 * 8 * 128
    assert asked / completed < 2.5, f"{asked / completed:.2f} queries a wait"
