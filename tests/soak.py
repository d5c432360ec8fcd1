"""Soak: a million awaits of real recorded events, with resident memory and threads watched.

``python -m tests.soak --device simulated|gpu --awaits N --strategy S --loop L`` (from the
project root) runs the load below and prints one JSON line: awaits done, resident memory (RSS,
not its peak: ``/proc/self/statm``) after warm-up, at the end and in between, the growth, the
most threads seen and the threads at the end, and the elapsed time. ``tests/test_soak.py`` and
``tests/gpu/test_soak.py`` run it in a child process and check the figures.

The load is a server's. ``STREAMS`` streams; each round enqueues ``STAGES`` pieces of work on
every stream (``launch_spin``: a kernel on the GPU, timed work on the simulator), each followed
by an event — alternately a new event, closed at the end of the round, and one of the stream's
own events, re-recorded every round — and starts one task per request (``AWAITERS_PER_STREAM``
per stream, 128 in all), each awaiting its stream's stages in order, as a handler awaits copy
in, compute and copy out: 512 awaits per round, 16 tasks on every event. Every ``HELD_EVERY``-th
round holds its streams with a ``Latch`` until every task has started, so all of its first-stage
awaits find their work pending and go through the wake engine (parked watchers, waiter threads
blocked in the driver, doorbells); in the other rounds the awaits race the work. Every
``CHURN_EVERY`` rounds one stream and its events are closed and replaced. ``--strategy mixed``
gives each event of a round one of the four strategies, rotating from round to round.

The first ``WARMUP_SHARE`` of the awaits is warm-up (the wake engine's threads start, the
predictors learn, allocators grow their pools); then ``gc.collect()`` and the baseline RSS.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import platform
import sys
import threading
import time
from typing import Any

import anyio
import anyio.lowlevel

import aiogpu
from aiogpu._wait import STRATEGIES, _thread
from aiogpu.testing import Latch, SimulatedDriver, launch_spin

#: Event loops by name, as ``anyio.run`` arguments: (backend, backend options).
LOOPS: dict[str, tuple[str, dict[str, Any]]] = {
    "asyncio": ("asyncio", {}),
    "uvloop": ("asyncio", {"use_uvloop": True}),
    "trio": ("trio", {}),
}
STREAMS = 8
STAGES = 4  # events per stream per round: new ones and re-recorded ones, alternately
AWAITERS_PER_STREAM = 16  # requests (tasks) per stream per round, each awaiting every stage
HELD_EVERY = 2  # every other round: 40-75 % of all awaits then find their work pending (measured)
CHURN_EVERY = 64
WARMUP_SHARE = 0.05
SAMPLES = 10  # RSS samples after warm-up, evenly spread, besides the baseline and the end
#: Work per stage: stream ``i`` runs ``WORK * (1 + i / STREAMS)`` before its first event (so the
#: streams complete at different times) and ``WORK`` before each of the others. Long enough that
#: many awaits find it pending; short enough that a million awaits take under a minute.
WORK = {"simulated": 3e-3, "gpu": 2e-3}
#: Bound on one round (a hang fails the soak instead of stalling it).
ROUND_TIMEOUT = 30.0
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


def resident_bytes() -> int:
    """The process's resident set size now (not its peak)."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * PAGE_SIZE


def os_threads() -> int:
    """Threads of this process as the kernel counts them (the driver's own threads included)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("Threads:"):
                return int(line.split()[1])
    return 0


class Soak:
    def __init__(self, device: aiogpu.Device, awaits: int, strategy: str, work: float, loop: str) -> None:
        self.device = device
        self.target = awaits
        self.strategy = strategy
        self.work = work
        self.loop = loop
        self.streams = [aiogpu.Stream(device) for _ in range(STREAMS)]
        self.reused = [[aiogpu.Event(device) for _ in range(STAGES // 2)] for _ in range(STREAMS)]
        self.rounds = 0
        self.started = 0  # awaits started
        self.done = 0  # awaits that returned
        self.pending = 0  # awaits that found their work still pending when they started
        self.arrived = 0  # tasks of the current round that have started
        self.held_rounds = 0
        self.held_tasks = 0  # tasks of held rounds: their first await always finds its work pending
        self.events_created = 0
        self.tasks = 0
        self.threads_max = threading.active_count()
        self.os_threads_max = os_threads()
        self.samples: list[dict[str, int]] = []
        self.baseline: dict[str, int] | None = None
        self.warmup_awaits = max(1, int(awaits * WARMUP_SHARE))

    def strategy_of(self, stream: int, stage: int) -> aiogpu.WaitStrategy:
        if self.strategy == "mixed":
            return STRATEGIES[(stream + stage + self.rounds) % len(STRATEGIES)]  # type: ignore[return-value]
        return self.strategy  # type: ignore[return-value]

    async def request(self, events: list[tuple[aiogpu.Event, aiogpu.WaitStrategy]]) -> None:
        """One request: awaits its stream's stages in order, as a handler awaits copy in, compute, copy out."""
        self.arrived += 1
        for event, strategy in events:
            if not event.is_done:
                self.pending += 1
            await event.wait(strategy=strategy)
            self.done += 1

    def enqueue(self, latch: Latch | None) -> tuple[list[list[tuple[aiogpu.Event, aiogpu.WaitStrategy]]], list[aiogpu.Event]]:
        """Enqueue a round's work on every stream; its stages' events per stream, and the new ones."""
        fresh: list[aiogpu.Event] = []
        stages: list[list[tuple[aiogpu.Event, aiogpu.WaitStrategy]]] = []
        for i, stream in enumerate(self.streams):
            if latch is not None:
                latch.block(stream)
            events = []
            for stage in range(STAGES):
                launch_spin(stream, self.work * (1 + i / STREAMS) if stage == 0 else self.work)
                if stage % 2 == 0:  # a new event: closed at the end of the round
                    event = stream.record()
                    fresh.append(event)
                else:  # the stream's own events, re-recorded every round (both ways of saying it)
                    event = self.reused[i][stage // 2]
                    if self.rounds % 2:
                        stream.record(event)
                    else:
                        event.record(stream)
                events.append((event, self.strategy_of(i, stage)))
            stages.append(events)
        self.events_created += len(fresh)
        return stages, fresh

    async def round(self, awaits: int) -> None:
        held = self.rounds % HELD_EVERY == HELD_EVERY - 1
        latch = Latch(self.device) if held else None
        fresh: list[aiogpu.Event] = []
        requests: list[list[tuple[aiogpu.Event, aiogpu.WaitStrategy]]] = []
        try:
            stages, fresh = self.enqueue(latch)
            for k in range(-(-awaits // STAGES)):  # the last round may end with a short request
                take = min(STAGES, awaits - k * STAGES)
                requests.append(stages[k % STREAMS][:take])
            self.arrived = 0
            self.started += awaits
            self.tasks += len(requests)
            with anyio.fail_after(ROUND_TIMEOUT):
                await self.serve(requests, latch)
        finally:
            if latch is not None:
                latch.close()
                self.held_rounds += 1
                self.held_tasks += len(requests)
            for event in fresh:
                event.close()
        self.rounds += 1
        if self.rounds % CHURN_EVERY == 0:
            self.replace_stream(self.rounds // CHURN_EVERY % STREAMS)

    async def serve(self, requests: list[list[tuple[aiogpu.Event, aiogpu.WaitStrategy]]], latch: Latch | None) -> None:
        """One task per request; a held round's latch opens once every task has started waiting."""

        async def release_when_all_wait() -> None:
            assert latch is not None
            while self.arrived < len(requests):  # each task runs to its first await in one step
                await anyio.lowlevel.checkpoint()
            latch.release()

        if self.loop == "trio":  # trio's own nursery, through anyio
            async with anyio.create_task_group() as tg:
                for events in requests:
                    tg.start_soon(self.request, events)
                if latch is not None:
                    await release_when_all_wait()
        else:  # asyncio's own tasks: what asyncio servers spawn per request
            coroutines = [self.request(events) for events in requests]
            if latch is not None:
                coroutines.append(release_when_all_wait())
            await asyncio.gather(*coroutines)

    def replace_stream(self, i: int) -> None:
        for event in self.reused[i]:
            event.close()
        self.streams[i].close()
        self.streams[i] = aiogpu.Stream(self.device)
        self.reused[i] = [aiogpu.Event(self.device) for _ in range(STAGES // 2)]

    def sample(self) -> dict[str, int]:
        return {
            "awaits": self.done,
            "rss": resident_bytes(),
            "threads": threading.active_count(),
            "os_threads": os_threads(),
        }

    def watch_threads(self) -> None:
        self.threads_max = max(self.threads_max, threading.active_count())
        self.os_threads_max = max(self.os_threads_max, os_threads())

    async def run(self) -> None:
        per_round = STREAMS * AWAITERS_PER_STREAM * STAGES
        next_sample = 0
        while self.started < self.target:
            await self.round(min(per_round, self.target - self.started))
            self.watch_threads()
            if self.baseline is None:
                if self.done >= self.warmup_awaits:
                    gc.collect()
                    self.baseline = self.sample()
                    self.samples.append(self.baseline)
                    next_sample = self.done + (self.target - self.done) // SAMPLES
            elif self.done >= next_sample and self.started < self.target:
                self.samples.append(self.sample())
                next_sample += max(1, (self.target - self.baseline["awaits"]) // SAMPLES)

    def close(self) -> None:
        for events in self.reused:
            for event in events:
                event.close()
        for stream in self.streams:
            stream.close()


def open_device(kind: str) -> tuple[aiogpu.Device, SimulatedDriver | None]:
    if kind == "simulated":
        sim = SimulatedDriver(forbid_blocking_on_event_loop=True)  # blocking a loop thread raises
        return sim.device(0), sim
    device = aiogpu.Device(0)
    with aiogpu.Stream(device) as stream:  # load the kernel now: lazy loading could wait behind a Latch
        launch_spin(stream, 0)
        stream.synchronize()
    return device, None


def soak(kind: str, awaits: int, strategy: str, loop: str, work: float | None = None) -> dict[str, Any]:
    device, sim = open_device(kind)
    runner = Soak(device, awaits, strategy, WORK[kind] if work is None else work, loop)
    backend, options = LOOPS[loop]
    started = time.perf_counter()
    try:
        anyio.run(runner.run, backend=backend, backend_options=options)
    finally:
        runner.close()
    elapsed = time.perf_counter() - started
    gc.collect()
    end = runner.sample()
    runner.watch_threads()
    baseline = runner.baseline if runner.baseline is not None else end
    samples = [*runner.samples, end]
    pool = _thread.pool().statistics()
    report: dict[str, Any] = {
        "device": kind if sim is not None else f"gpu: {device.name}",
        "loop": loop,
        "strategy": strategy,
        "awaits": runner.done,
        "awaits_started": runner.started,
        "awaits_pending_at_start": runner.pending,
        "warmup_awaits": baseline["awaits"],
        "rounds": runner.rounds,
        "held_rounds": runner.held_rounds,
        "held_round_tasks": runner.held_tasks,
        "events_created": runner.events_created,
        "tasks": runner.tasks,
        "work_s": runner.work,
        "rss_baseline": baseline["rss"],
        "rss_end": end["rss"],
        "rss_growth": end["rss"] - baseline["rss"],
        "rss_max_after_warmup": max(sample["rss"] for sample in samples),
        "rss_samples": samples,
        "threads_max": runner.threads_max,
        "threads_end": end["threads"],
        "os_threads_max": runner.os_threads_max,
        "os_threads_end": end["os_threads"],
        "waiter_threads_end": pool.threads,
        "waiter_subscribers_end": pool.subscribers,
        "waiter_max_threads": _thread.MAX_THREADS,
        "elapsed_s": round(elapsed, 3),
        "awaits_per_s": round(runner.done / elapsed, 1) if elapsed > 0 else None,
        "python": platform.python_version(),
    }
    if sim is not None:  # once abandoned waiter jobs are over and idle waiter threads gone (with their helper events)
        settled = _thread.pool()
        report["waiter_jobs_settled"] = settled.wait_quiet(30.0)
        settled.stop_idle_threads()
        statistics = sim.statistics()
        report["sim_live_events"] = statistics.live_events
        report["sim_live_streams"] = statistics.live_streams
        report["sim_lifetime_violations"] = statistics.lifetime_violations
    return report


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.soak", description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--device", choices=("simulated", "gpu"), default="simulated")
    parser.add_argument("--awaits", type=int, default=1_000_000)
    parser.add_argument("--strategy", choices=(*STRATEGIES, "mixed"), default="mixed")
    parser.add_argument("--loop", choices=tuple(LOOPS), default="asyncio")
    parser.add_argument("--work-us", type=float, default=None, help="work per stream per round (default: by device)")
    args = parser.parse_args(argv)
    if args.awaits < 1:
        parser.error("--awaits must be at least 1")
    work = None if args.work_us is None else args.work_us * 1e-6
    print(json.dumps(soak(args.device, args.awaits, args.strategy, args.loop, work)), flush=True)


if __name__ == "__main__":
    sys.exit(main())
