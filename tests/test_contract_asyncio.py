"""The contract suite on asyncio and uvloop (pytest-asyncio), plus asyncio's own cancellation APIs."""

from __future__ import annotations

import asyncio
import sys

import pytest

import aiogpu
from aiogpu.testing import Latch
from tests.contract import PROMPT, Contract
from tests.helpers import eager_tasks

if sys.version_info < (3, 11):
    from async_timeout import timeout as asyncio_timeout
else:
    asyncio_timeout = asyncio.timeout

TIMEOUTS = (TimeoutError, asyncio.TimeoutError)  # distinct before Python 3.11


@pytest.mark.asyncio
class TestContractOnAsyncio(Contract):
    pass


async def _held_event(device: aiogpu.Device, stream: aiogpu.Stream, latch: Latch) -> aiogpu.Event:
    latch.block(stream)
    return stream.record()


@pytest.mark.asyncio
@pytest.mark.parametrize("how", ["task.cancel", "asyncio.timeout", "asyncio.wait_for"])
async def test_asyncio_cancellation_is_prompt(device: aiogpu.Device, strategy: aiogpu.WaitStrategy, how: str) -> None:
    with aiogpu.Stream(device) as stream, Latch(device) as latch:
        event = await _held_event(device, stream, latch)
        if how == "task.cancel":
            task = asyncio.create_task(event.wait(strategy=strategy))
            await asyncio.sleep(0)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await asyncio.wait_for(task, PROMPT)
        elif how == "asyncio.timeout":
            with pytest.raises(TIMEOUTS):
                async with asyncio_timeout(0.05):
                    await event.wait(strategy=strategy)
        else:
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(event.wait(strategy=strategy), 0.05)
        assert not event.is_done
        latch.release()
        await asyncio.wait_for(event.wait(strategy=strategy), 10)


@pytest.mark.asyncio
async def test_await_event_in_gather(device: aiogpu.Device) -> None:
    with aiogpu.Stream(device) as first, aiogpu.Stream(device) as second:
        await asyncio.wait_for(asyncio.gather(first.record(), second.record(), first.wait_idle()), 10)


@pytest.mark.asyncio
async def test_a_wait_cancelled_as_its_work_completes_wakes_the_others(
    device: aiogpu.Device, strategy: aiogpu.WaitStrategy
) -> None:
    # The first wait drives the watcher; the second is cancelled, and the work released, in one
    # step of another task: on the simulator the driver then completes the recording before the
    # cancelled task has run, and must wake the other waiter past that task's cancelled future.
    with aiogpu.Stream(device) as stream, Latch(device) as latch:
        event = await _held_event(device, stream, latch)
        driving = asyncio.create_task(event.wait(strategy=strategy))
        await asyncio.sleep(0)
        cancelled = asyncio.create_task(event.wait(strategy=strategy))
        await asyncio.sleep(0)
        assert [wait.waiters for wait in aiogpu.pending_waits()] == [2]
        cancelled.cancel()
        latch.release()
        await asyncio.wait_for(driving, 10)
        with pytest.raises(asyncio.CancelledError):
            await cancelled
        assert aiogpu.pending_waits() == []


@pytest.mark.asyncio
async def test_a_watcher_whose_system_task_is_cancelled_before_it_ran_serves_later_waits(
    device: aiogpu.Device, strategy: aiogpu.WaitStrategy
) -> None:
    # The driving task is cancelled and hands the watcher over to a system task; a "cancel
    # every other task" (a shutdown routine, a test's teardown) reaches that task before its
    # first step, so it never runs: the loop's later waits must still be watched.
    with aiogpu.Stream(device) as stream, Latch(device) as latch:
        event = await _held_event(device, stream, latch)
        driving = asyncio.create_task(event.wait(strategy=strategy))
        other = asyncio.create_task(event.wait(strategy=strategy))
        await asyncio.sleep(0)
        driving.cancel()
        await asyncio.sleep(0)  # the driving task left: the system task is created, not started
        me = asyncio.current_task()
        for task in asyncio.all_tasks():
            if task is not me:
                task.cancel()
        await asyncio.gather(driving, other, return_exceptions=True)
        latch.release()
        with aiogpu.Stream(device) as later_stream, Latch(device) as later_latch:
            later = await _held_event(device, later_stream, later_latch)
            waiting = asyncio.create_task(later.wait(strategy=strategy))
            await asyncio.sleep(0)
            later_latch.release()
            await asyncio.wait_for(waiting, 10)
            assert later.is_done


@pytest.mark.asyncio
@pytest.mark.skipif(sys.version_info < (3, 12), reason="eager tasks are Python 3.12's")
async def test_a_system_task_that_ends_in_its_eager_first_step_leaves_later_waits_alone(device: aiogpu.Device) -> None:
    # The driving task's wait completes while another's is still pending on its stream: it hands
    # the watcher over to a system task, whose eager first step finds that one done too and ends
    # before create_task returns. Kept as the watcher's system task, the finished task kept the
    # loop alive, and its done-callback later failed a new wait ("the event loop is shutting down").
    from aiogpu._wait import _registry

    with (
        eager_tasks(),
        aiogpu.Stream(device) as stream,
        aiogpu.Stream(device) as later_stream,
        Latch(device) as latch,
        Latch(device) as later_latch,
    ):
        first, second = await _held_event(device, stream, latch), stream.record()
        later = await _held_event(device, later_stream, later_latch)

        async def first_then_later() -> None:
            await first.wait(strategy="poll")  # drives; hands over as its wait ends
            # The same step: the finished system task's done-callbacks have not run yet.
            assert _registry.current()._system_task is None
            await later.wait(strategy="poll")

        driving = asyncio.create_task(first_then_later())  # eager: watching closely now
        other = asyncio.create_task(second.wait(strategy="poll"))
        latch.release()  # the close watch completes the first alone, then hands over
        await asyncio.wait_for(other, 10)
        later_latch.release()
        await asyncio.wait_for(driving, 10)
        assert later.is_done
