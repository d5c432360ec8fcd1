"""The goal figures of the other benchmarks in one short run: what an ablation or a comparison
of two engines measures, run after run.

Parts (``--parts``; every one but ``sustained`` by default), each for the strategies of
``--strategies`` (``auto`` by default), on asyncio:

- ``lone``: lone waits on 200 µs and 5 ms of work, each strategy interleaved with the floor (a
  spinning ``cuEventSynchronize`` on the loop) in rounds, as ``benchmarks.wake`` measures them:
  p50 and p99 over the floor's, and CPU per wait as a share of the floor's;
- ``first_wait``: waits on 200 µs of work, each on a new stream (nothing predicted yet),
  interleaved with the floor: p50 over the floor's;
- ``fanout``: 10,000 waiters on 64 streams, each awaiting an event of its own, released at
  once (``benchmarks.wake``'s "own" fan-out), interleaved with the GPU floor: the median wall
  over the floor's, CPU per wait, and how soon after the release the first task woke;
- ``loop_profile``: 64 tasks on 8 pooled streams launching 1 ms of work and waiting for it,
  over and over (``benchmarks.loop_profile``): waits per second and the loop thread's busy time
  per wait;
- ``overlap``: GPU jobs beside host chunks on one loop (``benchmarks.overlap``): the speed-up
  over running them one after the other, and the wall over the floor;
- ``sustained``: ``benchmarks.wake``'s sustained load, shortened, on 32 streams (one per
  hardware queue), on asyncio only: wall over its floor and the cores busy waiting. It asks the
  driver for every hardware queue, in a process of its own beside other parts; the other parts
  run with the driver's default, as most servers do.

Writes ``goals.json`` (every figure as workload, metric, value) to ``--out`` and prints them.
Without a GPU it runs on the simulated device and says so.

Run:  python -m benchmarks.goals [--quick] [--strategies auto poll] [--parts lone fanout ...] [--out DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path
from typing import Any

import aiogpu
from aiogpu.testing import launch_spin

from . import baselines, loop_profile, overlap, wake

PARTS = ("lone", "first_wait", "fanout", "loop_profile", "overlap", "sustained")
DEFAULT_PARTS = ("lone", "first_wait", "fanout", "loop_profile", "overlap")
LONE_WORK = (200e-6, 5e-3)


def _floor_and(strategies: list[str]) -> list[tuple[str, baselines.Maker]]:
    """("floor", the floor's maker), then (strategy, its maker) for each strategy."""
    return [("floor", baselines._aiogpu_event_waiter()(baselines._floor))] + [
        (strategy, baselines._strategy(strategy)) for strategy in strategies
    ]


def lone(device: aiogpu.Device, strategies: list[str], quick: bool) -> list[tuple[str, str, float]]:
    figures = []
    rounds = 2 if quick else 3
    for work in LONE_WORK:
        per_round = (10 if work >= 1e-3 else 20) if quick else (50 if work >= 1e-3 else 100)
        makers = _floor_and(strategies)
        cases: dict[str, tuple[Any, aiogpu.Stream, list[float], list[float]]] = {}
        closers = []
        try:
            for name, make in makers:
                stream = aiogpu.Stream(device)
                wait, close = make(stream)
                closers += [close, stream.close]
                cases[name] = (wait, stream, [], [])
            for _ in range(rounds):  # interleaved: the machine's drift hits the floor and the strategies alike
                for wait, stream, samples, cpus in cases.values():
                    measured, cpu = asyncio.run(wake.time_waits(wait, stream, work, per_round))
                    samples += measured
                    cpus.append(cpu)
        finally:
            for close in closers:
                close()
        _, _, floor_samples, floor_cpus = cases["floor"]
        floor_p50, floor_p99 = statistics.median(floor_samples), wake.percentile(floor_samples, 0.99)
        floor_cpu = sum(floor_cpus) / len(floor_samples)
        for strategy in strategies:
            _, _, samples, cpus = cases[strategy]
            workload = f"lone wait {work * 1e6:.0f} µs, {strategy}"
            figures += [
                (workload, "p50 over floor µs", (statistics.median(samples) - floor_p50) * 1e6),
                (workload, "p99 over floor µs", (wake.percentile(samples, 0.99) - floor_p99) * 1e6),
                (workload, "CPU share of floor", sum(cpus) / len(samples) / floor_cpu),
            ]
    return figures


def first_waits(device: aiogpu.Device, strategies: list[str], quick: bool) -> list[tuple[str, str, float]]:
    """Waits on 200 µs of work, each on a stream nothing has waited on yet (nothing predicted),
    interleaved with the floor: p50 over the floor's."""
    rounds, per_round = (2, 10) if quick else (3, 40)
    work = 200e-6
    makers = _floor_and(strategies)
    samples: dict[str, list[float]] = {name: [] for name, _ in makers}

    async def first_wait(make: baselines.Maker) -> float:
        with aiogpu.Stream(device) as stream:
            wait, close = make(stream)
            try:
                launch_spin(stream, work)
                started = time.perf_counter()
                await wait()
                return time.perf_counter() - started
            finally:
                close()

    async def measure(make: baselines.Maker) -> list[float]:
        return [await first_wait(make) for _ in range(per_round)]

    for _ in range(rounds):  # interleaved
        for name, make in makers:
            samples[name] += asyncio.run(measure(make))
    floor = statistics.median(samples["floor"])
    return [
        (
            f"first wait on a stream {work * 1e6:.0f} µs, {strategy}",
            "p50 over floor µs",
            (statistics.median(samples[strategy]) - floor) * 1e6,
        )
        for strategy in strategies
    ]


def fanout(device: aiogpu.Device, strategies: list[str], quick: bool) -> list[tuple[str, str, float]]:
    waiters = 1_000 if quick else 10_000
    names = [baselines.FANOUT_GPU_FLOOR, *(f"aiogpu {strategy}" for strategy in strategies)]
    runs: dict[str, list[tuple[float, float, float]]] = {name: [] for name in names}
    for _ in range(1 if quick else 3):  # interleaved
        for name in names:
            wall, cpu, _, _, first = asyncio.run(wake.fanout_case(device, name, waiters, 64, True))
            runs[name].append((wall, cpu, first))
    floor = statistics.median(wall for wall, _, _ in runs[baselines.FANOUT_GPU_FLOOR])
    figures = []
    for strategy in strategies:
        measured = runs[f"aiogpu {strategy}"]
        workload = f"fan-out {waiters}x64 own events, {strategy}"
        figures += [
            (workload, "wall / GPU floor", statistics.median(wall for wall, _, _ in measured) / floor),
            (workload, "CPU µs/wait", statistics.median(cpu for _, cpu, _ in measured) / waiters * 1e6),
            (workload, "first wake ms", statistics.median(first for _, _, first in measured) * 1e3),
        ]
    return figures


def saturation(device: aiogpu.Device, strategies: list[str], quick: bool) -> list[tuple[str, str, float]]:
    arguments = argparse.Namespace(
        tasks=16 if quick else 64, streams=8, work=1e-3, seconds=0.3 if quick else 1.5, warmup=0.1 if quick else 0.3
    )
    figures = []
    for strategy in strategies:
        row = loop_profile.run(strategy, device, arguments)
        workload = f"loop profile {arguments.tasks} tasks, {strategy}"
        figures += [(workload, "waits/s", row["waits_per_second"]), (workload, "loop busy µs/wait", row["busy_us"])]
    return figures


def overlapping(device: aiogpu.Device, strategies: list[str], quick: bool) -> list[tuple[str, str, float]]:
    seconds = 3e-3 if quick else 13e-3
    arguments = argparse.Namespace(rounds=4 if quick else 20, gpu=seconds, host=seconds)
    with aiogpu.Stream(device) as stream:
        gpu_floor = overlap.gpu_back_to_back(stream, arguments)
        started = time.perf_counter()
        for _ in range(arguments.rounds):
            overlap.host_chunk(arguments.host)
        floor = max(gpu_floor, time.perf_counter() - started)
        serial = overlap.serial(stream, arguments)
        figures = []
        for strategy in strategies:
            wall = asyncio.run(overlap.overlapped(stream, strategy, arguments))
            workload = f"overlap, {strategy}"
            figures += [(workload, "speed-up", serial / wall), (workload, "wall / overlap floor", wall / floor)]
    return figures


def sustained(device: aiogpu.Device, strategies: list[str], quick: bool) -> list[tuple[str, str, float]]:
    waiters = 1_000 if quick else wake.SUSTAINED_WAITERS
    kernel = 0.5e-3 if quick else wake.SUSTAINED_KERNEL
    layout = wake.sustained_layout(waiters, wake.HARDWARE_QUEUES)  # within the hardware queues
    turns = max(2, round((0.05 if quick else 1.0) / (max(wake.sustained_kernels(layout)) * kernel)))
    figures = []
    with wake.sustained_streams(device, layout) as (streams, events):
        floor, launch_cpu = wake.sustained_floor(streams, events, turns, kernel)
        for strategy in strategies:
            wall, cpu, completed = asyncio.run(
                wake.sustained_run(f"aiogpu {strategy}", streams, events, turns, kernel, wake.SUSTAINED_CAP * floor)
            )
            workload = f"sustained {waiters}x{len(layout)}, {strategy}"
            figures += [
                (workload, "wall / floor", wall * waiters * turns / completed / floor),
                (workload, "waiting cores", (cpu - completed * launch_cpu) / wall),
            ]
    return figures


MEASURE = {
    "lone": lone,
    "first_wait": first_waits,
    "fanout": fanout,
    "loop_profile": saturation,
    "overlap": overlapping,
    "sustained": sustained,
}


def _sustained_apart(arguments: argparse.Namespace) -> list[tuple[str, str, float]]:
    """The sustained part's figures from a process of its own, which asks for every hardware queue."""
    child = ["--parts", "sustained", "--strategies", *arguments.strategies, *(["--quick"] if arguments.quick else [])]
    result, _ = wake.run_apart("goals", child)  # its figures are printed here
    return [(figure["workload"], figure["metric"], figure["value"]) for figure in result["figures"]]


def main(arguments: argparse.Namespace) -> dict[str, Any]:
    # As in ``benchmarks.wake``: only the sustained part asks for every hardware queue.
    alone = list(arguments.parts) == ["sustained"]
    device, simulated = wake.open_device(every_queue=alone)
    environment = baselines.environment(device, simulated)
    where = "the simulated device" if simulated else device.name
    figures = []
    for part in arguments.parts:
        started = time.perf_counter()
        if part == "sustained" and not alone:
            measured = _sustained_apart(arguments)
        else:
            measured = MEASURE[part](device, arguments.strategies, arguments.quick)
        for workload, metric, value in measured:
            print(f"{where}: {workload:42} {metric:22} {value:10.3f}", flush=True)
        print(f"{where}: {part} took {time.perf_counter() - started:.1f} s", flush=True)
        figures += [{"workload": workload, "metric": metric, "value": value} for workload, metric, value in measured]
    return {"environment": environment, "arguments": vars(arguments), "figures": figures}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--strategies", nargs="+", default=["auto"], choices=baselines.STRATEGIES)
    parser.add_argument("--parts", nargs="+", default=list(DEFAULT_PARTS), choices=PARTS)
    parser.add_argument("--quick", action="store_true", help="a short run that only checks it works")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    options = parser.parse_args()
    result = main(options)
    options.out.mkdir(parents=True, exist_ok=True)
    (options.out / "goals.json").write_text(json.dumps(result, indent=1, default=str))
