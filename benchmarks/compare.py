"""Two aiogpu engines side by side in one benchmark run: the current one and a new one.

Runs one benchmark module (``--bench``: ``wake``, ``loop_profile``, ``overlap`` or ``goals``)
in child processes, ``--rounds`` times for each tree, the two interleaved (old then new in even
rounds, new then old in odd ones) so that the machine's drift reaches both alike. Every child
imports ``aiogpu`` from its tree and ``benchmarks`` from the ``--new`` tree, so both run the same
measurement code (``benchmarks._child``); the benchmarks use only aiogpu's public API and
``aiogpu.testing``, so an older engine runs them unchanged. Arguments after ``--`` go to the
benchmark (``--quick``, ``--parts``, ...).

Writes ``compare.json`` (every run's figures) and ``compare.md`` (per workload and metric: each
side's median and range over its runs, new / old and new - old, and *better* or *worse* where
every new run lies beyond every old one: by chance alone once in 20 with three rounds, and no
verdict with fewer) to ``--out``, and prints the table. Each child's own output
and results stay under ``--out/old-N`` and ``--out/new-N``.

Run:  python -m benchmarks.compare --old OLD_TREE --new NEW_TREE [--bench goals] [--rounds 3]
          [--out DIR] [-- BENCHMARK ARGUMENTS]
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from . import _child, _metrics

BENCHES = tuple(_child.RESULTS)


def side_by_side(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (workload, metric) found in both sides: medians, ranges, new/old and a verdict
    (``_metrics.judge``): ``better`` or ``worse`` where every new run lies beyond every old one,
    ``within noise`` otherwise, ``too few runs`` with fewer than three of each."""
    values: dict[tuple[str, str], dict[str, list[float]]] = {}
    for run in runs:
        for key, value in run["metrics"].items():
            values.setdefault(key, {"old": [], "new": []})[run["side"]].append(value)
    table = []
    for (workload, metric), sides in values.items():
        old, new = sides["old"], sides["new"]
        if not old or not new:
            continue
        old_median, new_median = statistics.median(old), statistics.median(new)
        lower_is_better = _metrics.LOWER_IS_BETTER.get(metric, True)
        verdict = _metrics.judge(old, new, lower_is_better)
        table.append(
            {
                "workload": workload,
                "metric": metric,
                "lower_is_better": lower_is_better,
                "old_median": old_median,
                "new_median": new_median,
                # A ratio of figures that can be negative (an overhead over a floor) would mislead.
                "ratio_new_to_old": new_median / old_median if old_median > 0 and new_median >= 0 else None,
                "difference": new_median - old_median,
                "old_values": old,
                "new_values": new,
                "verdict": verdict,
            }
        )
    return table


def markdown(result: dict[str, Any]) -> str:
    environment = result["environment"]
    where = _metrics.where(environment)
    lines = [
        f"# Old and new engine, `benchmarks.{result['bench']}`: {where}, {environment.get('date')}",
        "",
        f"Old: `{result['old']}`; new: `{result['new']}`; {result['rounds']} runs each, interleaved; benchmark arguments:"
        f" `{' '.join(result['arguments']) or '(none)'}`. Medians over the runs, the range beside; new / old only where"
        " both are positive. *Better* or *worse*: every new run beyond every old one, which runs that all measure the"
        f" same thing would show by chance once in {round(1 / _metrics.chance(result['rounds'], result['rounds']))} on a"
        " given metric and side (no verdict where that is more often than once in 20).",
        "",
        "| workload | metric | old | new | new / old | new - old | verdict | old range | new range |",
        "|---|---|---:|---:|---:|---:|---|---|---|",
    ]
    for row in result["table"]:
        ratio = row["ratio_new_to_old"]
        lines.append(
            f"| {row['workload']} | {row['metric']} {'↓' if row['lower_is_better'] else '↑'} | {_metrics.number(row['old_median'])} |"
            f" {_metrics.number(row['new_median'])} | {'' if ratio is None else f'{ratio:.3f}'} | {row['difference']:+.3g} | {row['verdict']} |"
            f" {_metrics.number(min(row['old_values']))} to {_metrics.number(max(row['old_values']))} |"
            f" {_metrics.number(min(row['new_values']))} to {_metrics.number(max(row['new_values']))} |"
        )
    lines += ["", "↓: lower is better; ↑: higher is better."]
    return "\n".join(lines) + "\n"


def main(arguments: argparse.Namespace, bench_arguments: list[str]) -> dict[str, Any]:
    trees = {"old": _child.check_tree(arguments.old), "new": _child.check_tree(arguments.new)}
    if not (trees["new"] / "benchmarks" / f"{arguments.bench}.py").is_file():
        raise SystemExit(f"{trees['new']} has no benchmarks/{arguments.bench}.py: --new must be a tree with the benchmarks")
    out = arguments.out.resolve()
    runs: list[dict[str, Any]] = []
    environment: dict[str, Any] = {}
    result: dict[str, Any] = {}
    started = time.perf_counter()
    for round_ in range(arguments.rounds):
        for side in ("old", "new") if round_ % 2 == 0 else ("new", "old"):
            child = _child.run(arguments.bench, trees[side], trees["new"], out / f"{side}-{round_}", bench_arguments)
            environment = child.get("environment", environment)
            figures = _metrics.metrics(arguments.bench, child)
            runs.append(
                {
                    "side": side,
                    "round": round_,
                    "aiogpu": child["child"]["aiogpu_tree"],
                    "wall_s": child["child"]["wall_s"],
                    "metrics": figures,
                }
            )
            print(f"{side} (round {round_ + 1}): {len(figures)} figures in {child['child']['wall_s']:.1f} s", flush=True)
            result = {
                "bench": arguments.bench,
                "old": str(trees["old"]),
                "new": str(trees["new"]),
                "rounds": arguments.rounds,
                "arguments": bench_arguments,
                "environment": environment or {"date": datetime.date.today().isoformat()},
                "runs": [{**run, "metrics": [[*key, value] for key, value in run["metrics"].items()]} for run in runs],
                "table": side_by_side(runs),
            }
            (out / "compare.json").write_text(json.dumps(result, indent=1))  # after every run: a cut-off run keeps what it has
            (out / "compare.md").write_text(markdown(result))
    print(markdown(result))
    print(f"wrote {out / 'compare.json'}, {out / 'compare.md'} in {time.perf_counter() - started:.0f} s")
    return result


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--old", type=Path, required=True, help="the tree of the current engine (a git archive unpacked)")
    parser.add_argument("--new", type=Path, default=Path("."), help="the tree of the new engine, and of the benchmarks")
    parser.add_argument("--bench", choices=BENCHES, default="goals")
    parser.add_argument("--rounds", type=int, default=3, help="runs of each tree (a verdict needs three)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/compare"))
    return _child.parse_runner(parser, argv)


if __name__ == "__main__":
    main(*parse(sys.argv[1:]))
