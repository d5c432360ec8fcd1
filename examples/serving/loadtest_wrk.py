"""Load ``per_request_server.py`` with ``wrk`` at saturation, every way of waiting, repeated.

Each repeat starts one server per mode, warms each up with a first ``wrk`` run and waits until it
has answered every request that run left behind, then loads them in turn, a short slice each:
``--slices`` rounds of ``wrk -c CONNECTIONS -d SECONDS --latency`` posting 512 tokens a request,
the order rotated from round to round. (``wrk`` drops its connections when its time is up, with
up to one request each still being served; the next slice waits until they are answered, so that
no server works while another is measured.) Short interleaved slices, not one long run per mode:
a virtual machine's cores can run Python at half speed for seconds at a time, and a mode measured
in one long run takes whatever pace the host had then; slices spread every mode over the same
moments, and a slice is compared with its round's others, measured seconds apart.

It reports, per repeat and mode, over all its slices: requests/s, latency p50 / p99 / max
(``wrk``'s latency quantiles of each slice, pooled), requests that hit wrk's 2 s timeout, non-2xx
answers and the server's CPU (cores busy); how many rounds each mode served more requests with a
lower p99 than ``to_thread`` in; and from the server's ``/stats`` how long the requests spent in
each part of the server's work (waiting for a stream, enqueueing, awaiting the GPU, reading the
outputs), and in the web app around that (reading and checking the body, writing the answer;
where that falls short of wrk's latency, the request waited to be read or its answer to be sent). Prints a line per slice and two per repeat and mode, and writes ``--out`` (JSON) and a
Markdown summary beside it. ``--engine LABEL=TREE`` adds a server that waits like ``aiogpu`` with
aiogpu imported from another source tree (mode ``aiogpu@LABEL``): two engines compared in one
run, on one machine.

Run:  python examples/serving/loadtest_wrk.py [--wrk path/to/wrk] [--lend pool|queue] [--repeats 3]
          [--slices 2] [--seconds 6] [--loop auto|asyncio|uvloop] [--engine LABEL=TREE]
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
from dataclasses import dataclass, field
from operator import itemgetter
from pathlib import Path
from typing import TYPE_CHECKING, Any

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parent))  # loadtools.py, shared with the other load tests
from loadtools import (  # noqa: E402
    call_json,
    cpu_list,
    cpu_seconds,
    engines,
    free_port,
    pin,
    server_mode,
    stop_server,
    wait_until_healthy,
)

if TYPE_CHECKING:
    from collections.abc import Callable

#: The parts of a request's time in the server (``/stats``), their sum, and the web app's time
#: around it.
PARTS = ("stream", "enqueue", "wait", "read", "total", "app")
UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 60e3}
#: The mode every other is compared with, round by round.
REFERENCE = "to_thread"
#: ``wrk`` reports each slice's latency at this many evenly spaced quantiles (``REPORT``), from
#: which a mode's slices are pooled.
QUANTILES = 1000
#: The ``done`` hook of the Lua script: one line with the requests answered, the duration (µs)
#: and the latency quantiles (µs), all that pooling slices needs.
REPORT = f"""
done = function(summary, latency, requests)
  io.write(string.format("slice: %d %d", summary.requests, summary.duration))
  for i = 1, {QUANTILES} do io.write(string.format(" %d", latency:percentile(100 * i / {QUANTILES}))) end
  io.write("\\n")
end
"""


def milliseconds(text: str) -> float:
    number, unit = re.fullmatch(r"([\d.]+)(us|ms|s|m)", text).groups()  # type: ignore[union-attr]
    return float(number) * UNITS[unit]


def parse_wrk(output: str) -> dict[str, Any]:
    """One slice: requests, seconds and latency quantiles (ms) from the ``REPORT`` hook's line;
    p50 / p99 / max, timeouts and non-2xx answers from ``wrk --latency``'s report."""

    def find(pattern: str, default: str | None = None) -> str:
        match = re.search(pattern, output, re.MULTILINE)
        if match is None:
            if default is None:
                raise ValueError(f"no {pattern!r} in wrk's output:\n{output}")
            return default
        return match.group(1)

    requests, duration, *quantiles = (int(number) for number in find(r"^slice: ([\d ]+)$").split())
    return {
        "requests": requests,
        "seconds": duration / 1e6,
        "requests_per_second": requests / (duration / 1e6) if duration else 0.0,
        "p50_ms": milliseconds(find(r"\s50%\s+([\d.]+\w+)")),
        "p99_ms": milliseconds(find(r"\s99%\s+([\d.]+\w+)")),
        "max_ms": milliseconds(find(r"Latency\s+\S+\s+\S+\s+([\d.]+\w+)")),
        "timeouts": int(find(r"Socket errors:.*timeout (\d+)", "0")),
        "non_2xx": int(find(r"Non-2xx or 3xx responses: (\d+)", "0")),
        "quantiles_ms": [value / 1e3 for value in quantiles],
    }


def pool(slices: list[dict[str, Any]]) -> dict[str, float]:
    """A mode's slices as one run: requests/s over their summed durations, p50 and p99 of their
    latencies pooled (each slice's quantiles weighted by its requests), the highest max, the
    timeouts and non-2xx answers summed, and CPU cores over their summed wall time."""
    points = sorted(
        (value, piece["requests"] / len(piece["quantiles_ms"]))
        for piece in slices
        if piece["quantiles_ms"]
        for value in piece["quantiles_ms"]
    )
    total = sum(weight for _, weight in points)

    def quantile(share: float) -> float:
        reached = 0.0
        for value, weight in points:
            reached += weight
            if reached >= share * total:
                return value
        return float("nan")

    seconds = sum(piece["seconds"] for piece in slices)
    return {
        "requests_per_second": sum(piece["requests"] for piece in slices) / seconds if seconds else 0.0,
        "p50_ms": quantile(0.5),
        "p99_ms": quantile(0.99),
        "max_ms": max(piece["max_ms"] for piece in slices),
        "timeouts": sum(piece["timeouts"] for piece in slices),
        "non_2xx": sum(piece["non_2xx"] for piece in slices),
        "cpu_cores": sum(piece["cpu_seconds"] for piece in slices) / sum(piece["wall_seconds"] for piece in slices),
    }


def wait_until_drained(port: int, timeout: float = 60.0) -> None:
    """Return once the server's ``/health`` says no request is in flight (``in_flight`` 0)."""
    deadline = time.monotonic() + timeout
    while True:
        in_flight = call_json(port, "/health")["in_flight"]  # type: ignore[index]
        if in_flight == 0:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"the server still had {in_flight} requests in flight {timeout:g} s after wrk stopped")
        time.sleep(0.05)


def server_phases(port: int, method: str = "GET") -> dict[str, object]:
    """The server's ``/stats``: where its answered requests spent their time (``DELETE`` starts over)."""
    return call_json(port, "/stats", method)  # type: ignore[return-value]


@dataclass
class Server:
    """One mode's server process, and the slices measured on it."""

    mode: str
    port: int
    process: subprocess.Popen[bytes]
    slices: list[dict[str, Any]] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/predict"


def start(arguments: argparse.Namespace, mode: str, engine_trees: dict[str, str]) -> Server:
    port = free_port()
    server_mode_, environment = server_mode(mode, engine_trees)
    command = [
        sys.executable,
        str(HERE / "per_request_server.py"),
        "--mode",
        server_mode_,
        "--lend",
        arguments.lend,
        "--loop",
        arguments.loop,
    ]
    command += ["--port", str(port)]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=environment)
    pin(process.pid, cpu_list(arguments.server_cpus))
    return Server(mode, port, process)


def measure(server: Server, wrk: list[str], seconds: int) -> dict[str, Any]:
    """One slice: ``wrk`` on ``server`` for ``seconds``, then until the server has answered the
    requests wrk left behind (their clients gone, they count all the same)."""
    cpu_before, started = cpu_seconds(server.process.pid), time.monotonic()
    result = subprocess.run([*wrk, f"-d{seconds}s", server.url], capture_output=True, text=True, check=True)
    wall, cpu = time.monotonic() - started, cpu_seconds(server.process.pid) - cpu_before
    wait_until_drained(server.port)
    return {**parse_wrk(result.stdout), "cpu_seconds": cpu, "wall_seconds": wall}


def run_repeat(arguments: argparse.Namespace, repeat: int, script: Path) -> list[dict[str, object]]:
    """One server per mode, warmed up, then ``--slices`` rounds of a slice each; a row per mode."""
    taskset = ["taskset", "-c", arguments.client_cpus] if arguments.client_cpus else []
    wrk = [*taskset, arguments.wrk, "-t2", f"-c{arguments.connections}", "-s", str(script), "--latency"]
    engine_trees = engines(arguments.engine)
    modes: list[str] = arguments.modes + list(engine_trees)
    servers: list[Server] = []
    try:
        servers += [start(arguments, mode, engine_trees) for mode in modes]  # they load torch side by side
        for server in servers:
            wait_until_healthy(server.port, server.process)
            subprocess.run([*wrk, f"-d{arguments.warmup}s", server.url], capture_output=True, check=True)
            wait_until_drained(server.port)
            server_phases(server.port, "DELETE")
        for round_ in range(arguments.slices):
            turn = (repeat + round_) % len(servers)
            for server in servers[turn:] + servers[:turn]:
                piece = {"round": round_, **measure(server, wrk, arguments.seconds)}
                server.slices.append(piece)
                print(
                    f"  slice {round_} {server.mode:14} {piece['requests_per_second']:7.0f} req/s"
                    f"  p99 {piece['p99_ms']:7.1f} ms  max {piece['max_ms']:7.1f} ms",
                    flush=True,
                )
        phases = {server.mode: server_phases(server.port) for server in servers}
    finally:
        where = {server.mode: stop_server(server.process) for server in servers}
    return [
        {
            "repeat": repeat,
            "mode": s.mode,
            "lend": arguments.lend,
            "server": where[s.mode],
            **pool(s.slices),
            "phases": phases[s.mode],
            "slices": s.slices,
        }
        for s in servers
    ]


def rounds_won(rows: list[dict[str, Any]], row: dict[str, Any]) -> tuple[int, int, int] | None:
    """Of ``row``'s rounds, how many it served more requests per second in than ``REFERENCE``'s
    server of the same repeat, and how many with a lower p99: ``(more, lower, rounds)``; ``None``
    for the reference itself or where it did not run."""
    reference = next((r for r in rows if r["mode"] == REFERENCE and r["repeat"] == row["repeat"]), None)
    if reference is None or row is reference:
        return None
    theirs = {piece["round"]: piece for piece in reference["slices"]}
    pairs = [(piece, theirs[piece["round"]]) for piece in row["slices"] if piece["round"] in theirs]
    more = sum(ours["requests_per_second"] > other["requests_per_second"] for ours, other in pairs)
    lower = sum(ours["p99_ms"] < other["p99_ms"] for ours, other in pairs)
    return more, lower, len(pairs)


def phase_line(phases: dict[str, dict[str, float]]) -> str:
    """``stream 1.0 / 2.0  enqueue ...``: each phase's p50 and p99, and the whole."""
    return "  ".join(f"{name} {phases[name]['p50_ms']:.1f} / {phases[name]['p99_ms']:.1f}" for name in PARTS)


def summarize(rows: list[dict[str, Any]]) -> str:
    """Markdown: per mode, each repeat's figures in the order run, the rounds won against
    ``REFERENCE``, then where in the server each repeat's requests spent their time (p99 of each
    part)."""
    modes = list(dict.fromkeys(row["mode"] for row in rows))

    def runs(mode: str, figure: Callable[[dict[str, Any]], object], digits: int = 0) -> str:
        return ", ".join(f"{figure(row):.{digits}f}" for row in rows if row["mode"] == mode)

    figures = ("requests_per_second", "p50_ms", "p99_ms", "max_ms", "timeouts", "non_2xx")
    lines = [
        "| way of waiting | req/s | p50 ms | p99 ms | max ms | over 2 s | non-2xx | server CPU (cores) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for mode in modes:
        cells = [runs(mode, itemgetter(name)) for name in figures] + [runs(mode, itemgetter("cpu_cores"), 2)]
        lines.append(f"| {mode} | {' | '.join(cells)} |")
    won = [(row["mode"], rounds_won(rows, row)) for row in rows]
    if any(counts for _, counts in won):
        lines += ["", f"Rounds against `{REFERENCE}` (its slice of the same round, seconds apart): more req/s; lower p99:", ""]
        for mode in modes:
            counts = [c for m, c in won if m == mode and c]
            if counts:
                lines.append(f"- {mode}: " + ", ".join(f"{more} and {lower} of {total}" for more, lower, total in counts))
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
    rows: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory() as folder:
        script = Path(folder) / "post.lua"
        script.write_text(
            f'wrk.method = "POST"\nwrk.headers["Content-Type"] = "application/json"\nwrk.body = {json.dumps(body)}\n{REPORT}'
        )
        for repeat in range(arguments.repeats):
            repeat_rows = run_repeat(arguments, repeat, script)
            rows += repeat_rows
            for row in repeat_rows:
                counts = rounds_won(rows, row)  # type: ignore[arg-type]
                against = f"  rounds won {counts[0]} / {counts[1]} of {counts[2]}" if counts else ""
                print(
                    f"{row['mode']:14} {arguments.lend:5} {row['requests_per_second']:7.0f} req/s  p50 {row['p50_ms']:7.1f} ms"
                    f"  p99 {row['p99_ms']:7.1f} ms  max {row['max_ms']:7.1f} ms  timeouts {row['timeouts']}"
                    f"  non-2xx {row['non_2xx']}  CPU {row['cpu_cores']:.2f}{against}",
                    flush=True,
                )
                print(f"{'':20} in the server, p50 / p99 ms: {phase_line(row['phases'])}", flush=True)  # type: ignore[arg-type]
    return rows


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--wrk", default="wrk")
    parser.add_argument("--modes", nargs="+", default=["aiogpu", "aiogpu-thread", "to_thread", "blocking"])
    parser.add_argument("--lend", choices=("pool", "queue"), default="pool")
    parser.add_argument("--loop", choices=("auto", "asyncio", "uvloop"), default="auto", help="the servers' event loop")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--slices", type=int, default=2, help="rounds of one slice per mode, each repeat")
    parser.add_argument("--seconds", type=int, default=6, help="each slice's length, whole seconds (wrk's unit)")
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--server-cpus", help='pin the servers to these CPUs ("0-7"; default: no pinning)')
    parser.add_argument("--client-cpus", help='pin wrk to these CPUs ("8-15")')
    parser.add_argument(
        "--engine",
        action="append",
        metavar="LABEL=TREE",
        help="also run an aiogpu server importing aiogpu from the source tree TREE, as mode aiogpu@LABEL",
    )
    parser.add_argument("--out", type=Path)
    options = parser.parse_args()
    results = main(options)
    if options.out:
        options.out.parent.mkdir(parents=True, exist_ok=True)
        options.out.write_text(json.dumps(results, indent=1))
        options.out.with_suffix(".md").write_text(summarize(results))
