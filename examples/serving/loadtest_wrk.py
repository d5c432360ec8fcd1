"""Load ``per_request_server.py`` with ``wrk`` at saturation, every way of waiting, repeated.

For each repeat and mode (the order rotated from repeat to repeat) it starts the server, warms it
up with a first ``wrk`` run, waits until the server has answered every request that run left
behind, then runs ``wrk -c CONNECTIONS -d SECONDS --latency`` posting 512 tokens a request. (``wrk``
drops its connections when its time is up, with up to one request each still being served; a
measured run started at once would queue its first requests behind them, and on a saturated
server those few dominate the p99.) It
reports requests/s, latency p50 / p99 / max, requests that hit wrk's 2 s timeout, non-2xx
answers and the server's CPU (cores busy), and from the server's ``/stats`` how long the measured
run's requests spent in each part of the server's work (waiting for a stream, enqueueing, awaiting
the GPU, reading the outputs; where their mean falls short of wrk's, the rest went to the HTTP side
and the loop's queue); prints two lines per run and writes ``--out`` (JSON) and a Markdown summary
beside it.

Run:  python examples/serving/loadtest_wrk.py [--wrk path/to/wrk] [--lend pool|queue] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import random
import re
import subprocess
import sys
import tempfile
import time
from operator import itemgetter
from pathlib import Path
from typing import TYPE_CHECKING, Any

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parent))  # loadtools.py, shared with the other load tests
from loadtools import call_json, cpu_list, cpu_seconds, free_port, pin, wait_until_healthy  # noqa: E402

if TYPE_CHECKING:
    from collections.abc import Callable

#: The parts of a request's time in the server (``/stats``), and their sum.
PARTS = ("stream", "enqueue", "wait", "read", "total")
UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 60e3}


def milliseconds(text: str) -> float:
    number, unit = re.fullmatch(r"([\d.]+)(us|ms|s|m)", text).groups()  # type: ignore[union-attr]
    return float(number) * UNITS[unit]


def parse_wrk(output: str) -> dict[str, float]:
    """The figures of ``wrk --latency``'s report."""

    def find(pattern: str, default: str | None = None) -> str:
        match = re.search(pattern, output)
        if match is None:
            if default is None:
                raise ValueError(f"no {pattern!r} in wrk's output:\n{output}")
            return default
        return match.group(1)

    timeouts = int(find(r"Socket errors:.*timeout (\d+)", "0"))
    return {
        "requests_per_second": float(find(r"Requests/sec:\s+([\d.]+)")),
        "p50_ms": milliseconds(find(r"\s50%\s+([\d.]+\w+)")),
        "p99_ms": milliseconds(find(r"\s99%\s+([\d.]+\w+)")),
        "max_ms": milliseconds(find(r"Latency\s+\S+\s+\S+\s+([\d.]+\w+)")),
        "timeouts": timeouts,
        "non_2xx": int(find(r"Non-2xx or 3xx responses: (\d+)", "0")),
    }


def wait_until_drained(port: int, timeout: float = 60.0) -> None:
    """Return once the server's ``/health`` says no request is in flight (``in_flight`` 0)."""
    deadline = time.monotonic() + timeout
    while True:
        in_flight = call_json(port, "/health")["in_flight"]  # type: ignore[index]
        if in_flight == 0:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"the server still had {in_flight} requests in flight {timeout:g} s after the warm-up")
        time.sleep(0.05)


def server_phases(port: int, method: str = "GET") -> dict[str, object]:
    """The server's ``/stats``: where its answered requests spent their time (``DELETE`` starts over)."""
    return call_json(port, "/stats", method)  # type: ignore[return-value]


def run_once(arguments: argparse.Namespace, mode: str, script: Path) -> dict[str, object]:
    port = free_port()
    command = [sys.executable, str(HERE / "per_request_server.py"), "--mode", mode, "--lend", arguments.lend, "--port", str(port)]
    server = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    pin(server.pid, cpu_list(arguments.server_cpus))
    try:
        wait_until_healthy(port, server)
        url = f"http://127.0.0.1:{port}/predict"
        taskset = ["taskset", "-c", arguments.client_cpus] if arguments.client_cpus else []
        wrk = [*taskset, arguments.wrk, "-t2", f"-c{arguments.connections}", "-s", str(script), "--latency"]
        subprocess.run([*wrk, f"-d{arguments.warmup}s", url], capture_output=True, check=True)
        wait_until_drained(port)
        server_phases(port, "DELETE")
        cpu_before, started = cpu_seconds(server.pid), time.monotonic()
        result = subprocess.run([*wrk, f"-d{arguments.seconds}s", url], capture_output=True, text=True, check=True)
        cpu = (cpu_seconds(server.pid) - cpu_before) / (time.monotonic() - started)
        wait_until_drained(port)  # the run's last requests, their clients gone, count all the same
        phases = server_phases(port)
    finally:
        server.terminate()
        output = server.communicate(timeout=30)[0].decode(errors="replace")
    figures = parse_wrk(result.stdout)
    where = next((line for line in output.splitlines() if line.startswith("serving on")), "?")
    return {"mode": mode, "lend": arguments.lend, "cpu_cores": cpu, "server": where, **figures, "phases": phases}


def phase_line(phases: dict[str, dict[str, float]]) -> str:
    """``stream 1.0 / 2.0  enqueue ...``: each phase's p50 and p99, and the whole."""
    return "  ".join(f"{name} {phases[name]['p50_ms']:.1f} / {phases[name]['p99_ms']:.1f}" for name in PARTS)


def summarize(rows: list[dict[str, Any]]) -> str:
    """Markdown: per mode, each repeat's figures in the order run, then where in the server each
    repeat's requests spent their time (p99 of each part)."""
    modes = list(dict.fromkeys(row["mode"] for row in rows))

    def runs(mode: str, figure: Callable[[dict[str, Any]], float], digits: int = 0) -> str:
        return ", ".join(f"{figure(row):.{digits}f}" for row in rows if row["mode"] == mode)

    figures = ("requests_per_second", "p50_ms", "p99_ms", "max_ms", "timeouts", "non_2xx")
    lines = [
        "| way of waiting | req/s | p50 ms | p99 ms | max ms | over 2 s | non-2xx | server CPU (cores) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for mode in modes:
        cells = [runs(mode, itemgetter(name)) for name in figures] + [runs(mode, itemgetter("cpu_cores"), 2)]
        lines.append(f"| {mode} | {' | '.join(cells)} |")
    lines += [
        "",
        "In the server, p99 ms of each part of a request:",
        "",
        f"| way of waiting | {' | '.join(PARTS)} |",
        "|---" * (len(PARTS) + 1) + "|",
    ]
    for mode in modes:
        cells = [runs(mode, lambda row, part=part: row["phases"][part]["p99_ms"], 1) for part in PARTS]
        lines.append(f"| {mode} | {' | '.join(cells)} |")
    return "\n".join(lines) + "\n"


def main(arguments: argparse.Namespace) -> list[dict[str, object]]:
    rng = random.Random(0)
    body = json.dumps({"tokens": [rng.randrange(32_000) for _ in range(512)]})
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        script = Path(folder) / "post.lua"
        script.write_text(
            f'wrk.method = "POST"\nwrk.headers["Content-Type"] = "application/json"\nwrk.body = {json.dumps(body)}\n'
        )
        modes: list[str] = arguments.modes
        for repeat in range(arguments.repeats):
            for mode in modes[repeat % len(modes) :] + modes[: repeat % len(modes)]:
                row = {"repeat": repeat, **run_once(arguments, mode, script)}
                rows.append(row)
                print(
                    f"{mode:14} {arguments.lend:5} {row['requests_per_second']:7.0f} req/s  p50 {row['p50_ms']:7.1f} ms"
                    f"  p99 {row['p99_ms']:7.1f} ms  max {row['max_ms']:7.1f} ms  timeouts {row['timeouts']}"
                    f"  non-2xx {row['non_2xx']}  CPU {row['cpu_cores']:.2f}",
                    flush=True,
                )
                print(f"{'':20} in the server, p50 / p99 ms: {phase_line(row['phases'])}", flush=True)  # type: ignore[arg-type]
    return rows


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--wrk", default="wrk")
    parser.add_argument("--modes", nargs="+", default=["aiogpu", "aiogpu-thread", "to_thread", "blocking"])
    parser.add_argument("--lend", choices=("pool", "queue"), default="pool")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--seconds", type=int, default=8, help="whole seconds (wrk's unit)")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--server-cpus", help='pin the server to these CPUs ("0-7"; default: no pinning)')
    parser.add_argument("--client-cpus", help='pin wrk to these CPUs ("8-15")')
    parser.add_argument("--out", type=Path)
    options = parser.parse_args()
    results = main(options)
    if options.out:
        options.out.parent.mkdir(parents=True, exist_ok=True)
        options.out.write_text(json.dumps(results, indent=1))
        options.out.with_suffix(".md").write_text(summarize(results))
