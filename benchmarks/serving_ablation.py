"""Ablation in a real server: each named heuristic of the wake engine switched off in turn in the
per-request example server under ``wrk`` at saturation, against the engine with all of them on.

The micro-benchmarks' ablation (``benchmarks.ablation``) says what a heuristic pays for lone
waits and fan-outs; a server is where it must pay. Each run is one
``examples/serving/loadtest_wrk.py --repeats 1 --modes aiogpu`` (arguments after ``--`` go to it:
``--wrk``, ``--server-cpus``, ``--client-cpus``, ``--seconds``, ...), so a run starts its own
server, warms it up and measures it once. The heuristic is switched off inside that server: the
run's processes start with ``benchmarks._patch_site`` first on ``PYTHONPATH``, whose
``sitecustomize`` makes the changes (``ablation.HEURISTICS``) before anything else runs, and
records them; a run whose server did not record them fails. The order of the runs and the
verdicts are ``benchmarks.ablation``'s, on the requests a second, ``wrk``'s p99 and max, and the
p99 of the time the server's handler took (``/stats``).

Writes ``ablation.json`` (every run's figures) and ``ablation.md`` to ``--out`` after every run,
and prints the verdicts.

Run:  python -m benchmarks.serving_ablation [--heuristics NAME ...] [--rounds 3] [--out DIR]
          -- --wrk path/to/wrk [LOADTEST_WRK ARGUMENTS]
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from . import _child, ablation

ROOT = Path(__file__).resolve().parent.parent
LOAD_TEST = ROOT / "examples" / "serving" / "loadtest_wrk.py"
SERVER = "per_request_server.py"
WORKLOAD = "per-request server under wrk, auto"
#: The heuristics a serving ablation switches off unless told otherwise: those that act only on a
#: loop that is busy or reads asyncio's internals, where a saturated server differs most from a
#: benchmark's idle loop.
DEFAULT_HEURISTICS = ("busy-loop look", "asyncio internals")


def figures(row: dict[str, Any]) -> list[list[Any]]:
    """One ``loadtest_wrk`` row as ``[workload, metric, value]`` triples (``_metrics`` knows
    which way each improves)."""
    return [
        [WORKLOAD, "req/s", row["requests_per_second"]],
        [WORKLOAD, "p99 ms", row["p99_ms"]],
        [WORKLOAD, "max ms", row["max_ms"]],
        [WORKLOAD, "handler p99 ms", row["phases"]["total"]["p99_ms"]],
    ]


def check_applied(record: Path, expected: list[tuple[str, str, Any]]) -> list[dict[str, Any]]:
    """What the run's server changed, from the record its ``sitecustomize`` appended to. Raises
    ``RuntimeError`` where no server process recorded every attribute of ``expected``."""
    lines = record.read_text().splitlines() if record.exists() else []
    for line in lines:
        entry = json.loads(line)
        if any(Path(argument).name == SERVER for argument in entry["argv"]):
            applied: list[dict[str, Any]] = entry["applied"]
            if {attribute for _, attribute, _ in expected} <= {change["attribute"] for change in applied}:
                return applied
    raise RuntimeError(f"no {SERVER} process recorded the changes {expected} (records: {lines})")


def run_once(name: str, out: Path, load_arguments: list[str]) -> dict[str, Any]:
    """One ``loadtest_wrk`` run with the heuristic ``name`` off (none for ``ablation.ALL_ON``)."""
    patches = ablation.HEURISTICS.get(name, [])
    encoded = [(module, attribute, _child.encode(value)) for module, attribute, value in patches]
    out.mkdir(parents=True, exist_ok=True)
    record = out / "applied.jsonl"
    record.unlink(missing_ok=True)
    environment = _child.patched_environment(encoded, record)
    command = [sys.executable, str(LOAD_TEST), "--repeats", "1", "--modes", "aiogpu", "--out", str(out / "wrk.json")]
    started = time.perf_counter()
    child = subprocess.run([*command, *load_arguments], env=environment, capture_output=True, text=True, check=False)
    (out / "stdout.txt").write_text(child.stdout + child.stderr)
    if child.returncode:
        raise RuntimeError(f"loadtest_wrk.py exited with {child.returncode}:\n{(child.stdout + child.stderr)[-3000:]}")
    applied = check_applied(record, patches) if patches else []
    (row,) = json.loads((out / "wrk.json").read_text())
    return {"metrics": figures(row), "patches": applied, "wall_s": time.perf_counter() - started, "wrk": row}


def main(arguments: argparse.Namespace, load_arguments: list[str]) -> dict[str, Any]:
    out = arguments.out.resolve()
    runs: list[dict[str, Any]] = []
    result: dict[str, Any] = {}
    started = time.perf_counter()
    for index, (round_, name) in enumerate(ablation.schedule(arguments.heuristics, arguments.rounds)):
        run = {"configuration": name, "round": round_, **run_once(name, out / f"{index:03d}", load_arguments)}
        runs.append(run)
        row = run["wrk"]
        print(
            f"round {round_ + 1} {name:20} {row['requests_per_second']:6.0f} req/s  p99 {row['p99_ms']:7.1f} ms"
            f"  handler p99 {row['phases']['total']['p99_ms']:7.1f} ms  ({time.perf_counter() - started:.0f} s so far)",
            flush=True,
        )
        result = {
            "bench": "serving_ablation",
            "tree": str(ROOT),
            "rounds": arguments.rounds,
            "arguments": load_arguments,
            "environment": {
                "device": row["server"].removeprefix("serving on ").split(", waiting with")[0],
                "simulated": "simulated" in row["server"],
                "date": datetime.date.today().isoformat(),
            },
            "heuristics": {
                heuristic: [
                    [module, attribute, _child.encode(value)] for module, attribute, value in ablation.HEURISTICS[heuristic]
                ]
                for heuristic in arguments.heuristics
            },
            "runs": runs,
            "table": ablation.verdicts(runs),
        }
        ablation.write(out, result)  # after every run: a cut-off run keeps what it has
    ablation.finish(out, result, started)
    return result


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--heuristics", nargs="+", choices=tuple(ablation.HEURISTICS), default=list(DEFAULT_HEURISTICS), metavar="NAME"
    )
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/serving_ablation"))
    return _child.parse_runner(parser, argv)


if __name__ == "__main__":
    main(*parse(sys.argv[1:]))
