"""Streams and events dropped by the user (never closed) while waits on them are pending, and
while a callback wait's host function is still enqueued: no crash, every wait finishes or
fails cleanly, and (on the simulated device, which counts them) every handle is destroyed.
"""

from __future__ import annotations

import gc
import weakref
from functools import partial

import anyio
import pytest

import aiogpu
from aiogpu._wait import _helpers
from aiogpu.testing import Latch, SimulatedDriver
from tests.helpers import armer_caught_up, settle_waiter_threads

pytestmark = pytest.mark.anyio
TIMEOUT = 20.0


def live_handles(device: aiogpu.Device) -> tuple[int, int] | None:
    """(events, streams) alive on the simulated driver, less the callback strategy's idle helper
    streams (a bounded pool, reused by the next waits); ``None`` on a GPU (nothing counts them)."""
    statistics = getattr(device._driver, "statistics", None)
    if statistics is None:
        return None
    snapshot = statistics()
    helpers = len(_helpers.helper_streams(device._driver, device._context))
    assert helpers <= _helpers.KEEP_IDLE_HELPERS
    return snapshot.live_events, snapshot.live_streams - helpers


@pytest.mark.slow
async def test_dropped_streams_and_events_with_pending_waits(device: aiogpu.Device, strategy: aiogpu.WaitStrategy) -> None:
    before = live_handles(device)
    with Latch(device) as latch:
        woken = 0
        dropped: list[weakref.ref[object]] = []

        def start_work() -> aiogpu.Event:
            stream = aiogpu.Stream(device)  # the user keeps no reference to it
            dropped.append(weakref.ref(stream))
            latch.block(stream)
            return stream.record()

        async def waiter(event: aiogpu.Event) -> None:
            nonlocal woken
            await event.wait(strategy=strategy)
            woken += 1

        with anyio.fail_after(TIMEOUT):
            async with anyio.create_task_group() as tg:
                for _ in range(4):
                    event = start_work()
                    dropped.append(weakref.ref(event))
                    for _ in range(5):
                        tg.start_soon(waiter, event)
                del event  # only the waits hold the events now
                await anyio.wait_all_tasks_blocked()
                gc.collect()
                assert all(ref() is None for ref in dropped[0::2])  # the streams were destroyed
                latch.release()
        assert woken == 20
    await anyio.to_thread.run_sync(settle_waiter_threads)
    await anyio.to_thread.run_sync(armer_caught_up)  # arming can lag: creating a stream blocks while others are held
    gc.collect()
    assert all(ref() is None for ref in dropped)  # nothing kept them once the waits were over
    assert live_handles(device) == before


@pytest.mark.slow
async def test_a_closed_event_lives_while_a_task_still_awaits_it(sim: SimulatedDriver, strategy: aiogpu.WaitStrategy) -> None:
    # Three tasks await one recording (one entry of the watcher); the event is closed meanwhile.
    # The handle outlives the two cancelled waits and is destroyed once the last one is over.
    device = sim.device(0)
    with aiogpu.Stream(device) as stream, Latch(device) as latch:
        latch.block(stream)
        event = stream.record()
        scopes = [anyio.CancelScope() for _ in range(3)]
        woke = []

        async def waiter(scope: anyio.CancelScope) -> None:
            with scope:
                await event.wait(strategy=strategy)
                woke.append(scope)

        with anyio.fail_after(TIMEOUT):
            async with anyio.create_task_group() as tg:
                for scope in scopes:
                    tg.start_soon(waiter, scope)
                await anyio.wait_all_tasks_blocked()
                live = sim.statistics().live_events
                event.close()
                scopes[0].cancel()
                scopes[1].cancel()
                await anyio.wait_all_tasks_blocked()
                assert sim.statistics().live_events == live  # the third wait still holds it
                latch.release()
        assert woke == [scopes[2]]
        await anyio.to_thread.run_sync(settle_waiter_threads)  # a waiter thread holds it too until its job ends
        await anyio.to_thread.run_sync(armer_caught_up)
        assert sim.statistics().live_events == 1  # only the latch's own marker event is left


async def test_a_closed_event_whose_waits_are_all_cancelled_is_destroyed_at_once(sim: SimulatedDriver) -> None:
    # With no thread involved (``poll``), nothing but the waits holds the handle: once the last
    # of them is cancelled, the closed event is destroyed though its work is still held.
    device = sim.device(0)
    with aiogpu.Stream(device) as stream, Latch(device) as latch:
        latch.block(stream)
        event = stream.record()
        with anyio.fail_after(TIMEOUT):
            async with anyio.create_task_group() as tg:
                for _ in range(3):
                    tg.start_soon(partial(event.wait, strategy="poll"))
                await anyio.wait_all_tasks_blocked()
                live = sim.statistics().live_events
                event.close()
                assert sim.statistics().live_events == live
                tg.cancel_scope.cancel()
        assert sim.statistics().live_events == live - 1


async def test_dropped_event_whose_wait_was_cancelled_with_a_host_function_enqueued(device: aiogpu.Device) -> None:
    """A cancelled callback wait leaves its host function on the stream; the user then drops
    the event and the stream. The host function runs later, when nothing else refers to them."""
    before = live_handles(device)
    with Latch(device) as latch:
        stream = aiogpu.Stream(device)
        latch.block(stream)
        event = stream.record()
        with anyio.move_on_after(0.05) as scope:
            await event.wait(strategy="callback")
        assert scope.cancelled_caught
        refs = [weakref.ref(event), weakref.ref(stream)]
        del event, stream
        gc.collect()
        latch.release()
        with aiogpu.Stream(device) as later:  # the device still works: the host function ran harmlessly
            with anyio.fail_after(TIMEOUT):
                await later.record().wait(strategy="callback")
    await anyio.to_thread.run_sync(settle_waiter_threads)
    await anyio.to_thread.run_sync(armer_caught_up)
    gc.collect()
    assert all(ref() is None for ref in refs)  # the engine let go of them once the work was done
    assert live_handles(device) == before


async def test_a_burst_of_callback_waits_leaves_a_bounded_pool_of_helper_streams(device: aiogpu.Device) -> None:
    burst = _helpers.KEEP_IDLE_HELPERS + 8
    pool = _helpers.helper_streams(device._driver, device._context)
    streams = [aiogpu.Stream(device) for _ in range(burst)]

    async def armed_waits(held: list[aiogpu.Stream]) -> None:
        """Callback waits on work held by a latch; never wait for the armer while it is held (on
        a GPU, creating a helper stream blocks while other streams spin on the latch)."""
        with Latch(device) as latch:
            for stream in held:
                latch.block(stream)
            events = [stream.record() for stream in held]
            with anyio.fail_after(TIMEOUT):
                async with anyio.create_task_group() as tg:
                    for event in events:
                        tg.start_soon(lambda e=event: e.wait(strategy="callback"))
                    await anyio.wait_all_tasks_blocked()
                    if simulated:  # arming never blocks there: every wait gets its own helper
                        await anyio.to_thread.run_sync(armer_caught_up)
                    latch.release()
        await anyio.to_thread.run_sync(armer_caught_up)

    simulated = device._driver.name == "simulated"
    await armed_waits(streams)
    peak = len(pool)
    if simulated:
        assert peak >= burst
    with aiogpu.Stream(device) as later:
        await armed_waits([later])  # arming it trims the idle helpers of the burst
    assert len(pool) <= _helpers.KEEP_IDLE_HELPERS, (peak, len(pool))
    for stream in streams:
        stream.close()
