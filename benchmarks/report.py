"""Render the wake benchmark's results: a Markdown table and the latency-versus-CPU chart."""

from __future__ import annotations

import importlib.util
import math
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
    if "latency" in result:
        lines += _latency_markdown(result)
    if "fanout" in result:
        lines += _fanout_markdown(result)
    if "sustained" in result:
        lines += _sustained_markdown(result["sustained"])
    return "\n".join(lines) + "\n"


def _latency_markdown(result: dict[str, Any]) -> list[str]:
    lines = [
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
    return lines


def _fanout_markdown(result: dict[str, Any]) -> list[str]:
    lines = [
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
    return lines


def _sustained_markdown(sustained: dict[str, Any]) -> list[str]:
    floor = sustained["floor"]
    lines = [
        "",
        f"Sustained load: {floor['waiters']:,} tasks on {floor['streams']} streams, each in turn recording its event on its"
        f" stream (every fourth launching a {floor['kernel_us']:.0f} µs kernel first) and awaiting it, {floor['turns']} turns"
        f" ({floor['planned_waits']:,} waits a run): every stream keeps its kernels queued while the waits",
        "complete steadily. The floor makes the same launches and recordings from a plain loop that synchronizes",
        "each event in turn (no task at all), so the GPU runs the kernels back to back:"
        f" {floor['wall_ms']:.1f} ms (median; the kernels alone {floor['device_ms']:.1f} ms on the busiest stream),"
        f" {floor['launch_cpu_us']:.2f} µs of CPU a turn to launch and record.",
        "Cores are process CPU time over wall; *waiting* cores and CPU leave out the launches' and recordings'",
        "own CPU (the floor's, per turn): what the way of waiting costs; *engine* cores leave out also the loop's cost",
        "of resuming each task from a plain future (measured alone): what the engine costs; *other threads'* cores",
        "are the CPU of every thread but the loop's (waiter and timer threads, `to_thread`'s workers) over wall.",
        "Medians of the repeats, interleaved; a way that fell behind stopped starting turns at twice the floor's wall,",
        "and its wall is scaled to the planned work at the pace it kept (stopped runs: last column).",
        "",
        "| loop | strategy | waits | wall ms | vs floor | cores | waiting cores | engine cores | other threads' cores"
        " | CPU µs/wait | waiting CPU µs/wait | stopped early |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in sustained["rows"]:
        lines.append(
            f"| {row['loop']} | {row['strategy']} | {row['waits']:,} | {row['wall_ms']:.1f} | {row['wall_ratio_to_floor']:.3f}x |"
            f" {row['cores']:.2f} | {row['waiting_cores']:.2f} | {row.get('engine_cores', math.nan):.2f} |"
            f" {row.get('other_threads_cores', math.nan):.2f} | {row['cpu_us_per_wait']:.2f} | {row['waiting_cpu_us_per_wait']:.2f} |"
            f" {row['stopped_early']} |"
        )
    lines += ["", "Goals (the best of the ways each is about, on each loop):", ""]
    for goal in sustained["goals"]:
        lines.append(
            f"- {goal['goal']} ≤ {goal['max_ratio']:.2f}x the floor at ≤ {goal['max_cores']:.2f} waiting cores, {goal['loop']}:"
            f" {goal['strategy']} {goal['ratio']:.3f}x at {goal['waiting_cores']:.2f} cores ({goal['cores']:.2f} in all):"
            f" **{'met' if goal['met'] else 'not met'}**{least_waiter_note(goal)}"
        )
    return lines


def chart(result: dict[str, Any], path: Path) -> Path | None:
    """Latency overhead (p50) against CPU per wait, one point per strategy and workload."""
    if importlib.util.find_spec("matplotlib") is None:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    latency = result.get("latency", [])
    floors = {row["work_us"]: row for row in latency if row["strategy"].startswith("floor")}
    rows = [row for row in latency if not row["strategy"].startswith("floor")]
    workloads = sorted({row["work_us"] for row in rows})
    strategies = sorted({row["strategy"] for row in rows})
    sustained = result.get("sustained")
    panels = len(workloads) + (sustained is not None)
    if not panels:
        return None
    markers = "os^Dv<>pPX*h"
    figure, axes = plt.subplots(1, panels, figsize=(max(6 * panels, 9), 5.5), squeeze=False)
    for axis, work in zip(axes[0], workloads, strict=False):
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
    if sustained is not None:
        _sustained_panel(axes[0][-1], sustained, markers)
    if workloads:
        handles, labels = axes[0][0].get_legend_handles_labels()
        figure.legend(handles, labels, loc="lower center", ncol=4, fontsize=8)
    figure.suptitle(f"Waiting for the GPU: lower left is better — {_title(result['environment'])}", fontsize=10, wrap=True)
    figure.tight_layout(rect=(0, 0.12 if workloads else 0, 1, 0.93))
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def _sustained_panel(axis: Any, sustained: dict[str, Any], markers: str) -> None:
    """Sustained load: wall over the floor against waiting cores, a point per way and loop, and
    the goals' boxes (lower left of a box meets that goal)."""
    strategies = sorted({row["strategy"] for row in sustained["rows"]})
    loops = sorted({row["loop"] for row in sustained["rows"]})
    left = min([0.01, *(row["waiting_cores"] for row in sustained["rows"] if row["waiting_cores"] > 0)]) / 2
    for row in sustained["rows"]:
        index = strategies.index(row["strategy"])
        axis.scatter(
            max(row["waiting_cores"], left),
            row["wall_ratio_to_floor"],
            marker=markers[index % len(markers)],
            s=60,
            facecolors="none" if loops.index(row["loop"]) else None,
            color="C3" if row["strategy"].startswith("aiogpu") else f"C{index % 3}",
            label=f"{row['strategy']}, {row['loop']}",
        )
    for index, goal in enumerate(
        dict.fromkeys((goal["goal"], goal["max_ratio"], goal["max_cores"]) for goal in sustained["goals"])
    ):
        name, ratio, cores = goal
        axis.plot(
            [left, cores, cores], [ratio, ratio, 0.95], color=f"C{4 + index}", linestyle="--", linewidth=1, label=f"goal: {name}"
        )
    floor = sustained["floor"]
    axis.set_xscale("log")
    axis.set_xlabel("cores busy waiting (process CPU over wall, less the launches')")
    axis.set_ylabel("wall over the floor")
    axis.set_title(
        f"sustained load: {floor['waiters']:,} waiters, {floor['streams']} streams, {floor['kernel_us']:.0f} µs kernels"
        " (hollow: the second loop)",
        fontsize=9,
    )
    axis.grid(True, which="both", alpha=0.3)
    axis.legend(fontsize=6, loc="upper left")


def least_waiter_note(goal: dict[str, Any]) -> str:
    """What the least waiter spent beside a goal's way of waiting (``""`` if it did not run)."""
    least = goal.get("least_waiter_cores")
    return "" if least is None else f" (the least waiter: {least:.2f} cores)"
