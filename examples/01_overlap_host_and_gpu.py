"""Keep the event loop responsive while the GPU works: ``await event`` versus ``synchronize()``.

A ticker coroutine wants to run every 5 ms (think: a web server answering health checks).
Meanwhile another coroutine runs GPU jobs (a kernel that keeps the GPU busy for 200 ms) and
waits for each. Awaiting the event keeps the ticker on time; blocking in ``synchronize()``
freezes it for the whole job. Uses the GPU when there is one, otherwise aiogpu's simulated
device, and says which.

Run:  python examples/01_overlap_host_and_gpu.py
"""

# /// script
# dependencies = ["aiogpu"]
# ///

from __future__ import annotations

import time

import anyio
import anyio.lowlevel

import aiogpu
from aiogpu.testing import SimulatedDriver, launch_spin

JOBS = 3
JOB_SECONDS = 0.2
TICK_SECONDS = 0.005


def open_device() -> tuple[aiogpu.Device, str]:
    """Device 0 of the GPU if there is one, else of the simulated driver."""
    try:
        device = aiogpu.Device(0)
    except aiogpu.CudaUnavailableError as exc:
        reason = str(exc).split(". ", 1)[0]
        return SimulatedDriver().device(0), f"the simulated device (no GPU: {reason})"
    return device, f"GPU {device.ordinal}: {device.name}"


async def run_jobs(stream: aiogpu.Stream, *, blocking: bool) -> float:
    """Run the GPU jobs one after another, waiting for each; return the elapsed seconds."""
    started = time.perf_counter()
    for _ in range(JOBS):
        launch_spin(stream, JOB_SECONDS)
        done = stream.record()
        if blocking:
            done.synchronize()  # blocks the event loop: what not to do
        else:
            await done  # only this task sleeps; the loop keeps running
        done.close()
    return time.perf_counter() - started


async def measure(stream: aiogpu.Stream, *, blocking: bool) -> str:
    ticks = 0
    worst_lag = 0.0
    jobs_finished = anyio.Event()

    async def ticker() -> None:
        nonlocal ticks, worst_lag
        while not jobs_finished.is_set():
            due = time.perf_counter() + TICK_SECONDS
            await anyio.sleep(TICK_SECONDS)
            worst_lag = max(worst_lag, time.perf_counter() - due)
            ticks += 1

    async with anyio.create_task_group() as tg:
        tg.start_soon(ticker)
        await anyio.lowlevel.checkpoint()  # let the ticker start
        elapsed = await run_jobs(stream, blocking=blocking)
        jobs_finished.set()
    how = "event.synchronize() on the loop" if blocking else "await event"
    return f"{how:32} {JOBS} GPU jobs of {JOB_SECONDS * 1000:.0f} ms in {elapsed:.2f} s; ticker ran {ticks:3} times, worst lag {worst_lag * 1000:6.1f} ms"


async def main() -> None:
    device, where = open_device()
    print(f"aiogpu demo on {where}")
    with aiogpu.Stream(device) as stream:
        launch_spin(stream, 0)  # warm up: loads the kernel, starts a waiter thread
        await stream.wait_idle()
        print(await measure(stream, blocking=False))
        print(await measure(stream, blocking=True))


if __name__ == "__main__":
    anyio.run(main)
