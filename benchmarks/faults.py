"""How soon a GPU fault reaches the code awaiting it, under every strategy and loop.

A stream is held by a ``Latch``; behind it, a kernel that stores to an unmapped address
(``launch_fault``) and a recording of an event. ``TASKS`` tasks await the event, and once every
one is parked the latch opens: the fault happens microseconds later. Measured from the opening:
when the first task sees ``CudaError``, when the last does, and the process's CPU meanwhile
(cores busy). The *floor* is the driver's own detection: a loop that does nothing but query the
event from the opening until the query fails.

A fault poisons the process's context, so every run is a child process of its own: the floor
and each (loop, strategy) ``REPEATS`` times, interleaved. On asyncio, uvloop and trio where they
are installed. The goal (``GOAL_MS``): every task sees the fault within that many milliseconds
of the fault; the table also says whether it does within that many of the floor's median
detection, which is as soon as the driver allows. Without a GPU it runs on the simulated device, where a fault
is seen at once, and says so.

Writes ``faults.json`` and ``faults.md`` to ``--out``.

Run:  python -m benchmarks.faults [--repeats 3] [--tasks 100] [--out DIR]
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from . import _metrics

TASKS = 100
REPEATS = 3
GOAL_MS = 50.0
STRATEGIES = ("auto", "poll", "thread", "callback")
FLOOR = "floor"
CHILD_TIMEOUT = 120


def _loops() -> list[str]:
    """``benchmarks.wake``'s loops (asyncio, uvloop where installed), and trio where installed."""
    from .wake import event_loops

    return [name for name, _ in event_loops()] + (["trio"] if importlib.util.find_spec("trio") else [])


def child(loop_name: str, strategy: str, tasks: int) -> dict[str, Any]:
    """One fault in this process (its context is lost after): seconds from the latch's opening
    to the first and the last ``CudaError`` seen, and cores busy meanwhile."""
    import aiogpu
    from aiogpu.testing import Latch, launch_fault, launch_spin

    from .wake import open_device

    device, _ = open_device()
    stream = aiogpu.Stream(device, nonblocking=True)
    warm = aiogpu.Event(device)
    launch_spin(stream, 1e-4)  # loads the instruments' kernels before the clock runs
    warm.record(stream)
    warm.synchronize()
    event = aiogpu.Event(device)
    latch = Latch(device)
    latch.block(stream)
    launch_fault(stream)
    event.record(stream)
    seen: list[float] = []

    def opened() -> tuple[float, float]:
        latch.release()
        return time.perf_counter(), time.process_time()

    if strategy == FLOOR:
        start, cpu = opened()
        while time.perf_counter() < start + CHILD_TIMEOUT / 2:
            try:
                if event.is_done:
                    break  # no fault: the check below says so
            except aiogpu.CudaError:
                seen.append(time.perf_counter())
                break
    else:
        start, cpu = _await_fault(loop_name, strategy, tasks, event, opened, seen)
    cpu = time.process_time() - cpu
    if len(seen) != (1 if strategy == FLOOR else tasks):
        raise RuntimeError(f"{len(seen)} of {tasks} waits saw the fault")
    last = max(seen) - start
    return {"first_ms": (min(seen) - start) * 1e3, "last_ms": last * 1e3, "cores": cpu / last}


def _await_fault(loop_name: str, strategy: str, tasks: int, event: Any, opened: Any, seen: list[float]) -> tuple[float, float]:
    import aiogpu

    async def waiter() -> None:
        try:
            await event.wait(strategy=strategy)
        except aiogpu.CudaError:
            seen.append(time.perf_counter())

    if loop_name == "trio":
        import trio
        import trio.testing

        async def main_trio() -> tuple[float, float]:
            async with trio.open_nursery() as nursery:
                for _ in range(tasks):
                    nursery.start_soon(waiter)
                await trio.testing.wait_all_tasks_blocked()
                began = opened()
            return began

        return trio.run(main_trio)

    import asyncio

    async def main_asyncio() -> tuple[float, float]:
        waiting = [asyncio.ensure_future(waiter()) for _ in range(tasks)]
        for _ in range(3):
            await asyncio.sleep(0)  # every task has started its wait
        began = opened()
        await asyncio.gather(*waiting)
        return began

    if loop_name == "uvloop":
        import uvloop

        return uvloop.run(main_asyncio())
    return asyncio.run(main_asyncio())


def run_child(loop_name: str, strategy: str, tasks: int) -> dict[str, Any]:
    command = [sys.executable, "-m", "benchmarks.faults", "--child", loop_name, strategy, "--tasks", str(tasks)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=CHILD_TIMEOUT, check=False)
    except subprocess.TimeoutExpired as exc:
        raise RuntimeError(f"{loop_name} {strategy}: no result in {CHILD_TIMEOUT} s") from exc
    lines = done.stdout.strip().splitlines()
    if done.returncode or not lines:
        raise RuntimeError(f"{loop_name} {strategy}: exit {done.returncode}\n{done.stderr[-2000:]}")
    return json.loads(lines[-1])


def _met(milliseconds: float) -> str:
    return "met" if milliseconds <= GOAL_MS else "not met"


def markdown(result: dict[str, Any]) -> str:
    environment = result["environment"]
    lines = [
        f"# Fault detection: {_metrics.where(environment)}, driver {environment.get('driver', '-')}, {environment['date']}",
        "",
        f"{result['tasks']} tasks await one event behind a faulting kernel; milliseconds from the fault to the first and the"
        f" last task seeing `CudaError` (medians of {result['repeats']} runs), and the process's cores busy meanwhile. The"
        f" floor is a loop doing nothing but query the event: when the driver reports the fault. Goal: the last task"
        f" within {GOAL_MS:.0f} ms of the fault; beside it, whether it is within {GOAL_MS:.0f} ms of the driver's report.",
        "",
        f"| loop | strategy | first ms | last ms | over the floor ms | cores | ≤ {GOAL_MS:.0f} ms after the fault |"
        f" ≤ {GOAL_MS:.0f} ms after the driver's report |",
        "|---|---|---:|---:|---:|---:|---|---|",
    ]
    floor = result["floor_ms"]
    for row in result["rows"]:
        over = row["last_ms"] - floor
        goals = ["", ""] if row["strategy"] == FLOOR else [_met(row["last_ms"]), _met(over)]
        lines.append(
            f"| {row['loop']} | {row['strategy']} | {row['first_ms']:.1f} | {row['last_ms']:.1f} | {over:.1f} |"
            f" {row['cores']:.2f} | {goals[0]} | {goals[1]} |"
        )
    return "\n".join(lines) + "\n"


def main(arguments: argparse.Namespace) -> None:
    from . import baselines
    from .wake import open_device

    device, simulated = open_device()
    environment = baselines.environment(device, simulated)
    cases = [("-", FLOOR)] + [(loop_name, strategy) for loop_name in _loops() for strategy in STRATEGIES]
    runs: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for repeat in range(arguments.repeats):
        for loop_name, strategy in cases if repeat % 2 == 0 else cases[::-1]:
            measured = run_child(loop_name, strategy, arguments.tasks)
            runs.setdefault((loop_name, strategy), []).append(measured)
            print(
                f"{loop_name:8} {strategy:9} first {measured['first_ms']:7.1f} ms  last {measured['last_ms']:7.1f} ms"
                f"  cores {measured['cores']:4.2f}  (run {repeat + 1})",
                flush=True,
            )
    rows = [
        {
            "loop": loop_name,
            "strategy": strategy,
            **{key: statistics.median(run[key] for run in measured) for key in ("first_ms", "last_ms", "cores")},
            "runs": measured,
        }
        for (loop_name, strategy), measured in runs.items()
    ]
    environment.setdefault("date", datetime.date.today().isoformat())
    floor_ms = next(row["last_ms"] for row in rows if row["strategy"] == FLOOR)
    result = {
        "environment": environment,
        "tasks": arguments.tasks,
        "repeats": arguments.repeats,
        "floor_ms": floor_ms,
        "rows": rows,
    }
    arguments.out.mkdir(parents=True, exist_ok=True)
    (arguments.out / "faults.json").write_text(json.dumps(result, indent=1))
    (arguments.out / "faults.md").write_text(markdown(result))
    print(markdown(result))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--child", nargs=2, metavar=("LOOP", "STRATEGY"), help=argparse.SUPPRESS)
    parser.add_argument("--tasks", type=int, default=TASKS)
    parser.add_argument("--repeats", type=int, default=REPEATS)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    parsed = parser.parse_args()
    if parsed.child:
        print(json.dumps(child(*parsed.child, parsed.tasks)), flush=True)
    else:
        main(parsed)
