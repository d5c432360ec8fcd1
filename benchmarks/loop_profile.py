"""Where the loop thread's time goes per completed wait, at saturation, for each way of waiting.

``--tasks`` tasks share ``--streams`` streams from a :class:`aiogpu.StreamPool`; each, over and
over, borrows a stream, launches ``--work`` seconds of GPU work on it (a spin kernel; simulated
work without a GPU), records an event and waits for it, then gives the stream back: more tasks
than streams keep every stream busy, as a saturated server does. An asyncio loop whose selector
is timed (a public ``selector=`` argument) splits the loop thread's wall time into time asleep in
``select`` and time running callbacks; thread CPU clocks split the process's CPU into the loop
thread's and every other thread's (waiter threads, ``to_thread``'s pool). Per completed wait:

- ``busy_us``: loop-thread wall time outside ``select`` (callbacks: aiogpu's watcher, the
  tasks, the pool);
- ``loop_cpu_us``: the loop thread's CPU time (busy time plus the selector's own system time);
- ``other_cpu_us``: every other thread's CPU time;
- ``idle_us``: loop-thread time asleep in ``select``.

With the GPU the only bottleneck, waits/s is the same for every way of waiting and the
loop's busy share is what a server has left for requests. Prints a table and writes
``loop_profile.json`` to ``--out``. Without a GPU it runs on the simulated device and says so.

Run:  python -m benchmarks.loop_profile [--quick] [--seconds 3] [--work 0.001] [--out DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import selectors
import time
from pathlib import Path

import aiogpu
from aiogpu.testing import launch_spin
from benchmarks.wake import open_device

WAYS = ("auto", "poll", "thread", "callback", "to_thread")


class TimedSelector(selectors.DefaultSelector):  # type: ignore[misc,valid-type]
    """The default selector, counting the wall time spent inside ``select``."""

    def __init__(self) -> None:
        super().__init__()
        self.asleep = 0.0

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        started = time.perf_counter()
        try:
            return super().select(timeout)
        finally:
            self.asleep += time.perf_counter() - started


async def saturate(device: aiogpu.Device, way: str, arguments: argparse.Namespace, selector: TimedSelector) -> dict[str, float]:
    pool = aiogpu.StreamPool([device], streams_per_device=arguments.streams)
    completed = 0
    running = True

    async def worker() -> None:
        nonlocal completed
        while running:
            async with pool.stream() as stream:
                launch_spin(stream, arguments.work)
                with stream.record() as done:
                    if way == "to_thread":
                        await asyncio.to_thread(done.synchronize)
                    else:
                        await done.wait(strategy=way)  # type: ignore[arg-type]
            completed += 1

    tasks = [asyncio.create_task(worker()) for _ in range(arguments.tasks)]
    await asyncio.sleep(arguments.warmup)
    start_wall, start_loop_cpu, start_cpu = time.perf_counter(), time.thread_time(), time.process_time()
    start_asleep, start_completed = selector.asleep, completed
    await asyncio.sleep(arguments.seconds)
    wall = time.perf_counter() - start_wall
    loop_cpu = time.thread_time() - start_loop_cpu
    cpu = time.process_time() - start_cpu
    asleep = selector.asleep - start_asleep
    waits = completed - start_completed
    running = False
    await asyncio.gather(*tasks)
    pool.close()
    per_wait = 1e6 / max(waits, 1)
    return {
        "waits_per_second": waits / wall,
        "busy_share": (wall - asleep) / wall,
        "busy_us": (wall - asleep) * per_wait,
        "loop_cpu_us": loop_cpu * per_wait,
        "other_cpu_us": (cpu - loop_cpu) * per_wait,
        "idle_us": asleep * per_wait,
    }


def run(way: str, device: aiogpu.Device, arguments: argparse.Namespace) -> dict[str, float]:
    selector = TimedSelector()
    loop = asyncio.SelectorEventLoop(selector)
    try:
        return loop.run_until_complete(saturate(device, way, arguments, selector))
    finally:
        loop.close()


def main(arguments: argparse.Namespace) -> dict[str, object]:
    device, simulated = open_device()
    where = "the simulated device" if simulated else device.name
    print(
        f"{where}: {arguments.tasks} tasks on {arguments.streams} streams, {arguments.work * 1e6:.0f} µs of work a wait, "
        f"{arguments.seconds:g} s a case, asyncio",
        flush=True,
    )
    print(f"{'way':10} {'waits/s':>8} {'busy':>6} {'busy µs':>8} {'loop CPU µs':>11} {'other CPU µs':>12} {'idle µs':>8}")
    rows = []
    for round_ in range(arguments.rounds):
        for way in arguments.ways:
            row = {"round": round_, "way": way, **run(way, device, arguments)}
            rows.append(row)
            print(
                f"{way:10} {row['waits_per_second']:8.0f} {row['busy_share']:6.0%} {row['busy_us']:8.1f} "
                f"{row['loop_cpu_us']:11.1f} {row['other_cpu_us']:12.1f} {row['idle_us']:8.1f}",
                flush=True,
            )
    return {"device": where, "arguments": vars(arguments), "rows": rows}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ways", nargs="+", default=list(WAYS))
    parser.add_argument("--tasks", type=int, default=64)
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--work", type=float, default=0.001, help="seconds of GPU work per wait")
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--warmup", type=float, default=0.5)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="a short run that only checks the benchmark works")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    options = parser.parse_args()
    if options.quick:
        options.tasks, options.seconds, options.warmup, options.rounds = 16, 0.3, 0.1, 1
    result = main(options)
    options.out.mkdir(parents=True, exist_ok=True)
    (options.out / "loop_profile.json").write_text(json.dumps(result, indent=1, default=str))
