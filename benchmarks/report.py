"""Render the wake benchmark's results: a Markdown table and the latency-versus-CPU chart."""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pathlib import Path

#: The chart's overhead axis is logarithmic: an overhead at or below this (or negative, a waiter
#: that beat the floor) is drawn at it, as the axis label says.
OVERHEAD_SHOWN_MIN_US = 0.5


def _title(environment: dict[str, Any]) -> str:
    where = "SIMULATED device (no GPU): figures are not GPU measurements" if environment["simulated"] else environment["device"]
    driver = f", driver {environment['driver']}" if environment.get("driver") else ""
    return f"{where}{driver}, {environment['date']}, Python {environment['python']}, aiogpu {environment['aiogpu']}"


def markdown(result: dict[str, Any]) -> str:
    lines = [f"# Wake-up benchmark: {_title(result['environment'])}", ""]
    lines += [
        "Overhead is over the floor (a spinning `cuEventSynchronize` on the loop) in the same run; each",
        "workload's ways of waiting are measured in interleaved rounds (older results: one after the other);",
        "CPU is process CPU time per wait. Lag is how late the loop reads input that another process",
        "writes to a pipe at 1 kHz while the waits run; timer lag is how late a 1 kHz `asyncio.sleep` ticker",
        "wakes while they run (measured after the input, not beside it: asyncio rounds sleeps up to whole",
        "milliseconds, so each input read could make the next tick up to 1 ms late). GC pauses are the",
        "garbage collector's, on the loop thread, while lag was measured (the start-up heap frozen first,",
        "as servers do).",
        "",
        "| work | strategy | p50 µs | p99 µs | overhead p50 µs | overhead p99 µs | CPU µs/wait | CPU vs floor"
        " | lag p99 ms | lag max ms | timer lag p99 ms | GC pauses (max ms) |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in result["latency"]:
        lines.append(
            f"| {row['work_us']:.0f} µs | {row['strategy']} | {row['p50_us']:.1f} | {row['p99_us']:.1f} | "
            f"{row['overhead_p50_us']:+.1f} | {row['overhead_p99_us']:+.1f} | {row['cpu_us_per_wait']:.1f} | "
            f"{row['cpu_fraction_of_floor']:.0%} | {row['lag_p99_ms']:.2f} | {row['lag_max_ms']:.2f} | "
            f"{row.get('timer_lag_p99_ms', float('nan')):.2f} | {row.get('gc_pauses', '?')} ({row.get('gc_pause_max_ms', float('nan')):.2f}) |"
        )
    idle = result.get("idle_lag", [])
    if idle:
        lines += [
            "",
            "The same probe on an idle loop (no waits at all: the lag the machine alone causes), in the rounds of each workload: "
            + "; ".join(
                f"{row['work_us']:.0f} µs: lag p99 {row['lag_p99_ms']:.2f} ms, max {row['lag_max_ms']:.2f} ms" for row in idle
            )
            + ".",
        ]
    lines += [
        "",
        "Fan-out: waiting tasks awaiting events queued behind a latch on N streams (20 µs kernels),",
        "released at once; medians of repeated runs, the waiters interleaved, and the best run (what the",
        "way of waiting costs when the host does not get in the way; over the GPU floor's best run). The GPU floor wakes no",
        "task; the task floor wakes the same N tasks through plain futures after the same spinning",
        "synchronize; the stream-order floor synchronizes one stream at a time and wakes and runs its",
        "tasks before the next, so tasks run while the GPU finishes the rest, as a waking engine's do:",
        "near the least a loop can do for N waiting tasks. Each waiting task counts itself",
        "done on a shared countdown; the clock stops when the last one has woken (freeing the finished",
        "tasks all at once afterwards is the harness's, timed apart: last column). Fan-out runs on",
        "asyncio and on uvloop (where installed). An event follows each kernel, shared by several waiters",
        'where there are more waiters than kernels, except in the rows marked "own": there every waiter',
        "awaits an event of its own, a few recorded after each of the same kernels.",
        "CPU over the task floor is what the way of waiting adds per wait to the loop's cost of waking a task.",
        "The host probe, a fixed pure-Python loop timed before each run (median and slowest), is how fast the",
        "host ran Python then: fan-out walls are CPU-bound on the loop and the GPU floor is not, so runs at a",
        "moment the probe took longer push the ratios up (it took 0.76-0.81 ms at some moments and",
        "1.33-1.60 ms at others on the lent H200 machine, 2026-11-26).",
        "",
        "| loop | waiters | streams | events | strategy | wall ms | vs GPU floor | vs task floor | CPU µs/wait"
        " | CPU over task floor µs/wait | best wall ms | best vs GPU floor | then freeing the tasks ms | host probe ms |",
        "|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in result["fanout"]:
        lines.append(
            f"| {row.get('loop', 'asyncio')} | {row['waiters']} | {row['streams']} | {row['events']}{' own' if row.get('own_events') else ''} | {row['strategy']} | {row['wall_ms']:.2f} | "
            f"{row['wall_ratio_to_floor']:.2f}x | {row['wall_ratio_to_task_floor']:.2f}x | {row['cpu_us_per_wait']:.2f} | "
            f"{row.get('cpu_us_per_wait_over_task_floor', float('nan')):+.2f} | {row.get('wall_ms_best', float('nan')):.2f} | "
            f"{row.get('wall_best_ratio_to_floor', float('nan')):.2f}x | {row.get('freeing_ms', float('nan')):.2f} | "
            f"{row.get('host_probe_ms', float('nan')):.2f} / {row.get('host_probe_slowest_ms', float('nan')):.2f} |"
        )
    return "\n".join(lines) + "\n"


def chart(result: dict[str, Any], path: Path) -> Path | None:
    """Latency overhead (p50) against CPU per wait, one point per strategy and workload."""
    if importlib.util.find_spec("matplotlib") is None:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    floors = {row["work_us"]: row for row in result["latency"] if row["strategy"].startswith("floor")}
    rows = [row for row in result["latency"] if not row["strategy"].startswith("floor")]
    workloads = sorted({row["work_us"] for row in rows})
    strategies = sorted({row["strategy"] for row in rows})
    markers = "os^Dv<>pPX*h"
    figure, axes = plt.subplots(1, len(workloads), figsize=(6 * len(workloads), 5.5), squeeze=False)
    for axis, work in zip(axes[0], workloads, strict=True):
        for index, strategy in enumerate(strategies):
            for row in rows:
                if row["work_us"] == work and row["strategy"] == strategy:
                    axis.scatter(
                        row["cpu_us_per_wait"],
                        max(row["overhead_p50_us"], OVERHEAD_SHOWN_MIN_US),
                        marker=markers[index % len(markers)],
                        s=60,
                        label=strategy,
                        color="C3" if strategy.startswith("aiogpu") else f"C{index % 3}",
                    )
        if work in floors:
            axis.axvline(
                floors[work]["cpu_us_per_wait"], color="grey", linestyle="--", linewidth=1, label="the floor's CPU per wait"
            )
        axis.set_xscale("log")
        # CPU spans one or two decades per workload: label 1, 2 and 5 of each in plain numbers
        # (matplotlib's own minor labels, 2x10^2 3x10^2 4x10^2..., run into each other).
        axis.xaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        axis.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
        axis.xaxis.set_minor_formatter(NullFormatter())
        axis.set_yscale("log")
        axis.set_xlabel("host CPU per wait, µs")
        axis.set_ylabel(f"p50 wake-up overhead over the floor, µs (≤ {OVERHEAD_SHOWN_MIN_US} drawn at {OVERHEAD_SHOWN_MIN_US})")
        axis.set_title(f"{work:.0f} µs of GPU work")
        axis.grid(True, which="both", alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    figure.legend(handles, labels, loc="lower center", ncol=4, fontsize=8)
    figure.suptitle(f"Waiting for the GPU: lower left is better — {_title(result['environment'])}", fontsize=10)
    figure.tight_layout(rect=(0, 0.12, 1, 0.95))
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path
