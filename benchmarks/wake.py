"""Wake-up benchmark: aiogpu's wait strategies against what async code does today, in one run.

For GPU work of about 20 µs, 200 µs and 5 ms (a kernel that spins for that long) it measures,
for each way of waiting:

- wake latency: p50 and p99 of the time from the launch call's return to the wake-up (the
  launch call itself varies by tens of µs from call to call and is the same for
  every waiter), and the overhead over the floor (a busy ``cuEventSynchronize`` on the loop,
  measured in the same run);
- host CPU per wait (process CPU time over the case divided by waits), also as a fraction of
  the floor's;
- event-loop responsiveness while the waits run, two ways, each over at least ``LAG_SECONDS``
  in turn (and the garbage collector's pauses meanwhile; the start-up heap is frozen first, as
  servers do): how late the loop reads input that another process writes to a pipe at 1 kHz (as
  requests arrive on a socket), and how late a 1 kHz ``asyncio.sleep`` ticker wakes. Not at
  once: asyncio rounds a sleep's timeout up to whole milliseconds, so each read of the input,
  arriving at its own moments, leaves the loop to sleep up to a millisecond past the ticker's
  next tick, and the ticker would measure the input's effect rather than the strategy's;
  and the input probe on a loop that runs nothing else: the lag the machine alone causes (a
  loop asleep in ``epoll_wait`` woken late by the OS), the reference for every other case's lag;

each workload in ``LATENCY_ROUNDS`` rounds, every way of waiting (and the idle probe) once per
round, so that the machine's drift reaches all of them alike;

and fan-out: 1,000 and 10,000 concurrent waiters over 1, 8 and 64 streams (an event after each
kernel, shared by several waiters where there are more waiters than kernels), and 10,000 on 64
streams each awaiting an event of its own, work queued behind a
latch and then released, ``FANOUT_REPEATS`` times each (medians, and the best run): wall time against the GPU floor
(synchronizing the last event of each stream, no waiting task at all), beside two rows of plain
futures, one per waiting task: the task floor (the GPU floor, then resolving them all: waking
the N tasks once everything is done) and the stream-order floor (each stream synchronized in
turn and its tasks resolved and run before the next: waking tasks while the GPU finishes the
rest, as a waking engine does, with nothing to ask the driver but one synchronize per stream) —
and host CPU per wait, in all and over the task floor's (what the way of waiting adds to
the loop's own cost of waking a task). Each waiting task counts itself done on a shared
countdown. Fan-out runs on asyncio and again on uvloop where it is installed (uvicorn's loop).
The garbage collector is off while a fan-out runs (as ``timeit`` does). Before each fan-out run
a fixed pure-Python loop is timed (``host_probe``): how fast the host ran Python at that moment.

and sustained load: 10,240 tasks on 64 streams, each in turn recording its event on its stream
(every fourth launching a kernel of ``SUSTAINED_KERNEL`` first) and awaiting it, again and
again for about ``SUSTAINED_SECONDS`` of GPU time, so that every stream always has 40 kernels
queued and completions arrive steadily rather than in one released burst: wall time against
its floor (the same launches and recordings made by a plain loop that synchronizes each event in
turn, no task at all: the kernels back to back on every stream at once, as the GPU runs them)
and CPU as cores busy (process CPU time over wall), in all and less the launches' and
recordings' own CPU (measured in the floor run): what the way of waiting costs, and less also
the loop's own cost of resuming the tasks from plain futures (``task_wakes``): what the engine
costs. On asyncio and uvloop, for every strategy, ``thread`` on blocking-sync events,
``asyncio.to_thread(event.synchronize)`` and a reference that is no way to wait, the least CPU a
waiter on asyncio spends here (``least_waiter``), ``SUSTAINED_REPEATS`` times interleaved; a
way that falls behind stops starting new turns at ``SUSTAINED_CAP`` times the floor's wall and
its wall is scaled to the work it did. The goals (``SUSTAINED_GOALS``) are printed as met or
not met, each with the least waiter's cores beside it.

Writes ``wake.json``, ``wake.md`` and ``wake.png`` (latency overhead against CPU per wait, one
point per strategy and workload, and the sustained load's wall against cores) to ``--out`` and
prints a progress line per case. Without a GPU it runs on aiogpu's simulated device and labels
every figure as simulated. ``--parts`` runs some of latency, fan-out and sustained load only.

Run:  python -m benchmarks.wake [--quick] [--parts latency fanout sustained] [--out DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import itertools
import json
import math
import os
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import aiogpu
from aiogpu.testing import Latch, SimulatedDriver, launch_spin

from . import _child, baselines, least_waiter, report

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Coroutine, Iterator

WORKLOADS = (20e-6, 200e-6, 5e-3)
FANOUT_WAITERS = (1_000, 10_000)
FANOUT_STREAMS = (1, 8, 64)
# Too many operations queued behind a held stream make the launch call itself block the host
# until the latch opens (which it never would): the driver's queues are finite, and how many
# operations fit depends on the device and driver, a few thousand on one stream and more over
# several. The limits below stay well inside that: at most 400 kernels per stream and 3,000 in
# all, each followed by one event (waiters share events), and where every waiter has an event of
# its own at most 1,000 operations per stream (13,000 in all for 10,000 waiters on 64 streams).
EVENTS_PER_STREAM_MAX = 400
EVENTS_MAX = 3_000
OPERATIONS_PER_STREAM_MAX = 1_000
#: Operations queued on all streams together: the driver's queues are shared by a context's
#: streams, and enqueueing blocks once they are full (``benchmarks.memory_flags`` finds where).
OPERATIONS_MAX = 13_000
#: (waiters, streams) where every waiter also gets an event of its own (within the limit above):
#: an inference server's requests each await their own recording.
FANOUT_OWN_EVENTS = ((10_000, 64),)
FANOUT_KERNEL = 20e-6
#: Each fan-out case runs this many times, the waiters interleaved; the tables give medians (a
#: single 10,000-task case varies widely from run to run on a VM, where the host's pace changes
#: between one run and the next) and the best run: what the way of waiting costs when the host
#: does not get in the way.
FANOUT_REPEATS = 7
#: The host probe's loop: about a millisecond of pure Python on a server CPU at full speed, long
#: enough to time reliably and short beside a fan-out.
HOST_PROBE_STEPS = 20_000
#: Each responsiveness probe runs at least this long per case, spread over the rounds (p99 of
#: ~500 ticks, not ~5).
LAG_SECONDS = 0.5
#: Each workload's ways of waiting are measured in this many rounds, one after the other within
#: a round (the machine drifts: a noisy second must not land on one way of waiting alone).
LATENCY_ROUNDS = 5
#: The most hardware work queues the driver gives a context (``CUDA_DEVICE_MAX_CONNECTIONS``;
#: its default is 8). Streams beyond them share a queue, where a kernel waiting for its own
#: stream's previous one holds up every other stream's work behind it: past 32 streams, kernels
#: launched in the order their waits complete, not round robin as the floors launch them, run
#: far slower than the floors whatever the way of waiting. The sustained load asks for every
#: queue, unless the variable is set, as a server with many streams should; the other parts
#: measure the driver's default, which most servers run with.
HARDWARE_QUEUES = 32
#: Sustained load: this many tasks (task i on stream i % ``SUSTAINED_STREAMS``), each awaiting an
#: event of its own, in turn; every ``SUSTAINED_SHARE`` th task on a stream launches a kernel of
#: ``SUSTAINED_KERNEL`` before its recording, so that a kernel's completion completes that many
#: waits, as a batched step completes its requests' waits. Every stream keeps 40 kernels and
#: 160 recordings queued (12,800 operations in all: within ``OPERATIONS_MAX``), and the 64
#: streams complete 51,200 waits a second: about as many as one loop can launch, record and
#: resume tasks for, with CPU to spare.
SUSTAINED_WAITERS = 10_240
SUSTAINED_SHARE = 4
SUSTAINED_STREAMS = 64
SUSTAINED_KERNEL = 5e-3
#: Each run is as many turns as make about this much GPU time on every stream.
SUSTAINED_SECONDS = 3.0
SUSTAINED_REPEATS = 2
#: A way of waiting that falls this far behind the floor's wall stops starting new turns (its
#: wall is then scaled to the work it did): a slow baseline must not take minutes.
SUSTAINED_CAP = 2.0
SUSTAINED_FLOOR = "floor: a plain loop synchronizing each event in turn, no task"
#: Not a way to wait: the least CPU a waiter on asyncio spends here (``least_waiter``).
SUSTAINED_REFERENCE = "reference: least waiter (plain futures)"
SUSTAINED_WAYS = (
    "aiogpu auto",
    "aiogpu poll",
    "aiogpu thread",
    "aiogpu callback",
    baselines.THREAD_BLOCKING_SYNC,
    "to_thread(aiogpu Event.synchronize)",
    SUSTAINED_REFERENCE,
)
#: (goal, the ways it is about (the best of them counts), at most this wall over the floor, at
#: most this many cores busy waiting: process CPU over wall, less the launches' and recordings'
#: own CPU).
SUSTAINED_GOALS = (
    ("auto", ("aiogpu auto",), 1.05, 0.25),
    ("best off-loop strategy", ("aiogpu thread", "aiogpu callback", baselines.THREAD_BLOCKING_SYNC), 1.10, 0.10),
)


@dataclass
class LatencyRow:
    strategy: str
    work_us: float
    waits: int
    p50_us: float
    p99_us: float
    overhead_p50_us: float
    overhead_p99_us: float
    cpu_us_per_wait: float
    cpu_fraction_of_floor: float
    lag_p99_ms: float
    lag_max_ms: float
    timer_lag_p99_ms: float
    timer_lag_max_ms: float
    gc_pauses: int
    gc_pause_max_ms: float


@dataclass
class FanoutRow:
    loop: str
    strategy: str
    waiters: int
    streams: int
    events: int
    own_events: bool  # each waiter awaits an event of its own (else waiters share events)
    wall_ms: float
    wall_ratio_to_floor: float
    wall_ratio_to_task_floor: float
    cpu_us_per_wait: float
    cpu_us_per_wait_over_task_floor: float
    wall_ms_best: float
    wall_best_ratio_to_floor: float  # best run over the GPU floor's best run
    freeing_ms: float  # freeing the finished tasks after the clock stopped (median)
    host_probe_ms: float  # ``host_probe`` before each run: median
    host_probe_slowest_ms: float


@dataclass
class SustainedFloor:
    """The sustained load with no waiting task: what the GPU and the launches alone take."""

    waiters: int
    streams: int
    kernel_us: float
    turns: int  # each waiter's turns: a kernel, a recording, a wait
    planned_waits: int
    device_ms: float  # the most kernels on one stream, back to back
    wall_ms: float  # median over the repeats
    walls_ms: list[float]
    launch_cpu_us: float  # CPU of one turn's launch and recording (median over the repeats)


@dataclass
class SustainedRow:
    loop: str
    strategy: str
    waiters: int
    streams: int
    kernel_us: float
    planned_waits: int
    waits: int  # completed (median over the repeats)
    wall_ms: float  # median; scaled to the planned work where a run stopped at the cap
    wall_ratio_to_floor: float
    cores: float  # process CPU time over wall
    waiting_cores: float  # less the launches' and recordings' own CPU
    cpu_us_per_wait: float
    waiting_cpu_us_per_wait: float
    resuming_cpu_us_per_wait: float  # a task resumed from a plain future (``task_wakes``)
    engine_cores: float  # waiting cores less resuming the tasks: what the engine itself costs
    other_threads_cores: float  # CPU of every thread but the loop's, over wall: waiter and timer threads, workers
    stopped_early: int  # runs that stopped starting turns at ``SUSTAINED_CAP``


def host_probe() -> float:
    """Seconds a fixed pure-Python loop takes (the best of three): how fast the host runs the
    loop's own code at this moment.

    A fan-out's wall is CPU-bound on the loop and the GPU floor's is not, so a host that runs
    Python slower for a while pushes every fan-out ratio up. A VM can run Python markedly
    slower at some moments than at others with no steal time or run-queue delay to show for
    it, and a fan-out right after a slow probe is usually slow too: the probe is recorded beside
    each run so that a ratio can be read against the host's pace, not the way of waiting's.
    """
    best = math.inf
    for _ in range(3):
        started = time.perf_counter()
        table: dict[int, int] = {}
        for step in range(HOST_PROBE_STEPS):
            table[step & 255] = step
        best = min(best, time.perf_counter() - started)
    return best


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def time_waits(
    wait: Callable[[], Awaitable[None]], stream: aiogpu.Stream, work: float, waits: int
) -> tuple[list[float], float]:
    """Launch ``work`` seconds of GPU work and wait for it, ``waits`` times; (latencies, CPU s)."""
    for _ in range(10):  # warm up: kernels loaded, threads started, completion times learned
        launch_spin(stream, work)
        await wait()
    samples = []
    cpu = time.process_time()
    for _ in range(waits):
        launch_spin(stream, work)
        started = time.perf_counter()  # the launch call's own time varies by tens of µs: not the wait's
        await wait()
        samples.append(time.perf_counter() - started)
    return samples, time.process_time() - cpu


class GcPauses:
    """The garbage collector's pauses on the loop thread while the responsiveness probes run:
    a collection stops the loop as surely as a blocking call (and walks torch's objects too,
    unless the start-up heap was frozen, as ``main`` does)."""

    def __init__(self) -> None:
        self.pauses: list[float] = []
        self._started = 0.0

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.pauses.append(time.perf_counter() - self._started)

    def __enter__(self) -> GcPauses:
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc_info: object) -> None:
        gc.callbacks.remove(self._callback)


#: Another process sends its clock reading down a pipe every millisecond: input arriving from
#: outside, as requests do (a thread of this process would compete for the GIL instead).
_INPUT_SENDER = """
import os, struct, sys, time
due = time.perf_counter()
while True:
    due += 1e-3
    time.sleep(max(0.0, due - time.perf_counter()))
    try:
        os.write(1, struct.pack("d", time.perf_counter()))
    except BrokenPipeError:
        sys.exit(0)
"""


class InputProbe:
    """How late the loop reads 1 kHz input from another process (``time.perf_counter`` is
    ``CLOCK_MONOTONIC``: the same clock in both)."""

    def __init__(self) -> None:
        self._sender = subprocess.Popen([sys.executable, "-c", _INPUT_SENDER], stdout=subprocess.PIPE)
        assert self._sender.stdout is not None
        self._pipe = self._sender.stdout.fileno()
        os.set_blocking(self._pipe, False)
        self._pending = b""
        self.lags: list[float] = []

    def _readable(self) -> None:
        now = time.perf_counter()
        try:
            data = self._pending + os.read(self._pipe, 1 << 16)
        except BlockingIOError:
            return
        whole = len(data) // 8 * 8
        self.lags += [now - sent for (sent,) in struct.iter_unpack("d", data[:whole])]
        self._pending = data[whole:]

    def start(self) -> None:
        self._readable()  # what arrived while nobody listened is not a lag
        self.lags = []
        asyncio.get_running_loop().add_reader(self._pipe, self._readable)

    def stop(self) -> list[float]:
        self._readable()  # input still unread is late until now (a loop blocked all along read none)
        asyncio.get_running_loop().remove_reader(self._pipe)
        return self.lags

    def close(self) -> None:
        self._sender.kill()
        self._sender.wait()


async def loop_lag(
    wait: Callable[[], Awaitable[None]], stream: aiogpu.Stream, work: float, seconds: float, probe: InputProbe
) -> tuple[list[float], list[float]]:
    """Lags (seconds) of 1 kHz input from another process, then of a 1 kHz sleep ticker, while
    waits run back to back for ``seconds`` each: (input lags, ticker lags)."""
    ticker_lags: list[float] = []
    finished = False

    async def ticker() -> None:
        while not finished:
            due = time.perf_counter() + 1e-3
            await asyncio.sleep(1e-3)
            ticker_lags.append(max(0.0, time.perf_counter() - due))

    async def waits_for(seconds: float) -> None:
        until = time.perf_counter() + seconds
        while time.perf_counter() < until:
            await time_waits(wait, stream, work, 20)

    probe.start()
    await waits_for(seconds)
    input_lags = probe.stop()
    task = asyncio.create_task(ticker())
    await asyncio.sleep(0)
    await waits_for(seconds)
    finished = True
    await task
    return input_lags, ticker_lags


@dataclass
class IdleLagRow:
    """The lag of a loop running nothing but the probe: what the machine alone costs."""

    work_us: float  # measured in the rounds of this workload
    lag_p99_ms: float
    lag_max_ms: float


async def idle_lag(seconds: float, probe: InputProbe) -> list[float]:
    """Lags of the probe on a loop that runs nothing else for ``seconds``."""
    probe.start()
    await asyncio.sleep(seconds)
    return probe.stop()


@dataclass
class _Case:
    """One way of waiting, measured in rounds (interleaved with the others)."""

    name: str
    wait: Callable[[], Awaitable[None]]
    stream: aiogpu.Stream
    samples: list[float] = field(default_factory=list)
    cpu: float = 0.0
    lags: list[float] = field(default_factory=list)
    timer_lags: list[float] = field(default_factory=list)
    gc_pauses: list[float] = field(default_factory=list)


def _ms(values: list[float], q: float | None) -> float:
    if not values:
        return math.nan
    return (percentile(values, q) if q is not None else max(values)) * 1e3


async def latency_cases(device: aiogpu.Device, quick: bool, probe: InputProbe) -> tuple[list[LatencyRow], list[IdleLagRow]]:
    rows, idle = [], []
    rounds = 2 if quick else LATENCY_ROUNDS
    lag_seconds = (0.2 if quick else LAG_SECONDS) / rounds
    for work in WORKLOADS:
        # 400 waits each, so that a p99 is not one outlier: at 5 ms of work, ~30 s a run in all.
        waits = (30 if work >= 1e-3 else 100) if quick else 400
        per_round = -(-waits // rounds)
        with contextlib.ExitStack() as resources:
            cases = []
            for name, make in baselines.latency_waiters(device):
                stream = resources.enter_context(aiogpu.Stream(device))  # its own: nothing learned from others
                wait, close = make(stream)
                resources.callback(close)
                cases.append(_Case(name, wait, stream))
            idle_lags: list[float] = []
            for _ in range(rounds):  # interleaved: the machine's drift hits every way of waiting alike
                idle_lags += await idle_lag(lag_seconds, probe)
                for case in cases:
                    samples, cpu = await time_waits(case.wait, case.stream, work, per_round)
                    case.samples += samples
                    case.cpu += cpu
                    with GcPauses() as pauses:
                        lags, timer_lags = await loop_lag(case.wait, case.stream, work, lag_seconds, probe)
                    case.lags += lags
                    case.timer_lags += timer_lags
                    case.gc_pauses += pauses.pauses
        reference = IdleLagRow(work * 1e6, _ms(idle_lags, 0.99), _ms(idle_lags, None))
        idle.append(reference)
        print(
            f"idle loop, {work * 1e6:.0f} us rounds: lag p99 {reference.lag_p99_ms:6.2f} ms  max {reference.lag_max_ms:6.2f} ms",
            flush=True,
        )
        floor: LatencyRow | None = None
        for case in cases:
            p50, p99 = statistics.median(case.samples), percentile(case.samples, 0.99)
            cpu_per_wait = case.cpu / len(case.samples)
            row = LatencyRow(
                strategy=case.name,
                work_us=work * 1e6,
                waits=len(case.samples),
                p50_us=p50 * 1e6,
                p99_us=p99 * 1e6,
                overhead_p50_us=(p50 - floor.p50_us / 1e6) * 1e6 if floor else 0.0,
                overhead_p99_us=(p99 - floor.p99_us / 1e6) * 1e6 if floor else 0.0,
                cpu_us_per_wait=cpu_per_wait * 1e6,
                cpu_fraction_of_floor=cpu_per_wait * 1e6 / floor.cpu_us_per_wait if floor else 1.0,
                lag_p99_ms=_ms(case.lags, 0.99),
                lag_max_ms=_ms(case.lags, None),
                timer_lag_p99_ms=_ms(case.timer_lags, 0.99),
                timer_lag_max_ms=_ms(case.timer_lags, None),
                gc_pauses=len(case.gc_pauses),
                gc_pause_max_ms=max(case.gc_pauses, default=0.0) * 1e3,
            )
            floor = floor or row  # the first waiter is the floor
            rows.append(row)
            print(
                f"latency {work * 1e6:6.0f} us  {case.name:34} p50 {row.p50_us:8.1f} us (+{row.overhead_p50_us:7.1f})"
                f"  p99 {row.p99_us:8.1f} us (+{row.overhead_p99_us:7.1f})  cpu/wait {row.cpu_us_per_wait:7.1f} us"
                f" ({row.cpu_fraction_of_floor:4.0%})  lag p99 {row.lag_p99_ms:6.2f} ms  max {row.lag_max_ms:6.2f} ms"
                f"  timer lag p99 {row.timer_lag_p99_ms:6.2f} ms  gc {row.gc_pauses} pauses, max {row.gc_pause_max_ms:5.2f} ms",
                flush=True,
            )
    return rows, idle


async def fanout_case(
    device: aiogpu.Device, name: str, waiters: int, nstreams: int, own_events: bool
) -> tuple[float, float, float, int, float]:
    """Wall seconds and CPU seconds from releasing the latch until every waiter woke; seconds
    to free the finished tasks after that; the number of events; seconds from the release until
    the first waiter woke (NaN for the GPU floor).

    The GPU work is the same either way: ``kernels`` spin kernels per stream. With shared
    events each kernel is followed by one event that several waiters await; with
    ``own_events`` each waiter awaits an event of its own, recorded after the kernels in turn
    (a few events after each kernel)."""
    streams = [aiogpu.Stream(device, nonblocking=True) for _ in range(nstreams)]
    kernels = min(EVENTS_PER_STREAM_MAX, EVENTS_MAX // nstreams, -(-waiters // nstreams))
    per_stream = -(-waiters // nstreams) if own_events else kernels
    assert kernels + per_stream <= OPERATIONS_PER_STREAM_MAX, "the launch call would block behind the latch"
    try:
        with Latch(device) as latch:
            events: list[list[aiogpu.Event]] = []
            for stream in streams:
                latch.block(stream)
                stream_events: list[aiogpu.Event] = []
                for kernel in range(kernels):
                    launch_spin(stream, FANOUT_KERNEL)
                    while len(stream_events) < (kernel + 1) * per_stream // kernels:
                        stream_events.append(stream.record())
                events.append(stream_events)
            if own_events:  # round robin over the streams: waiter i awaits event i
                flat = [event for row in itertools.zip_longest(*events) for event in row if event is not None]
                targets = flat[:waiters]
            else:
                flat = [event for stream_events in events for event in stream_events]
                targets = [flat[i % len(flat)] for i in range(waiters)]
            wait_all, tasks = baselines.fanout_tasks(name, targets, events)
            await asyncio.sleep(0)  # every waiter is parked before the release
            await asyncio.sleep(0)
            gc.collect()
            gc.disable()  # as timeit does: a collection of 10,000 tasks' garbage is noise here
            try:
                cpu = time.process_time()
                started = time.perf_counter()
                latch.release()
                first = await wait_all() - started
                wall = time.perf_counter() - started
                cpu = time.process_time() - cpu
                # The clock stops when the last waiter woke. Freeing the finished tasks all at
                # once is the harness's cost, not the way of waiting's (a server frees each as it
                # ends): timed apart.
                freeing = time.perf_counter()
                del wait_all, tasks
                freeing = time.perf_counter() - freeing
            finally:
                gc.enable()
            for event in flat:
                event.close()
            return wall, cpu, freeing, len(flat), first
    finally:
        for stream in streams:
            stream.synchronize()
            stream.close()


async def fanout_cases(device: aiogpu.Device, quick: bool, loop: str) -> list[FanoutRow]:
    rows = []
    cases = [(waiters, nstreams, False) for waiters in FANOUT_WAITERS for nstreams in FANOUT_STREAMS]
    cases += [(waiters, nstreams, True) for waiters, nstreams in FANOUT_OWN_EVENTS]
    for waiters, nstreams, own_events in cases:
        names = [name for name in baselines.FANOUT_WAITERS if not (quick and name == "aiogpu thread" and waiters > 1000)]
        runs: dict[str, list[tuple[float, float, float, float]]] = {name: [] for name in names}
        events = 0
        for repeat in range(1 if quick else FANOUT_REPEATS):  # interleaved: drift hits every waiter alike
            for name in names:
                probe = host_probe()
                wall, cpu, freeing, events, _ = await fanout_case(device, name, waiters, nstreams, own_events)
                runs[name].append((wall, cpu, freeing, probe))
                print(
                    f"fan-out {loop:7} {waiters:6} waiters {nstreams:3} streams ({events:5} events)  {name:40}"
                    f" wall {wall * 1e3:8.2f} ms  cpu/wait {cpu / waiters * 1e6:6.2f} us"
                    f"  then freeing the tasks {freeing * 1e3:5.2f} ms  host probe {probe * 1e3:5.2f} ms  (run {repeat + 1})",
                    flush=True,
                )
        measured = {}
        for name in names:
            walls, cpus, freeings, probes = zip(*runs[name], strict=True)
            measured[name] = (statistics.median(walls), statistics.median(cpus), min(walls), statistics.median(freeings), probes)
        gpu_floor, _, gpu_floor_best, _, _ = measured[baselines.FANOUT_GPU_FLOOR]
        task_floor, task_floor_cpu, _, _, _ = measured[baselines.FANOUT_TASK_FLOOR]
        rows += [
            FanoutRow(
                loop,
                name,
                waiters,
                nstreams,
                events,
                own_events,
                wall * 1e3,
                wall / gpu_floor,
                wall / task_floor,
                cpu / waiters * 1e6,
                (cpu - task_floor_cpu) / waiters * 1e6,
                best * 1e3,
                best / gpu_floor_best,
                freeing * 1e3,
                statistics.median(probes) * 1e3,
                max(probes) * 1e3,
            )
            for name, (wall, cpu, best, freeing, probes) in measured.items()
        ]
    return rows


def sustained_layout(waiters: int, nstreams: int) -> list[int]:
    """How many waiters each stream has (waiter i on stream i % streams)."""
    return [waiters // nstreams + (index < waiters % nstreams) for index in range(nstreams)]


def _round_robin(
    streams: list[aiogpu.Stream], events: list[list[aiogpu.Event]]
) -> list[tuple[aiogpu.Stream, aiogpu.Event, bool]]:
    """(stream, event, whether it launches the kernel) of every waiter, the first of each
    stream's first, as requests spread; every ``SUSTAINED_SHARE`` th waiter of a stream launches."""
    slots = max(len(stream_events) for stream_events in events)
    return [
        (stream, stream_events[slot], slot % SUSTAINED_SHARE == 0)
        for slot in range(slots)
        for stream, stream_events in zip(streams, events, strict=True)
        if slot < len(stream_events)
    ]


async def task_wakes(waiters: int, turns: int) -> float:
    """CPU seconds the running loop takes to resume a task from a plain future that is set, for
    the task to count itself and await a new one: the least any way of waiting adds per wait."""
    loop = asyncio.get_running_loop()
    futures = [loop.create_future() for _ in range(waiters)]
    left = waiters
    round_done: asyncio.Future[None] = loop.create_future()

    async def waiter(index: int) -> None:
        nonlocal left, round_done
        for _ in range(turns):
            await futures[index]
            futures[index] = loop.create_future()
            left -= 1
            if not left:
                round_done.set_result(None)

    tasks = [loop.create_task(waiter(index)) for index in range(waiters)]
    await asyncio.sleep(0)
    gc.collect()
    gc.disable()  # as in the sustained runs
    try:
        cpu = time.process_time()
        for _ in range(turns):
            left, round_done = waiters, loop.create_future()
            for future in list(futures):
                future.set_result(None)
            await round_done
        cpu = time.process_time() - cpu
    finally:
        gc.enable()
    await asyncio.gather(*tasks)
    return cpu / (waiters * turns)


def sustained_kernels(layout: list[int]) -> list[int]:
    """How many kernels each stream has queued in a turn (its every ``SUSTAINED_SHARE`` th waiter's)."""
    kernels = [-(-count // SUSTAINED_SHARE) for count in layout]
    if max(count + kernel for count, kernel in zip(layout, kernels, strict=True)) > OPERATIONS_PER_STREAM_MAX:
        raise ValueError(
            f"{max(layout)} waiters on one stream queue more than {OPERATIONS_PER_STREAM_MAX} operations on it:"
            " spread them over more streams"
        )
    if sum(layout) + sum(kernels) > OPERATIONS_MAX:
        raise ValueError(
            f"{sum(layout) + sum(kernels)} operations queued at once could block the launch call (at most {OPERATIONS_MAX})"
        )
    return kernels


def sustained_floor(
    streams: list[aiogpu.Stream], events: list[list[aiogpu.Event]], turns: int, kernel: float
) -> tuple[float, float]:
    """The same turns with no task: a plain loop synchronizes each waiter's event in turn and
    launches and records its next turn at once. Every stream keeps its kernels queued, so the
    GPU runs them back to back. Returns (wall seconds, CPU seconds of one turn's launch and
    recording)."""
    order = _round_robin(streams, events)
    clock = time.thread_time
    launching = 0.0
    started = time.perf_counter()
    for turn in range(turns):
        for stream, event, launches in order:
            if turn:
                event.synchronize()
            before = clock()
            if launches:
                launch_spin(stream, kernel)
            event.record(stream)
            launching += clock() - before
    for stream_events in events:
        for event in stream_events:
            event.synchronize()
    return time.perf_counter() - started, launching / (turns * len(order))


class SustainedRun(NamedTuple):
    """One run of the sustained load, from the start until the last task finished."""

    wall: float  # seconds
    cpu: float  # the process's CPU seconds
    completed: int  # waits
    loop_cpu: float  # the loop thread's CPU seconds (the rest: aiogpu's threads, to_thread's workers)

    @property
    def other_threads_cpu(self) -> float:
        """CPU seconds of every thread but the loop's (two clocks read a moment apart: never below 0)."""
        return max(self.cpu - self.loop_cpu, 0.0)


async def sustained_run(
    name: str, streams: list[aiogpu.Stream], events: list[list[aiogpu.Event]], turns: int, kernel: float, cap: float
) -> SustainedRun:
    """Every waiter's task takes ``turns`` turns (launch a kernel on its stream, record its
    event, await it), all at once; after ``cap`` seconds no task starts another."""
    loop = asyncio.get_running_loop()
    start: asyncio.Future[None] = loop.create_future()
    done: asyncio.Future[None] = loop.create_future()
    order = _round_robin(streams, events)
    left, completed, stop_at = len(order), 0, math.inf
    if name.startswith("aiogpu "):
        strategy: Any = name.removeprefix("aiogpu ").split(",")[0]

        def wait(stream: aiogpu.Stream, event: aiogpu.Event) -> Awaitable[None]:
            return event.wait(strategy=strategy)
    elif name == SUSTAINED_REFERENCE:
        wait = least_waiter.LeastWaiter(loop).wait
    else:

        def wait(stream: aiogpu.Stream, event: aiogpu.Event) -> Awaitable[None]:
            return asyncio.to_thread(event.synchronize)

    async def waiter(stream: aiogpu.Stream, event: aiogpu.Event, launches: bool) -> None:
        nonlocal left, completed
        try:
            await start
            for turn in range(turns):
                if turn and time.perf_counter() > stop_at:
                    break
                if launches:
                    launch_spin(stream, kernel)
                event.record(stream)
                await wait(stream, event)
                completed += 1
        except Exception as exc:
            if not done.done():
                done.set_exception(exc)
            return
        left -= 1
        if not left:
            done.set_result(None)

    tasks = [loop.create_task(waiter(*waiter_of)) for waiter_of in order]  # in order: the launches go round robin
    await asyncio.sleep(0)  # every task is parked on the start
    gc.collect()
    gc.disable()  # as in fan-out: a collection of 10,000 tasks is noise here
    try:
        cpu, loop_cpu = time.process_time(), time.thread_time()
        started = time.perf_counter()
        stop_at = started + cap
        start.set_result(None)
        await done
        wall = time.perf_counter() - started
        cpu, loop_cpu = time.process_time() - cpu, time.thread_time() - loop_cpu
    finally:
        gc.enable()
    del tasks
    return SustainedRun(wall, cpu, completed, loop_cpu)


@contextlib.contextmanager
def sustained_streams(device: aiogpu.Device, layout: list[int]) -> Iterator[tuple[list[aiogpu.Stream], list[list[aiogpu.Event]]]]:
    """A stream per entry of ``layout`` and that many events on each; drained and closed after."""
    streams = [aiogpu.Stream(device, nonblocking=True) for _ in layout]
    try:
        with sustained_events(device, layout) as events:
            try:
                yield streams, events
            finally:
                for stream in streams:  # before the events close
                    stream.synchronize()
    finally:
        for stream in streams:
            stream.close()


@contextlib.contextmanager
def sustained_events(device: aiogpu.Device, layout: list[int], **options: Any) -> Iterator[list[list[aiogpu.Event]]]:
    """As many events as ``layout`` says for each stream, made with ``options``; closed after."""
    events = [[aiogpu.Event(device, **options) for _ in range(count)] for count in layout]
    try:
        yield events
    finally:
        for stream_events in events:
            for event in stream_events:
                event.close()


def sustained_cases(device: aiogpu.Device, quick: bool, nstreams: int = SUSTAINED_STREAMS) -> dict[str, Any]:
    """The sustained load on every loop for every way of waiting, interleaved, against its floor;
    prints the goals, met or not met."""
    waiters = 1_000 if quick else SUSTAINED_WAITERS
    kernel = 0.5e-3 if quick else SUSTAINED_KERNEL
    seconds = 0.05 if quick else SUSTAINED_SECONDS
    layout = sustained_layout(waiters, nstreams)
    kernels = sustained_kernels(layout)
    turns = max(2, math.ceil(seconds / (max(kernels) * kernel)))
    planned = waiters * turns
    floor_runs: list[tuple[float, float]] = []
    runs: dict[tuple[str, str], list[SustainedRun]] = {}
    resuming: dict[str, list[float]] = {}
    what = f"{waiters:6} waiters {nstreams:3} streams {kernel * 1e6:5.0f} us kernels, {turns} turns"
    with (
        sustained_streams(device, layout) as (streams, events),
        sustained_events(device, layout, blocking_sync=True) as blocking_events,
    ):
        for repeat in range(1 if quick else SUSTAINED_REPEATS):  # interleaved: drift hits every way alike
            wall, launch_cpu = sustained_floor(streams, events, turns, kernel)
            floor_runs.append((wall, launch_cpu))
            print(
                f"sustained {'':7} {what}  {SUSTAINED_FLOOR:40} wall {wall * 1e3:8.1f} ms"
                f" (device time {max(kernels) * turns * kernel * 1e3:.1f} ms)  launch + record {launch_cpu * 1e6:5.2f} us a turn"
                f"  (run {repeat + 1})",
                flush=True,
            )
            for loop_name, run in event_loops():
                resuming.setdefault(loop_name, []).append(run(task_wakes(waiters, 3)))
                for name in SUSTAINED_WAYS:
                    chosen = blocking_events if name == baselines.THREAD_BLOCKING_SYNC else events
                    result = run(sustained_run(name, streams, chosen, turns, kernel, SUSTAINED_CAP * wall))
                    runs.setdefault((loop_name, name), []).append(result)
                    ran, cpu, completed, _ = result
                    print(
                        f"sustained {loop_name:7} {what}  {name:40} wall {ran * 1e3:8.1f} ms  cores {cpu / ran:5.2f}"
                        f" (other threads {result.other_threads_cpu / ran:4.2f})"
                        f"  cpu/wait {cpu / completed * 1e6:6.2f} us  waits {completed}/{planned}"
                        f"{' (stopped at the cap)' if completed < planned else ''}  (run {repeat + 1})",
                        flush=True,
                    )
    floor_wall = statistics.median(wall for wall, _ in floor_runs)
    launch_cpu = statistics.median(cost for _, cost in floor_runs)
    floor = SustainedFloor(
        waiters=waiters,
        streams=nstreams,
        kernel_us=kernel * 1e6,
        turns=turns,
        planned_waits=planned,
        device_ms=max(kernels) * turns * kernel * 1e3,
        wall_ms=floor_wall * 1e3,
        walls_ms=[wall * 1e3 for wall, _ in floor_runs],
        launch_cpu_us=launch_cpu * 1e6,
    )
    rows = []
    for (loop_name, name), measured in runs.items():
        walls = [run.wall * planned / run.completed for run in measured]  # the planned work at the pace it kept
        resume = statistics.median(resuming[loop_name])
        rows.append(
            SustainedRow(
                loop=loop_name,
                strategy=name,
                waiters=waiters,
                streams=nstreams,
                kernel_us=kernel * 1e6,
                planned_waits=planned,
                waits=round(statistics.median(run.completed for run in measured)),
                wall_ms=statistics.median(walls) * 1e3,
                wall_ratio_to_floor=statistics.median(walls) / floor_wall,
                cores=statistics.median(run.cpu / run.wall for run in measured),
                waiting_cores=statistics.median((run.cpu - run.completed * launch_cpu) / run.wall for run in measured),
                cpu_us_per_wait=statistics.median(run.cpu / run.completed for run in measured) * 1e6,
                waiting_cpu_us_per_wait=statistics.median(run.cpu / run.completed - launch_cpu for run in measured) * 1e6,
                resuming_cpu_us_per_wait=resume * 1e6,
                engine_cores=statistics.median((run.cpu - run.completed * (launch_cpu + resume)) / run.wall for run in measured),
                other_threads_cores=statistics.median(run.other_threads_cpu / run.wall for run in measured),
                stopped_early=sum(run.completed < planned for run in measured),
            )
        )
    goals = sustained_goals(rows)
    for goal in goals:
        print(
            f"goal: {goal['goal']} <= {goal['max_ratio']:.2f}x the floor at <= {goal['max_cores']:.2f} cores, {goal['loop']}:"
            f" {goal['strategy']} {goal['ratio']:.2f}x at {goal['waiting_cores']:.2f} cores: {'met' if goal['met'] else 'not met'}"
            f"{report.least_waiter_note(goal)}",
            flush=True,
        )
    return {"floor": asdict(floor), "rows": [asdict(row) for row in rows], "goals": goals}


def sustained_goals(rows: list[SustainedRow]) -> list[dict[str, Any]]:
    """Each goal on each loop, judged on the best of the ways it is about (met before not met,
    then the lower wall), with the least waiter's waiting cores on that loop beside it."""
    goals = []
    least = {row.loop: row.waiting_cores for row in rows if row.strategy == SUSTAINED_REFERENCE}
    for goal, ways, max_ratio, max_cores in SUSTAINED_GOALS:
        for loop_name in dict.fromkeys(row.loop for row in rows):
            mine = [row for row in rows if row.loop == loop_name and row.strategy in ways]
            if not mine:
                continue

            def met(row: SustainedRow, max_ratio: float = max_ratio, max_cores: float = max_cores) -> bool:
                return row.wall_ratio_to_floor <= max_ratio and row.waiting_cores <= max_cores

            best = min(mine, key=lambda row: (not met(row), row.wall_ratio_to_floor))
            goals.append(
                {
                    "goal": goal,
                    "loop": loop_name,
                    "max_ratio": max_ratio,
                    "max_cores": max_cores,
                    "strategy": best.strategy,
                    "ratio": best.wall_ratio_to_floor,
                    "waiting_cores": best.waiting_cores,
                    "cores": best.cores,
                    "met": met(best),
                    "least_waiter_cores": least.get(loop_name),
                }
            )
    return goals


def open_device(every_queue: bool = False) -> tuple[aiogpu.Device, bool]:
    """Device 0, or the simulated device where there is no GPU; with every hardware queue if
    asked (unless the environment says how many), else with the driver's default, as most
    servers run. The driver reads the setting once, when the process first uses the GPU."""
    if every_queue:
        os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", str(HARDWARE_QUEUES))
    try:
        return aiogpu.Device(0), False
    except aiogpu.CudaUnavailableError:
        return SimulatedDriver().device(0), True


def event_loops() -> list[tuple[str, Callable[[Coroutine[Any, Any, Any]], Any]]]:
    """The loops fan-out and the sustained load run on: asyncio, and uvloop where it is
    installed (what uvicorn uses)."""
    loops: list[tuple[str, Callable[[Coroutine[Any, Any, Any]], Any]]] = [("asyncio", asyncio.run)]
    try:
        import uvloop
    except ImportError:
        return loops
    return [*loops, ("uvloop", uvloop.run)]


PARTS = ("latency", "fanout", "sustained")


def run_apart(bench: str, arguments: list[str]) -> tuple[dict[str, Any], str]:
    """Run ``benchmarks.BENCH`` with ``arguments`` in a child process (``_child.run``) on the
    aiogpu and the benchmarks this process runs, with the tunables a comparison or an ablation
    changed here changed there too; return its results and its output. For a part that asks for
    every hardware queue beside parts that measure the driver's default.

    Raises:
        RuntimeError: the child failed (its output's end is in the message).
    """
    aiogpu_tree = Path(aiogpu.__file__).resolve().parent.parent
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder)
        result = _child.run(
            bench, aiogpu_tree, Path(__file__).resolve().parent.parent, out, arguments, _child.patches_started_with()
        )
        return result, (out / "stdout.txt").read_text()


def main(out: Path, quick: bool, parts: tuple[str, ...] = PARTS, sustained_streams: int = SUSTAINED_STREAMS) -> None:
    # The sustained load asks for every hardware queue (``HARDWARE_QUEUES``), which would also
    # shorten the fan-out's GPU floor below what waking its tasks takes: alone, it runs here;
    # beside the other parts, in a process of its own.
    device, simulated = open_device(every_queue=parts == ("sustained",))
    environment = baselines.environment(device, simulated)
    print(json.dumps(environment), flush=True)

    baselines.latency_waiters(device)  # imports what the baselines use (torch, cuda.core)
    gc.collect()
    gc.freeze()  # as a server does after start-up: collections skip the imported modules' objects

    async def latency() -> tuple[list[LatencyRow], list[IdleLagRow]]:
        probe = InputProbe()
        try:
            return await latency_cases(device, quick, probe)
        finally:
            probe.close()

    result: dict[str, Any] = {"environment": environment}
    if "latency" in parts:
        rows, idle = asyncio.run(latency())
        result["latency"] = [asdict(r) for r in rows]
        result["idle_lag"] = [asdict(r) for r in idle]
    if "fanout" in parts:
        fanout = [row for name, run in event_loops() for row in run(fanout_cases(device, quick, name))]
        result["fanout"] = [asdict(r) for r in fanout]
    if parts == ("sustained",):
        result["sustained"] = sustained_cases(device, quick, sustained_streams)
    elif "sustained" in parts:
        arguments = ["--parts", "sustained", "--sustained-streams", str(sustained_streams), *(["--quick"] if quick else [])]
        apart, output = run_apart("wake", arguments)
        print(output, end="", flush=True)
        result["sustained"] = apart["sustained"]
    out.mkdir(parents=True, exist_ok=True)
    (out / "wake.json").write_text(json.dumps(result, indent=1))
    (out / "wake.md").write_text(report.markdown(result))
    chart = report.chart(result, out / "wake.png")
    print(f"wrote {out / 'wake.json'}, {out / 'wake.md'}" + (f", {chart}" if chart else " (no matplotlib: no chart)"))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    parser.add_argument("--quick", action="store_true", help="fewer waits per case (a smoke run)")
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS), help="run only these parts")
    parser.add_argument("--sustained-streams", type=int, default=SUSTAINED_STREAMS, help="streams of the sustained load")
    arguments = parser.parse_args()
    main(arguments.out, arguments.quick, tuple(arguments.parts), arguments.sustained_streams)
