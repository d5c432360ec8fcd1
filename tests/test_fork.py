"""A child forked after the parent used CUDA gets a clear ``CudaError`` from every aiogpu call:
never a hang, never a false "done". CUDA cannot be used in such a child (the simulated driver
fails the same way); children started with ``spawn`` work (tests/gpu/test_ipc.py awaits events
in spawned children on the GPU, and the last case here on the simulated device).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

import aiogpu

pytestmark = pytest.mark.slow  # children forked and spawned

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = textwrap.dedent(
    """
    import asyncio, json, os, signal, sys, threading
    import aiogpu
    from aiogpu.testing import Latch, SimulatedDriver

    device = SimulatedDriver().device(0) if sys.argv[1] == "simulated" else aiogpu.Device(0)
    stream = aiogpu.Stream(device)
    latch = Latch(device)
    latch.block(stream)
    pending = stream.record(blocking_sync=True)  # still awaited; a thread wait parks in the driver
    done = aiogpu.Event(device)            # work that finished before the fork
    done.record(aiogpu.Stream(device))
    done.synchronize()

    async def park_a_waiter_thread():
        try:
            await asyncio.wait_for(pending.wait(strategy="thread"), 0.05)
        except asyncio.TimeoutError:
            pass

    asyncio.run(park_a_waiter_thread())    # the parent forks with a waiter thread in the driver

    def attempt(name, call):
        try:
            result = call()
        except aiogpu.CudaError as error:
            return {"call": name, "raised": "CudaError", "says_fork": "fork()" in str(error)}
        except BaseException as error:
            return {"call": name, "raised": type(error).__name__, "message": str(error)}
        return {"call": name, "raised": None, "result": repr(result)}

    def child():
        signal.alarm(20)                   # a hang fails the test instead of blocking it
        calls = [
            ("is_done", lambda: pending.is_done),
            ("done.is_done", lambda: done.is_done),
            ("synchronize", pending.synchronize),
            ("Stream", lambda: aiogpu.Stream(device)),
            ("Event", lambda: aiogpu.Event(device)),
            ("record", lambda: stream.record()),
        ]
        for strategy in ("auto", "poll", "thread", "callback"):
            calls.append((f"await {strategy}", lambda s=strategy: asyncio.run(pending.wait(strategy=s))))
            calls.append((f"await done {strategy}", lambda s=strategy: asyncio.run(done.wait(strategy=s))))
        for name, call in calls:           # one line per call: a hang shows where
            print(json.dumps(attempt(name, call)), flush=True)

    pid = os.fork()
    if pid == 0:
        try:
            child()
        finally:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    latch.release()
    pending.synchronize()
    print(json.dumps({"child_status": status, "parent_still_works": pending.is_done}), flush=True)
    """
)


def run_fork_script(kind: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, kind], cwd=ROOT, capture_output=True, text=True, timeout=90, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    *child, parent = (json.loads(line) for line in result.stdout.strip().splitlines())
    assert parent["child_status"] == 0, f"the child hung or crashed ({parent}) after: {child}\n{result.stderr}"
    return child, parent


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["simulated", pytest.param("gpu", marks=pytest.mark.gpu)])
def test_a_forked_child_gets_a_clear_error_from_every_call(kind: str) -> None:
    outcomes, parent = run_fork_script(kind)
    assert parent == {"child_status": 0, "parent_still_works": True}
    assert len(outcomes) == 14
    for outcome in outcomes:
        assert outcome["raised"] == "CudaError", outcome  # not a hang (the alarm), not a result
        assert outcome["says_fork"], outcome  # and the message says what to do: spawn


def spawned_child_awaits(queue: object) -> None:
    import anyio

    import aiogpu
    from aiogpu.testing import SimulatedDriver

    async def main() -> bool:
        device = SimulatedDriver().device(0)
        with aiogpu.Stream(device) as stream:
            await stream.record()
            return stream.is_idle

    queue.put(anyio.run(main))  # type: ignore[attr-defined]


@pytest.mark.timeout(60)
def test_a_spawned_child_works() -> None:
    import multiprocessing

    spawn = multiprocessing.get_context("spawn")
    queue = spawn.Queue()
    child = spawn.Process(target=spawned_child_awaits, args=(queue,))
    child.start()
    assert queue.get(timeout=50) is True
    child.join(10)
    assert child.exitcode == 0


def test_calls_a_driver_subclass_inherits_fail_after_fork_too() -> None:
    """The child-side hook, called directly: a subclass overriding one call inherits the rest."""
    from aiogpu import _driver
    from aiogpu.testing import SimulatedDriver

    class CountingDriver(SimulatedDriver):
        def event_query(self, event: int) -> bool:
            return super().event_query(event)

    driver = CountingDriver()
    _driver.fail_every_call_after_fork(driver)
    for call in (lambda: driver.event_query(0), lambda: driver.stream_create(0, 0), driver.init):
        with pytest.raises(aiogpu.CudaError, match="fork"):
            call()
