"""The figures of each benchmark's results that a comparison puts side by side.

``metrics(bench, result)`` flattens one run's JSON into ``{(workload, metric): value}``;
``LOWER_IS_BETTER`` says which way each metric improves. Fields a results file lacks (one
written by an older benchmark) are left out, never guessed.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

#: Each metric's direction: ``True`` where less is better.
LOWER_IS_BETTER = {
    "p50 over floor µs": True,
    "p99 over floor µs": True,
    "CPU share of floor": True,
    "CPU µs/wait": True,
    "first wake ms": True,
    "lag p99 ms": True,
    "timer lag p50 ms": True,
    "timer lag p99 ms": True,
    "last wake ms": True,
    "wall / GPU floor": True,
    "wall / stream-order floor": True,
    "best wall / GPU floor": True,
    "wall / floor": True,
    "cores": True,
    "waiting cores": True,
    "other threads' cores": True,
    "waits/s": False,
    "loop busy µs/wait": True,
    "other threads' CPU µs/wait": True,
    "speed-up": False,
    "wall / overlap floor": True,
    "req/s": False,
    "p99 ms": True,
    "max ms": True,
    "handler p99 ms": True,
}


#: A change is called only where runs that all measure the same thing would show it by chance at
#: most this often (on a given metric and side).
CHANCE_MAX = 0.05


def chance(runs: int, other_runs: int) -> float:
    """How often every one of ``runs`` values lies beyond every one of ``other_runs`` values on a
    given side by chance alone (all the runs measuring the same thing)."""
    return 1 / math.comb(runs + other_runs, runs)


def judge(reference: list[float], changed: list[float], lower_is_better: bool) -> str:
    """``worse`` where every ``changed`` value is worse than every ``reference`` value, ``better``
    where every one is better, else ``within noise``: the two sides' own spread is the noise;
    ``too few runs`` where chance alone would give such a call more often than ``CHANCE_MAX``."""
    if chance(len(changed), len(reference)) > CHANCE_MAX:
        return "too few runs"
    above, below = min(changed) > max(reference), max(changed) < min(reference)
    if above or below:
        return "worse" if above == lower_is_better else "better"
    return "within noise"


def metrics(bench: str, result: dict[str, Any]) -> dict[tuple[str, str], float]:
    """One run's figures, by (workload, metric)."""
    return {"wake": _wake, "loop_profile": _loop_profile, "overlap": _overlap, "goals": _goals}[bench](result)


def _put(figures: dict[tuple[str, str], float], workload: str, row: dict[str, Any], names: dict[str, str]) -> None:
    for field, metric in names.items():
        if field in row and row[field] is not None:
            figures[workload, metric] = float(row[field])


_LATENCY = {
    "overhead_p50_us": "p50 over floor µs",
    "overhead_p99_us": "p99 over floor µs",
    "cpu_fraction_of_floor": "CPU share of floor",
    "cpu_us_per_wait": "CPU µs/wait",
    "lag_p99_ms": "lag p99 ms",
    "timer_lag_p99_ms": "timer lag p99 ms",
}
_FANOUT = {
    "wall_ratio_to_floor": "wall / GPU floor",
    "wall_best_ratio_to_floor": "best wall / GPU floor",
    "cpu_us_per_wait": "CPU µs/wait",
}
_SUSTAINED = {
    "wall_ratio_to_floor": "wall / floor",
    "cores": "cores",
    "waiting_cores": "waiting cores",
    "cpu_us_per_wait": "CPU µs/wait",
}


def _wake(result: dict[str, Any]) -> dict[tuple[str, str], float]:
    figures: dict[tuple[str, str], float] = {}
    for row in result.get("latency", []):
        if not row["strategy"].startswith("floor"):
            _put(figures, f"latency {row['work_us']:.0f} µs, {row['strategy']}", row, _LATENCY)
    for row in result.get("fanout", []):
        if not row["strategy"].startswith("floor"):
            own = " own events" if row.get("own_events") else ""
            workload = f"fan-out {row.get('loop', 'asyncio')} {row['waiters']}x{row['streams']}{own}, {row['strategy']}"
            _put(figures, workload, row, _FANOUT)
    for row in result.get("sustained", {}).get("rows", []):
        _put(figures, f"sustained {row['loop']}, {row['strategy']}", row, _SUSTAINED)
    return figures


def _loop_profile(result: dict[str, Any]) -> dict[tuple[str, str], float]:
    figures: dict[tuple[str, str], float] = {}
    names = {"waits_per_second": "waits/s", "busy_us": "loop busy µs/wait", "other_cpu_us": "other threads' CPU µs/wait"}
    for way in dict.fromkeys(row["way"] for row in result["rows"]):
        rows = [row for row in result["rows"] if row["way"] == way]
        for field, metric in names.items():
            figures[f"loop profile, {way}", metric] = statistics.median(float(row[field]) for row in rows)
    return figures


def _overlap(result: dict[str, Any]) -> dict[tuple[str, str], float]:
    figures: dict[tuple[str, str], float] = {}
    for way in dict.fromkeys(row["way"] for row in result["rows"]):
        rows = [row for row in result["rows"] if row["way"] == way]
        figures[f"overlap, {way}", "speed-up"] = statistics.median(row["serial_s"] / row["wall_s"] for row in rows)
        figures[f"overlap, {way}", "wall / overlap floor"] = statistics.median(row["wall_s"] / row["floor_s"] for row in rows)
    return figures


def _goals(result: dict[str, Any]) -> dict[tuple[str, str], float]:
    return {(row["workload"], row["metric"]): float(row["value"]) for row in result["figures"]}


def number(value: float) -> str:
    """``value`` for a results table: three significant figures, thousands with separators."""
    return f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"


def where(environment: dict[str, Any]) -> str:
    """The device a run measured, as a results table's heading says it."""
    if environment.get("simulated"):
        return "SIMULATED device (no GPU): figures are not GPU measurements"
    return str(environment.get("device"))
