"""Overlap host-to-device copies, compute and device-to-host copies with coroutines and streams.

Each chunk of data goes through three stages: copy in (``aiogpu.copy_to_device``), compute on
its own stream (a kernel that keeps the GPU busy, standing in for a model), copy out
(``aiogpu.copy_to_host``). One coroutine doing the chunks one after another leaves two of the
three engines idle; three coroutines on three streams overlap one chunk's copies with another's
compute (and, since the stand-in kernel uses one block, the chunks' compute with each other; a
real model that fills the GPU would overlap copies with compute only). The example checks every byte that comes back and prints the achieved
overlap against the serial time. Uses the GPU (with torch or CuPy for device memory) when there
is one, otherwise aiogpu's simulated device, and says which.

Run:  python examples/02_pipeline_overlap.py
"""

# /// script
# dependencies = ["aiogpu", "torch"]
# ///

from __future__ import annotations

import importlib.util
import sys
import time
from functools import partial
from typing import TYPE_CHECKING, Any

import anyio

import aiogpu
from aiogpu.testing import SimulatedDriver, launch_spin

if TYPE_CHECKING:
    from collections.abc import Callable

CHUNKS = 12
LANES = 3  # coroutines, each with its own compute stream


def open_device() -> tuple[aiogpu.Device, str, int, float, Callable[[int], Any]]:
    """(device, what it is, bytes per chunk, compute seconds per chunk, device memory maker)."""
    try:
        device = aiogpu.Device(0)
    except aiogpu.CudaUnavailableError as exc:
        reason = str(exc).split(". ", 1)[0]
        sim = SimulatedDriver(record_latency=0.002)  # copies and compute take simulated time
        return sim.device(0), f"the simulated device (no GPU: {reason})", 1 << 20, 0.004, sim.allocate
    return device, f"GPU {device.ordinal}: {device.name}", 16 << 20, 0.02, partial(gpu_array, device)


def gpu_array(device: aiogpu.Device, nbytes: int) -> Any:
    if importlib.util.find_spec("torch") is not None:
        import torch

        return torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{device.ordinal}")
    import cupy

    with cupy.cuda.Device(device.ordinal):
        return cupy.empty(nbytes, dtype=cupy.uint8)


async def run(
    device: aiogpu.Device, device_array: Callable[[int], Any], chunk_bytes: int, compute_seconds: float, lanes: int
) -> float:
    """Push every chunk through the three stages with ``lanes`` coroutines; return the seconds."""
    chunks = [bytes([index]) * chunk_bytes for index in range(CHUNKS)]
    inputs = [device_array(chunk_bytes) for _ in range(lanes)]
    # A pool (and side stream) per direction, each keeping a buffer per lane for reuse.
    copy_in = aiogpu.PinnedPool(device, max_idle_bytes=lanes * chunk_bytes)
    copy_out = aiogpu.PinnedPool(device, max_idle_bytes=lanes * chunk_bytes)
    streams = [aiogpu.Stream(device, nonblocking=True) for _ in range(lanes)]
    for pool in (copy_in, copy_out):  # allocate the pinned memory before timing
        for buffer in [pool.take(chunk_bytes) for _ in range(lanes)]:
            buffer.release()
    todo = list(range(CHUNKS))
    mismatches: list[int] = []

    async def lane(number: int) -> None:
        stream, buffer = streams[number], inputs[number]
        while todo:
            index = todo.pop(0)
            await aiogpu.copy_to_device(buffer, chunks[index], after=stream, pool=copy_in)
            launch_spin(stream, compute_seconds)  # the model's work, enqueued: no wait here
            result = await aiogpu.copy_to_host(buffer, after=stream, pool=copy_out)
            if bytes(result.view()) != chunks[index]:  # every byte (host work, in both runs alike)
                mismatches.append(index)
            result.release()

    started = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for number in range(lanes):
            tg.start_soon(lane, number)
    elapsed = time.perf_counter() - started
    for stream in streams:
        stream.close()
    copy_in.close()
    copy_out.close()
    if mismatches:
        sys.exit(f"chunks {mismatches} came back wrong")
    return elapsed


async def main() -> None:
    device, where, chunk_bytes, compute_seconds, device_array = open_device()
    print(
        f"aiogpu pipeline on {where}: {CHUNKS} chunks of {chunk_bytes >> 20} MiB, {compute_seconds * 1e3:.0f} ms of compute each"
    )
    await run(device, device_array, chunk_bytes, compute_seconds, LANES)  # warm-up: kernels loaded, memory touched
    serial = await run(device, device_array, chunk_bytes, compute_seconds, 1)
    overlapped = await run(device, device_array, chunk_bytes, compute_seconds, LANES)
    print(f"serial (1 coroutine)     {serial * 1e3:7.1f} ms")
    print(f"pipelined ({LANES} coroutines) {overlapped * 1e3:7.1f} ms: {serial / overlapped:.2f}x faster, every byte checked")


if __name__ == "__main__":
    anyio.run(main)
