"""Work that never finishes: a deadline ends the wait promptly and leaks nothing, and the hang
watchdog (``pending_waits`` / ``watch_for_hangs``) reports it so a health check can fail.

A ``Latch`` that is never released (until clean-up) is the work that never finishes.
"""

from __future__ import annotations

import dataclasses
import logging
import pickle
import pydoc
import threading
import time

import anyio
import pytest

import aiogpu
from aiogpu.testing import Latch, SimulatedDriver
from tests.helpers import settle_waiter_threads

pytestmark = pytest.mark.anyio
STRATEGIES = ["auto", "poll", "thread", "callback"]


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def waiter_threads() -> list[threading.Thread]:
    """Threads that serve waits (the doorbell, armer and timer threads are one per process)."""
    return [thread for thread in threading.enumerate() if thread.name.startswith("aiogpu-waiter")]


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.slow
async def test_a_deadline_ends_a_wait_on_work_that_never_finishes(sim: SimulatedDriver, strategy: str) -> None:
    device = sim.device(0)
    with aiogpu.Stream(device) as stream, Latch(device) as latch:
        latch.block(stream)
        stuck = stream.record()
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            with anyio.fail_after(0.05):
                await stuck.wait(strategy=strategy)  # type: ignore[arg-type]
        assert time.monotonic() - started < 0.5  # promptly, with every strategy
        assert aiogpu.pending_waits() == []  # the wait is gone from the engine
        assert not stuck.is_done
        latch.release()
        with anyio.fail_after(10):
            await stuck.wait(strategy=strategy)  # type: ignore[arg-type]  # the event is still usable
        stuck.close()
    await anyio.to_thread.run_sync(settle_waiter_threads)  # idle waiter threads keep a helper event each
    assert sim.statistics().live_events == 0
    assert waiter_threads() == []


async def test_pending_waits_lists_what_tasks_wait_for(sim: SimulatedDriver) -> None:
    device = sim.device(0)
    with aiogpu.Stream(device) as stream, Latch(device) as latch:
        latch.block(stream)
        first, second = stream.record(), stream.record()
        async with anyio.create_task_group() as tg:
            for event in (first, first, second):
                tg.start_soon(event.wait)
            await anyio.wait_all_tasks_blocked()
            waits = aiogpu.pending_waits()
            assert {wait.event: wait.waiters for wait in waits} == {first: 2, second: 1}
            assert waits[0].age >= waits[1].age  # oldest wait first
            assert all(wait.stream is stream and wait.device is device for wait in waits)
            assert all(wait.age >= 0 and wait.strategy == "auto" for wait in waits)
            latch.release()
        assert aiogpu.pending_waits() == []
        first.close()
        second.close()


async def test_watch_for_hangs_reports_each_stuck_wait_once(sim: SimulatedDriver) -> None:
    device = sim.device(0)
    reports: list[aiogpu.PendingWait] = []
    with aiogpu.Stream(device) as stuck_stream, aiogpu.Stream(device) as quick_stream, Latch(device) as latch:
        latch.block(stuck_stream)
        stuck = stuck_stream.record()
        reported = anyio.Event()

        def on_hang(wait: aiogpu.PendingWait) -> None:
            reports.append(wait)
            reported.set()

        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                tg.start_soon(lambda: aiogpu.watch_for_hangs(0.05, on_hang=on_hang, interval=0.01))
                tg.start_soon(stuck.wait)
                for _ in range(5):  # waits that finish are never reported
                    await quick_stream.record().wait()
                await reported.wait()
                await anyio.sleep(0.1)  # ten more looks: still one report
                assert [wait.event for wait in reports] == [stuck]
                assert reports[0].age >= 0.05
                assert reports[0].stream is stuck_stream
                latch.release()
                await stuck.wait()
                tg.cancel_scope.cancel()
        stuck.close()


async def test_hangs_are_logged_by_default(sim: SimulatedDriver, caplog: pytest.LogCaptureFixture) -> None:
    device = sim.device(0)
    with aiogpu.Stream(device) as stream, Latch(device) as latch:
        latch.block(stream)
        stuck = stream.record()
        with caplog.at_level(logging.WARNING, logger="aiogpu"):
            with anyio.move_on_after(0.2):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(lambda: aiogpu.watch_for_hangs(0.02))
                    await stuck.wait()
        (record,) = caplog.records
        assert "a GPU wait has been pending for" in record.getMessage()
        assert f"stream {stream.handle:#x} of device 0" in record.getMessage()
        assert record.aiogpu_event == repr(stuck)  # type: ignore[attr-defined]
        assert record.aiogpu_stream == stream.handle  # type: ignore[attr-defined]
        assert record.aiogpu_age >= 0.02  # type: ignore[attr-defined]
        pickle.dumps(record)  # handlers that pickle records (QueueHandler, SocketHandler) can
        latch.release()
        stuck.close()


async def test_watch_for_hangs_refuses_bad_input() -> None:
    for bad, error in [("1", TypeError), (True, TypeError), (0, ValueError), (-1.0, ValueError), (float("nan"), ValueError)]:
        with pytest.raises(error, match="threshold"):
            await aiogpu.watch_for_hangs(bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="interval"):
        await aiogpu.watch_for_hangs(1.0, interval=float("inf"))
    with pytest.raises(TypeError, match="on_hang must be callable"):
        await aiogpu.watch_for_hangs(1.0, on_hang=42)  # type: ignore[arg-type]


def test_pending_waits_needs_a_running_loop() -> None:
    with pytest.raises(RuntimeError, match="running asyncio, uvloop or trio event loop"):
        aiogpu.pending_waits()


def test_a_pending_wait_documents_its_fields() -> None:
    """help(aiogpu.PendingWait) shows what each field means."""
    text = pydoc.render_doc(aiogpu.PendingWait, renderer=pydoc.plaintext)
    for field in dataclasses.fields(aiogpu.PendingWait):
        if not field.name.startswith("_"):
            assert f"{field.name}: " in text.split("Attributes:", 1)[1], field.name
    with pytest.raises(dataclasses.FrozenInstanceError):
        aiogpu.PendingWait(None, None, None, 0.0, 1, "auto").age = 1.0  # type: ignore[arg-type,misc]


async def test_a_pending_wait_names_the_stream_where_aiogpu_knows_it(sim: SimulatedDriver) -> None:
    device = sim.device(0)
    with aiogpu.Stream(device) as stream, Latch(device) as latch:
        latch.block(stream)
        latch.block(device.default_stream)
        on_stream, on_default = stream.record(), device.default_stream.record()
        shared = stream.record(interprocess=True)  # another process may record it: its own queue
        adopted = aiogpu.Event.adopt(on_stream.handle, device=device)  # its owner records it
        async with anyio.create_task_group() as tg:
            for event in (on_stream, on_default, shared, adopted):
                tg.start_soon(event.wait)
            await anyio.wait_all_tasks_blocked()
            streams = {wait.event: wait.stream for wait in aiogpu.pending_waits()}
            assert streams == {on_stream: stream, on_default: device.default_stream, shared: None, adopted: None}
            latch.release()
        for event in (on_stream, on_default, shared, adopted):
            event.close()
