"""The asyncio park, where a task waits to be woken: woken from a loop callback of its own (a
thread's poke, a timer), it resumes its task right in that callback, one loop iteration sooner
than a future would; woken from a task, it resumes its task on the next iteration, in one
callback with every other park woken meanwhile; cancelled, it behaves as a future."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import gc
import sys
import threading
import weakref
from typing import TYPE_CHECKING, Any

import pytest

import aiogpu
from aiogpu import _loop
from aiogpu._wait._watcher import DriverFlag
from aiogpu.testing import SimulatedDriver
from tests.helpers import eager_tasks

if TYPE_CHECKING:
    from collections.abc import Iterator

who = contextvars.ContextVar("who", default="nobody")


async def _parked(park: _loop.Park, resumed: list[str]) -> None:
    who.set("the parked task")
    await park
    resumed.append(who.get())


async def _park_with_a_task() -> tuple[_loop.Park, list[str], asyncio.Task[None]]:
    park = _loop.AsyncioBackend(asyncio.get_running_loop()).new_park()
    resumed: list[str] = []
    task = asyncio.create_task(_parked(park, resumed))
    await asyncio.sleep(0)
    assert not resumed, "the task should be parked"
    return park, resumed, task


async def _tasks_awaiting(signals: list[Any]) -> tuple[list[asyncio.Task[None]], list[int]]:
    """A task awaiting each signal, all parked; the list they add their index to as they resume."""
    resumed: list[int] = []

    async def parked(index: int) -> None:
        await signals[index]
        resumed.append(index)

    tasks = [asyncio.create_task(parked(index)) for index in range(len(signals))]
    await asyncio.sleep(0)
    return tasks, resumed


@contextlib.contextmanager
def _scheduled_callbacks(loop: asyncio.AbstractEventLoop, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[object]]:
    """The callbacks ``loop.call_soon`` is asked to schedule meanwhile."""
    scheduled: list[object] = []
    call_soon = loop.call_soon

    def counted(callback: Any, *args: Any, **kwargs: Any) -> asyncio.Handle:
        scheduled.append(callback)
        return call_soon(callback, *args, **kwargs)

    with monkeypatch.context() as patched:
        patched.setattr(loop, "call_soon", counted)
        yield scheduled


@pytest.mark.asyncio
@pytest.mark.parametrize("scheduled_by", ["call_soon", "call_soon_threadsafe from a thread", "call_later"])
async def test_a_park_woken_in_a_callback_resumes_its_task_within_that_callback(scheduled_by: str) -> None:
    park, resumed, task = await _park_with_a_task()
    seen_after_waking: list[list[str]] = []

    def callback() -> None:
        park.wake_in_callback()
        seen_after_waking.append(list(resumed))

    loop = asyncio.get_running_loop()
    if scheduled_by == "call_soon":
        loop.call_soon(callback)
    elif scheduled_by == "call_later":
        loop.call_later(1e-3, callback)
    else:
        thread = threading.Thread(target=loop.call_soon_threadsafe, args=(callback,))
        thread.start()
        thread.join()
    await asyncio.wait_for(task, 10)
    # The task ran in its own context (not the callback's) before the callback went on.
    assert seen_after_waking == [["the parked task"]]
    assert park.done()


@pytest.mark.asyncio
@pytest.mark.parametrize("wake", ["set_signal", "wake_in_callback"])
async def test_a_park_woken_from_a_task_resumes_its_task_on_the_next_iteration(wake: str) -> None:
    # Running one task's step inside another's is an error for asyncio: never nested.
    park, resumed, task = await _park_with_a_task()
    if wake == "set_signal":
        _loop.set_signal(park)
    else:
        park.wake_in_callback()
    assert resumed == []
    await asyncio.wait_for(task, 10)
    assert resumed == ["the parked task"]


@pytest.mark.asyncio
@pytest.mark.parametrize("parks", [True, False], ids=["park", "plain future"])
async def test_a_parked_task_cancelled_gets_cancelled_error_with_its_message(parks: bool) -> None:
    # The plain future is the reference: on every Python the park's task sees what a future's does.
    loop = asyncio.get_running_loop()
    park = _loop.AsyncioBackend(loop).new_park() if parks else loop.create_future()
    seen: list[asyncio.CancelledError] = []

    async def parked() -> None:
        try:
            await park
        except asyncio.CancelledError as error:
            seen.append(error)
            raise

    task = asyncio.create_task(parked())
    await asyncio.sleep(0)
    task.cancel("shutting down")
    with pytest.raises(asyncio.CancelledError) as raised:
        await task
    assert [error.args for error in seen] == [("shutting down",)]  # the parked task has the message
    if sys.version_info >= (3, 11):
        assert raised.value.args == ("shutting down",)
    else:  # a task's awaiter gets a new error without it, the task's as its context (bpo-45390)
        assert raised.value.args == ()
        assert raised.value.__context__ is seen[0]
    assert park.cancelled()
    if parks:
        park.wake_in_callback()  # a poke that comes too late is nothing
    _loop.set_signal(park)


@pytest.mark.asyncio
async def test_a_park_woken_before_it_is_awaited_does_not_suspend() -> None:
    park = _loop.AsyncioBackend(asyncio.get_running_loop()).new_park()
    park.wake_in_callback()
    await park
    assert park.done()
    assert not park.cancelled()
    with pytest.raises(asyncio.InvalidStateError):
        park.set_result(None)


@pytest.mark.asyncio
@pytest.mark.parametrize("wake", ["set_signal", "wake_in_callback"])
async def test_a_park_awaited_by_a_second_task_wakes_both(wake: str) -> None:
    # Only the first done-callback (the awaiting task's wake-up) is the park's own: any other is
    # a future's, never dropped.
    park, resumed, task = await _park_with_a_task()
    second = asyncio.create_task(_parked(park, resumed))
    await asyncio.sleep(0)
    if wake == "set_signal":
        _loop.set_signal(park)
    else:
        asyncio.get_running_loop().call_soon(park.wake_in_callback)
    await asyncio.wait_for(asyncio.gather(task, second), 10)
    assert resumed == ["the parked task", "the parked task"]


@pytest.mark.asyncio
async def test_a_lone_thread_wait_returns_within_the_callback_of_its_threads_poke(monkeypatch: pytest.MonkeyPatch) -> None:
    # The thread strategy's wake-up path: the waiter thread sees the completion and schedules a
    # poke; the waiting task (driving the watcher itself) resumes, finds its wait done and
    # returns from it before that callback ends, not on another loop iteration.
    from aiogpu._wait import _policy, _watcher

    monkeypatch.setitem(_policy.COLD_POLL, "thread", (60.0, 60.0))  # the loop never asks itself
    returned = threading.Event()
    returned_within_poke: list[bool] = []
    poke = _watcher.Watcher._poke_in_callback

    def observed(self: _watcher.Watcher) -> None:
        before = returned.is_set()
        poke(self)
        returned_within_poke.append(not before and returned.is_set())

    monkeypatch.setattr(_watcher.Watcher, "_poke_in_callback", observed)
    sim = SimulatedDriver()
    with aiogpu.Stream(sim.device(0)) as stream:
        work = sim.launch(stream)
        event = stream.record()

        async def wait() -> None:
            await event.wait(strategy="thread")
            returned.set()

        task = asyncio.create_task(wait())
        await asyncio.sleep(0)
        work.release()
        await asyncio.wait_for(task, 10)
    assert returned_within_poke[-1:] == [True], returned_within_poke


@pytest.mark.asyncio
async def test_parks_woken_together_resume_in_one_callback_in_the_order_woken(monkeypatch: pytest.MonkeyPatch) -> None:
    # A sweep wakes hundreds of tasks at once: on asyncio's own loops a scheduled callback is a
    # Handle made and run in Python, so they resume in one, not one each.
    loop = asyncio.get_running_loop()
    backend = _loop.AsyncioBackend(loop)
    parks = [backend.new_park() for _ in range(5)]
    tasks, resumed = await _tasks_awaiting(parks)
    with _scheduled_callbacks(loop, monkeypatch) as scheduled:
        for index in (3, 1, 4, 0, 2):
            parks[index].set_result(None)
    assert len(scheduled) == 1
    await asyncio.wait_for(asyncio.gather(*tasks), 10)
    assert resumed == [3, 1, 4, 0, 2]


class _Waiters:
    """What ``Backend.set_signals`` is given: a completed wait's signals (``_entries.Entry``)."""

    def __init__(self, signal: Any, *more: Any) -> None:
        self.signal = signal
        self.more_signals = dict.fromkeys(more) if more else None

    def signals(self) -> list[_loop.Signal]:
        return ([] if self.signal is None else [self.signal]) + list(self.more_signals or ())


@pytest.mark.asyncio
@pytest.mark.parametrize("parks", [True, False], ids=["parks (asyncio)", "futures (uvloop)"])
async def test_set_signals_wakes_every_task_in_order_past_a_cancelled_one(parks: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    # The sweep's wake-up of 10,000 tasks: on asyncio's own loops the parks are set without
    # their ``set_result`` and resume in one callback; a task cancelled but not yet gone, a
    # first waiter that left, the driving task's flag and a second awaiter are all handled.
    loop = asyncio.get_running_loop()
    backend = _loop.AsyncioBackend(loop)
    backend._parks_for_signals = parks
    signals = [backend.new_signal() for _ in range(6)]
    tasks, resumed = await _tasks_awaiting(signals)
    tasks[2].cancel()  # its signal is cancelled now; the task has not run its cancellation yet
    flag = DriverFlag()
    waking: list[_loop.Waiters] = [
        _Waiters(signals[4], signals[1], flag),
        _Waiters(None, signals[5]),
        _Waiters(signals[2], signals[0]),
        _Waiters(signals[3]),
    ]
    with _scheduled_callbacks(loop, monkeypatch) as scheduled:
        backend.set_signals(waking)
    assert waking == []
    assert flag.done()
    assert len(scheduled) == (1 if parks else 5)
    await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 10)
    assert resumed == [4, 1, 5, 0, 3]
    assert tasks[2].cancelled()


@pytest.mark.asyncio
async def test_set_signals_schedules_nothing_when_only_a_flag_is_woken(monkeypatch: pytest.MonkeyPatch) -> None:
    # A lone wait's task drives the watcher and checks its flag itself: no callback to run.
    loop = asyncio.get_running_loop()
    backend = _loop.AsyncioBackend(loop)
    flag = DriverFlag()
    with _scheduled_callbacks(loop, monkeypatch) as scheduled:
        backend.set_signals([_Waiters(flag)])
    assert flag.done()
    assert scheduled == []


def test_a_task_that_raises_keyboard_interrupt_as_it_resumes_does_not_strand_the_others() -> None:
    loop = asyncio.new_event_loop()
    try:
        backend = _loop.AsyncioBackend(loop)
        parks = [backend.new_park() for _ in range(3)]
        resumed: list[int] = []

        async def parked(index: int) -> None:
            await parks[index]
            if index == 0:
                raise KeyboardInterrupt
            resumed.append(index)

        tasks = [loop.create_task(parked(index)) for index in range(3)]

        async def wake_all() -> None:
            for park in parks:
                park.set_result(None)  # they resume in one callback, task 0 first

        with pytest.raises(KeyboardInterrupt):
            loop.run_until_complete(wake_all())
        assert isinstance(tasks[0].exception(), KeyboardInterrupt)
        loop.run_forever()  # one iteration: the stop that run_until_complete had scheduled comes next
        assert resumed == [1, 2]
        assert all(task.done() for task in tasks[1:])
    finally:
        loop.close()


@pytest.mark.asyncio
async def test_a_task_cancelled_after_its_park_was_woken_ends_cancelled() -> None:
    park, resumed, task = await _park_with_a_task()
    park.set_result(None)
    assert task.cancel()  # woken, not resumed yet: the task is cancelled as it resumes
    with pytest.raises(asyncio.CancelledError):
        await task
    assert resumed == []
    assert not park.cancelled()


@pytest.mark.asyncio
@pytest.mark.skipif(sys.version_info < (3, 12), reason="eager tasks are Python 3.12's")
@pytest.mark.parametrize("strategy", ["auto", "thread"])
async def test_waits_of_eager_tasks_wake(strategy: aiogpu.WaitStrategy) -> None:
    # An eager task runs its first step inside the code that creates it: here, inside the steps
    # of tasks that parks resume (each starts another waiter as it wakes).
    with eager_tasks():
        sim = SimulatedDriver()
        with aiogpu.Stream(sim.device(0)) as stream:
            work = sim.launch(stream)
            events = [stream.record() for _ in range(20)]
            woken: list[int] = []
            tasks: list[asyncio.Task[None]] = []

            async def wait(index: int) -> None:
                await events[index % 20].wait(strategy=strategy)
                woken.append(index)
                if index < 20:
                    tasks.append(asyncio.create_task(wait(index + 20)))  # eager: waits at once

            tasks += [asyncio.create_task(wait(index)) for index in range(20)]
            work.release()
            while len(tasks) < 40:
                await asyncio.wait_for(asyncio.gather(*tasks), 10)
            await asyncio.wait_for(asyncio.gather(*tasks), 10)
            assert sorted(woken) == list(range(40))
            for event in events:
                event.close()


@pytest.mark.asyncio
async def test_anyio_does_not_cancel_a_task_whose_wait_completed(monkeypatch: pytest.MonkeyPatch) -> None:
    # Three tasks wait for one event; the first to return cancels their task group. The others'
    # waits completed in the same sweep: anyio skips cancelling a task whose future is done, so
    # their waits return too (it would not for a park that were no future).
    import anyio

    sim = SimulatedDriver()
    with aiogpu.Stream(sim.device(0)) as stream:
        work = sim.launch(stream)
        event = stream.record()
        returned: list[str] = []
        async with anyio.create_task_group() as group:

            async def wait(name: str) -> None:
                await event.wait(strategy="poll")
                returned.append(name)
                group.cancel_scope.cancel()

            for name in "abc":
                group.start_soon(wait, name)
            await anyio.wait_all_tasks_blocked()
            work.release()
        assert sorted(returned) == ["a", "b", "c"]


def _close_a_loop_with_woken_parks_unresumed(backend_of: list[_loop.AsyncioBackend]) -> weakref.ref[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    loop.set_exception_handler(lambda loop, context: None)  # "Task was destroyed but it is pending"
    backend = _loop.AsyncioBackend(loop)
    backend_of.append(backend)  # kept, as a watcher keeps its backend
    parks = [backend.new_park() for _ in range(3)]

    async def parked(park: _loop.Park) -> None:
        await park

    async def wake_then_stop() -> None:
        for park in parks:
            park.set_result(None)
        loop.stop()  # before the callback that would resume them runs

    tasks = [loop.create_task(parked(park)) for park in parks]
    loop.run_until_complete(asyncio.sleep(0))
    tasks.append(loop.create_task(wake_then_stop()))
    loop.run_forever()
    loop.close()
    return weakref.ref(loop)


def test_a_loop_closed_before_it_resumed_woken_parks_is_freed() -> None:
    # The backend holds the parks to resume (which hold their tasks, which hold the loop) only
    # weakly, through the loop's own callback: a loop closed before running it is freed.
    backend_of: list[_loop.AsyncioBackend] = []
    freed = _close_a_loop_with_woken_parks_unresumed(backend_of)
    gc.collect()
    assert freed() is None
    assert backend_of[0]._batch() is None
