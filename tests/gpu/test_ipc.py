"""Interprocess events on the real GPU: a spawned child awaits an event the parent records.

The parent holds its stream with a ``Latch``, records an ``interprocess=True`` event behind it
and hands the event to a ``spawn`` child (as an ``IpcEventHandle``, or as the ``Event``, which
pickles through its handle). The child must still be waiting while the latch holds, and wake
once the parent releases it. CUDA cannot reopen a handle in the process that exported it.
"""

from __future__ import annotations

import multiprocessing
import pickle
import queue
import time
from typing import TYPE_CHECKING

import pytest

import aiogpu
from aiogpu.testing import Latch
from tests.gpu._child import IPC_TIMEOUT, await_shared_event

if TYPE_CHECKING:
    from multiprocessing.process import BaseProcess
    from multiprocessing.queues import Queue

pytestmark = pytest.mark.gpu

SPAWN = multiprocessing.get_context("spawn")  # a forked child cannot use CUDA
#: Starting Python, importing aiogpu and initializing CUDA in the child.
START_TIMEOUT = 60.0
#: How long the child gets to (wrongly) report "done" while the latch still holds the event.
QUIET_SECONDS = 0.5


def next_report(reports: Queue[str], child: BaseProcess, timeout: float) -> str:
    """The child's next report; fails soon after the child dies, or after ``timeout``."""
    deadline = time.monotonic() + timeout
    while child.is_alive() and time.monotonic() < deadline:
        try:
            return reports.get(timeout=0.1)
        except queue.Empty:
            pass
    try:
        return reports.get(timeout=1.0)  # what it sent just before exiting
    except queue.Empty:
        raise AssertionError(f"no report from the child within {timeout} s (exit code {child.exitcode})") from None


@pytest.mark.timeout(START_TIMEOUT + 2 * IPC_TIMEOUT)
@pytest.mark.parametrize("share", ["handle", "event"])
def test_an_awaiter_in_another_process_wakes_when_the_event_completes(
    gpu: aiogpu.Device, strategy: aiogpu.WaitStrategy, share: str
) -> None:
    reports: Queue[str] = SPAWN.Queue()
    with aiogpu.Stream(gpu) as stream, Latch(gpu) as latch, aiogpu.Event(gpu, interprocess=True) as event:
        latch.block(stream)
        event.record(stream)
        shared = event if share == "event" else event.ipc_handle()
        child = SPAWN.Process(target=await_shared_event, args=(shared, strategy, reports), name="aiogpu-ipc-child")
        child.start()
        try:
            assert next_report(reports, child, START_TIMEOUT) == "waiting"
            with pytest.raises(queue.Empty):
                reports.get(timeout=QUIET_SECONDS)  # nothing may arrive while the latch holds the event
            assert not event.is_done
            latch.release()
            assert next_report(reports, child, IPC_TIMEOUT) == "done"
            child.join(IPC_TIMEOUT)
            assert child.exitcode == 0
        finally:
            if child.is_alive():
                child.kill()
                child.join()
            reports.close()
            reports.join_thread()


def test_the_exporting_process_cannot_open_its_own_handle(gpu: aiogpu.Device) -> None:
    with aiogpu.Event(gpu, interprocess=True) as event:
        event.record()
        with pytest.raises(ValueError, match="exported by this process"):
            aiogpu.Event.from_ipc_handle(event.ipc_handle())
        with pytest.raises(ValueError, match="exported by this process"):
            pickle.loads(pickle.dumps(event))
