"""Overlap of host and GPU work on one event loop, against its floor, for each way of waiting.

Two tasks share the loop for ``--rounds`` rounds: one launches ``--gpu`` seconds of GPU work (a
spin kernel, simulated without a GPU) and waits for it, again and again; the other does
``--host`` seconds of pure-Python work between ``await asyncio.sleep(0)``. Run one after the
other they take the serial time (the GPU jobs waited for with a busy ``synchronize``, then the
host chunks); the floor is the longer of the GPU jobs back to back (launched all at once and
synchronized: no host work at all) and the host chunks back to back. Each way of waiting reports
the speed-up over serial and how far its wall time is above the floor.

The tasks cooperate: a GPU job that ends while a host chunk runs is seen when the chunk yields,
so the GPU idles for the rest of the chunk. How much of that a way of waiting avoids is what
the speed-up measures; the floor is what launching the next job before awaiting the last one
(two in flight) would reach.

Run:  python -m benchmarks.overlap [--quick] [--rounds 20] [--gpu 0.013] [--host 0.013] [--out DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path

import aiogpu
from aiogpu.testing import launch_spin
from benchmarks.wake import open_device

WAYS = ("auto", "poll", "thread", "callback", "to_thread", "query+sleep(0)")


def host_chunk(seconds: float) -> None:
    """Pure-Python work for about ``seconds`` (holding the GIL, as request handling does)."""
    end = time.perf_counter() + seconds
    total = 0
    while time.perf_counter() < end:
        total += sum(range(200))


async def wait(event: aiogpu.Event, way: str) -> None:
    if way == "to_thread":
        await asyncio.to_thread(event.synchronize)
    elif way == "query+sleep(0)":
        while not event.is_done:
            await asyncio.sleep(0)
    else:
        await event.wait(strategy=way)  # type: ignore[arg-type]


async def overlapped(stream: aiogpu.Stream, way: str, arguments: argparse.Namespace) -> float:
    async def gpu_task() -> None:
        for _ in range(arguments.rounds):
            launch_spin(stream, arguments.gpu)
            with stream.record() as done:
                await wait(done, way)

    async def host_task() -> None:
        for _ in range(arguments.rounds):
            host_chunk(arguments.host)
            await asyncio.sleep(0)

    started = time.perf_counter()
    await asyncio.gather(gpu_task(), host_task())
    return time.perf_counter() - started


def gpu_back_to_back(stream: aiogpu.Stream, arguments: argparse.Namespace) -> float:
    started = time.perf_counter()
    for _ in range(arguments.rounds):
        launch_spin(stream, arguments.gpu)
    with stream.record() as done:
        done.synchronize()
    return time.perf_counter() - started


def serial(stream: aiogpu.Stream, arguments: argparse.Namespace) -> float:
    started = time.perf_counter()
    for _ in range(arguments.rounds):
        launch_spin(stream, arguments.gpu)
        with stream.record() as done:
            done.synchronize()
    for _ in range(arguments.rounds):
        host_chunk(arguments.host)
    return time.perf_counter() - started


def main(arguments: argparse.Namespace) -> dict[str, object]:
    device, simulated = open_device()
    where = "the simulated device" if simulated else device.name
    stream = aiogpu.Stream(device)
    rows: list[dict[str, object]] = []
    for repeat in range(arguments.repeats):
        gpu_floor = gpu_back_to_back(stream, arguments)
        started = time.perf_counter()
        for _ in range(arguments.rounds):
            host_chunk(arguments.host)
        floor = max(gpu_floor, time.perf_counter() - started)
        serial_time = serial(stream, arguments)
        for way in arguments.ways:
            wall = asyncio.run(overlapped(stream, way, arguments))
            rows.append({"repeat": repeat, "way": way, "wall_s": wall, "floor_s": floor, "serial_s": serial_time})
    stream.close()
    print(
        f"{where}: {arguments.rounds} rounds of {arguments.gpu * 1e3:g} ms GPU jobs beside {arguments.host * 1e3:g} ms host chunks"
    )
    print(f"{'way':15} {'wall ms':>8} {'speed-up':>9} {'over floor':>11}")
    for way in arguments.ways:
        mine = [row for row in rows if row["way"] == way]
        wall = statistics.median(float(row["wall_s"]) for row in mine)  # type: ignore[arg-type]
        speedup = statistics.median(float(row["serial_s"]) / float(row["wall_s"]) for row in mine)  # type: ignore[arg-type]
        over = statistics.median(float(row["wall_s"]) / float(row["floor_s"]) for row in mine)  # type: ignore[arg-type]
        print(f"{way:15} {wall * 1e3:8.1f} {speedup:8.2f}x {over:10.2f}x")
    floor_ms = statistics.median(float(row["floor_s"]) for row in rows) * 1e3  # type: ignore[arg-type]
    serial_ms = statistics.median(float(row["serial_s"]) for row in rows) * 1e3  # type: ignore[arg-type]
    print(f"floor {floor_ms:.1f} ms, serial {serial_ms:.1f} ms (best possible speed-up {serial_ms / floor_ms:.2f}x)")
    return {"device": where, "arguments": vars(arguments), "rows": rows}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ways", nargs="+", default=list(WAYS))
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--gpu", type=float, default=0.013, help="seconds of GPU work per job")
    parser.add_argument("--host", type=float, default=0.013, help="seconds of host work per chunk")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="a short run that only checks the benchmark works")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    options = parser.parse_args()
    if options.quick:
        options.rounds, options.repeats, options.gpu, options.host = 4, 1, 0.003, 0.003
    result = main(options)
    options.out.mkdir(parents=True, exist_ok=True)
    (options.out / "overlap.json").write_text(json.dumps(result, indent=1, default=str))
