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
  once (``benchmarks.wake``'s "own" fan-out), interleaved with the GPU floor and the
  stream-order floor (plain futures, each stream's tasks woken as soon as it is done: the
  loop's own cost of resuming them): the median wall over each floor's, CPU per wait, and how
  soon after the release the first task woke;
- ``loop_profile``: 64 tasks on 8 pooled streams launching 1 ms of work and waiting for it,
  over and over (``benchmarks.loop_profile``): waits per second and the loop thread's busy time
  per wait;
- ``overlap``: GPU jobs beside host chunks on one loop (``benchmarks.overlap``): the speed-up
  over running them one after the other, and the wall over the floor;
- ``sustained``: ``benchmarks.wake``'s sustained load, shortened, on 32 streams (one per
  hardware queue), on asyncio only: wall over its floor, the cores busy waiting, and the cores
  of every thread but the loop's (waiter and timer threads). It asks the
  driver for every hardware queue, in a process of its own beside other parts; the other parts
  run with the driver's default, as most servers do.

Four more parts, not run by default, each the case one heuristic of the wake engine exists for
(``benchmarks.ablation`` switches it off there):

- ``short``: lone waits on 20 µs of work, as ``lone`` measures them (spin-ahead: a wait whose
  work ends before an entry and a plan would be set up);
- ``timers``: an application's 1 kHz ``asyncio.sleep`` ticker beside lone waits on 5 ms of work,
  back to back: how late its sleeps end, p50 and p99 (keeping the loop's timers on time while
  a wait is parked), and the same ticker on a loop with nothing else to do;
- ``varying``: lone waits on work of 1 or 5 ms in a random order (the same for every
  strategy and the floor), so that a prediction is often milliseconds off either way: p50 and
  p99 over the floor's, CPU as a share of the floor's (``auto``'s looks before its close watch);
- ``backlog``: 10,000 waits on 64 streams, each on an event of its own, whose work all ends
  while the loop is blocked (a long host step): how soon after the loop is back the first task
  resumes, and the last (the sweep's wake budget).

Writes ``goals.json`` (every figure as workload, metric, value) to ``--out`` and prints them.
Without a GPU it runs on the simulated device and says so.

Run:  python -m benchmarks.goals [--quick] [--strategies auto poll] [--parts lone fanout ...] [--out DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiogpu
from aiogpu.testing import Latch, launch_spin

from . import baselines, loop_profile, overlap, wake

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

PARTS = ("lone", "first_wait", "fanout", "loop_profile", "overlap", "sustained", "short", "timers", "varying", "backlog")
DEFAULT_PARTS = ("lone", "first_wait", "fanout", "loop_profile", "overlap")
LONE_WORK = (200e-6, 5e-3)
SHORT_WORK = 20e-6
TICK = 1e-3  # the ticker's period
TIMER_WORK = 5e-3
VARYING_WORK = (1e-3, 5e-3)


def _floor_and(strategies: list[str]) -> list[tuple[str, baselines.Maker]]:
    """("floor", the floor's maker), then (strategy, its maker) for each strategy."""
    return [("floor", baselines._aiogpu_event_waiter()(baselines._floor))] + [
        (strategy, baselines._strategy(strategy)) for strategy in strategies
    ]


def lone(
    device: aiogpu.Device, strategies: list[str], quick: bool, works: tuple[float, ...] = LONE_WORK
) -> list[tuple[str, str, float]]:
    figures = []
    rounds = 2 if quick else 3
    for work in works:
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
    floors = (baselines.FANOUT_GPU_FLOOR, baselines.FANOUT_STREAM_ORDER_FLOOR)
    names = [*floors, *(f"aiogpu {strategy}" for strategy in strategies)]
    runs: dict[str, list[tuple[float, float, float]]] = {name: [] for name in names}
    for _ in range(1 if quick else 3):  # interleaved
        for name in names:
            wall, cpu, _, _, first = asyncio.run(wake.fanout_case(device, name, waiters, 64, True))
            runs[name].append((wall, cpu, first))
    floor, stream_order = (statistics.median(wall for wall, _, _ in runs[name]) for name in floors)
    # The stream-order floor wakes each stream's tasks through plain futures as soon as the stream
    # is done: what the loop itself costs to resume the tasks while the GPU finishes the rest.
    figures = [(f"fan-out {waiters}x64 own events, stream-order floor", "wall / GPU floor", stream_order / floor)]
    for strategy in strategies:
        measured = runs[f"aiogpu {strategy}"]
        workload = f"fan-out {waiters}x64 own events, {strategy}"
        median_wall = statistics.median(wall for wall, _, _ in measured)
        figures += [
            (workload, "wall / GPU floor", median_wall / floor),
            (workload, "wall / stream-order floor", median_wall / stream_order),
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
            run = asyncio.run(
                wake.sustained_run(f"aiogpu {strategy}", streams, events, turns, kernel, wake.SUSTAINED_CAP * floor)
            )
            wall, cpu, completed = run.wall, run.cpu, run.completed
            workload = f"sustained {waiters}x{len(layout)}, {strategy}"
            figures += [
                (workload, "wall / floor", wall * waiters * turns / completed / floor),
                (workload, "waiting cores", (cpu - completed * launch_cpu) / wall),
                (workload, "other threads' cores", run.other_threads_cpu / wall),
            ]
    return figures


def short(device: aiogpu.Device, strategies: list[str], quick: bool) -> list[tuple[str, str, float]]:
    return lone(device, strategies, quick, works=(SHORT_WORK,))


async def _ticker_lags(wait: Callable[[], Awaitable[None]] | None, stream: aiogpu.Stream, seconds: float) -> list[float]:
    """How late each sleep of a ``TICK`` ticker ends while lone waits on ``TIMER_WORK`` run back
    to back for ``seconds`` (``wait`` ``None``: while the loop has nothing else to do)."""
    lags: list[float] = []
    finished = False

    async def ticker() -> None:
        while not finished:
            due = time.perf_counter() + TICK
            await asyncio.sleep(TICK)
            lags.append(max(0.0, time.perf_counter() - due))

    task = asyncio.create_task(ticker())
    await asyncio.sleep(0)
    if wait is None:
        await asyncio.sleep(seconds)
    else:
        until = time.perf_counter() + seconds
        while time.perf_counter() < until:
            await wake.time_waits(wait, stream, TIMER_WORK, 20)
    finished = True
    await task
    return lags


def timers(device: aiogpu.Device, strategies: list[str], quick: bool) -> list[tuple[str, str, float]]:
    rounds, seconds = (1, 0.2) if quick else (3, 1.0)
    lags: dict[str | None, list[float]] = {None: [], **{strategy: [] for strategy in strategies}}
    with aiogpu.Stream(device) as stream:
        made = {strategy: baselines._strategy(strategy)(stream) for strategy in strategies}
        try:
            for _ in range(rounds):  # interleaved
                for strategy in lags:
                    wait = None if strategy is None else made[strategy][0]
                    lags[strategy] += asyncio.run(_ticker_lags(wait, stream, seconds))
        finally:
            for _, close in made.values():
                close()
    figures = []
    for strategy, samples in lags.items():
        workload = "timers, nothing else" if strategy is None else f"timers beside {TIMER_WORK * 1e6:.0f} µs waits, {strategy}"
        figures += [
            (workload, "timer lag p50 ms", statistics.median(samples) * 1e3),
            (workload, "timer lag p99 ms", wake.percentile(samples, 0.99) * 1e3),
        ]
    return figures


def varying(device: aiogpu.Device, strategies: list[str], quick: bool) -> list[tuple[str, str, float]]:
    rounds, per_round = (2, 10) if quick else (3, 60)
    works = random.Random(42).choices(VARYING_WORK, k=per_round)
    samples: dict[str, list[float]] = {}
    cpus: dict[str, float] = {}
    with aiogpu.Stream(device) as stream:
        makers = [(name, *make(stream)) for name, make in _floor_and(strategies)]
        try:
            for _ in range(rounds):  # interleaved
                for name, wait, _ in makers:
                    measured, cpu = asyncio.run(_time_works(wait, stream, works))
                    samples.setdefault(name, []).extend(measured)
                    cpus[name] = cpus.get(name, 0.0) + cpu
        finally:
            for _, _, close in makers:
                close()
    floor = samples["floor"]
    figures = []
    for strategy in strategies:
        workload = f"varying 1 or 5 ms, {strategy}"
        figures += [
            (workload, "p50 over floor µs", (statistics.median(samples[strategy]) - statistics.median(floor)) * 1e6),
            (workload, "p99 over floor µs", (wake.percentile(samples[strategy], 0.99) - wake.percentile(floor, 0.99)) * 1e6),
            (workload, "CPU share of floor", cpus[strategy] / cpus["floor"]),
        ]
    return figures


async def _time_works(
    wait: Callable[[], Awaitable[None]], stream: aiogpu.Stream, works: list[float]
) -> tuple[list[float], float]:
    """Each of ``works`` seconds of GPU work launched and waited for in turn: (how much longer than
    its work each wait took, CPU seconds)."""
    for work in works[:10]:  # warm up
        launch_spin(stream, work)
        await wait()
    samples = []
    cpu = time.process_time()
    for work in works:
        launch_spin(stream, work)
        started = time.perf_counter()
        await wait()
        samples.append(time.perf_counter() - started - work)
    return samples, time.process_time() - cpu


def backlog(device: aiogpu.Device, strategies: list[str], quick: bool) -> list[tuple[str, str, float]]:
    waiters, nstreams = (1_000, 16) if quick else (10_000, 64)
    runs: dict[str, list[tuple[float, float]]] = {strategy: [] for strategy in strategies}
    for _ in range(1 if quick else 3):  # interleaved
        for strategy in strategies:
            runs[strategy].append(asyncio.run(_backlog_case(device, strategy, waiters, nstreams)))
    figures = []
    for strategy, measured in runs.items():
        workload = f"backlog {waiters}x{nstreams} own events, {strategy}"
        figures += [
            (workload, "first wake ms", statistics.median(first for first, _ in measured) * 1e3),
            (workload, "last wake ms", statistics.median(last for _, last in measured) * 1e3),
        ]
    return figures


async def _backlog_case(device: aiogpu.Device, strategy: str, waiters: int, nstreams: int) -> tuple[float, float]:
    """Seconds from the loop's return to the first waiter's wake-up and to the last's."""
    streams = [aiogpu.Stream(device, nonblocking=True) for _ in range(nstreams)]
    per_stream = -(-waiters // nstreams)
    try:
        with Latch(device) as latch:
            events = []
            for stream in streams:
                latch.block(stream)
                launch_spin(stream, 1e-3)
                events.append([stream.record() for _ in range(per_stream)])
            targets = [event for row in zip(*events, strict=True) for event in row][:waiters]
            wait_all, tasks = baselines.fanout_tasks(f"aiogpu {strategy}", targets, events)
            await asyncio.sleep(0)  # every waiter is parked before the release
            await asyncio.sleep(0)
            latch.release()
            for stream in streams:  # a long host step: the loop is blocked until all is done
                stream.synchronize()
            back = time.perf_counter()
            first = await wait_all() - back
            last = time.perf_counter() - back
            del wait_all, tasks
            for row in events:
                for event in row:
                    event.close()
            return first, last
    finally:
        for stream in streams:
            stream.close()


MEASURE = {
    "lone": lone,
    "first_wait": first_waits,
    "fanout": fanout,
    "loop_profile": saturation,
    "overlap": overlapping,
    "sustained": sustained,
    "short": short,
    "timers": timers,
    "varying": varying,
    "backlog": backlog,
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
