"""The benchmarks run end to end without a GPU, on the simulated device, and say so."""

from __future__ import annotations

import asyncio
import ctypes
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import weakref
from pathlib import Path
from typing import Any

import pytest

import aiogpu
from aiogpu._wait import _backends
from aiogpu.testing import SimulatedDriver
from benchmarks import (
    _child,
    _metrics,
    ablation,
    baselines,
    compare,
    faults,
    goals,
    handoff,
    host_functions,
    least_waiter,
    serving_ablation,
    wake,
)
from tests.conftest import gpu_unavailable_reason
from tests.helpers import ENVIRONMENT, fake_wrk

ROOT = Path(__file__).resolve().parent.parent


def run_on_the_simulated_device(
    benchmark: str, out: Path, timeout: float, *arguments: str, quick: bool = True
) -> subprocess.CompletedProcess[str]:
    """``python -m benchmarks.BENCHMARK --quick --out OUT ARGUMENTS`` from the project root, where
    no GPU is (where one is, the benchmark would measure it: run it by hand)."""
    if gpu_unavailable_reason() is None:
        pytest.skip("a GPU is here: the benchmark would measure it (run it by hand)")
    run = subprocess.run(
        [sys.executable, "-m", f"benchmarks.{benchmark}", *(["--quick"] if quick else []), "--out", str(out), *arguments],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return run


@pytest.mark.timeout(300)
@pytest.mark.slow
def test_the_wake_benchmark_runs_on_the_simulated_device_and_labels_it(tmp_path: Path) -> None:
    run = run_on_the_simulated_device("wake", tmp_path, timeout=280)
    result = json.loads((tmp_path / "wake.json").read_text())
    assert result["environment"]["simulated"] is True
    assert (tmp_path / "wake.md").read_text().startswith("# Wake-up benchmark: SIMULATED device (no GPU)")
    strategies = {f"aiogpu {strategy}" for strategy in ("auto", "poll", "thread", "callback")}
    for work in (20.0, 200.0, 5000.0):
        measured = {row["strategy"] for row in result["latency"] if row["work_us"] == work}
        assert strategies <= measured, f"{work} µs: {sorted(measured)}"
    # The lag reference: the same probe on a loop running nothing else, in each workload's rounds.
    assert [row["work_us"] for row in result["idle_lag"]] == [20.0, 200.0, 5000.0]
    assert all(0 <= row["lag_p99_ms"] <= row["lag_max_ms"] for row in result["idle_lag"])
    assert "The same probe on an idle loop" in (tmp_path / "wake.md").read_text()
    baseline_names = {row["strategy"] for row in result["latency"]} - strategies
    assert {"floor: sync spin on the loop", "query + sleep(0)", "query + sleep(1 ms)"} <= baseline_names
    assert any(name.startswith("to_thread(") for name in baseline_names)
    floor = {row["work_us"]: row["cpu_us_per_wait"] for row in result["latency"] if row["strategy"].startswith("floor")}
    for row in result["latency"]:  # every figure the goals use is there and consistent
        assert row["p50_us"] <= row["p99_us"]
        assert row["overhead_p50_us"] == pytest.approx(row["p50_us"] - floor_p50(result, row["work_us"]))
        assert row["cpu_fraction_of_floor"] == pytest.approx(row["cpu_us_per_wait"] / floor[row["work_us"]])
        assert 0 <= row["timer_lag_p99_ms"] <= row["timer_lag_max_ms"]
        assert 0 <= row["lag_p99_ms"] <= row["lag_max_ms"], row["strategy"]
    # The blocking floor reads no input until its waits are over: the contrast the lag shows.
    floor_lag = [row["lag_max_ms"] for row in result["latency"] if row["strategy"].startswith("floor")]
    assert min(floor_lag) > 50, floor_lag
    assert run.stdout.count("latency ") >= len(result["latency"])  # a progress line per case
    loops = {row["loop"] for row in result["fanout"]}
    assert "asyncio" in loops
    fanout = {(row["loop"], row["waiters"], row["streams"], row["own_events"], row["strategy"]) for row in result["fanout"]}
    for waiters in (1_000, 10_000):
        for streams in (1, 8, 64):
            assert ("asyncio", waiters, streams, False, "aiogpu auto") in fanout
    assert ("asyncio", 10_000, 64, True, "aiogpu auto") in fanout
    for floor_name in (baselines.FANOUT_GPU_FLOOR, baselines.FANOUT_TASK_FLOOR, baselines.FANOUT_STREAM_ORDER_FLOOR):
        assert ("asyncio", 10_000, 64, True, floor_name) in fanout
        assert ("asyncio", 10_000, 64, False, floor_name) in fanout
    for row in result["fanout"]:  # 10,000 waiters on 64 streams share 2,944 events, or have one each
        if (row["waiters"], row["streams"]) == (10_000, 64):
            assert (row["events"] >= 10_000) if row["own_events"] else (row["events"] < 3_000)
    assert all(row["wall_ms"] > 0 and row["cpu_us_per_wait"] > 0 for row in result["fanout"])
    assert all(0 < row["wall_ms_best"] <= row["wall_ms"] for row in result["fanout"])  # the best run and the median
    # How fast the host ran Python before each run: the median and the slowest, in the table too.
    assert all(0 < row["host_probe_ms"] <= row["host_probe_slowest_ms"] for row in result["fanout"])
    assert "The host probe, a fixed pure-Python loop" in (tmp_path / "wake.md").read_text()
    # The clock stops at the last wake-up; the finished tasks are still held then and freed
    # after it, timed apart: 10,000 of them take far longer than the GPU floor's none.
    freeing = {
        (row["loop"], row["waiters"], row["streams"], row["own_events"], row["strategy"]): row["freeing_ms"]
        for row in result["fanout"]
    }
    for (loop, waiters, streams, own, strategy), ms in freeing.items():
        if waiters == 10_000 and strategy == "aiogpu auto":
            assert ms > 10 * freeing[loop, waiters, streams, own, "floor: sync last event per stream"] > 0
    assert run.stdout.count("fan-out") >= len(result["fanout"])  # a progress line per case
    assert {row["strategy"] for row in result["sustained"]["rows"]} == set(wake.SUSTAINED_WAYS)
    assert (tmp_path / "wake.png").read_bytes().startswith(b"\x89PNG"), run.stdout[-500:]  # the chart


@pytest.mark.timeout(120)
@pytest.mark.slow
def test_the_sustained_load_runs_every_way_of_waiting_against_its_floor(tmp_path: Path) -> None:
    run = run_on_the_simulated_device("wake", tmp_path, 100, "--parts", "sustained")
    result = json.loads((tmp_path / "wake.json").read_text())
    assert result["environment"]["simulated"] is True
    assert "latency" not in result and "fanout" not in result  # only the part asked for
    # Alone, the sustained load asks for every hardware queue in its own process.
    assert result["environment"]["cuda_device_max_connections"] == os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS", "32")
    sustained = result["sustained"]
    floor = sustained["floor"]
    assert floor["streams"] == 64 and floor["waiters"] >= 1_000 and floor["kernel_us"] >= 500
    assert floor["planned_waits"] == floor["waiters"] * floor["turns"] and floor["turns"] >= 2
    # The floor runs the kernels back to back: never faster than the busiest stream's kernels.
    assert floor["wall_ms"] >= floor["device_ms"] > 0
    assert floor["launch_cpu_us"] > 0
    loops = {row["loop"] for row in sustained["rows"]}
    assert "asyncio" in loops
    for loop in loops:
        assert [row["strategy"] for row in sustained["rows"] if row["loop"] == loop] == list(wake.SUSTAINED_WAYS)
    for row in sustained["rows"]:
        assert row["planned_waits"] == floor["planned_waits"]
        # One run in quick mode: it did all its turns, or stopped starting them at the cap.
        assert 0 < row["waits"] <= row["planned_waits"], row
        assert row["stopped_early"] == (row["waits"] < row["planned_waits"]), row
        assert row["wall_ratio_to_floor"] == pytest.approx(row["wall_ms"] / floor["wall_ms"])
        assert row["wall_ms"] * 1.01 >= floor["device_ms"], row  # no way of waiting beats the GPU
        assert row["cores"] > 0 and row["waiting_cores"] < row["cores"], row
        assert row["waiting_cpu_us_per_wait"] == pytest.approx(row["cpu_us_per_wait"] - floor["launch_cpu_us"])
        # Resuming a task from a plain future costs something, and the engine the rest.
        assert row["resuming_cpu_us_per_wait"] > 0, row
        assert row["engine_cores"] < row["waiting_cores"], row
        assert 0 <= row["other_threads_cores"] < row["cores"], row  # the loop thread ran the tasks
    # Each goal once per loop, judged on one of the ways it is about, met or not.
    goals = {(goal["goal"], goal["loop"]): goal for goal in sustained["goals"]}
    assert set(goals) == {(goal, loop) for goal, *_ in wake.SUSTAINED_GOALS for loop in loops}
    for (name, _), goal in goals.items():
        assert goal["strategy"] in {g: ways for g, ways, *_ in wake.SUSTAINED_GOALS}[name]
        assert goal["met"] == (goal["ratio"] <= goal["max_ratio"] and goal["waiting_cores"] <= goal["max_cores"])
        # Beside it, what the least waiter spent on the same loop.
        (least,) = (
            row for row in sustained["rows"] if row["loop"] == goal["loop"] and row["strategy"] == wake.SUSTAINED_REFERENCE
        )
        assert goal["least_waiter_cores"] == least["waiting_cores"]
    assert run.stdout.count("goal: ") == len(goals)
    assert run.stdout.count("(the least waiter: ") == len(goals)
    assert run.stdout.count("sustained ") == 1 + len(sustained["rows"])  # a progress line per run
    markdown = (tmp_path / "wake.md").read_text()
    assert "Sustained load: 1,000 tasks on 64 streams" in markdown
    assert markdown.count("| aiogpu auto |") == len(loops)
    assert (tmp_path / "wake.png").read_bytes().startswith(b"\x89PNG")


@pytest.mark.timeout(300)
@pytest.mark.slow
def test_the_fault_benchmark_times_each_loop_and_strategy_against_the_drivers_report(tmp_path: Path) -> None:
    run = run_on_the_simulated_device("faults", tmp_path, 250, "--repeats", "1", "--tasks", "5", quick=False)
    result = json.loads((tmp_path / "faults.json").read_text())
    assert result["environment"]["simulated"] is True
    cases = [(row["loop"], row["strategy"]) for row in result["rows"]]
    assert cases[0] == ("-", faults.FLOOR)
    loops = faults._loops()
    assert sorted(cases[1:]) == sorted((loop, strategy) for loop in loops for strategy in faults.STRATEGIES)
    for row in result["rows"]:
        assert 0 <= row["first_ms"] <= row["last_ms"], row
        assert len(row["runs"]) == 1 and row["cores"] > 0, row
    assert result["floor_ms"] == result["rows"][0]["last_ms"]
    markdown = (tmp_path / "faults.md").read_text()
    assert "SIMULATED" in markdown
    assert markdown.count("| met | met |") == len(cases) - 1  # the simulated device faults at once
    assert run.stdout.count("(run 1)") == len(cases)


class _RecordedEvent:
    """Stands in for an event in ``fanout_tasks``: a synchronize reports which tasks had run."""

    def __init__(self, stream: int, log: list[tuple[int, list[bool]]], tasks: list[asyncio.Task[None]]) -> None:
        self.stream, self._log, self._tasks = stream, log, tasks

    def synchronize(self) -> None:
        self._log.append((self.stream, [task.done() for task in self._tasks]))


@pytest.mark.asyncio
async def test_the_stream_order_floor_runs_each_streams_tasks_before_it_looks_at_the_next() -> None:
    log: list[tuple[int, list[bool]]] = []
    tasks: list[asyncio.Task[None]] = []
    per_stream = [[_RecordedEvent(stream, log, tasks) for _ in range(3)] for stream in range(4)]
    # Round robin, as requests spread over streams: task i awaits an event of stream i % 4.
    targets = [per_stream[i % 4][i // 4 % 3] for i in range(24)]
    wait_all, started = baselines.fanout_tasks(baselines.FANOUT_STREAM_ORDER_FLOOR, targets, per_stream)  # type: ignore[arg-type]
    tasks += started
    await wait_all()
    assert [stream for stream, _ in log] == [0, 1, 2, 3]  # the last event of each stream, in turn
    for stream, done in log:  # every earlier stream's tasks had run, no later one's
        assert done == [i % 4 < stream for i in range(24)]
    assert all(task.done() for task in tasks)


@pytest.mark.asyncio
@pytest.mark.parametrize("floor", [baselines.FANOUT_TASK_FLOOR, baselines.FANOUT_STREAM_ORDER_FLOOR])
async def test_the_task_floors_free_each_future_as_its_task_ends(floor: str) -> None:
    # As an aiogpu wait's future is: inside the timed window, not with the tasks afterwards.
    per_stream = [[_RecordedEvent(stream, [], []) for _ in range(3)] for stream in range(4)]
    targets = [per_stream[i % 4][i // 4 % 3] for i in range(24)]
    wait_all, tasks = baselines.fanout_tasks(floor, targets, per_stream)  # type: ignore[arg-type]
    await asyncio.sleep(0)  # every task awaits its future
    futures = [weakref.ref(task._fut_waiter) for task in tasks]  # type: ignore[attr-defined]
    assert all(future() is not None for future in futures)
    await wait_all()
    assert all(task.done() for task in tasks)
    assert [future() for future in futures] == [None] * 24  # while wait_all and the tasks live on


class _HeldEvent:
    """An event whose work is done once the test says so (``is_done``, asked and counted)."""

    def __init__(self) -> None:
        self.done = False
        self.asked = 0

    @property
    def is_done(self) -> bool:
        self.asked += 1
        return self.done


@pytest.mark.asyncio
async def test_the_least_waiter_completes_each_streams_waits_in_order_and_sleeps_between() -> None:
    waiter = least_waiter.LeastWaiter(asyncio.get_running_loop())
    streams = [object(), object()]
    events = [[_HeldEvent() for _ in range(3)] for _ in streams]
    futures = [[waiter.wait(stream, event) for event in row] for stream, row in zip(streams, events, strict=True)]  # type: ignore[arg-type]
    await asyncio.sleep(0.001)
    assert not any(future.done() for row in futures for future in row)
    assert all(row[0].asked and row[1].asked == row[2].asked == 0 for row in events)  # each stream's oldest only
    for event in events[0][:2]:
        event.done = True
    await asyncio.sleep(0.001)
    assert [future.done() for future in futures[0]] == [True, True, False]
    assert not any(future.done() for future in futures[1])
    # The second stream completes twice, 50 ms apart: its next wait is not asked until most of
    # that time has passed after the last completion (the loop sleeps on a timer meanwhile).
    events[1][0].done = True
    await asyncio.sleep(0.05)
    events[0][2].done = events[1][1].done = events[1][2].done = True
    await asyncio.sleep(0.001)
    assert all(future.done() for row in futures for future in row)
    later = _HeldEvent()
    future = waiter.wait(streams[1], later)  # type: ignore[arg-type]
    await asyncio.sleep(0.005)
    assert later.asked == 0
    later.done = True
    await asyncio.wait_for(future, 1)
    assert later.asked


def floor_p50(result: dict[str, Any], work_us: float) -> float:
    (floor,) = (row for row in result["latency"] if row["work_us"] == work_us and row["strategy"].startswith("floor"))
    return float(floor["p50_us"])


@pytest.mark.timeout(120)
def test_the_host_cost_profile_runs_on_the_simulated_device_and_labels_it(tmp_path: Path) -> None:
    run = run_on_the_simulated_device("host_costs", tmp_path, timeout=100)
    result = json.loads((tmp_path / "host_costs.json").read_text())
    assert result["environment"]["simulated"] is True
    calls = [row["call"] for row in result["costs"]]
    assert calls == [
        "aiogpu.Event(device) + close()",
        "stream.record() + close(): a new event each time",
        "stream.record(), dropped: destroyed by the GC's finalizer",
        "event.record(stream): re-recording one event",
        "event.is_done, done",
        "await event, done: a query and a checkpoint (asyncio)",
    ]  # no driver or torch rows: there is no driver to time
    assert all(row["group"] == "aiogpu" and row["us"] > 0 for row in result["costs"])
    assert run.stdout.count("SIMULATED aiogpu") == len(calls)


def _host_functions_run_by_a_timer(calls: list[tuple[int, int | None]], result: int = 0) -> Any:
    """A stand-in for ``host_functions.launcher``: each launch runs the C host function itself,
    10 ms later on another thread, as the driver's host-task thread would once the work is done."""

    def launcher(sync_mode: int | None) -> Any:
        def launch(stream: int, function: int, argument: int) -> int:
            calls.append((stream, sync_mode))
            if result == 0:
                host_function = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(function)
                threading.Timer(0.01, host_function, args=(argument,)).start()
            return result

        return launch

    return launcher


@pytest.mark.asyncio
async def test_a_host_function_waiter_wakes_its_task_once_the_function_has_run(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[int, int | None]] = []
    monkeypatch.setattr(host_functions, "launcher", _host_functions_run_by_a_timer(calls))
    make = host_functions.host_function_waiter("spin", host_functions.CU_HOST_TASK_SPINWAIT)
    assert make is not None
    with aiogpu.Stream(SimulatedDriver().device(0)) as stream:
        wait, close = make(stream)
        try:
            for _ in range(3):
                started = time.perf_counter()
                await asyncio.wait_for(wait(), 10)
                assert time.perf_counter() - started >= 0.009  # woken by the function, not before
        finally:
            close()
    assert calls == [(stream.handle, host_functions.CU_HOST_TASK_SPINWAIT)] * 3


@pytest.mark.asyncio
async def test_a_host_function_that_fails_to_launch_raises_with_its_result(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(host_functions, "launcher", _host_functions_run_by_a_timer([], result=801))
    make = host_functions.host_function_waiter("v1", None)
    assert make is not None
    with aiogpu.Stream(SimulatedDriver().device(0)) as stream:
        wait, close = make(stream)
        try:
            with pytest.raises(RuntimeError, match="v1: the launch failed with CUresult 801"):
                await wait()
        finally:
            close()


def test_only_the_host_function_launches_the_driver_has_become_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    first_way_only = _host_functions_run_by_a_timer([])
    monkeypatch.setattr(host_functions, "launcher", lambda mode: first_way_only(mode) if mode is None else None)
    assert [name for name, _ in host_functions.waiters()] == ["host function (cuLaunchHostFunc) -> thread -> loop"]


def test_the_handoff_benchmark_times_each_loop_from_the_moment_of_the_handoff() -> None:
    # Handed straight back on the handing thread: the latency counts from the hand-off, not
    # from when the trial began, ASLEEP_AFTER earlier.
    done = threading.Event()
    trial = handoff._Trial(lambda arrive: arrive(), done.set)
    assert done.wait(10)
    assert 0 <= trial.latency() < handoff.ASLEEP_AFTER
    assert trial.handed > 0

    rows = handoff.measure(20)
    assert [row["way"] for row in rows] == [
        "thread to a blocked thread (threading.Event)",
        "thread to asyncio (call_soon_threadsafe)",
        "thread to uvloop (call_soon_threadsafe)",
        "thread to trio (TrioToken.run_sync_soon)",
    ]
    for row in rows:
        assert row["handoffs"] == 20
        assert 0 < row["p50_us"] <= row["p99_us"], row


@pytest.mark.timeout(120)
def test_the_loop_profile_runs_on_the_simulated_device_for_every_way_of_waiting(tmp_path: Path) -> None:
    run = run_on_the_simulated_device("loop_profile", tmp_path, timeout=100)
    assert "the simulated device" in run.stdout
    result = json.loads((tmp_path / "loop_profile.json").read_text())
    assert result["device"] == "the simulated device"
    assert [row["way"] for row in result["rows"]] == ["auto", "poll", "thread", "callback", "to_thread"]
    for row in result["rows"]:
        assert row["waits_per_second"] > 0, row
        assert 0 < row["busy_share"] <= 1, row
        assert row["busy_us"] > 0 and row["loop_cpu_us"] > 0 and row["idle_us"] >= 0, row


@pytest.mark.timeout(120)
def test_the_overlap_benchmark_runs_on_the_simulated_device_against_its_floor(tmp_path: Path) -> None:
    run = run_on_the_simulated_device("overlap", tmp_path, timeout=100)
    assert "the simulated device" in run.stdout
    assert "best possible speed-up" in run.stdout
    result = json.loads((tmp_path / "overlap.json").read_text())
    assert [row["way"] for row in result["rows"]] == ["auto", "poll", "thread", "callback", "to_thread", "query+sleep(0)"]
    arguments = result["arguments"]
    least = arguments["rounds"] * max(arguments["gpu"], arguments["host"])
    for row in result["rows"]:
        # Overlapped, the two tasks can beat running one after the other, never the floor: the
        # kernels back to back, or the host chunks (each busy until its time is up) back to back.
        # The floor as measured can come out longer, where the host was preempted meanwhile.
        assert least * 0.99 <= row["floor_s"], row
        assert least * 0.99 <= row["wall_s"] <= row["serial_s"] * 2, row


@pytest.mark.timeout(120)
@pytest.mark.slow
def test_the_goal_figures_run_on_the_simulated_device(tmp_path: Path) -> None:
    run = run_on_the_simulated_device("goals", tmp_path, 100, "--parts", *goals.PARTS, "--strategies", "auto", "poll")
    result = json.loads((tmp_path / "goals.json").read_text())
    assert result["environment"]["simulated"] is True
    # The sustained part ran in a process of its own: the others kept the driver's queues.
    default = os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS", "driver default")
    assert result["environment"]["cuda_device_max_connections"] == default
    figures = {(row["workload"], row["metric"]): row["value"] for row in result["figures"]}
    for strategy in ("auto", "poll"):
        for work in (200, 5000):
            for metric in ("p50 over floor µs", "p99 over floor µs", "CPU share of floor"):
                assert (f"lone wait {work} µs, {strategy}", metric) in figures
        assert figures[f"fan-out 1000x64 own events, {strategy}", "wall / GPU floor"] > 0
        assert figures[f"fan-out 1000x64 own events, {strategy}", "wall / stream-order floor"] > 0
        assert figures[f"fan-out 1000x64 own events, {strategy}", "first wake ms"] > 0
        assert (f"first wait on a stream 200 µs, {strategy}", "p50 over floor µs") in figures
        assert figures[f"loop profile 16 tasks, {strategy}", "waits/s"] > 0
        assert figures[f"overlap, {strategy}", "speed-up"] > 0
        assert figures[f"sustained 1000x32, {strategy}", "wall / floor"] > 0
        assert figures[f"sustained 1000x32, {strategy}", "other threads' cores"] >= 0
        assert (f"lone wait 20 µs, {strategy}", "p50 over floor µs") in figures
        assert figures[f"varying 1 or 5 ms, {strategy}", "CPU share of floor"] > 0
        p50, p99 = (figures[f"timers beside 5000 µs waits, {strategy}", f"timer lag {q} ms"] for q in ("p50", "p99"))
        assert 0 <= p50 <= p99, (p50, p99)
        first, last = (figures[f"backlog 1000x16 own events, {strategy}", f"{which} wake ms"] for which in ("first", "last"))
        assert 0 < first <= last, (first, last)
    assert figures["timers, nothing else", "timer lag p99 ms"] >= 0
    assert figures["fan-out 1000x64 own events, stream-order floor", "wall / GPU floor"] > 0
    # Every figure is one the comparison and the ablation know which way is better.
    assert {metric for _, metric in figures} <= set(_metrics.LOWER_IS_BETTER)
    assert run.stdout.count("the simulated device: ") == len(figures) + len(goals.PARTS)


@pytest.mark.timeout(120)
def test_the_engine_profile_lists_each_ways_own_work_per_wait(tmp_path: Path) -> None:
    run = run_on_the_simulated_device("engine_profile", tmp_path, 100, "--top", "40", "--waiters", "640")
    result = json.loads((tmp_path / "engine_profile.json").read_text())
    assert result["environment"]["simulated"] is True
    profiles = {profile["way"]: profile for profile in result["profiles"]}
    assert set(profiles) == {"aiogpu auto", wake.SUSTAINED_REFERENCE}
    for way, profile in profiles.items():
        assert profile["waits"] == 2 * 640, way  # every task's two turns, the warm-up's left out
        assert profile["pace"] > 0.5, way  # profiled wall over the kernels' GPU time: it cannot beat the GPU
        top = profile["top"]
        assert len(top) == 40
        owns = [row["own_us_per_wait"] for row in top]
        assert owns == sorted(owns, reverse=True) and sum(owns) <= profile["profiled_us_per_wait"] + 1e-6
        # (cProfile on Python 3.12 may time a blocking builtin's own time a fraction of a percent
        # over its cumulative time, ``lock.acquire`` for one: two clock reads around a GIL release.)
        assert all(row["own_us_per_wait"] <= row["cumulative_us_per_wait"] * 1.01 + 1e-6 for row in top), way
        assert f"{way}: 1280 waits in " in run.stdout and " (pace " in run.stdout
    # Every wait records its event once, whichever way waits for it; only aiogpu runs its own wait.
    records = {
        way: [row for row in profile["top"] if row["function"].endswith("(_record_event)")] for way, profile in profiles.items()
    }
    assert all(len(rows) == 1 and rows[0]["calls_per_wait"] == pytest.approx(1.0) for rows in records.values()), records
    assert any(
        row["function"].startswith("__init__.py:") and row["function"].endswith("(wait)")
        for row in profiles["aiogpu auto"]["top"]
    )
    assert not any(
        row["function"].endswith("(wait)") and "__init__" in row["function"] for row in profiles[wake.SUSTAINED_REFERENCE]["top"]
    )


def _old_tree(tmp_path: Path) -> Path:
    """A copy of this tree's aiogpu, as ``git archive`` of another commit would give: the
    comparison must import it from there."""
    old = tmp_path / "old"
    shutil.copytree(ROOT / "aiogpu", old / "aiogpu", ignore=shutil.ignore_patterns("__pycache__"))
    return old


@pytest.mark.timeout(120)
@pytest.mark.slow
def test_the_comparison_runs_each_tree_in_turn_and_puts_them_side_by_side(tmp_path: Path) -> None:
    old = _old_tree(tmp_path)
    out = tmp_path / "compare"
    run = run_on_the_simulated_device(
        "compare",
        out,
        100,
        *("--old", str(old), "--new", str(ROOT), "--bench", "goals", "--rounds", "2", "--", "--quick", "--parts", "lone"),
        quick=False,
    )
    result = json.loads((out / "compare.json").read_text())
    # Interleaved: old then new, then new then old; each from its own tree.
    assert [(r["side"], r["round"]) for r in result["runs"]] == [("old", 0), ("new", 0), ("new", 1), ("old", 1)]
    trees = {"old": str(old.resolve()), "new": str(ROOT)}
    assert all(r["aiogpu"] == trees[r["side"]] for r in result["runs"]), result["runs"]
    assert result["arguments"] == ["--quick", "--parts", "lone"]
    rows = {(row["workload"], row["metric"]): row for row in result["table"]}
    assert set(rows) == {(f"lone wait {work} µs, auto", metric) for work in (200, 5000) for metric in _LONE_METRICS}
    for row in rows.values():
        assert len(row["old_values"]) == len(row["new_values"]) == 2
        assert row["old_median"] == pytest.approx(sum(row["old_values"]) / 2)
        assert row["difference"] == pytest.approx(row["new_median"] - row["old_median"])
        if row["ratio_new_to_old"] is not None:
            assert row["ratio_new_to_old"] == pytest.approx(row["new_median"] / row["old_median"])
        assert row["verdict"] == "too few runs"  # two runs each: no verdict
    markdown = (out / "compare.md").read_text()
    assert markdown.startswith("# Old and new engine, `benchmarks.goals`: SIMULATED device")
    assert markdown.count("| lone wait ") == len(rows)
    assert "| lone wait 200 µs, auto | CPU share of floor ↓ |" in run.stdout


_LONE_METRICS = ("p50 over floor µs", "p99 over floor µs", "CPU share of floor")


@pytest.mark.parametrize(
    ("old", "new", "verdict"),
    [
        ([1.0, 1.1, 1.2], [2.0, 2.1, 1.3], "worse"),  # a time that grew: every new run beyond every old one
        ([2.0, 2.1, 2.2], [1.0, 1.1, 1.9], "better"),
        ([1.0, 1.1, 1.2], [2.0, 2.1, 1.15], "within noise"),  # one new run among the old ones
        ([1.0, 1.1], [2.0, 2.1], "too few runs"),  # two each: one in six by chance alone
    ],
)
def test_the_comparison_calls_a_change_only_where_every_run_says_so(old: list[float], new: list[float], verdict: str) -> None:
    runs = [{"side": "old", "metrics": {("w", "wall / floor"): value}} for value in old]
    runs += [{"side": "new", "metrics": {("w", "wall / floor"): value}} for value in new]
    (row,) = compare.side_by_side(runs)
    assert row["verdict"] == verdict
    runs = [{**run, "metrics": {("w", "waits/s"): value}} for run, value in zip(runs, old + new, strict=True)]
    (row,) = compare.side_by_side(runs)  # more waits a second is better: the verdict turns round
    assert row["verdict"] == {"worse": "better", "better": "worse"}.get(verdict, verdict)


def test_the_comparison_refuses_a_tree_without_aiogpu(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"holds no aiogpu package \(expected .*aiogpu/__init__.py\)"):
        _child.check_tree(tmp_path)


def test_every_heuristic_is_switched_off_by_tunables_the_engine_has() -> None:
    # Where the engine moves or renames a tunable, the ablation must be told: this fails first.
    for name, changes in ablation.HEURISTICS.items():
        for module, attribute, off in changes:
            if module == _child.ENVIRON:  # a setting aiogpu reads from the environment
                assert attribute == _backends.PUBLIC_ASYNCIO_VARIABLE, name
                assert off not in ("", "0"), name  # what switches the internals off
                continue
            (owner, *_) = _child.owners(module, attribute) or pytest.fail(f"{name}: no {attribute} in {module} or its fallbacks")
            current = getattr(owner, attribute)
            if isinstance(current, dict):  # one value per strategy: the same strategies
                assert isinstance(off, dict) and off.keys() == current.keys(), (name, attribute)
            else:
                assert isinstance(current, (int, float)) and isinstance(off, type(current)), (name, attribute, current, off)
                assert off != current, name


def test_a_child_sets_an_environment_patch_before_it_imports_aiogpu() -> None:
    assert "AIOGPU_BENCH_TEST_SETTING" not in os.environ
    try:
        applied = _child._apply([(_child.ENVIRON, "AIOGPU_BENCH_TEST_SETTING", "1")])
        assert os.environ["AIOGPU_BENCH_TEST_SETTING"] == "1"
    finally:
        os.environ.pop("AIOGPU_BENCH_TEST_SETTING", None)
    assert applied == [{"module": "environ", "attribute": "AIOGPU_BENCH_TEST_SETTING", "was": "None", "now": "'1'"}]


@pytest.mark.timeout(240)
@pytest.mark.slow
def test_the_serving_ablation_switches_a_heuristic_off_inside_the_server(tmp_path: Path) -> None:
    wrk = fake_wrk(tmp_path)
    out = tmp_path / "ablation"
    run = run_on_the_simulated_device(
        "serving_ablation",
        out,
        220,
        *("--rounds", "1", "--heuristics", "busy-loop look", "--", "--wrk", str(wrk), "--warmup", "1", "--seconds", "1"),
        quick=False,
    )
    result = json.loads((out / "ablation.json").read_text())
    assert [r["configuration"] for r in result["runs"]] == ["all on", "busy-loop look", "all on"]
    assert result["environment"]["simulated"] is True
    patched = {r["configuration"]: r["patches"] for r in result["runs"]}
    assert patched["all on"] == []
    (busy_look,) = patched["busy-loop look"]  # as the server recorded it
    assert (busy_look["module"], busy_look["attribute"], busy_look["now"]) == ("aiogpu._wait._policy", "BUSY_SHARE", "inf")
    for run_ in result["runs"]:
        values = {metric: value for _, metric, value in run_["metrics"]}
        assert set(values) == {"req/s", "p99 ms", "max ms", "handler p99 ms"}
        assert values["req/s"] > 0
        assert values["max ms"] >= values["p99 ms"] > 0
        assert values["handler p99 ms"] > 0
    (row,) = result["table"]
    assert row["verdict"] == "too few runs to judge"  # one run off against two all on
    summary = (out / "ablation.md").read_text()
    assert summary.startswith("# Ablation of the wake engine's heuristics, `benchmarks.serving_ablation`: SIMULATED")
    assert "| busy-loop look | `BUSY_SHARE = inf` | too few runs to judge |" in summary
    assert "busy-loop look               too few runs to judge" in run.stdout


def test_a_serving_ablation_run_fails_where_the_server_did_not_record_the_change(tmp_path: Path) -> None:
    record = tmp_path / "applied.jsonl"
    expected = ablation.HEURISTICS["busy-loop look"]
    with pytest.raises(RuntimeError, match="no per_request_server.py process recorded"):
        serving_ablation.check_applied(record, expected)  # no record at all
    change = {"module": "aiogpu._wait._policy", "attribute": "BUSY_SHARE", "was": "0.5", "now": "inf"}
    record.write_text(json.dumps({"argv": ["python", "loadtest_wrk.py"], "applied": [change]}) + "\n")
    with pytest.raises(RuntimeError, match="no per_request_server.py process recorded"):
        serving_ablation.check_applied(record, expected)  # only the load test made it
    with record.open("a") as file:
        file.write(json.dumps({"argv": ["python", "/x/per_request_server.py", "--mode", "aiogpu"], "applied": [change]}) + "\n")
    assert serving_ablation.check_applied(record, expected) == [change]


def test_a_patched_environment_makes_the_changes_in_every_python_process_it_starts(tmp_path: Path) -> None:
    record = tmp_path / "applied.jsonl"
    patches = [(_child.POLICY, "BUSY_SHARE", _child.encode(float("inf")))]
    environment = _child.patched_environment(patches, record)
    show = "import aiogpu._wait._policy as p; print(p.BUSY_SHARE)"
    child = subprocess.run([sys.executable, "-c", show], env=environment, capture_output=True, text=True, check=True)
    assert child.stdout.strip() == "inf"
    (line,) = record.read_text().splitlines()
    entry = json.loads(line)
    assert entry["argv"][-2:] == ["-c", show]
    assert [(c["attribute"], c["now"]) for c in entry["applied"]] == [("BUSY_SHARE", "inf")]
    plain = subprocess.run([sys.executable, "-c", show], env=ENVIRONMENT, capture_output=True, text=True, check=True)
    assert plain.stdout.strip() == "0.5"  # without it, the engine's own value


def test_the_ablation_judges_only_where_chance_alone_would_seldom_flag() -> None:
    assert _metrics.chance(3, 6) == pytest.approx(1 / 84)
    assert ablation.judge([1.0, 1.1, 1.2, 1.0, 1.1, 1.2], [1.5, 1.6, 1.4], lower_is_better=True) == "pays"
    assert ablation.judge([1.0, 1.1, 1.2, 1.0, 1.1, 1.2], [0.5, 0.6, 0.4], lower_is_better=True) == "costs"
    assert ablation.judge([1.0, 1.1, 1.2, 1.0, 1.1, 1.2], [0.5, 0.6, 0.4], lower_is_better=False) == "pays"
    assert ablation.judge([1.0, 1.1, 1.2, 1.0, 1.1, 1.2], [1.5, 1.15, 1.4], lower_is_better=True) == "within noise"
    assert ablation.judge([1.0, 1.1], [1.5], lower_is_better=True) == "too few runs"  # 1 in 3


def test_the_ablation_interleaves_every_heuristic_with_all_on_runs() -> None:
    order = ablation.schedule(["a", "b", "c"], rounds=2)
    assert order == [
        (0, "all on"), (0, "a"), (0, "b"), (0, "all on"), (0, "c"),
        (1, "all on"), (1, "c"), (1, "b"), (1, "all on"), (1, "a"),
    ]  # fmt: skip


@pytest.mark.timeout(120)
@pytest.mark.slow
def test_the_ablation_runs_each_heuristic_off_in_a_child_and_reports_it(tmp_path: Path) -> None:
    out = tmp_path / "ablation"
    run = run_on_the_simulated_device(
        "ablation",
        out,
        100,
        *("--rounds", "1", "--heuristics", "busy-loop look", "close watch at start", "--", "--quick", "--parts", "lone"),
        quick=False,
    )
    result = json.loads((out / "ablation.json").read_text())
    assert [r["configuration"] for r in result["runs"]] == ["all on", "busy-loop look", "all on", "close watch at start"]
    patched = {r["configuration"]: r["patches"] for r in result["runs"]}
    assert patched["all on"] == []
    (busy_look,) = patched["busy-loop look"]
    assert (busy_look["attribute"], busy_look["now"]) == ("BUSY_SHARE", "inf")
    assert busy_look["module"] == "aiogpu._wait._policy"
    assert [p["attribute"] for p in patched["close watch at start"]] == ["WATCH_UNPREDICTED"]
    table = {row["heuristic"]: row for row in result["table"]}
    assert set(table) == {"busy-loop look", "close watch at start"}
    for row in table.values():  # one run off against two all on: no judgement
        assert row["verdict"] == "too few runs to judge"
        assert {(m["workload"], m["metric"]) for m in row["metrics"]} == {
            (f"lone wait {work} µs, auto", metric) for work in (200, 5000) for metric in _LONE_METRICS
        }
    assert "| busy-loop look | `BUSY_SHARE = inf` | too few runs to judge |" in (out / "ablation.md").read_text()
    assert "busy-loop look               too few runs to judge" in run.stdout
