"""Where the sustained load's CPU goes, function by function: each way of waiting beside the least
waiter.

``benchmarks.wake``'s sustained load (10,240 tasks on 32 streams, one per hardware queue;
``--waiters`` to change it, 1,000 with ``--quick``) runs once per way under ``cProfile``, after a
run to warm it up on the same loop (as a server's one loop would have), and the functions that
took the most time of their own are listed per completed wait: calls, own µs and cumulative µs.
The least waiter (``least_waiter``) is the reference: what the loop cannot avoid (making,
completing and resuming a future per wait, a driver query or so), so that a row only the engine
has is the engine's own work.

``cProfile`` slows every Python call, the engine's more than the driver's C calls. Each way's
*pace* is its profiled wall over the GPU time of its kernels: about 1 while the profiled loop keeps
up with the GPU, as the unprofiled one does; well above 1, the loop fell behind, and a way of
waiting behaves otherwise when it is behind (fewer queries, longer sweeps): use fewer waiters.
The figures say where to look, not what a wait costs (``benchmarks.wake`` measures that,
unprofiled). Writes ``engine_profile.json`` to ``--out`` and prints a table per way. Without a GPU
it runs on the simulated device, whose driver is Python too, and says so.

Run:  python -m benchmarks.engine_profile [--ways "aiogpu auto" ...] [--waiters N] [--top 25] [--quick]
          [--out DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import pstats
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import baselines, wake

if TYPE_CHECKING:
    import aiogpu

WAYS = ("aiogpu auto", wake.SUSTAINED_REFERENCE)


def profile(device: aiogpu.Device, way: str, waiters: int, quick: bool, top: int) -> dict[str, Any]:
    """The sustained load for ``way`` under ``cProfile``: its ``top`` functions by own time."""
    kernel = 0.5e-3 if quick else wake.SUSTAINED_KERNEL
    layout = wake.sustained_layout(waiters, wake.HARDWARE_QUEUES)
    turns = 2 if quick else 3
    profiler = cProfile.Profile()

    async def warmed_up_then_profiled() -> wake.SustainedRun:
        await wake.sustained_run(way, streams, events, 1, kernel, 60.0)
        profiler.enable()
        try:
            return await wake.sustained_run(way, streams, events, turns, kernel, 60.0)
        finally:
            profiler.disable()

    with wake.sustained_streams(device, layout) as (streams, events):
        wall, _, completed, _ = asyncio.run(warmed_up_then_profiled())
    gpu_time = turns * max(wake.sustained_kernels(layout)) * kernel
    stats = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
    rows = [
        {
            "function": f"{Path(filename).name}:{line}({name})" if line else name,
            "calls_per_wait": calls / completed,
            "own_us_per_wait": own / completed * 1e6,
            "cumulative_us_per_wait": cumulative / completed * 1e6,
        }
        for (filename, line, name), (_, calls, own, cumulative, _) in stats.items()
    ]
    rows.sort(key=lambda row: row["own_us_per_wait"], reverse=True)
    total = sum(row["own_us_per_wait"] for row in rows)
    return {
        "way": way,
        "waits": completed,
        "wall_s": wall,
        "pace": wall / gpu_time,
        "profiled_us_per_wait": total,
        "top": rows[:top],
    }


def print_profile(result: dict[str, Any]) -> None:
    print(
        f"{result['way']}: {result['waits']} waits in {result['wall_s'] * 1e3:.0f} ms (pace {result['pace']:.2f}: "
        f"wall / the kernels' GPU time), {result['profiled_us_per_wait']:.2f} µs a wait in all (profiled)"
    )
    print(f"  {'calls':>7} {'own µs':>8} {'cum. µs':>8}  per wait")
    for row in result["top"]:
        print(
            f"  {row['calls_per_wait']:7.3f} {row['own_us_per_wait']:8.3f} {row['cumulative_us_per_wait']:8.3f}  {row['function']}"
        )


def main(ways: list[str], waiters: int, quick: bool, top: int) -> dict[str, Any]:
    device, simulated = wake.open_device(every_queue=True)
    results = [profile(device, way, waiters, quick, top) for way in ways]
    for result in results:
        print_profile(result)
    return {"environment": baselines.environment(device, simulated), "profiles": results}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ways", nargs="+", default=list(WAYS), help="ways of waiting, as benchmarks.wake names them")
    parser.add_argument("--top", type=int, default=25, help="how many functions to list per way")
    parser.add_argument(
        "--waiters", type=int, default=None, help=f"waiting tasks (default {wake.SUSTAINED_WAITERS:,}; 1,000 with --quick)"
    )
    parser.add_argument("--quick", action="store_true", help="a short run that only checks it works")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    options = parser.parse_args()
    waiters = options.waiters or (1_000 if options.quick else wake.SUSTAINED_WAITERS)
    result = main(options.ways, waiters, options.quick, options.top)
    options.out.mkdir(parents=True, exist_ok=True)
    (options.out / "engine_profile.json").write_text(json.dumps(result, indent=1, default=str))
