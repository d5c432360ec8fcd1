"""How waits keep an event's handle alive (``aiogpu._wait._holds``): the event's home loop counts
its waits on the event and holds one use of the handle for them all; other loops' waits each
hold a use of their own. Closing destroys the handle once every wait is over, wherever
``close()`` runs: on the home loop at once, from another thread on the loop's next iteration,
after the loop closed at once.
"""

from __future__ import annotations

import asyncio
import gc
import threading
import weakref
from functools import partial
from typing import Any

import anyio
import anyio.lowlevel
import pytest

import aiogpu
from aiogpu.testing import Latch, SimulatedDriver
from tests.helpers import settle_waiter_threads

pytestmark = pytest.mark.anyio
TIMEOUT = 20.0


@pytest.fixture(params=["asyncio", "uvloop", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> tuple[str, dict[str, Any]]:
    if request.param == "uvloop":
        pytest.importorskip("uvloop")
        return "asyncio", {"use_uvloop": True}
    return str(request.param), {}


def lifetime_uses(event: aiogpu.Event) -> int:
    return len(event._lifetime._uses)


async def test_home_waits_count_on_the_event_not_on_its_handle_lifetime(sim: SimulatedDriver) -> None:
    device = sim.device(0)
    with aiogpu.Stream(device) as stream, Latch(device) as latch:
        latch.block(stream)
        first, second = stream.record(), stream.record()
        with anyio.fail_after(TIMEOUT):
            async with anyio.create_task_group() as tg:
                for event in (first, first, first, second):
                    tg.start_soon(partial(event.wait, strategy="poll"))  # poll: no thread retains the handle
                await anyio.wait_all_tasks_blocked()
                # One pending recording each (three tasks share the first's): counted on the event;
                # the lifetime holds the home's one use, however many waits come and go.
                assert (first._home_uses, second._home_uses) == (1, 1)
                assert (lifetime_uses(first), lifetime_uses(second)) == (1, 1)
                latch.release()
        assert (first._home_uses, second._home_uses) == (0, 0)
        assert (lifetime_uses(first), lifetime_uses(second)) == (1, 1)  # the home's, until closed
        live = sim.statistics().live_events
        first.close()  # on the home loop, nothing pending: destroyed right here
        assert sim.statistics().live_events == live - 1
        assert lifetime_uses(first) == 0
        second.close()


@pytest.mark.parametrize("strategy", ["auto", "poll", "thread", "callback"])
@pytest.mark.slow
async def test_a_closed_event_is_destroyed_when_its_last_home_wait_ends(sim: SimulatedDriver, strategy: str) -> None:
    device = sim.device(0)
    with aiogpu.Stream(device) as stream, Latch(device) as latch:
        latch.block(stream)
        event = stream.record()
        with anyio.fail_after(TIMEOUT):
            async with anyio.create_task_group() as tg:
                tg.start_soon(partial(event.wait, strategy=strategy))
                await anyio.wait_all_tasks_blocked()
                live = sim.statistics().live_events
                event.close()
                assert event._home_closing
                assert sim.statistics().live_events == live  # the pending wait still holds it
                latch.release()
        await anyio.to_thread.run_sync(settle_waiter_threads)  # a waiter thread's own use ends with its job
        assert not event._home_closing
        assert sim.statistics().live_events == live - 1


async def test_a_close_that_runs_as_a_home_wait_starts_fails_the_wait_not_the_driver(
    sim: SimulatedDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A finalizer or ``__del__`` closing the event on the home loop's thread right after the wait
    # checked it was open: the home, with no wait pending, lets go of the handle at once, so the
    # wait must not go on to use it.
    from aiogpu import _wait
    from aiogpu._wait import _watcher

    device = sim.device(0)
    with aiogpu.Stream(device) as stream:
        event = stream.record()
        await event.wait()  # this loop is its home, and nothing is pending
        current = _wait.current

        def closing_current() -> _watcher.Watcher:
            watcher = current()
            event.close()
            return watcher

        monkeypatch.setattr(_wait, "current", closing_current)  # what ``wait`` calls
        live = sim.statistics().live_events
        with pytest.raises(aiogpu.ClosedResourceError):
            await event.wait()
        assert sim.statistics().live_events == live - 1  # and never queried after (the fixture checks)
        assert event._home_uses == 0


async def test_close_from_another_thread_is_settled_on_the_home_loop(sim: SimulatedDriver) -> None:
    device = sim.device(0)
    with aiogpu.Stream(device) as stream, Latch(device) as latch:
        idle = stream.record()
        await idle.wait()  # its home is this loop now
        live = sim.statistics().live_events
        await anyio.to_thread.run_sync(idle.close)  # nothing pending: settled on the loop's next iteration
        await anyio.lowlevel.checkpoint()
        assert sim.statistics().live_events == live - 1

        latch.block(stream)
        busy = stream.record()
        with anyio.fail_after(TIMEOUT):
            async with anyio.create_task_group() as tg:
                tg.start_soon(partial(busy.wait, strategy="poll"))
                await anyio.wait_all_tasks_blocked()
                live = sim.statistics().live_events
                await anyio.to_thread.run_sync(busy.close)
                await anyio.wait_all_tasks_blocked()
                assert busy._home_closing
                assert sim.statistics().live_events == live  # its pending wait holds it
                latch.release()
        assert sim.statistics().live_events == live - 1


def test_an_event_closed_after_its_home_loop_is_gone_is_destroyed_at_once(sim: SimulatedDriver) -> None:
    pytest.importorskip("trio")
    device = sim.device(0)
    with aiogpu.Stream(device) as stream:
        for backend in ("asyncio", "trio"):
            event = stream.record()
            anyio.run(event.wait, backend=backend)
            live = sim.statistics().live_events
            event.close()
            assert sim.statistics().live_events == live - 1, backend


def test_an_event_closed_while_its_stopped_loop_never_runs_again_is_destroyed_when_collected(sim: SimulatedDriver) -> None:
    # The home's use is handed back on the loop; one closed without running again never does it.
    device = sim.device(0)
    with aiogpu.Stream(device) as stream:
        event = stream.record()
        loop = asyncio.new_event_loop()
        try:
            loop.run_until_complete(event.wait())
            live = sim.statistics().live_events
            event.close()
            assert sim.statistics().live_events == live
        finally:
            loop.close()
        del event
        gc.collect()
        assert sim.statistics().live_events == live - 1


async def test_waits_of_another_loop_hold_handle_uses_of_their_own(sim: SimulatedDriver) -> None:
    device = sim.device(0)
    with aiogpu.Stream(device) as stream, Latch(device) as latch:
        event = stream.record()
        await event.wait()  # this loop is its home
        latch.block(stream)
        event.record(stream)
        started, errors = threading.Event(), []

        def other_loop() -> None:
            async def wait() -> None:
                waiting = asyncio.get_running_loop().create_task(event.wait(strategy="poll"))
                await asyncio.sleep(0)
                started.set()
                await waiting

            try:
                asyncio.run(wait())
            except BaseException as error:  # reported by the test
                errors.append(error)

        thread = threading.Thread(target=other_loop)
        thread.start()
        try:
            assert await anyio.to_thread.run_sync(started.wait, TIMEOUT)
            assert event._home_uses == 0
            assert lifetime_uses(event) == 2  # the home's and the other loop's wait's
            live = sim.statistics().live_events
            event.close()  # the home lets go at once; the other loop's wait still holds it
            assert lifetime_uses(event) == 1
            assert sim.statistics().live_events == live
        finally:
            latch.release()
            await anyio.to_thread.run_sync(thread.join, TIMEOUT)
        assert not errors, errors
        assert sim.statistics().live_events == live - 1


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_an_event_does_not_keep_its_home_loops_watcher_alive(sim: SimulatedDriver, backend: str) -> None:
    if backend == "trio":
        pytest.importorskip("trio")
    device = sim.device(0)
    with aiogpu.Stream(device) as stream:
        event = stream.record()
        homes: list[weakref.ref[object] | None] = []

        async def wait() -> None:
            await event.wait()
            homes.append(event._lifetime.home)

        anyio.run(wait, backend=backend)
        gc.collect()
        assert homes[0] is not None and homes[0]() is None  # collected with its loop
        live = sim.statistics().live_events
        event.close()  # its home is gone: the home's use goes back at once
        assert sim.statistics().live_events == live - 1
