"""Behaviour only a real GPU shows: CPU cost of waiting, concurrency, GPU timing, default streams.

The simulated driver checks the awaiting contract everywhere (``tests/contract.py``); these
tests check what it cannot model: that the ``thread`` strategy sleeps instead of spinning,
that two streams really run at once, that timing events measure device time, that the legacy
default stream is the right device's, and that waiter threads go away afterwards. Work is held
with a ``Latch`` or timed with ``launch_spin``; every wait is bounded by ``fail_after``.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from importlib.util import find_spec

import anyio
import pytest

import aiogpu
from aiogpu._wait import _thread
from aiogpu.testing import Latch, launch_spin
from tests.gpu._child import LOOPS
from tests.helpers import settle_waiter_threads

pytestmark = [pytest.mark.gpu, pytest.mark.anyio]

#: Bound on every wait for work that has been released (a bug fails instead of hanging).
TIMEOUT = 10.0


# -- the thread strategy sleeps -------------------------------------------------------------------
async def warm_up_thread_strategy(stream: aiogpu.Stream) -> None:
    """Make one wait go through a waiter thread, so the measured one finds everything set up."""
    with Latch(stream.device) as latch:
        latch.block(stream)
        held = stream.record()
        with anyio.fail_after(TIMEOUT):
            async with anyio.create_task_group() as tg:
                tg.start_soon(partial(held.wait, strategy="thread"))
                await anyio.wait_all_tasks_blocked()
                latch.release()


@pytest.mark.alone  # its process CPU and the kernel's wall time, with no other test beside it
@pytest.mark.parametrize(
    "anyio_backend",
    [
        pytest.param(backend, id=name, marks=pytest.mark.skipif(find_spec(name) is None, reason=f"{name} is not installed"))
        for name, backend in LOOPS.items()
    ],
)
async def test_thread_strategy_burns_no_cpu_while_waiting(gpu: aiogpu.Device) -> None:
    with aiogpu.Stream(gpu) as stream:
        await warm_up_thread_strategy(stream)
        launch_spin(stream, 0.2)
        event = stream.record()
        cpu_started, wall_started = time.process_time(), time.perf_counter()
        with anyio.fail_after(TIMEOUT):
            await event.wait(strategy="thread")
        cpu = time.process_time() - cpu_started
        wall = time.perf_counter() - wall_started
    assert wall >= 0.150, f"the wait returned after {wall * 1000:.1f} ms, before the 200 ms kernel could finish"
    assert cpu < 0.020, f"the process used {cpu * 1000:.1f} ms of CPU during a {wall * 1000:.0f} ms wait"


# -- streams and timing ---------------------------------------------------------------------------
async def test_two_streams_run_concurrently(gpu: aiogpu.Device) -> None:
    reference = gpu.default_stream.record(timing=True)
    with (
        aiogpu.Stream(gpu, nonblocking=True) as first,
        aiogpu.Stream(gpu, nonblocking=True) as second,
        Latch(gpu) as latch,
    ):
        intervals: list[tuple[aiogpu.Event, aiogpu.Event]] = []
        for stream in (first, second):
            stream.wait_for(reference)
            latch.block(stream)  # both start together, however slowly the host enqueues
            start = stream.record(timing=True)
            launch_spin(stream, 0.1)
            intervals.append((start, stream.record(timing=True)))
        latch.release()
        with anyio.fail_after(TIMEOUT):
            for _, end in intervals:
                await end
    starts = [reference.elapsed_time(start) for start, _ in intervals]
    ends = [reference.elapsed_time(end) for _, end in intervals]
    assert min(starts) >= 0
    assert max(starts) < min(ends), f"the kernels ran one after the other: starts {starts} ms, ends {ends} ms"


async def test_elapsed_time_measures_device_time(gpu: aiogpu.Device) -> None:
    with aiogpu.Stream(gpu) as stream:
        start = stream.record(timing=True)
        launch_spin(stream, 0.05)
        end = stream.record(timing=True)
        with anyio.fail_after(TIMEOUT):
            await end
    elapsed = end - start
    assert 45 <= elapsed <= 500
    assert start.elapsed_time(end) == elapsed


async def test_elapsed_time_of_pending_events_raises(gpu: aiogpu.Device) -> None:
    with aiogpu.Stream(gpu) as stream, Latch(gpu) as latch:
        latch.block(stream)
        start = stream.record(timing=True)
        launch_spin(stream, 0.05)
        end = stream.record(timing=True)
        with pytest.raises(aiogpu.EventStateError, match="has not completed yet"):
            start.elapsed_time(end)
        latch.release()
        with anyio.fail_after(TIMEOUT):
            await end
        assert 45 <= start.elapsed_time(end) <= 500


# -- the legacy default stream --------------------------------------------------------------------
async def test_default_stream_record_and_await(gpu: aiogpu.Device) -> None:
    with Latch(gpu) as latch:
        latch.block(gpu.default_stream)
        event = gpu.default_stream.record()
        assert not event.is_done
        latch.release()
        with anyio.fail_after(TIMEOUT):
            await event
        assert event.is_done


async def test_record_without_a_stream_uses_the_default_stream(gpu: aiogpu.Device) -> None:
    with Latch(gpu) as latch, aiogpu.Event(gpu) as event:
        latch.block(gpu.default_stream)
        event.record()
        assert not event.is_done  # held: it is behind the default stream's latch
        latch.release()
        with anyio.fail_after(TIMEOUT):
            await event


@pytest.mark.parametrize("current", ["no context", "another device"])
async def test_default_stream_is_its_devices_whatever_is_current(gpu: aiogpu.Device, current: str) -> None:
    other = None
    if current == "another device":
        if aiogpu.Device.count() < 2:
            pytest.skip("needs two GPUs")
        other = aiogpu.Device(1)

    def record_on_a_fresh_thread() -> aiogpu.Event:
        if other is not None:
            other.set_current()
        before = gpu._driver.context_get_current()
        event = gpu.default_stream.record()
        assert gpu._driver.context_get_current() == before, "aiogpu left its context current"
        return event

    with Latch(gpu) as latch:
        latch.block(gpu.default_stream)
        with ThreadPoolExecutor(max_workers=1) as fresh_thread:  # a new thread: nothing is current on it
            event = fresh_thread.submit(record_on_a_fresh_thread).result(timeout=TIMEOUT)
        assert event.device is gpu
        assert not event.is_done  # held: it is behind device 0's default stream
        latch.release()
        with anyio.fail_after(TIMEOUT):
            await event


# -- the thread strategy cleans up ----------------------------------------------------------------
async def test_thread_strategy_leaves_no_thread_behind(gpu: aiogpu.Device) -> None:
    gave_up: list[bool] = []

    async def wait_briefly(event: aiogpu.Event) -> None:
        with anyio.move_on_after(0.05) as scope:
            await event.wait(strategy="thread")
        gave_up.append(scope.cancelled_caught)

    with aiogpu.Stream(gpu) as stream, Latch(gpu) as latch:
        latch.block(stream)
        events = [stream.record() for _ in range(20)]
        with anyio.fail_after(TIMEOUT):
            async with anyio.create_task_group() as waiting:
                for event in events[::2]:
                    waiting.start_soon(partial(event.wait, strategy="thread"))
                async with anyio.create_task_group() as brief:
                    for event in events[1::2]:
                        brief.start_soon(wait_briefly, event)
                # Every brief wait gave up while the GPU work is still held; the others wait on.
                assert gave_up == [True] * 10
                assert not any(event.is_done for event in events)
                # One waiter thread watches the stream (its oldest wait) for all ten: a stream
                # completes in order.
                assert _thread.pool().statistics().subscribers == 1
                latch.release()
        for event in events:
            event.close()
    statistics = settle_waiter_threads()
    assert statistics.threads == 0, statistics
    assert statistics.running_jobs == statistics.queued_jobs == 0, statistics
    assert statistics.subscribers == 0, statistics


# -- a stream pool over every GPU ---------------------------------------------------------------
async def test_stream_pool_spreads_over_every_gpu_and_their_work_is_awaited(gpu: aiogpu.Device) -> None:
    count = aiogpu.Device.count()
    with aiogpu.StreamPool(streams_per_device=2) as pool:
        assert pool.devices == tuple(aiogpu.Device(ordinal) for ordinal in range(count))
        streams = [await pool.acquire() for _ in range(count)]
        assert {stream.device.ordinal for stream in streams} == set(range(count))  # one per GPU first
        latches = [Latch(stream.device) for stream in streams]
        events = []
        for stream, latch in zip(streams, latches, strict=True):
            latch.block(stream)
            launch_spin(stream, 0.001)
            events.append(stream.record())
        assert not any(event.is_done for event in events)
        for latch in latches:
            latch.release()
        with anyio.fail_after(TIMEOUT):
            for event in events:
                await event
        for stream, latch in zip(streams, latches, strict=True):
            latch.close()
            pool.release(stream)
        assert pool.in_use == 0
