"""One event awaited from several event loops in several threads (asyncio, uvloop and trio
mixed), and aiogpu used from a thread where another CUDA context is current: every wait wakes,
nothing is left subscribed, and aiogpu never changes the context the thread had.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest

import aiogpu
from aiogpu.testing import Latch, SimulatedDriver

#: The loops of the four threads: (anyio backend, backend options).
LOOPS: list[tuple[str, dict[str, Any]]] = [("asyncio", {}), ("trio", {}), ("asyncio", {"use_uvloop": True}), ("trio", {})]
TASKS_PER_LOOP = 25
TIMEOUT = 20.0


def test_one_event_awaited_from_four_loops_in_four_threads(device: aiogpu.Device, strategy: aiogpu.WaitStrategy) -> None:
    pytest.importorskip("uvloop")
    pytest.importorskip("trio")
    with aiogpu.Stream(device) as stream, Latch(device) as latch:
        latch.block(stream)
        event = stream.record()
        all_waiting = threading.Barrier(len(LOOPS) + 1, timeout=TIMEOUT)
        woken: list[int] = []
        errors: list[BaseException] = []

        async def loop_body() -> None:
            count = 0

            async def waiter() -> None:
                nonlocal count
                await event.wait(strategy=strategy)
                count += 1

            with anyio.fail_after(TIMEOUT):
                async with anyio.create_task_group() as tg:
                    for _ in range(TASKS_PER_LOOP):
                        tg.start_soon(waiter)
                    await anyio.wait_all_tasks_blocked()
                    assert count == 0  # the work is held by the latch
                    await anyio.to_thread.run_sync(all_waiting.wait)
            woken.append(count)

        def thread_body(backend: str, options: dict[str, Any]) -> None:
            try:
                anyio.run(loop_body, backend=backend, backend_options=options)
            except BaseException as error:  # reported by the main thread
                errors.append(error)
                all_waiting.abort()

        threads = [threading.Thread(target=thread_body, args=loop, name=f"loop-{index}") for index, loop in enumerate(LOOPS)]
        for thread in threads:
            thread.start()
        try:
            all_waiting.wait()  # every loop has its tasks waiting
        finally:
            latch.release()
            for thread in threads:
                thread.join(TIMEOUT)
        assert not errors, errors
        assert not any(thread.is_alive() for thread in threads)
        assert woken == [TASKS_PER_LOOP] * len(LOOPS)
        event.close()


@contextmanager
def another_context_current(device: aiogpu.Device) -> Iterator[int]:
    """Make a CUDA context other than ``device``'s primary context current on this thread."""
    driver = device._driver
    if driver.name == "simulated":
        other = aiogpu.Device(1, driver=driver)._context
        driver.context_set_current(other)
        try:
            yield other
        finally:
            driver.context_set_current(0)
        return
    from cuda.bindings import driver as cu

    try:  # cuda-bindings 13: cuCtxCreate(params, flags, device); 12: cuCtxCreate(flags, device)
        result, context = cu.cuCtxCreate(None, 0, cu.CUdevice(device.ordinal))
    except TypeError:
        result, context = cu.cuCtxCreate(0, cu.CUdevice(device.ordinal))
    assert result == cu.CUresult.CUDA_SUCCESS, result
    try:
        yield int(context)  # cuCtxCreate made it current
    finally:
        cu.cuCtxSetCurrent(cu.CUcontext(0))
        cu.cuCtxDestroy(context)


def test_aiogpu_leaves_another_current_context_alone(device: aiogpu.Device, strategy: aiogpu.WaitStrategy) -> None:
    driver = device._driver
    checked: list[str] = []
    failures: list[BaseException] = []

    def thread_body() -> None:
        try:
            with another_context_current(device) as other:
                assert other != device._context

                def still_theirs(what: str) -> None:
                    assert driver.context_get_current() == other, f"{what} changed the thread's current context"
                    checked.append(what)

                with aiogpu.Stream(device) as stream, Latch(device) as latch:
                    still_theirs("Stream()")
                    latch.block(stream)
                    event = stream.record()
                    still_theirs("record()")
                    assert not event.is_done
                    still_theirs("is_done")
                    with aiogpu.Stream(device) as follower:
                        follower.wait_for(event)
                        still_theirs("wait_for()")

                        async def wait() -> None:
                            with anyio.fail_after(TIMEOUT):
                                async with anyio.create_task_group() as tg:
                                    tg.start_soon(lambda: event.wait(strategy=strategy))
                                    await anyio.wait_all_tasks_blocked()
                                    latch.release()
                                await follower.wait_idle(strategy=strategy)

                        anyio.run(wait)
                        still_theirs("await")
                    assert event.is_done
                    event.close()
                still_theirs("close()")
        except BaseException as error:  # reported by the main thread
            failures.append(error)

    thread = threading.Thread(target=thread_body, name="another-context")
    thread.start()
    thread.join(TIMEOUT)
    assert not thread.is_alive(), "the thread hung"
    assert not failures, failures
    assert checked == ["Stream()", "record()", "is_done", "wait_for()", "await", "close()"]


def test_a_loop_that_awaited_events_is_not_kept_alive_after_it_closed(sim: Any) -> None:
    import asyncio
    import gc
    import weakref

    loops: list[weakref.ref[asyncio.AbstractEventLoop]] = []

    async def await_one() -> None:
        loops.append(weakref.ref(asyncio.get_running_loop()))
        with aiogpu.Stream(sim.device(0)) as stream, Latch(sim.device(0)) as latch:
            latch.block(stream)
            event = stream.record()
            waiting = asyncio.get_running_loop().create_task(event.wait())
            await asyncio.sleep(0)
            latch.release()
            await waiting
            event.close()

    for _ in range(3):
        asyncio.run(await_one())
    gc.collect()
    assert [loop() for loop in loops] == [None, None, None]


def _new_asyncio_loop(kind: str) -> Any:
    import asyncio

    if kind == "uvloop":
        return pytest.importorskip("uvloop").new_event_loop()
    return asyncio.new_event_loop()


def _collect_holding_aiogpus_locks() -> None:
    """``gc.collect()`` on a thread that holds the waiter pool's, the timer's and the doorbell's
    locks: the collector runs finalizers on whichever thread it interrupts, inside such a lock
    too, so one that took a lock of aiogpu's could deadlock that thread."""
    import contextlib
    import gc

    from aiogpu._wait import _doorbell, _thread, _timer

    locks = [_thread.pool()._lock, _timer.timer()._lock, _doorbell.doorbell()._lock]

    def collect() -> None:
        with contextlib.ExitStack() as held:
            for lock in locks:
                held.enter_context(lock)
            gc.collect()

    collector = threading.Thread(target=collect, daemon=True)
    collector.start()
    collector.join(TIMEOUT)
    assert not collector.is_alive(), "a finalizer waits for a lock of aiogpu's"


def _collected(reference: Any, timeout: float = 10.0) -> bool:
    """Whether ``reference``'s object is collected within ``timeout``: a waiter thread, the timer
    thread or the doorbell lets go of a dropped loop's watcher once it has poked it (in vain)."""
    import time

    deadline = time.monotonic() + timeout
    while True:
        _collect_holding_aiogpus_locks()
        if reference() is None:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)


@pytest.mark.parametrize("loop_kind", ["asyncio", "uvloop"])
@pytest.mark.slow
def test_a_loop_closed_with_waits_pending_is_collected_with_its_tasks(
    device: aiogpu.Device, strategy: aiogpu.WaitStrategy, loop_kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Closed without cancelling its tasks (``asyncio.run`` and anyio cancel them first): the
    # watcher, held by the registry of loops only while it is idle, no longer keeps it alive.
    import asyncio
    import weakref

    from tests.helpers import settle_waiter_threads

    unraisable: list[Any] = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)  # a finalizer that failed
    reported: list[str] = []
    with aiogpu.Stream(device) as stream, Latch(device) as latch:
        latch.block(stream)
        shared, own = stream.record(), stream.record()
        loop = _new_asyncio_loop(loop_kind)
        loop.set_exception_handler(lambda loop, context: reported.append(context["message"]))

        async def start_waits() -> None:
            for event in (shared, shared, own):  # the driving task, one sharing its entry, another
                asyncio.get_running_loop().create_task(event.wait(strategy=strategy))
            await anyio.wait_all_tasks_blocked()
            assert sum(wait.waiters for wait in aiogpu.pending_waits()) == 3

        loop.run_until_complete(start_waits())
        loop.close()
        dropped = weakref.ref(loop)
        del loop
        latch.release()
        shared.synchronize()
        settle_waiter_threads()
        # The events are the caller's: until closed or recorded again, an event holds the entry
        # of its pending wait, whose futures refer to their loop, as any future does.
        shared.close()
        own.record(stream)
        assert _collected(dropped), "the closed loop is kept alive"
        own.close()
    assert reported == ["Task was destroyed but it is pending!"] * 3
    assert unraisable == []
    if isinstance(device._driver, SimulatedDriver):  # every handle the waits held was destroyed
        assert device._driver.statistics().live_events == 0


def test_a_closed_event_keeps_no_entry_of_a_wait_requeued_for_its_new_recording(
    sim: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Recorded again under a pending wait, then closed: the sweep that moves the wait to the new
    # recording must not hand the event its entry again (it would keep the loop alive if the
    # loop were dropped with the wait pending).
    import asyncio

    from aiogpu._wait import _watcher

    requeued: list[asyncio.Event] = []
    rekey = _watcher.Watcher._rekey

    def noted(self: Any, entry: Any, now: float) -> None:
        rekey(self, entry, now)
        requeued[0].set()

    monkeypatch.setattr(_watcher.Watcher, "_rekey", noted)

    async def main() -> None:
        requeued.append(asyncio.Event())
        with aiogpu.Stream(sim.device(0)) as stream, Latch(sim.device(0)) as latch:
            latch.block(stream)
            event = stream.record()
            waiting = asyncio.get_running_loop().create_task(event.wait(strategy="poll"))
            await anyio.wait_all_tasks_blocked()
            event.record(stream)
            event.close()
            await asyncio.wait_for(requeued[0].wait(), TIMEOUT)  # the watcher's next sweep
            assert event._waiting is None
            latch.release()
            await asyncio.wait_for(waiting, TIMEOUT)

    asyncio.run(main())


@pytest.mark.slow
def test_the_doorbell_forgets_a_listener_whose_loop_is_gone_without_another_ring() -> None:
    # A callback wait's last ring may come just before its loop is closed: the doorbell pokes its
    # listeners once a second without a ring too, and forgets one whose poke fails.
    from aiogpu._wait._doorbell import Doorbell

    doorbell = Doorbell()
    pokes = {"gone": 0, "live": 0}
    second_round = threading.Event()

    def gone() -> bool:
        pokes["gone"] += 1
        return False

    def live() -> bool:
        pokes["live"] += 1
        if pokes["live"] == 2:
            second_round.set()
        return True

    doorbell.listen(live)
    doorbell.listen(gone)
    try:
        assert second_round.wait(TIMEOUT), "no poke without a ring"
        assert list(doorbell._listeners) == [live]
        assert pokes["gone"] == 1
    finally:
        doorbell.ignore(live)


@pytest.mark.parametrize("loop_kind", ["asyncio", "uvloop"])
@pytest.mark.slow
def test_a_wait_whose_task_nobody_refers_to_completes(
    device: aiogpu.Device, strategy: aiogpu.WaitStrategy, loop_kind: str
) -> None:
    # asyncio refers to tasks weakly; while waits are pending the loop keeps its watcher, and the
    # watcher the waiting tasks, as a pending read keeps its task through the loop's selector.
    import asyncio
    import gc

    woken: list[aiogpu.Event] = []
    loop = _new_asyncio_loop(loop_kind)
    try:
        with aiogpu.Stream(device) as stream, Latch(device) as latch:
            latch.block(stream)
            shared, own = stream.record(), stream.record()

            async def wait(event: aiogpu.Event, all_woken: asyncio.Event) -> None:
                await event.wait(strategy=strategy)
                woken.append(event)
                if len(woken) == 3:
                    all_woken.set()

            async def main() -> None:
                all_woken = asyncio.Event()
                for event in (shared, shared, own):
                    loop.create_task(wait(event, all_woken))  # no reference kept
                await anyio.wait_all_tasks_blocked()
                assert sum(wait.waiters for wait in aiogpu.pending_waits()) == 3
                gc.collect()
                await asyncio.sleep(0)
                gc.collect()
                latch.release()
                await asyncio.wait_for(all_woken.wait(), TIMEOUT)

            loop.run_until_complete(main())
            shared.close()
            own.close()
    finally:
        loop.close()
    assert sorted(map(id, woken)) == sorted(map(id, (shared, shared, own)))


def test_trio_running_as_a_guest_of_asyncio_waits_through_trio(device: aiogpu.Device, strategy: aiogpu.WaitStrategy) -> None:
    # trio's guest mode runs trio's tasks from the asyncio loop's callbacks, so that loop is
    # "running" inside them too: their waits must still be trio's (an asyncio future awaited in
    # a trio task is an error), and the host's own tasks' waits asyncio's, at the same time.
    import asyncio

    trio = pytest.importorskip("trio")
    with aiogpu.Stream(device) as stream, Latch(device) as latch:
        latch.block(stream)
        event = stream.record()
        waiting: dict[str, int] = {}  # waiting tasks, as each loop's watcher counts them

        async def guest() -> str:
            with trio.fail_after(TIMEOUT):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(partial(event.wait, strategy=strategy))
                    while not aiogpu.pending_waits():
                        await trio.lowlevel.checkpoint()
                    waiting["guest"] = sum(wait.waiters for wait in aiogpu.pending_waits())
            return "guest woke"

        async def host() -> list[str]:
            loop = asyncio.get_running_loop()
            guest_done: asyncio.Future[Any] = loop.create_future()
            trio.lowlevel.start_guest_run(
                guest, run_sync_soon_threadsafe=loop.call_soon_threadsafe, done_callback=guest_done.set_result
            )
            host_wait = asyncio.create_task(event.wait(strategy=strategy))
            while "guest" not in waiting or not aiogpu.pending_waits():
                await anyio.lowlevel.checkpoint()
            waiting["host"] = sum(wait.waiters for wait in aiogpu.pending_waits())
            latch.release()
            await asyncio.wait_for(host_wait, TIMEOUT)
            return [(await asyncio.wait_for(guest_done, TIMEOUT)).unwrap()]

        assert asyncio.run(host()) == ["guest woke"]
        assert waiting == {"guest": 1, "host": 1}


#: Run in a child process: importing trio_asyncio patches asyncio process-wide (its loop policy
#: and ``asyncio._get_running_loop``), which no other test should run under.
_TRIO_ASYNCIO_CHILD = """
import sys
import trio, trio_asyncio
import aiogpu
from aiogpu._wait import _policy, _registry, _watcher
from aiogpu.testing import Latch, SimulatedDriver

device = SimulatedDriver().device(0) if sys.argv[1] == "simulated" else aiogpu.Device(0)
strategy = sys.argv[2]
backends = {}

async def main():
    with aiogpu.Stream(device) as stream, Latch(device) as latch:
        latch.block(stream)
        event = stream.record()

        async def asyncio_side():
            backends["asyncio"] = type(_registry.current().backend).__name__
            await event.wait(strategy=strategy)

        async def trio_side():
            backends["trio"] = type(_registry.current().backend).__name__
            await event.wait(strategy=strategy)

        with trio.fail_after(20):
            async with trio_asyncio.open_loop(), trio.open_nursery() as nursery:
                nursery.start_soon(trio_side)
                nursery.start_soon(trio_asyncio.aio_as_trio(asyncio_side))
                while len(backends) < 2 or not aiogpu.pending_waits():
                    await trio.lowlevel.checkpoint()
                latch.release()

trio.run(main)
print(sorted(backends.items()))
"""


def test_trio_asyncio_waits_through_the_watcher_of_whichever_mode_runs_the_code(
    device: aiogpu.Device, strategy: aiogpu.WaitStrategy
) -> None:
    # trio-asyncio runs asyncio code inside trio's tasks: the asyncio side's waits must be
    # asyncio's (a trio signal awaited by an asyncio task: "Task got bad yield"), the trio
    # side's trio's, one event awaited from both at once.
    if find_spec("trio_asyncio") is None:  # not importorskip: the import would patch asyncio here
        pytest.skip("trio-asyncio is not installed")
    kind = "simulated" if device.name.startswith("Simulated") else "gpu"
    child = subprocess.run(
        [sys.executable, "-c", _TRIO_ASYNCIO_CHILD, kind, strategy],
        cwd=Path(__file__).resolve().parents[1],
        capture_output=True,
        text=True,
        timeout=TIMEOUT + 40,
        check=False,
    )
    assert child.returncode == 0, child.stderr[-3000:]
    asyncio_side = ("AsyncioBackend", "PrivateAsyncioBackend")  # (trio-asyncio's timers are trio's: public)
    assert child.stdout.strip().splitlines()[-1] in [f"[('asyncio', {name!r}), ('trio', 'TrioBackend')]" for name in asyncio_side]


def test_an_asyncio_loop_run_inside_a_trio_task_waits_through_asyncio(device: aiogpu.Device) -> None:
    # trio says "trio" through sniffio for its whole run, also while a trio task runs an asyncio
    # loop to completion (asyncio.run called from trio code): that loop's tasks are asyncio's.
    import asyncio

    trio = pytest.importorskip("trio")

    async def asyncio_wait() -> str:
        with aiogpu.Stream(device) as stream:
            await stream.record()
        return "woke"

    async def trio_task() -> str:
        return asyncio.run(asyncio_wait())

    assert trio.run(trio_task) == "woke"


def test_a_half_imported_sniffio_does_not_break_asyncio_waits(device: aiogpu.Device, monkeypatch: pytest.MonkeyPatch) -> None:
    # Another thread importing trio can leave sniffio in sys.modules before it has finished
    # (no thread_local yet): a plain asyncio wait must not trip over it.
    import asyncio
    import types

    pytest.importorskip("trio")
    monkeypatch.setitem(sys.modules, "sniffio", types.ModuleType("sniffio"))

    async def asyncio_wait() -> str:
        with aiogpu.Stream(device) as stream:
            await stream.record()
        return "woke"

    assert asyncio.run(asyncio_wait()) == "woke"
