"""The awaiting contract, written once, run for every loop, strategy and device.

``Contract`` is collected through ``test_contract_asyncio.py`` (pytest-asyncio: asyncio and
uvloop) and ``test_contract_trio.py`` (anyio's plugin: trio), with the ``device`` fixture
giving the simulated device and, on the GPU lane, the real one. Pending work is held by a
``Latch`` and released by the test; nothing sleeps to let the GPU finish.
"""

from __future__ import annotations

import threading
import time
from functools import partial

import anyio
import anyio.abc
import anyio.lowlevel
import pytest

import aiogpu
from aiogpu._wait import _policy
from aiogpu.testing import Latch, launch_spin
from tests.helpers import in_waiter_thread, settle_waiter_threads

# Generous bound for "returned promptly": the work is held, so a wait that did not return
# on cancellation would run into fail_after instead.
PROMPT = 2.0


class Contract:
    async def test_await_returns_when_work_completes(self, device: aiogpu.Device, strategy: aiogpu.WaitStrategy) -> None:
        with aiogpu.Stream(device) as stream, Latch(device) as latch:
            latch.block(stream)
            event = stream.record()
            woke = anyio.Event()

            async def waiter() -> None:
                await event.wait(strategy=strategy)
                woke.set()

            with anyio.fail_after(10):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(waiter)
                    await anyio.wait_all_tasks_blocked()
                    assert not woke.is_set()
                    assert not event.is_done
                    latch.release()
            assert woke.is_set()
            assert event.is_done

    async def test_plain_await_uses_the_default_strategy(self, device: aiogpu.Device, strategy: aiogpu.WaitStrategy) -> None:
        previous = aiogpu.get_default_wait_strategy()
        aiogpu.set_default_wait_strategy(strategy)
        try:
            with aiogpu.Stream(device) as stream:
                launch_spin(stream, 0.01)
                with anyio.fail_after(10):
                    await stream.record()
                assert stream.is_idle
        finally:
            aiogpu.set_default_wait_strategy(previous)

    async def test_many_tasks_awaiting_one_event_all_wake(self, device: aiogpu.Device, strategy: aiogpu.WaitStrategy) -> None:
        woken = 0
        with aiogpu.Stream(device) as stream, Latch(device) as latch:
            latch.block(stream)
            event = stream.record()

            async def waiter() -> None:
                nonlocal woken
                await event.wait(strategy=strategy)
                woken += 1

            with anyio.fail_after(10):
                async with anyio.create_task_group() as tg:
                    for _ in range(50):
                        tg.start_soon(waiter)
                    await anyio.wait_all_tasks_blocked()
                    assert woken == 0
                    latch.release()
        assert woken == 50

    async def test_waiting_never_blocks_the_loop(self, device: aiogpu.Device, strategy: aiogpu.WaitStrategy) -> None:
        # The only task that can release the latch runs on the same loop: a wait that blocked
        # the loop would never let it run, and fail_after would fire instead.
        ticks = 0
        with aiogpu.Stream(device) as stream, Latch(device) as latch:
            latch.block(stream)
            event = stream.record()

            async def ticker() -> None:
                nonlocal ticks
                for _ in range(20):
                    await anyio.lowlevel.checkpoint()
                    ticks += 1
                latch.release()

            with anyio.fail_after(10):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(ticker)
                    await event.wait(strategy=strategy)
        assert ticks == 20

    async def test_await_on_completed_event_is_a_checkpoint(self, device: aiogpu.Device, strategy: aiogpu.WaitStrategy) -> None:
        with aiogpu.Stream(device) as stream:
            event = stream.record()
            await event.wait(strategy=strategy)
            assert event.is_done
            with anyio.CancelScope() as scope:
                scope.cancel()
                await event.wait(strategy=strategy)
                pytest.fail("a completed event's wait did not raise the pending cancellation")
            assert scope.cancelled_caught

    async def test_await_on_completed_event_lets_other_tasks_run(
        self, device: aiogpu.Device, strategy: aiogpu.WaitStrategy
    ) -> None:
        other_ran = False

        async def other() -> None:
            nonlocal other_ran
            other_ran = True

        with aiogpu.Stream(device) as stream:
            event = stream.record()
            async with anyio.create_task_group() as tg:
                tg.start_soon(other)
                for _ in range(3):
                    await event.wait(strategy=strategy)
                assert other_ran

    async def test_cancellation_is_prompt_and_leaves_the_event_usable(
        self, device: aiogpu.Device, strategy: aiogpu.WaitStrategy
    ) -> None:
        with aiogpu.Stream(device) as stream, Latch(device) as latch:
            latch.block(stream)
            event = stream.record()
            started = time.monotonic()
            with anyio.fail_after(PROMPT), anyio.move_on_after(0.05) as scope:
                await event.wait(strategy=strategy)
            assert scope.cancelled_caught
            assert time.monotonic() - started < PROMPT
            assert not event.is_done  # the GPU work was left alone
            latch.release()
            with anyio.fail_after(10):
                await event.wait(strategy=strategy)
            assert event.is_done

    async def test_fail_after_raises_timeout_while_work_is_held(
        self, device: aiogpu.Device, strategy: aiogpu.WaitStrategy
    ) -> None:
        with aiogpu.Stream(device) as stream, Latch(device) as latch:
            latch.block(stream)
            event = stream.record()
            with pytest.raises(TimeoutError), anyio.fail_after(0.05):
                await event.wait(strategy=strategy)
            latch.release()
            with anyio.fail_after(10):
                await event

    @pytest.mark.slow
    async def test_cancelled_waits_leak_nothing(self, device: aiogpu.Device, strategy: aiogpu.WaitStrategy) -> None:
        with aiogpu.Stream(device) as stream, Latch(device) as latch:
            latch.block(stream)
            events = [stream.record() for _ in range(10)]
            async with anyio.create_task_group() as tg:
                for event in events:
                    tg.start_soon(partial(event.wait, strategy=strategy))
                await anyio.wait_all_tasks_blocked()
                tg.cancel_scope.cancel()
            latch.release()
            with anyio.fail_after(10):
                for event in events:
                    await event
                    event.close()
        statistics = settle_waiter_threads()
        assert statistics.subscribers == 0
        assert statistics.running_jobs == statistics.queued_jobs == 0
        assert statistics.threads == 0

    @pytest.mark.slow
    async def test_other_waits_go_on_when_the_first_waiter_is_cancelled(
        self, device: aiogpu.Device, strategy: aiogpu.WaitStrategy
    ) -> None:
        # The first task to wait drives the watcher; cancelling it must hand the other
        # waits (here on another stream) over, not strand them.
        with aiogpu.Stream(device) as first, aiogpu.Stream(device) as second, Latch(device) as latch:
            latch.block(first)
            latch.block(second)
            held, other = first.record(), second.record()
            woke = anyio.Event()

            async def other_waiter() -> None:
                await other.wait(strategy=strategy)
                woke.set()

            with anyio.fail_after(10):
                async with anyio.create_task_group() as tg:
                    first_scope = anyio.CancelScope()
                    tg.start_soon(self._wait_in, first_scope, held, strategy)
                    await anyio.wait_all_tasks_blocked()
                    tg.start_soon(other_waiter)
                    await anyio.wait_all_tasks_blocked()
                    first_scope.cancel()
                    await anyio.wait_all_tasks_blocked()
                    assert not woke.is_set()
                    latch.release()
            assert woke.is_set()

    @pytest.mark.slow
    async def test_tasks_that_join_a_recording_after_others_left_it_are_woken(
        self, device: aiogpu.Device, strategy: aiogpu.WaitStrategy
    ) -> None:
        # Tasks awaiting one recording share one entry of the watcher, which keeps the first
        # task's signal apart from the others': whichever leave, first or not, are not woken,
        # and those that join after them are (the last takes the first one's place).
        with aiogpu.Stream(device) as stream, Latch(device) as latch:
            latch.block(stream)
            event = stream.record()
            woke: list[str] = []
            scopes = {name: anyio.CancelScope() for name in "abcd"}

            async def waiter(name: str) -> None:
                with scopes[name]:
                    await event.wait(strategy=strategy)
                    woke.append(name)

            with anyio.fail_after(10):
                async with anyio.create_task_group() as tg:
                    for name in "abc":  # one at a time: "a" waits first
                        tg.start_soon(waiter, name)
                        await anyio.wait_all_tasks_blocked()
                    scopes["a"].cancel()
                    await anyio.wait_all_tasks_blocked()
                    tg.start_soon(waiter, "d")
                    await anyio.wait_all_tasks_blocked()
                    scopes["c"].cancel()
                    await anyio.wait_all_tasks_blocked()
                    assert [wait.waiters for wait in aiogpu.pending_waits()] == [2]
                    latch.release()
            assert sorted(woke) == ["b", "d"]
            event.close()

    @pytest.mark.slow
    async def test_a_wait_that_starts_while_the_watcher_winds_down_is_watched(
        self, device: aiogpu.Device, strategy: aiogpu.WaitStrategy
    ) -> None:
        # A cancelled driver hands its (now abandoned) wait to the system task, which finds
        # nothing left and stops; a wait starting at any moment of that must still be watched.
        for pause in range(6):
            with aiogpu.Stream(device) as stream, Latch(device) as latch:
                latch.block(stream)
                abandoned, awaited = stream.record(), stream.record()
                with anyio.fail_after(10):
                    async with anyio.create_task_group() as tg:
                        scope = anyio.CancelScope()
                        tg.start_soon(self._wait_in, scope, abandoned, strategy)
                        await anyio.wait_all_tasks_blocked()
                        scope.cancel()
                        for _ in range(pause):
                            await anyio.lowlevel.checkpoint()
                        tg.start_soon(partial(awaited.wait, strategy=strategy))
                        await anyio.wait_all_tasks_blocked()
                        latch.release()

    @staticmethod
    async def _wait_in(scope: anyio.CancelScope, event: aiogpu.Event, strategy: aiogpu.WaitStrategy) -> None:
        with scope:
            await event.wait(strategy=strategy)

    async def test_other_waits_go_on_when_the_first_waiter_finishes(
        self, device: aiogpu.Device, strategy: aiogpu.WaitStrategy
    ) -> None:
        with (
            aiogpu.Stream(device) as first_stream,
            aiogpu.Stream(device) as second_stream,
            Latch(device) as first_latch,
            Latch(device) as second_latch,
        ):
            first_latch.block(first_stream)
            second_latch.block(second_stream)
            first, second = first_stream.record(), second_stream.record()
            order: list[str] = []
            first_woke = anyio.Event()

            async def waiter(name: str, event: aiogpu.Event) -> None:
                await event.wait(strategy=strategy)
                order.append(name)
                first_woke.set()

            with anyio.fail_after(10):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(waiter, "first", first)  # the first waiter drives the watcher
                    await anyio.wait_all_tasks_blocked()
                    tg.start_soon(waiter, "second", second)
                    await anyio.wait_all_tasks_blocked()
                    first_latch.release()
                    await first_woke.wait()  # the driver's own wait ends; the second goes on
                    await anyio.wait_all_tasks_blocked()
                    assert order == ["first"]
                    second_latch.release()
            assert order == ["first", "second"]

    async def test_a_wait_for_earlier_work_started_second_wakes_with_its_work(
        self, device: aiogpu.Device, strategy: aiogpu.WaitStrategy
    ) -> None:
        # Waits start in any order; a stream completes its work in record order. The wait for
        # the earlier recording, started after the one for the later recording, must wake once
        # its own work is done, while the later work is still held.
        with aiogpu.Stream(device) as stream, Latch(device) as first_latch, Latch(device) as second_latch:
            first_latch.block(stream)
            earlier = stream.record()
            second_latch.block(stream)
            later = stream.record()
            woke: list[str] = []
            earlier_woke = anyio.Event()

            async def waiter(name: str, event: aiogpu.Event) -> None:
                await event.wait(strategy=strategy)
                woke.append(name)
                if event is earlier:
                    earlier_woke.set()

            with anyio.fail_after(10):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(waiter, "later", later)
                    await anyio.wait_all_tasks_blocked()
                    tg.start_soon(waiter, "earlier", earlier)
                    await anyio.wait_all_tasks_blocked()
                    first_latch.release()
                    await earlier_woke.wait()
                    assert woke == ["earlier"]
                    assert not later.is_done
                    second_latch.release()
            assert woke == ["earlier", "later"]

    async def test_a_wait_recorded_behind_a_watched_one_is_not_asked_until_that_one_is_done(
        self, device: aiogpu.Device, strategy: aiogpu.WaitStrategy, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        # A stream completes in record order: while a wait for its earlier recording is pending
        # and watched, a new wait for a later one is pending too, and a driver query for it at
        # its start would be wasted. Once the earlier work is done, both wake, in order. A later
        # wait behind a head nobody waits for any more is asked at once.
        asked: list[int] = []
        query = device._driver.event_query

        def noted(event: int) -> bool:
            asked.append(event)
            return query(event)

        monkeypatch.setattr(device._driver, "event_query", noted)
        with aiogpu.Stream(device) as stream, Latch(device) as latch:
            latch.block(stream)
            earlier = stream.record()
            launch_spin(stream, 1e-5)
            later = stream.record()
            woke: list[str] = []

            async def waiter(name: str, event: aiogpu.Event) -> None:
                await event.wait(strategy=strategy)
                woke.append(name)

            with anyio.fail_after(10):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(waiter, "earlier", earlier)
                    await anyio.wait_all_tasks_blocked()
                    tg.start_soon(waiter, "later", later)
                    await anyio.wait_all_tasks_blocked()
                    assert later._handle not in asked
                    assert earlier._handle in asked  # the check above could fail: queries are noted
                    latch.release()
            assert woke == ["earlier", "later"]

            latch.block(stream)
            head = stream.record()
            behind = stream.record()
            with anyio.fail_after(10):
                async with anyio.create_task_group() as tg:  # the head's only waiter leaves
                    tg.start_soon(partial(head.wait, strategy=strategy))
                    await anyio.wait_all_tasks_blocked()
                    tg.cancel_scope.cancel()
                asked.clear()
                async with anyio.create_task_group() as tg:
                    tg.start_soon(waiter, "behind", behind)
                    await anyio.wait_all_tasks_blocked()
                    assert behind._handle in asked
                    latch.release()
            assert woke[-1] == "behind"

    async def test_pending_waits_hold_up_no_other_stream(
        self, device: aiogpu.Device, strategy: aiogpu.WaitStrategy, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        # Work queued on any other stream (the legacy default stream, blocking and non-blocking
        # ones) while waits are pending, in the waiter threads too, must run while the awaited
        # work is held: a wait that stalled it would deadlock a server whose held work waits
        # for that other work. (A helper stream parked on the event, cuStreamWaitEvent, then a
        # blocking-sync record, did stall it on an H100 from 2 pending waits on.)
        if strategy == "callback":
            pytest.skip("a pending host function delays device work added to other streams afterwards (CUDA documents it)")
        held_count = 8
        polled_events = {"poll": 0, "auto": min(held_count, _policy.AUTO_WATCH_MAX)}.get(strategy, held_count)
        polled: set[int] = set()
        all_polled = threading.Event()
        driver = device._driver
        query = driver.event_query

        def noted(event: int) -> bool:  # which events the waiter threads have begun to poll
            if in_waiter_thread():
                polled.add(event)
                if len(polled) >= polled_events:
                    all_polled.set()
            return query(event)

        monkeypatch.setattr(driver, "event_query", noted)
        if polled_events == 0:
            all_polled.set()
        held_streams = [aiogpu.Stream(device, nonblocking=True) for _ in range(held_count)]
        own_streams = [aiogpu.Stream(device) for _ in range(4)] + [aiogpu.Stream(device, nonblocking=True) for _ in range(11)]
        try:
            with Latch(device) as latch:
                held = []
                for stream in held_streams:
                    latch.block(stream)
                    held.append(stream.record())
                with anyio.fail_after(20):
                    async with anyio.create_task_group() as tg:
                        for event in held:
                            tg.start_soon(partial(event.wait, strategy=strategy))
                        await anyio.wait_all_tasks_blocked()
                        # The loop sleeps meanwhile: that is when waits go off the loop.
                        assert await anyio.to_thread.run_sync(all_polled.wait, 10.0), f"{len(polled)} of {polled_events}"
                        after = []
                        for stream in (device.default_stream, *own_streams):
                            launch_spin(stream, 1e-5)
                            after.append(stream.record())
                        for event in after:
                            await event.wait(strategy=strategy)
                        assert not any(event.is_done for event in held)
                        latch.release()
        finally:
            for stream in held_streams + own_streams:
                stream.close()

    async def test_never_recorded_event_raises(self, device: aiogpu.Device, strategy: aiogpu.WaitStrategy) -> None:
        with aiogpu.Event(device) as event:
            with pytest.raises(aiogpu.EventStateError, match="never recorded"):
                await event.wait(strategy=strategy)
            with pytest.raises(aiogpu.EventStateError, match="never recorded"):
                await event

    async def test_closed_event_raises(self, device: aiogpu.Device, strategy: aiogpu.WaitStrategy) -> None:
        with aiogpu.Stream(device) as stream:
            event = stream.record()
            event.close()
            with pytest.raises(aiogpu.ClosedResourceError):
                await event.wait(strategy=strategy)
            with pytest.raises(anyio.ClosedResourceError):
                await event

    async def test_close_while_waiting_defers_destruction(self, device: aiogpu.Device, strategy: aiogpu.WaitStrategy) -> None:
        with aiogpu.Stream(device) as stream, Latch(device) as latch:
            latch.block(stream)
            event = stream.record()
            with anyio.fail_after(10):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(partial(event.wait, strategy=strategy))
                    await anyio.wait_all_tasks_blocked()
                    event.close()  # the pending wait keeps the handle alive until it ends
                    assert event.is_closed
                    latch.release()

    async def test_close_right_after_waits_start_fails_no_wait(
        self, device: aiogpu.Device, strategy: aiogpu.WaitStrategy
    ) -> None:
        # Closed while its waits still watch closely, before any waiter thread or host function
        # took the handle: those must still take it (the waits hold it), and nobody may fail.
        with aiogpu.Stream(device) as first, aiogpu.Stream(device) as second, Latch(device) as latch:
            latch.block(first)
            latch.block(second)
            closed, other = first.record(), second.record()

            async def wait_on(event: aiogpu.Event, *, task_status: anyio.abc.TaskStatus[None]) -> None:
                task_status.started()
                await event.wait(strategy=strategy)  # entered before the parent goes on

            with anyio.fail_after(10):
                async with anyio.create_task_group() as tg:
                    for event in (closed, closed, other):
                        await tg.start(wait_on, event)
                    closed.close()
                    await anyio.wait_all_tasks_blocked()  # parked: waiter threads, host functions
                    latch.release()

    async def test_rerecorded_event_waits_for_the_new_work(self, device: aiogpu.Device, strategy: aiogpu.WaitStrategy) -> None:
        with aiogpu.Stream(device) as stream, aiogpu.Event(device) as event:
            event.record(stream)
            with anyio.fail_after(10):
                await event.wait(strategy=strategy)
            with Latch(device) as latch:
                latch.block(stream)
                event.record(stream)
                assert not event.is_done
                with anyio.move_on_after(0.05):
                    await event.wait(strategy=strategy)
                assert not event.is_done
                latch.release()
                with anyio.fail_after(10):
                    await event.wait(strategy=strategy)

    async def test_wait_idle_covers_work_enqueued_before_the_call(
        self, device: aiogpu.Device, strategy: aiogpu.WaitStrategy
    ) -> None:
        with aiogpu.Stream(device) as stream, Latch(device) as latch:
            latch.block(stream)
            finished = anyio.Event()

            async def idle_waiter() -> None:
                await stream.wait_idle(strategy=strategy)
                finished.set()

            with anyio.fail_after(10):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(idle_waiter)
                    await anyio.wait_all_tasks_blocked()
                    assert not finished.is_set()
                    latch.release()
            assert stream.is_idle

    async def test_event_of_another_device_is_awaitable(
        self, device: aiogpu.Device, second_device: aiogpu.Device, strategy: aiogpu.WaitStrategy
    ) -> None:
        device.set_current()
        with aiogpu.Stream(second_device) as stream, Latch(second_device) as latch:
            latch.block(stream)
            event = stream.record()
            with anyio.fail_after(10):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(partial(event.wait, strategy=strategy))
                    await anyio.wait_all_tasks_blocked()
                    latch.release()
            assert event.is_done
        assert device._driver.context_get_current() == device._context

    async def test_failed_work_raises_cuda_error_in_every_awaiter(
        self, device: aiogpu.Device, strategy: aiogpu.WaitStrategy
    ) -> None:
        if device.driver_name != "simulated":
            pytest.skip("a real fault kills the process's context: tests/gpu/test_faults.py runs it in child processes")
        from aiogpu.testing import SimulatedDriver

        sim = device._driver
        assert isinstance(sim, SimulatedDriver)
        errors: list[BaseException] = []
        with aiogpu.Stream(device) as stream:
            work = sim.launch(stream)
            events = [stream.record() for _ in range(4)]

            async def waiter(event: aiogpu.Event) -> None:
                try:
                    await event.wait(strategy=strategy)
                except aiogpu.CudaError as exc:
                    errors.append(exc)

            with anyio.fail_after(10):
                async with anyio.create_task_group() as tg:
                    for event in events * 5:
                        tg.start_soon(waiter, event)
                    await anyio.wait_all_tasks_blocked()
                    work.fail("CUDA_ERROR_ILLEGAL_ADDRESS")
        assert len(errors) == 20
        assert len({id(error) for error in errors}) == 20  # each awaiter raises its own exception
        for error in errors:
            assert isinstance(error, aiogpu.CudaError)
            assert error.name == "CUDA_ERROR_ILLEGAL_ADDRESS"
            assert error.is_context_lost
