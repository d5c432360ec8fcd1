"""The asyncio park, where a task waits to be woken, on both asyncio backends.

Every backend's park behaves as a future: woken from a task, its task resumes on the loop's next
iteration; cancelled, its task gets ``CancelledError``. The private backend's park (asyncio's own
loops, ``private_only``) also resumes its task right in a loop callback of its own that wakes it
(a thread's poke, a timer), one loop iteration sooner than a future would, and the tasks that
parks woken together resume in one callback. Its capability checks fall back to the public
backend, without an error, wherever asyncio's internals are not as expected."""

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
from aiogpu._wait import _backends, _registry
from aiogpu._wait._backends import _asyncio, _asyncio_private
from aiogpu._wait._watcher import DriverFlag
from aiogpu.testing import SimulatedDriver
from tests.helpers import eager_tasks

if TYPE_CHECKING:
    from collections.abc import Iterator

who = contextvars.ContextVar("who", default="nobody")

#: Tests of what only the private backend does: on asyncio's own loop, which it supports.
private_only = pytest.mark.asyncio(loop_factories=["asyncio"])


def _backend() -> _backends.Backend:
    """The running loop's backend, as the watcher gets it (the test's loop decides which)."""
    return _backends.asyncio_backend(asyncio.get_running_loop())


def _private_backend(loop: asyncio.AbstractEventLoop) -> _asyncio_private.PrivateAsyncioBackend:
    assert _asyncio_private.supports(loop)
    return _asyncio_private.PrivateAsyncioBackend(loop, own_loop=True)


def _is_private(backend: _backends.Backend) -> bool:
    """Whether waiting tasks park too (asyncio's own loop, its internals as expected)."""
    return isinstance(backend, _asyncio_private.PrivateAsyncioBackend) and backend._own_loop


async def _parked(park: _backends.Park, resumed: list[str]) -> None:
    who.set("the parked task")
    await park
    resumed.append(who.get())


async def _park_with_a_task(backend: _backends.Backend | None = None) -> tuple[_backends.Park, list[str], asyncio.Task[None]]:
    park = (backend or _backend()).new_park()
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


@private_only
@pytest.mark.parametrize("scheduled_by", ["call_soon", "call_soon_threadsafe from a thread", "call_later"])
async def test_a_park_woken_in_a_callback_resumes_its_task_within_that_callback(scheduled_by: str) -> None:
    park, resumed, task = await _park_with_a_task(_private_backend(asyncio.get_running_loop()))
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
        _backends.set_signal(park)
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
    park = _backend().new_park() if parks else loop.create_future()
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
    _backends.set_signal(park)


@pytest.mark.asyncio
async def test_a_park_woken_before_it_is_awaited_does_not_suspend() -> None:
    park = _backend().new_park()
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
        _backends.set_signal(park)
    else:
        asyncio.get_running_loop().call_soon(park.wake_in_callback)
    await asyncio.wait_for(asyncio.gather(task, second), 10)
    assert resumed == ["the parked task", "the parked task"]


@private_only
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


@private_only
async def test_parks_woken_together_resume_in_one_callback_in_the_order_woken(monkeypatch: pytest.MonkeyPatch) -> None:
    # A sweep wakes hundreds of tasks at once: on asyncio's own loops a scheduled callback is a
    # Handle made and run in Python, so they resume in one, not one each.
    loop = asyncio.get_running_loop()
    backend = _private_backend(loop)
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

    def signals(self) -> list[_backends.Signal]:
        return ([] if self.signal is None else [self.signal]) + list(self.more_signals or ())


@pytest.mark.asyncio
async def test_set_signals_wakes_every_task_in_order_past_a_cancelled_one(monkeypatch: pytest.MonkeyPatch) -> None:
    # The sweep's wake-up of thousands of tasks: with the private backend the parks are set
    # without their ``set_result`` and resume in one callback, with the public one each future
    # schedules its task; a task cancelled but not yet gone, a first waiter that left, the
    # driving task's flag and a second awaiter are all handled.
    loop = asyncio.get_running_loop()
    backend = _backend()
    signals = [backend.new_signal() for _ in range(6)]
    tasks, resumed = await _tasks_awaiting(signals)
    tasks[2].cancel()  # its signal is cancelled now; the task has not run its cancellation yet
    flag = DriverFlag()
    waking: list[_backends.Waiters] = [
        _Waiters(signals[4], signals[1], flag),
        _Waiters(None, signals[5]),
        _Waiters(signals[2], signals[0]),
        _Waiters(signals[3]),
    ]
    with _scheduled_callbacks(loop, monkeypatch) as scheduled:
        backend.set_signals(waking)
    assert waking == []
    assert flag.done()
    assert len(scheduled) == (1 if _is_private(backend) else 5)
    await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 10)
    assert resumed == [4, 1, 5, 0, 3]
    assert tasks[2].cancelled()


@pytest.mark.asyncio
async def test_set_signals_schedules_nothing_when_only_a_flag_is_woken(monkeypatch: pytest.MonkeyPatch) -> None:
    # A lone wait's task drives the watcher and checks its flag itself: no callback to run.
    backend = _backend()
    flag = DriverFlag()
    with _scheduled_callbacks(asyncio.get_running_loop(), monkeypatch) as scheduled:
        backend.set_signals([_Waiters(flag)])
    assert flag.done()
    assert scheduled == []


def test_a_task_that_raises_keyboard_interrupt_as_it_resumes_does_not_strand_the_others() -> None:
    loop = asyncio.new_event_loop()
    try:
        backend = _private_backend(loop)
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


def _close_a_loop_with_woken_parks_unresumed(
    backend_of: list[_asyncio_private.PrivateAsyncioBackend],
) -> weakref.ref[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    loop.set_exception_handler(lambda loop, context: None)  # "Task was destroyed but it is pending"
    backend = _private_backend(loop)
    backend_of.append(backend)  # kept, as a watcher keeps its backend
    parks = [backend.new_park() for _ in range(3)]

    async def parked(park: _backends.Park) -> None:
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
    backend_of: list[_asyncio_private.PrivateAsyncioBackend] = []
    freed = _close_a_loop_with_woken_parks_unresumed(backend_of)
    gc.collect()
    assert freed() is None
    assert backend_of[0]._batch() is None


# -- which backend a loop gets, and the fallback when asyncio's internals are not as expected --


@pytest.mark.asyncio
async def test_the_watcher_of_each_loop_gets_the_backend_its_internals_allow(request: pytest.FixtureRequest) -> None:

    backend = _registry.current().backend
    public = request.node.callspec.params["_asyncio_loop_factory"].__name__ != "new_event_loop"  # the public lane
    own_loop = isinstance(asyncio.get_running_loop(), asyncio.BaseEventLoop)  # uvloop's is not
    assert type(backend) is (_asyncio.AsyncioBackend if public else _asyncio_private.PrivateAsyncioBackend)
    if public:
        assert type(backend.new_signal()) is not _asyncio_private._AsyncioPark
        assert type(backend.new_park()) is _asyncio.FuturePark
        assert backend.earliest_timer() is None
    else:  # the driving task parks on every asyncio loop; waiting tasks on asyncio's own
        assert backend._own_loop is own_loop  # type: ignore[attr-defined]
        assert type(backend.new_park()) is _asyncio_private._AsyncioPark
        assert (type(backend.new_signal()) is _asyncio_private._AsyncioPark) is own_loop


@pytest.mark.parametrize("variable", ["1", "yes", "0", ""])
def test_the_environment_variable_holds_every_new_loop_to_the_public_backend(
    variable: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(_backends.PUBLIC_ASYNCIO_VARIABLE, variable)
    loop = asyncio.new_event_loop()
    try:
        public = type(_backends.asyncio_backend(loop)) is _asyncio.AsyncioBackend
        assert public == (variable not in ("", "0"))
    finally:
        loop.close()


class _TimersOfItsOwn(asyncio.SelectorEventLoop):
    """asyncio's loop, handing out timers behind a handle of its own (as a loop that keeps its
    timers elsewhere does): its heap is not where they are."""

    def call_at(self, when: float, callback: Any, *args: Any, context: contextvars.Context | None = None) -> Any:
        return _OwnHandle(super().call_at(when, callback, *args, context=context))


class _OwnHandle:
    """Not a ``TimerHandle``, not in the heap: what it is asked, it asks asyncio's handle."""

    def __init__(self, handle: asyncio.TimerHandle) -> None:
        self._handle = handle

    def __getattr__(self, name: str) -> Any:
        return getattr(self._handle, name)


@pytest.mark.parametrize("internals", ["no _scheduled", "_scheduled not a list", "timers without _when", "timers kept elsewhere"])
def test_the_capability_check_keeps_out_of_internals_not_as_expected(internals: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(_backends.PUBLIC_ASYNCIO_VARIABLE, raising=False)
    loop: asyncio.AbstractEventLoop = _TimersOfItsOwn() if internals == "timers kept elsewhere" else asyncio.new_event_loop()
    try:
        with monkeypatch.context() as patched:
            if internals == "no _scheduled":
                patched.delattr(loop, "_scheduled")
            elif internals == "_scheduled not a list":
                patched.setattr(loop, "_scheduled", tuple(loop._scheduled))  # type: ignore[attr-defined]
            elif internals == "timers without _when":
                patched.setattr(loop, "_scheduled", [object()])
            assert not _asyncio_private.supports(loop)
            backend = _backends.asyncio_backend(loop)
            assert not _is_private(backend)  # only the driving task parks (checked at its first park)
            assert backend.earliest_timer() is None  # the loop's timers are left alone
    finally:
        loop.close()


def test_a_loop_whose_internals_fail_the_check_waits_without_reading_them() -> None:

    async def wait() -> tuple[str, object]:
        sim = SimulatedDriver()
        with aiogpu.Stream(sim.device(0)) as stream:
            work = sim.launch(stream)
            event = stream.record()
            task = asyncio.create_task(event.wait(strategy="thread"))
            await asyncio.sleep(0)
            work.release()
            await asyncio.wait_for(task, 10)
        backend = _registry.current().backend
        return _is_private(backend), backend.earliest_timer()

    loop = _TimersOfItsOwn()
    try:
        assert loop.run_until_complete(wait()) == (False, None)
    finally:
        loop.close()


@private_only
async def test_parks_turn_into_futures_when_the_first_callback_kept_is_no_tasks_wakeup() -> None:
    # A park keeps the first done-callback added to it only once the backend has seen that it is
    # a method of the awaiting task; anything else turns the loop's parks off, and the park
    # calls that callback as a future does.
    backend = _private_backend(asyncio.get_running_loop())
    park = backend.new_park()
    called: list[object] = []
    park.add_done_callback(called.append)  # type: ignore[attr-defined]
    assert type(backend.new_signal()) is not _asyncio_private._AsyncioPark
    later = backend.new_park()
    assert type(later) is _asyncio.FuturePark
    _park, resumed, task = await _park_with_a_task(backend)
    park.set_result(None)
    _park.wake_in_callback()
    await asyncio.wait_for(task, 10)
    assert called == [park]
    assert resumed == ["the parked task"]


@private_only
async def test_the_first_tasks_wakeup_a_park_keeps_passes_the_check() -> None:
    backend = _private_backend(asyncio.get_running_loop())
    park, resumed, task = await _park_with_a_task(backend)
    assert backend._wakeup_checked
    assert type(backend.new_signal()) is _asyncio_private._AsyncioPark
    park.wake_in_callback()
    await asyncio.wait_for(task, 10)
    assert resumed == ["the parked task"]
