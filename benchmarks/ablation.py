"""Ablation: each of the wake engine's heuristics switched off in turn, measured against the
engine with all of them on, so that each keeps its place only by what it measurably pays.

``HEURISTICS`` names each heuristic and the tunables that switch it off (module attributes the
engine reads when it runs; ``benchmarks._child`` sets them in a child process before the
benchmark starts, in ``aiogpu._wait._policy`` or, in an engine without that module, in
``aiogpu._wait._watcher``). Each round runs the benchmark (``--bench``, ``goals`` by default:
lone waits on 200 µs and 5 ms of work, a 10,000 x 64 fan-out, the loop profile at saturation and
the overlap, for ``auto``) with all heuristics on, then with each one off, all on again half way,
then the rest, in child processes; odd rounds go through the heuristics in reverse order, so
that the machine's drift reaches them alike.

**Verdict.** For each metric, a heuristic *pays* where every run with it off is worse than
every all-on run, and *costs* where every run with it off is better; otherwise the difference
is *within noise*: the all-on runs' own spread is the noise. With three rounds (three runs off,
six all on) a heuristic that changes nothing gets such a flag on a given metric and side by
chance once in 84 (``_metrics.chance``); with fewer runs, where that is more often than once in 20, no
judgement is made. The report says how many metrics each heuristic was judged on, and a flag
is worth a rerun of that heuristic alone (``--heuristics NAME --rounds 5``). A heuristic that
pays on some metric and costs on none *pays*; one that costs on some and pays on none *costs*;
both: a *trade-off*; neither: it *does not pay (within noise)*.

Writes ``ablation.json`` (every run's figures) and ``ablation.md`` to ``--out`` after every run,
and prints the verdicts. Arguments after ``--`` go to the benchmark.

Run:  python -m benchmarks.ablation [--bench goals] [--rounds 3] [--heuristics NAME ...]
          [--tree .] [--out DIR] [-- BENCHMARK ARGUMENTS]
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from . import _child, _metrics

_POLICY = _child.POLICY
_EVERY_STRATEGY_ZERO = {"auto": 0.0, "poll": 0.0, "thread": 0.0, "callback": 0.0}

#: name: [(module, attribute, off value), ...]. Each off value is chosen from how the engine reads
#: the attribute, so that the heuristic never acts (and nothing else changes with it).
HEURISTICS: dict[str, list[tuple[str, str, Any]]] = {
    # The close watch of a lone stream queries again and again for up to IDLE_SPIN when the loop
    # came back from a yield within IDLE_BEAT. A negative IDLE_BEAT: it never came back that
    # fast, so one query per beat.
    "idle spin": [(_POLICY, "IDLE_BEAT", -1.0)],
    # A wait on work predicted to end within SPIN_AHEAD is watched right where it started.
    # Minus infinity: no prediction is ever that close.
    "spin ahead": [(_POLICY, "SPIN_AHEAD", -math.inf)],
    # While the loop was at least BUSY_SHARE busy, parked waits are looked at from the loop once
    # per iteration. An infinite share: the loop never counts as busy.
    "busy-loop look": [(_POLICY, "BUSY_SHARE", math.inf)],
    # A sweep that woke SWEEP_WAKE_BUDGET tasks yields before the next stream. Never reached.
    "sweep budget": [(_POLICY, "SWEEP_WAKE_BUDGET", sys.maxsize)],
    # Loop timers due within KEEP_TIMER_HORIZON while the watcher parks get a timer-thread
    # wake-up. Zero: no timer is due within 0 < delay <= 0.
    "keep loop timer": [(_POLICY, "KEEP_TIMER_HORIZON", 0.0)],
    # A wait with nothing predicted is watched closely for WATCH_UNPREDICTED before it parks.
    # Zero: it parks at once.
    "close watch at start": [(_POLICY, "WATCH_UNPREDICTED", _EVERY_STRATEGY_ZERO)],
    # Close watching starts LEAD (or a share of a long prediction) before the predicted
    # completion. Zero, both: at the prediction itself.
    "lead before the prediction": [(_POLICY, "LEAD", _EVERY_STRATEGY_ZERO), (_POLICY, "LEAD_SHARE", _EVERY_STRATEGY_ZERO)],
    # On a long prediction auto's watch starts a share of it earlier, up to LEAD_MAX. Zero: LEAD alone.
    "lead share": [(_POLICY, "LEAD_SHARE", _EVERY_STRATEGY_ZERO)],
    # A wait queued behind other work may be seen done LATE_SHARE of that time late (at most
    # LATE_MAX): auto and thread ask about it that far apart. Zero: watched as closely as a lone wait.
    "late allowance": [(_POLICY, "LATE_SHARE", _EVERY_STRATEGY_ZERO)],
    # A back-off query before a predicted completion is made only EARLY_POLL_SLACK before the
    # close watch at the latest. Zero: right up to it.
    "early poll slack": [(_POLICY, "EARLY_POLL_SLACK", 0.0)],
    # auto spaces a predicted head's queries in its watch once a pause reaches SPACED_MIN.
    # Infinite: a query every beat in the watch (and every back-off cap past it).
    "spaced auto watch": [(_POLICY, "SPACED_MIN", math.inf)],
    # Before its watch, auto looks at a predicted head at halves of the time left. One: only
    # every back-off cap.
    "early halving": [(_POLICY, "EARLY_SHARE", 1.0)],
    # Back-off intervals are jittered by up to COLD_POLL_JITTER. Zero: exact.
    "cold poll jitter": [(_POLICY, "COLD_POLL_JITTER", 0.0)],
    # auto parks at most AUTO_WATCH_MAX streams' heads on its waiter thread. No cap.
    "auto watch cap": [(_POLICY, "AUTO_WATCH_MAX", sys.maxsize)],
    # Up to KEEP_IDLE_QUEUES idle streams keep their queue, and with it their predictor, for the
    # next wait. Zero: a stream forgets what it learned whenever it has nothing pending.
    "idle queues kept": [(_POLICY, "KEEP_IDLE_QUEUES", 0)],
    # On asyncio's own loops aiogpu reads asyncio's internals (parks that resume their task in
    # the wake-up's own callback, the busy-loop look, the loop's timers kept on time): the one
    # dependence on what CPython does not promise, kept only if it pays. AIOGPU_PUBLIC_ASYNCIO=1:
    # asyncio's public API alone, as on a loop whose internals fail the check.
    "asyncio internals": [(_child.ENVIRON, "AIOGPU_PUBLIC_ASYNCIO", "1")],
}
ALL_ON = "all on"


def judge(on: list[float], off: list[float], lower_is_better: bool) -> str:
    """``pays`` where every off value is worse than every all-on value, ``costs`` where every
    one is better, else ``within noise`` or ``too few runs`` (``_metrics.judge``)."""
    judgement = _metrics.judge(on, off, lower_is_better)
    return {"worse": "pays", "better": "costs"}.get(judgement, judgement)


def verdicts(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per heuristic and metric: the all-on and off medians, the change and the judgement; and
    per heuristic the overall verdict (module docstring)."""
    on: dict[tuple[str, str], list[float]] = {}
    for run in runs:
        if run["configuration"] == ALL_ON:
            for workload, metric, value in run["metrics"]:
                on.setdefault((workload, metric), []).append(value)
    table = []
    for name in dict.fromkeys(run["configuration"] for run in runs if run["configuration"] != ALL_ON):
        off: dict[tuple[str, str], list[float]] = {}
        errors = [run["error"] for run in runs if run["configuration"] == name and run.get("error")]
        for run in runs:
            if run["configuration"] == name:
                for workload, metric, value in run["metrics"]:
                    off.setdefault((workload, metric), []).append(value)
        metrics = []
        for key, off_values in off.items():
            if key not in on:
                continue
            lower_is_better = _metrics.LOWER_IS_BETTER.get(key[1], True)
            on_median, off_median = statistics.median(on[key]), statistics.median(off_values)
            metrics.append(
                {
                    "workload": key[0],
                    "metric": key[1],
                    "lower_is_better": lower_is_better,
                    "on_median": on_median,
                    "off_median": off_median,
                    "on_range": [min(on[key]), max(on[key])],
                    "off_values": off_values,
                    "judgement": judge(on[key], off_values, lower_is_better),
                }
            )
        pays = [m for m in metrics if m["judgement"] == "pays"]
        costs = [m for m in metrics if m["judgement"] == "costs"]
        if errors and not metrics:
            verdict = "not measured"
        elif all(m["judgement"] == "too few runs" for m in metrics):
            verdict = "too few runs to judge"
        elif pays and costs:
            verdict = "trade-off"
        elif pays:
            verdict = "pays"
        elif costs:
            verdict = "costs"
        else:
            verdict = "does not pay (within noise)"
        table.append({"heuristic": name, "verdict": verdict, "errors": errors, "metrics": metrics})
    return table


def markdown(result: dict[str, Any]) -> str:
    environment = result["environment"]
    where = _metrics.where(environment)
    runs_on = sum(run["configuration"] == ALL_ON and not run.get("error") for run in result["runs"])
    odds = round(1 / _metrics.chance(result["rounds"], runs_on)) if runs_on else 0
    lines = [
        f"# Ablation of the wake engine's heuristics, `benchmarks.{result['bench']}`: {where}, {environment.get('date')}",
        "",
        f"Tree `{result['tree']}`; benchmark arguments `{' '.join(result['arguments']) or '(none)'}`; {runs_on} runs with every"
        f" heuristic on, and {result['rounds']} with each one off, interleaved. A heuristic *pays* on a metric where every run"
        " with it off was worse than every all-on run, *costs* where every one was better; otherwise the difference is"
        " within the all-on runs' own spread. A heuristic that changes nothing gets such a flag on a given metric by chance"
        f" about once in {odds} ({result['rounds']} runs off, {runs_on} on; no judgement where that is more often than once"
        " in 20): rerun a flagged one alone.",
        "",
        "| heuristic | switched off by | verdict | pays on | costs on | metrics judged |",
        "|---|---|---|---|---|---:|",
    ]
    for row in result["table"]:
        changes = ", ".join(
            f"`{attribute} = {'sys.maxsize' if value == sys.maxsize else repr(value)}`"
            for _, attribute, value in HEURISTICS.get(row["heuristic"], [])
        )
        pays = "; ".join(f"{m['workload']}: {m['metric']}" for m in row["metrics"] if m["judgement"] == "pays")
        costs = "; ".join(f"{m['workload']}: {m['metric']}" for m in row["metrics"] if m["judgement"] == "costs")
        verdict = row["verdict"] + (f" ({row['errors'][0].splitlines()[-1]})" if row["errors"] else "")
        lines.append(f"| {row['heuristic']} | {changes} | {verdict} | {pays} | {costs} | {len(row['metrics'])} |")
    lines += [
        "",
        "Every figure: the median with all heuristics on (and its range) and with the heuristic off (its runs).",
        "",
        "| heuristic | workload | metric | all on | all-on range | off | off runs | judgement |",
        "|---|---|---|---:|---|---:|---|---|",
    ]
    for row in result["table"]:
        for m in row["metrics"]:
            lines.append(
                f"| {row['heuristic']} | {m['workload']} | {m['metric']} {'↓' if m['lower_is_better'] else '↑'} |"
                f" {_metrics.number(m['on_median'])} | {_metrics.number(m['on_range'][0])} to {_metrics.number(m['on_range'][1])} |"
                f" {_metrics.number(m['off_median'])} | {', '.join(_metrics.number(v) for v in m['off_values'])} | {m['judgement']} |"
            )
    lines += ["", "↓: lower is better; ↑: higher is better."]
    return "\n".join(lines) + "\n"


def schedule(heuristics: list[str], rounds: int) -> list[tuple[int, str]]:
    """(round, configuration) in the order they run: all on, the first half of the heuristics,
    all on, the rest; odd rounds reversed."""
    order = []
    half = (len(heuristics) + 1) // 2
    for round_ in range(rounds):
        names = heuristics if round_ % 2 == 0 else heuristics[::-1]
        order += [(round_, ALL_ON), *((round_, name) for name in names[:half])]
        order += [(round_, ALL_ON), *((round_, name) for name in names[half:])]
    return order


def main(arguments: argparse.Namespace, bench_arguments: list[str]) -> dict[str, Any]:
    tree = _child.check_tree(arguments.tree)
    out = arguments.out.resolve()
    runs: list[dict[str, Any]] = []
    failed: set[str] = set()
    environment: dict[str, Any] = {}
    result: dict[str, Any] = {}
    started = time.perf_counter()
    for index, (round_, name) in enumerate(schedule(arguments.heuristics, arguments.rounds)):
        if name in failed:
            continue
        patches = [(module, attribute, _child.encode(value)) for module, attribute, value in HEURISTICS.get(name, [])]
        run: dict[str, Any] = {"configuration": name, "round": round_, "metrics": []}
        try:
            child = _child.run(arguments.bench, tree, tree, out / f"{index:03d}", bench_arguments, patches)
        except RuntimeError as exc:
            if name == ALL_ON:
                raise
            failed.add(name)  # a tunable the engine no longer has: the same in every round
            run["error"] = str(exc)
            print(f"{name}: failed: {str(exc).splitlines()[-1]}", flush=True)
        else:
            environment = child.get("environment", environment)
            run["metrics"] = [[*key, value] for key, value in _metrics.metrics(arguments.bench, child).items()]
            run["patches"] = child["child"]["patches"]
            run["wall_s"] = child["child"]["wall_s"]
            print(
                f"round {round_ + 1} {name:28} {len(run['metrics'])} figures in {run['wall_s']:.1f} s"
                f" ({time.perf_counter() - started:.0f} s so far)",
                flush=True,
            )
        runs.append(run)
        result = {
            "bench": arguments.bench,
            "tree": str(tree),
            "rounds": arguments.rounds,
            "arguments": bench_arguments,
            "environment": environment or {"date": datetime.date.today().isoformat()},
            "heuristics": {
                name: [[module, attribute, _child.encode(value)] for module, attribute, value in HEURISTICS[name]]
                for name in arguments.heuristics
            },
            "runs": runs,
            "table": verdicts(runs),
        }
        write(out, result)  # after every run: a cut-off run keeps what it has
    finish(out, result, started)
    return result


def write(out: Path, result: dict[str, Any]) -> None:
    """``ablation.json`` and ``ablation.md`` in ``out``."""
    (out / "ablation.json").write_text(json.dumps(result, indent=1, default=repr))
    (out / "ablation.md").write_text(markdown(result))


def finish(out: Path, result: dict[str, Any], started: float) -> None:
    """Print each heuristic's verdict and where the results are (``started``: perf_counter)."""
    for row in result["table"]:
        print(f"{row['heuristic']:28} {row['verdict']}", flush=True)
    print(f"wrote {out / 'ablation.json'}, {out / 'ablation.md'} in {time.perf_counter() - started:.0f} s")


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", type=Path, default=Path("."), help="the tree whose engine and benchmarks run")
    parser.add_argument("--bench", choices=tuple(_child.RESULTS), default="goals")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--heuristics", nargs="+", choices=tuple(HEURISTICS), default=list(HEURISTICS), metavar="NAME")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/ablation"))
    return _child.parse_runner(parser, argv)


if __name__ == "__main__":
    main(*parse(sys.argv[1:]))
