"""Interpreter exit with objects left open and waits pending (a waiter thread parked in the
driver, a callback wait's host function still enqueued, tasks that ``asyncio.run`` cancels as it
closes its loop), the work still held or completing as the process exits: no crash, no handle
destroyed under a waiter thread, no exception in a foreign thread, no noise, exit within 1 s."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import pytest

pytestmark = pytest.mark.slow  # each test runs a child interpreter to its exit

SCRIPT = textwrap.dedent(
    """
    import atexit, weakref
    def report():                           # registered first, so it runs after finalizers ran
        statistics = getattr(device._driver, "statistics", None)
        violations = statistics().lifetime_violations if statistics else None
        print(f"finalizers ran: {weakref.finalize._shutdown}, violations: {violations}", flush=True)
    atexit.register(report)

    import asyncio, sys, time
    import anyio
    import aiogpu
    from aiogpu.testing import Latch, SimulatedDriver

    STRATEGIES = ("auto", "poll", "thread", "callback")
    device = SimulatedDriver().device(0) if sys.argv[1] == "simulated" else aiogpu.Device(0)
    stream = aiogpu.Stream(device)          # never closed
    latch = Latch(device)                   # held; "released" lets it go only as the script ends
    latch.block(stream)
    pending = stream.record(blocking_sync=True)  # a thread wait parks in cuEventSynchronize
    done = aiogpu.Event(device, timing=True)
    done.record(aiogpu.Stream(device))

    async def cancelled_waits():
        async with anyio.create_task_group() as tg:
            for strategy in STRATEGIES:
                tg.start_soon(lambda s=strategy: pending.wait(strategy=s))
            await anyio.wait_all_tasks_blocked()
            tg.cancel_scope.cancel()        # a waiter thread stays parked, a host function enqueued

    async def waits_left_to_asyncio_run():
        for strategy in STRATEGIES:         # asyncio.run cancels these as it closes its loop
            asyncio.get_running_loop().create_task(pending.wait(strategy=strategy))
        await asyncio.sleep(0.01)

    anyio.run(cancelled_waits)
    anyio.run(cancelled_waits, backend="trio")
    asyncio.run(waits_left_to_asyncio_run())
    if sys.argv[2] == "released":           # the parked waiter thread wakes as the process exits
        latch.release()
    print(f"exiting at {time.monotonic()!r}", flush=True)
    """
)


@pytest.mark.parametrize("work", ["held", "released"])
@pytest.mark.parametrize("kind", ["simulated", pytest.param("gpu", marks=pytest.mark.gpu)])
def test_exit_with_open_objects_and_pending_waits(kind: str, work: str) -> None:
    pytest.importorskip("trio")
    # Released: the waiter thread wakes from cuEventSynchronize during exit. Exit must not destroy
    # that event under it (that can segfault, not every time): so a few exits.
    for _ in range(5 if (kind, work) == ("gpu", "released") else 1):
        result = subprocess.run(
            [sys.executable, "-X", "dev", "-c", SCRIPT, kind, work], capture_output=True, text=True, timeout=60, check=False
        )
        exited = time.monotonic()
        assert result.returncode == 0, result.stderr
        assert result.stderr == ""  # no exception in a foreign thread, no "Task was destroyed" warning
        lines = result.stdout.strip().splitlines()
        assert len(lines) == 2, result.stdout
        exiting, ran = lines
        marker, _, when = exiting.partition(" at ")
        assert marker == "exiting", result.stdout
        assert exited - float(when) < 1.0, f"the interpreter took {exited - float(when):.2f} s to exit"
        assert ran == f"finalizers ran: True, violations: {0 if kind == 'simulated' else None}"
