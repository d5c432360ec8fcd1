"""StreamPool: streams spread over devices, lent one task at a time, fair and cancellation-safe.

Runs on a simulated driver with three devices; tests/gpu/test_gpu.py spreads a pool over the
real GPUs.
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import Awaitable, Callable

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


def run_asyncio(main: Callable[[], Awaitable[object]]) -> None:
    async def run() -> None:
        await main()

    asyncio.run(run())


def run_trio(main: Callable[[], Awaitable[object]]) -> None:
    import trio

    trio.run(main)


RUNNERS: dict[str, Callable[[Callable[[], Awaitable[object]]], None]] = {"asyncio": run_asyncio, "trio": run_trio}


@pytest.mark.parametrize("second", ["asyncio", "trio"])
def test_a_pool_used_from_a_second_running_loop_refuses_at_once(second: str) -> None:
    """Waiters wake through their own loop: a stream handed from one loop to a task of another
    was set from the wrong thread (trio: 'must be called from async context', and its task
    waited forever). The second loop now gets a clear error before it waits."""
    device = SimulatedDriver().device(0)
    pool = aiogpu.StreamPool([device], streams_per_device=1)
    held, second_done = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    async def first_loop() -> None:
        async with pool.stream():
            held.set()
            await anyio.to_thread.run_sync(second_done.wait, 10)

    first = threading.Thread(target=lambda: asyncio.run(first_loop()))
    first.start()
    try:
        assert held.wait(10)

        async def second_loop() -> None:
            with anyio.fail_after(5):  # (it used to wait here for good)
                try:
                    await pool.acquire()
                except RuntimeError as exc:
                    errors.append(exc)
                with pytest.raises(RuntimeError, match="still running"):
                    async with pool.stream():
                        pass

        RUNNERS[second](second_loop)
    finally:
        second_done.set()
        first.join(10)
    (error,) = errors
    message = str(error)
    assert "<aiogpu.StreamPool devices=[0] 1/1 in use, 0 waiting> is used by the asyncio event loop" in message
    assert ("from a trio run" if second == "trio" else "from the asyncio event loop") in message
    assert "create a pool per loop" in message
    pool.close()


@pytest.mark.parametrize("runs", [["asyncio", "asyncio"], ["trio", "asyncio"], ["asyncio", "trio", "trio"]])
def test_a_pool_serves_one_loop_after_another(runs: list[str]) -> None:
    """One pool for a whole test session: each run's loop takes it over once the last is over."""
    device = SimulatedDriver().device(0)
    with aiogpu.StreamPool([device], streams_per_device=1) as pool:
        for run in runs:

            async def use() -> None:
                with anyio.fail_after(5):
                    async with anyio.create_task_group() as tg:
                        for _ in range(3):  # the second and third wait, and are handed the stream
                            tg.start_soon(borrow)

            async def borrow() -> None:
                async with pool.stream() as stream:
                    await stream.record()

            RUNNERS[run](use)
        assert pool.in_use == 0


def test_a_stopped_loop_hands_an_idle_pool_on() -> None:
    device = SimulatedDriver().device(0)
    stopped = asyncio.new_event_loop()
    try:
        with aiogpu.StreamPool([device], streams_per_device=1) as pool:
            stream = stopped.run_until_complete(pool.acquire())
            with pytest.raises(RuntimeError, match="still running"):
                # stopped, but a stream is lent: its tasks may give it back when it runs again
                asyncio.run(pool.acquire())
            pool.release(stream)  # outside any loop, while the bound one is stopped
            other = asyncio.run(pool.acquire())  # idle now: this loop takes it over
            pool.release(other)  # (that loop is closed: any caller may)
    finally:
        stopped.close()
