"""StreamPool: streams spread over devices, lent one task at a time, fair and cancellation-safe.

Runs on a simulated driver with three devices; tests/gpu/test_gpu.py spreads a pool over the
real GPUs.
"""

from __future__ import annotations

from collections import Counter

import anyio
import pytest

import aiogpu
from aiogpu.testing import Latch, SimulatedDriver

pytestmark = pytest.mark.anyio


@pytest.fixture
def devices() -> list[aiogpu.Device]:
    sim = SimulatedDriver(devices=3, forbid_blocking_on_event_loop=True)
    return [sim.device(ordinal) for ordinal in range(3)]


async def test_leases_spread_over_devices(devices: list[aiogpu.Device]) -> None:
    with aiogpu.StreamPool(devices, streams_per_device=2) as pool:
        assert pool.size == 6
        first = [await pool.acquire() for _ in range(3)]
        assert {stream.device for stream in first} == set(devices)  # one on each device first
        second = [await pool.acquire() for _ in range(3)]
        assert Counter(stream.device for stream in first + second) == dict.fromkeys(devices, 2)
        assert pool.in_use == 6
        for stream in first + second:
            pool.release(stream)
        assert pool.in_use == 0


async def test_a_leased_stream_runs_and_awaits_work(device: aiogpu.Device) -> None:
    with aiogpu.StreamPool([device], streams_per_device=1) as pool, Latch(device) as latch:
        async with pool.stream() as stream:
            assert stream.device is device
            latch.block(stream)
            event = stream.record()
            assert not event.is_done
            latch.release()
            with anyio.fail_after(10):
                await event


async def test_when_all_are_lent_the_oldest_waiter_gets_the_next_one(devices: list[aiogpu.Device]) -> None:
    with aiogpu.StreamPool(devices[:1], streams_per_device=1) as pool:
        held = await pool.acquire()
        order: list[str] = []

        async def borrower(name: str) -> None:
            async with pool.stream() as stream:
                assert stream is held  # the only stream, handed on
                order.append(name)

        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                for name in ("first", "second", "third"):
                    tg.start_soon(borrower, name)
                    await anyio.wait_all_tasks_blocked()
                assert pool.waiting == 3
                assert order == []
                pool.release(held)
        assert order == ["first", "second", "third"]
        assert pool.in_use == 0


async def test_a_waiter_for_one_device_is_not_given_another_devices_stream(devices: list[aiogpu.Device]) -> None:
    with aiogpu.StreamPool(devices[:2], streams_per_device=1) as pool:
        on_0 = await pool.acquire(devices[0])
        on_1 = await pool.acquire(devices[1])
        got: list[aiogpu.Stream] = []

        async def wants_device_1() -> None:
            got.append(await pool.acquire(devices[1]))

        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                tg.start_soon(wants_device_1)
                await anyio.wait_all_tasks_blocked()
                pool.release(on_0)  # not for that waiter: back to the free list
                await anyio.wait_all_tasks_blocked()
                assert got == []
                assert await pool.acquire(devices[0]) is on_0  # device 0 is free for others
                pool.release(on_1)
        assert got == [on_1]


async def test_cancelled_waits_lose_no_stream(devices: list[aiogpu.Device]) -> None:
    with aiogpu.StreamPool(devices[:1], streams_per_device=1) as pool:
        held = await pool.acquire()
        with anyio.move_on_after(0.01):
            await pool.acquire()
        assert pool.waiting == 0
        # Handed over in the same step as the cancellation, in either order: the waiter either
        # gets the stream (and gives it back) or raises and passes it on. Nothing is lost.
        for cancel_first in (False, True):
            async with anyio.create_task_group() as tg:
                scope = anyio.CancelScope()

                async def cancelled_waiter(scope: anyio.CancelScope = scope) -> None:
                    with scope:
                        pool.release(await pool.acquire())

                tg.start_soon(cancelled_waiter)
                await anyio.wait_all_tasks_blocked()
                if cancel_first:
                    scope.cancel()
                pool.release(held)
                scope.cancel()
            assert pool.in_use == 0
            assert pool.waiting == 0
            held = await pool.acquire()
        pool.release(held)
        assert await pool.acquire() is held


async def test_close_fails_waiters_and_closes_streams_as_they_return(devices: list[aiogpu.Device]) -> None:
    pool = aiogpu.StreamPool(devices[:1], streams_per_device=1)
    held = await pool.acquire()
    failures: list[BaseException] = []

    async def waiter() -> None:
        try:
            await pool.acquire()
        except aiogpu.ClosedResourceError as error:
            failures.append(error)

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(waiter)
            await anyio.wait_all_tasks_blocked()
            pool.close()
    assert len(failures) == 1
    assert not held.is_closed  # still lent out: closed when it comes back
    pool.release(held)
    assert held.is_closed
    with pytest.raises(aiogpu.ClosedResourceError):
        await pool.acquire()
    pool.close()  # idempotent
    assert "closed" in repr(pool)


async def test_bad_input_is_refused_clearly(devices: list[aiogpu.Device]) -> None:
    with pytest.raises(ValueError, match="streams_per_device must be at least 1"):
        aiogpu.StreamPool(devices, streams_per_device=0)
    with pytest.raises(TypeError, match="streams_per_device must be an int"):
        aiogpu.StreamPool(devices, streams_per_device=True)
    with pytest.raises(ValueError, match="at least one device"):
        aiogpu.StreamPool([])
    with pytest.raises(ValueError, match="listed twice"):
        aiogpu.StreamPool([devices[0], devices[0]])
    with pytest.raises(TypeError, match="must be aiogpu.Device objects"):
        aiogpu.StreamPool([0])  # type: ignore[list-item]
    other = SimulatedDriver().device(0)
    with pytest.raises(ValueError, match="different drivers"):
        aiogpu.StreamPool([devices[0], other])
    with aiogpu.StreamPool(devices[:1]) as pool:
        with pytest.raises(ValueError, match="not one of this pool's devices"):
            await pool.acquire(devices[1])
        with aiogpu.Stream(devices[0]) as stranger, pytest.raises(ValueError, match="not lent out by this StreamPool"):
            pool.release(stranger)
