"""Interpreter exit with objects left open and waits pending: no crash, no noise, prompt exit."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import pytest

SCRIPT = textwrap.dedent(
    """
    import sys
    import anyio
    import aiogpu
    from aiogpu.testing import Latch, SimulatedDriver

    device = SimulatedDriver().device(0) if sys.argv[1] == "simulated" else aiogpu.Device(0)
    stream = aiogpu.Stream(device)          # never closed
    latch = Latch(device)                   # never released: the work stays pending forever
    latch.block(stream)
    pending = stream.record()
    done = aiogpu.Event(device, timing=True)
    done.record(aiogpu.Stream(device))

    async def main():
        async with anyio.create_task_group() as tg:
            for strategy in ("thread", "poll"):
                tg.start_soon(lambda s=strategy: pending.wait(strategy=s))
            await anyio.wait_all_tasks_blocked()
            tg.cancel_scope.cancel()        # the thread strategy's waiter stays parked in the driver

    anyio.run(main)
    print("exiting with a waiter thread parked", flush=True)
    """
)


@pytest.mark.parametrize("kind", ["simulated", pytest.param("gpu", marks=pytest.mark.gpu)])
def test_exit_with_open_objects_and_a_parked_waiter(kind: str) -> None:
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-X", "dev", "-c", SCRIPT, kind], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == "exiting with a waiter thread parked\n"
    assert result.stderr == ""  # no exception in a foreign thread, no "Task was destroyed" warning
    assert time.monotonic() - started < 30
