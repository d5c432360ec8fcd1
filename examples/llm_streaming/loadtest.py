"""An open-loop load test of the token-streaming server, every way of waiting in one run.

One server process per mode is started first and kept for the whole run (each loads its model
once); one is loaded at a time, the others idle. Each repeat measures every mode's capacity
(``--concurrency`` clients streaming back to back), then Poisson arrivals at ``--rates``
(fractions of ``--reference``'s capacity in the first repeat, so every mode gets the same
offered load), with the modes interleaved and their order rotated from repeat to repeat. The
load comes from ``--clients`` processes of aiohttp clients and ``/health`` is probed every 10 ms
from another, so the clients' work counts in none of the server's figures.

Per mode and phase: output tokens/s, time to first token and inter-token latency (p50, p99),
``/health`` p99, the server's CPU (cores busy, all its threads) and errors (a failed or cut
stream, or one unfinished ``--drain`` seconds after the phase); and from the server's own
counters (``/stats``), the tokens it decoded a second, its steps a second and the slots busy in
an average step, which tell a slow GPU from slow clients. Before the servers start, the
model's floors are timed in a process of their own on the idle GPU (``Engine.measure_floors``):
the tokens/s no way of waiting can pass, every slot busy. Writes ``--out``.json, .md (medians over
the repeats, the floors, and the serving goals checked, each beside the most the floor leaves
within reach) and .png.

Run:  python examples/llm_streaming/loadtest.py [--repeats 3] [--seconds 5] [--out results/llm]
"""

# /// script
# dependencies = ["aiogpu", "aiohttp", "fastapi", "uvicorn", "torch", "transformers", "matplotlib"]
# ///

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import multiprocessing
import random
import statistics
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp

if TYPE_CHECKING:
    from collections.abc import Callable

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parent))  # loadtools.py, shared with the other load tests
from loadtools import (  # noqa: E402
    call_json,
    cpu_list,
    cpu_seconds,
    free_port,
    percentile,
    pin,
    probe_health,
    stop_server,
    wait_until_healthy,
)

START_MARGIN = 1.0  # seconds for the worker processes to be ready before a phase starts
METRICS = ("tokens_per_second", "ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p99_ms", "health_p99_ms", "cpu_cores", "errors")
SERVER_METRICS = (
    "server_tokens_per_second",
    "steps_per_second",
    "slots_busy",
    "wait_ms_per_step",
    "wait_p99_ms",
    "host_ms_per_step",
)


def engine_counters(port: int) -> dict[str, Any] | None:
    """The server's own counters (``/stats``): steps, tokens decoded, the host's time waiting for
    steps and between them, and its uptime; ``None`` if the server does not answer (the phase
    then counts its failed streams as errors)."""
    try:
        stats: dict[str, Any] = call_json(port, "/stats", timeout=30)  # type: ignore[assignment]
    except (OSError, ValueError, RuntimeError):
        return None
    counters = {key: stats[key] for key in ("steps", "tokens", "waited_s", "host_s", "wait_bin_s", "uptime_s")}
    return {**counters, "wait_bins": {int(bin_): count for bin_, count in stats["wait_bins"].items()}}


def server_side(before: dict[str, Any] | None, after: dict[str, Any] | None) -> dict[str, float]:
    """What the server did between two samples of its counters: tokens it decoded a second (sent
    or not), steps a second, the slots busy in an average step, and the milliseconds an average
    step spent from its launch to the scheduler running after its wait (and the 99th percentile
    of that, to the upper edge of its bin), and from there to the next launch (NaN where a sample
    failed)."""
    if before is None or after is None:
        return dict.fromkeys(SERVER_METRICS, float("nan"))
    seconds = after["uptime_s"] - before["uptime_s"]
    steps = after["steps"] - before["steps"]
    tokens = after["tokens"] - before["tokens"]

    def per_step_ms(counter: str) -> float:
        return (after[counter] - before[counter]) / steps * 1e3 if steps else 0.0

    return {
        "server_tokens_per_second": tokens / seconds,
        "steps_per_second": steps / seconds,
        "slots_busy": tokens / steps if steps else 0.0,
        "wait_ms_per_step": per_step_ms("waited_s"),
        "wait_p99_ms": binned_percentile(after["wait_bins"], before["wait_bins"], after["wait_bin_s"], 0.99) * 1e3,
        "host_ms_per_step": per_step_ms("host_s"),
    }


def binned_percentile(after: dict[int, int], before: dict[int, int], width: float, share: float) -> float:
    """The ``share`` percentile, in seconds, of the waits counted in ``after`` and not in
    ``before`` (``Engine.wait_bins``, bins ``width`` seconds wide): the upper edge of the bin it
    falls in; 0 with none."""
    counts = {bin_: count - before.get(bin_, 0) for bin_, count in after.items()}
    total = sum(counts.values())
    seen = 0
    for bin_ in sorted(counts):
        seen += counts[bin_]
        if total and seen >= share * total:
            return (bin_ + 1) * width
    return 0.0


def load_worker(url: str, started: float, window: tuple[float, float], drain: float, plan: dict[str, float]) -> dict[str, object]:
    """In its own process: one client's share of a phase (see :func:`load`)."""
    return asyncio.run(load(url, started, window, drain, plan))


async def load(url: str, started: float, window: tuple[float, float], drain: float, plan: dict[str, float]) -> dict[str, object]:
    """Closed loop (``plan["concurrency"]`` clients back to back) or open loop (Poisson arrivals at
    ``plan["rate"]`` requests/s from ``started``, whatever the answers). Every token that arrives
    inside ``window`` counts for throughput; requests sent inside it count for latencies."""
    await asyncio.sleep(max(0.0, started - time.monotonic()))
    measure_from, stop_at = window
    rng = random.Random()
    tokens_in_window = 0
    ttft: list[float] = []
    gaps: list[float] = []
    errors = 0
    max_tokens = int(plan["max_tokens"])
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=None, sock_read=30)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def stream_one(since: float) -> None:
            nonlocal tokens_in_window, errors
            counted = measure_from <= since < stop_at
            prompt = [rng.randrange(3, 32_000) for _ in range(rng.randint(16, 128))]
            arrivals: list[float] = []
            done = False
            try:
                async with session.post(url + "/generate", json={"prompt": prompt, "max_tokens": max_tokens}) as response:
                    if response.status == 200:
                        async for line in response.content:
                            if not line.startswith(b"data: "):
                                continue
                            if line.startswith(b"data: [DONE]"):
                                done = True
                                break
                            now = time.monotonic()
                            arrivals.append(now)
                            if measure_from <= now < stop_at:
                                tokens_in_window += 1
            except (aiohttp.ClientError, asyncio.TimeoutError):
                pass
            if not counted:
                return
            if not done or not arrivals:
                errors += 1
                return
            ttft.append(arrivals[0] - since)
            gaps.extend(later - earlier for earlier, later in itertools.pairwise(arrivals))

        async def client() -> None:
            while (now := time.monotonic()) < stop_at:
                await stream_one(now)

        async def open_loop(rate: float) -> None:
            pending: set[asyncio.Task[None]] = set()
            due = started
            while (due := due + rng.expovariate(rate)) < stop_at:
                await asyncio.sleep(max(0.0, due - time.monotonic()))
                task = asyncio.create_task(stream_one(due))  # latency from when it was due
                pending.add(task)
                task.add_done_callback(pending.discard)
            if pending:
                _, unfinished = await asyncio.wait(pending, timeout=max(0.0, stop_at + drain - time.monotonic()))
                for task in unfinished:
                    task.cancel()
                await asyncio.gather(*unfinished, return_exceptions=True)
                nonlocal errors
                errors += len(unfinished)

        if plan.get("rate"):
            await open_loop(plan["rate"])
        else:
            await asyncio.gather(*(client() for _ in range(int(plan["concurrency"]))))
    return {"tokens": tokens_in_window, "ttft": ttft, "gaps": gaps, "errors": errors}


async def run_phase(
    workers: ProcessPoolExecutor, server: Server, arguments: argparse.Namespace, rate: float | None
) -> dict[str, float]:
    """One phase against one server: the client processes, the ``/health`` probe and the server's CPU."""
    loop = asyncio.get_running_loop()
    clients = arguments.clients
    started = time.monotonic() + START_MARGIN
    window = (started + arguments.warmup, started + arguments.warmup + arguments.seconds)
    plan = {"max_tokens": arguments.max_tokens, "concurrency": arguments.concurrency / clients, "rate": (rate or 0) / clients}
    url = f"http://127.0.0.1:{server.port}"
    shares = [loop.run_in_executor(workers, load_worker, url, started, window, arguments.drain, plan) for _ in range(clients)]
    health = loop.run_in_executor(workers, probe_health, server.port, *window)
    await asyncio.sleep(max(0.0, window[0] - time.monotonic()))
    cpu_before = cpu_seconds(server.process.pid)
    counters_before = await asyncio.to_thread(engine_counters, server.port)
    await asyncio.sleep(max(0.0, window[1] - time.monotonic()))
    cpu = cpu_seconds(server.process.pid) - cpu_before
    counters_after = await asyncio.to_thread(engine_counters, server.port)
    results = await asyncio.gather(*shares)
    health_latencies = await health
    ttft = [value for result in results for value in result["ttft"]]  # type: ignore[attr-defined]
    gaps = [value for result in results for value in result["gaps"]]  # type: ignore[attr-defined]
    return {
        "offered_requests_per_second": rate or float("nan"),
        "tokens_per_second": sum(result["tokens"] for result in results) / arguments.seconds,  # type: ignore[misc]
        "requests": len(ttft),
        "ttft_p50_ms": percentile(ttft, 0.5) * 1e3,
        "ttft_p99_ms": percentile(ttft, 0.99) * 1e3,
        "itl_p50_ms": percentile(gaps, 0.5) * 1e3,
        "itl_p99_ms": percentile(gaps, 0.99) * 1e3,
        "health_p99_ms": percentile(health_latencies, 0.99) * 1e3,
        "cpu_cores": cpu / arguments.seconds,
        "errors": sum(result["errors"] for result in results),  # type: ignore[misc]
        **server_side(counters_before, counters_after),
    }


class Server:
    """One server process for one mode, kept for the whole run."""

    def __init__(self, mode: str, extra: list[str], cpus: set[int] | None) -> None:
        self.mode = mode
        self.port = free_port()
        command = [sys.executable, str(HERE / "server.py"), "--mode", mode, "--port", str(self.port), *extra]
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        pin(self.process.pid, cpus)

    def stop(self) -> str:
        """Stop the server; its ``serving on ...`` line (``loadtools.stop_server``)."""
        return stop_server(self.process)


def report(mode: str, phase: str, result: dict[str, float]) -> None:
    print(
        f"{mode:15} {phase:>9} {result['tokens_per_second']:7.0f} tok/s  TTFT p50/p99 {result['ttft_p50_ms']:6.1f}/"
        f"{result['ttft_p99_ms']:6.1f} ms  ITL p50/p99 {result['itl_p50_ms']:5.1f}/{result['itl_p99_ms']:5.1f} ms"
        f"  /health p99 {result['health_p99_ms']:5.1f} ms  CPU {result['cpu_cores']:4.2f}  errors {result['errors']:.0f}"
        f"  server {result['server_tokens_per_second']:7.0f} tok/s in {result['steps_per_second']:4.0f} steps/s"
        f" ({result['slots_busy']:4.1f} slots busy)",
        flush=True,
    )


def measure_floors(extra: list[str], cpus: set[int] | None) -> dict[str, float]:
    """The model's floors (``engine.py --floors``), timed in a process of its own, with the
    tokens/s each allows (one token a slot a step)."""
    process = subprocess.Popen(
        [sys.executable, str(HERE / "engine.py"), "--floors", *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    pin(process.pid, cpus)
    output, errors = process.communicate(timeout=600)
    if process.returncode != 0:
        raise RuntimeError(f"engine.py --floors failed ({process.returncode}):\n{errors.decode(errors='replace')}")
    floors: dict[str, float] = json.loads(output.decode().strip().splitlines()[-1])
    for kind in ("gpu", "pipeline"):
        floors[f"{kind}_tokens_per_second"] = floors["slots"] / floors[f"{kind}_step_s"]
    return floors


async def main(arguments: argparse.Namespace) -> dict[str, object]:
    modes: list[str] = arguments.modes
    if arguments.reference not in modes:
        raise SystemExit(f"--reference {arguments.reference} is not among --modes {modes}")
    extra = [
        f"--{name}={value}" for name in ("slots", "window", "hidden", "layers", "heads") if (value := getattr(arguments, name))
    ]
    floors = await asyncio.to_thread(measure_floors, extra, cpu_list(arguments.server_cpus))
    print(
        f"floors: GPU {floors['gpu_step_s'] * 1e3:.2f} ms a step ({floors['gpu_tokens_per_second']:.0f} tok/s), "
        f"one step in flight {floors['pipeline_step_s'] * 1e3:.2f} ms ({floors['pipeline_tokens_per_second']:.0f} tok/s)",
        flush=True,
    )
    servers = {mode: Server(mode, extra, cpu_list(arguments.server_cpus)) for mode in modes}
    rows: list[dict[str, object]] = []
    rates: list[float] = []
    try:
        for server in servers.values():
            await asyncio.to_thread(wait_until_healthy, server.port, server.process)
        spawn = multiprocessing.get_context("spawn")  # clean processes: no copy of this one's state
        client_cpus = cpu_list(arguments.client_cpus)
        with ProcessPoolExecutor(arguments.clients + 1, mp_context=spawn, initializer=pin, initargs=(0, client_cpus)) as workers:
            for repeat in range(arguments.repeats):
                order = modes[repeat % len(modes) :] + modes[: repeat % len(modes)]
                for mode in order:
                    result = await run_phase(workers, servers[mode], arguments, None)
                    report(mode, "capacity", result)
                    rows.append({"repeat": repeat, "mode": mode, "phase": "capacity", **result})
                if not rates:
                    reference = next(row for row in rows if row["mode"] == arguments.reference)
                    requests_per_second = float(reference["tokens_per_second"]) / arguments.max_tokens  # type: ignore[arg-type]
                    rates = [fraction * requests_per_second for fraction in arguments.rates]
                for fraction, rate in zip(arguments.rates, rates, strict=True):
                    for mode in order:
                        result = await run_phase(workers, servers[mode], arguments, rate)
                        report(mode, f"{fraction:.0%}", result)
                        rows.append({"repeat": repeat, "mode": mode, "phase": f"{fraction:.0%}", **result})
    finally:
        stopped = {mode: server.stop() for mode, server in servers.items()}
    where = stopped[modes[0]]
    return {
        "served_by": where.removeprefix("serving on ").split(",")[0],
        "arguments": vars(arguments),
        "floors": floors,
        "rows": rows,
    }


def summarize(result: dict[str, object], reference: str) -> str:
    """Markdown: per mode and phase the median over the repeats of each figure, then the goals."""
    rows: list[dict[str, object]] = result["rows"]  # type: ignore[assignment]
    modes = list(dict.fromkeys(str(row["mode"]) for row in rows))
    phases = list(dict.fromkeys(str(row["phase"]) for row in rows))

    def median(mode: str, phase: str, metric: str) -> float:
        return statistics.median(float(row[metric]) for row in rows if row["mode"] == mode and row["phase"] == phase)  # type: ignore[arg-type]

    lines = [
        f"Served by {result['served_by']}; medians of {result['arguments']['repeats']} repeats "  # type: ignore[index]
        f"(rates are shares of {reference}'s capacity in the first repeat).",
        "",
        "| phase | mode | tokens/s | TTFT p50 / p99 ms | ITL p50 / p99 ms | /health p99 ms | CPU cores | errors |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    lines += table_rows(
        median,
        modes,
        phases,
        METRICS,
        lambda m: (
            f"{m['tokens_per_second']:.0f} | {m['ttft_p50_ms']:.1f} / {m['ttft_p99_ms']:.1f} | "
            f"{m['itl_p50_ms']:.1f} / {m['itl_p99_ms']:.1f} | {m['health_p99_ms']:.1f} | {m['cpu_cores']:.2f} | {m['errors']:.0f}"
        ),
    )
    floors: dict[str, float] | None = result.get("floors")  # type: ignore[assignment]
    if floors:
        lines += [
            "",
            f"Floors, every slot busy and no client: the GPU's own time {floors['gpu_step_s'] * 1e3:.2f} ms a step "
            f"({floors['gpu_tokens_per_second']:.0f} tokens/s); one step in flight, the host spinning in "
            f"`synchronize()` and doing the scheduler's work between steps, {floors['pipeline_step_s'] * 1e3:.2f} ms "
            f"({floors['pipeline_tokens_per_second']:.0f} tokens/s).",
        ]
    if all(metric in row for row in rows for metric in SERVER_METRICS):
        lines += ["", *server_table(median, modes, phases, floors)]
    if {"aiogpu", "to_thread", "blocking"} <= set(modes) and "80%" in phases:
        lines += ["", *goals(median, floors)]
    return "\n".join(lines) + "\n"


def server_table(
    median: Callable[[str, str, str], float], modes: list[str], phases: list[str], floors: dict[str, float] | None
) -> list[str]:
    """Markdown: what each server did in the measured window, from its own counters. With the
    floors, the share of the window its GPU spent stepping (steps a second times the GPU's own
    time a step): near 1 the GPU is the bottleneck, whatever the way of waiting; and how late an
    average wait ended (its time less the GPU's time a step)."""
    step = floors["gpu_step_s"] if floors else None

    def cells(m: dict[str, float]) -> str:
        figures = f"{m['server_tokens_per_second']:.0f} | {m['steps_per_second']:.0f} | {m['slots_busy']:.1f}"
        split = f"{m['wait_ms_per_step']:.2f} | {m['wait_p99_ms']:.2f} | {m['host_ms_per_step']:.2f}"
        if step is None:
            return f"{figures} | {split}"
        return f"{figures} | {m['steps_per_second'] * step:.0%} | {split} | {m['wait_ms_per_step'] - step * 1e3:.2f}"

    return [
        "What the servers did (their own counters; medians): tokens decoded a second, steps a second, "
        "slots busy in an average step"
        + (", the share of the time the GPU was stepping (steps a second times its time a step, above)" if step else "")
        + "; and an average step's milliseconds on the host: from its launch to the scheduler running after its wait "
        "(and that wait's p99), then from there to the next launch (tokens handed out, requests admitted, the next "
        "step launched)" + ("; and how late the wait ended: its time less the GPU's time a step." if step else "."),
        "",
        "| phase | mode | server tokens/s | steps/s | slots busy |"
        + (" GPU stepping | wait ms | wait p99 ms | host ms | late ms |" if step else " wait ms | wait p99 ms | host ms |"),
        "|---|---|---:|---:|---:|" + ("---:|---:|---:|---:|---:|" if step else "---:|---:|---:|"),
        *table_rows(median, modes, phases, SERVER_METRICS, cells),
    ]


def table_rows(
    median: Callable[[str, str, str], float],
    modes: list[str],
    phases: list[str],
    metrics: tuple[str, ...],
    cells: Callable[[dict[str, float]], str],
) -> list[str]:
    """A Markdown row per phase and mode: the phase, the mode, then ``cells`` of the medians."""
    rows = []
    for phase in phases:
        for mode in modes:
            rows.append(f"| {phase} | {mode} | {cells({metric: median(mode, phase, metric) for metric in metrics})} |")
    return rows


def goals(median: Callable[[str, str, str], float], floors: dict[str, float] | None) -> list[str]:
    """The serving goals as a Markdown table; beside each tokens/s goal, the most the GPU's floor
    allows (its tokens/s over the other mode's), which says whether the goal is within reach."""
    capacity = {mode: median(mode, "capacity", "tokens_per_second") for mode in ("aiogpu", "to_thread", "blocking")}
    at80 = {mode: {metric: median(mode, "80%", metric) for metric in METRICS} for mode in ("aiogpu", "to_thread")}
    ceiling = floors["gpu_tokens_per_second"] if floors else None
    checks = [
        ("tokens/s at capacity, aiogpu / to_thread >= 1.15", capacity["aiogpu"] / capacity["to_thread"], 1.15, ">=", "to_thread"),
        ("tokens/s at capacity, aiogpu / blocking >= 1.5", capacity["aiogpu"] / capacity["blocking"], 1.5, ">=", "blocking"),
        (
            "at 80 %: ITL p99, aiogpu / to_thread <= 1",
            at80["aiogpu"]["itl_p99_ms"] / at80["to_thread"]["itl_p99_ms"],
            1.0,
            "<=",
            None,
        ),
        (
            "at 80 %: TTFT p99, aiogpu / to_thread <= 1",
            at80["aiogpu"]["ttft_p99_ms"] / at80["to_thread"]["ttft_p99_ms"],
            1.0,
            "<=",
            None,
        ),
        ("at 80 %: aiogpu /health p99 <= 5 ms", at80["aiogpu"]["health_p99_ms"], 5.0, "<=", None),
    ]
    lines = ["| goal | measured | the most the GPU's floor allows | met |", "|---|---:|---:|---|"]
    for name, value, bound, sense, against in checks:
        met = value >= bound if sense == ">=" else value <= bound
        reach = ceiling / capacity[against] if ceiling is not None and against else None
        verdict = "yes" if met else "no" if reach is None or reach >= bound else "no: out of reach"
        lines.append(f"| {name} | {value:.2f} | {'' if reach is None else f'{reach:.2f}'} | {verdict} |")
    return lines


def plot(result: dict[str, object], path: Path) -> None:
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows: list[dict[str, object]] = [row for row in result["rows"] if row["phase"] != "capacity"]  # type: ignore[attr-defined]
    figure, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for mode in dict.fromkeys(str(row["mode"]) for row in rows):
        mine = [row for row in rows if row["mode"] == mode]
        for axis, metric, label in zip(
            axes,
            ("tokens_per_second", "ttft_p99_ms", "itl_p99_ms"),
            ("output tokens/s", "TTFT p99 (ms)", "inter-token p99 (ms)"),
            strict=True,
        ):
            axis.plot(
                [row["offered_requests_per_second"] for row in mine], [row[metric] for row in mine], "o", label=mode, alpha=0.7
            )
            axis.set_xlabel("offered requests/s (Poisson)")
            axis.set_ylabel(label)
    axes[1].set_yscale("log")  # past capacity the time to first token grows by orders of magnitude
    axes[1].yaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
    axes[2].set_ylim(bottom=0)
    axes[0].legend()
    figure.suptitle(f"Token streaming on {result['served_by']}")
    figure.tight_layout()
    figure.savefig(path, dpi=110)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--modes", nargs="+", default=["aiogpu", "aiogpu-thread", "to_thread", "blocking"])
    parser.add_argument("--reference", default="to_thread", help="the mode whose capacity sets the offered rates")
    parser.add_argument("--rates", nargs="+", type=float, default=[0.5, 0.8, 1.0], help="shares of the reference capacity")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--warmup", type=float, default=1.5)
    parser.add_argument("--drain", type=float, default=10.0, help="seconds an open-loop phase waits for its last streams")
    parser.add_argument(
        "--concurrency", type=int, default=128, help="streams at once in the capacity phase, shared by the clients"
    )
    parser.add_argument("--clients", type=int, default=4, help="client processes generating the load")
    parser.add_argument("--max-tokens", type=int, default=64)
    for name in ("slots", "window", "hidden", "layers", "heads"):
        parser.add_argument(f"--{name}", type=int, help="model shape passed to each server (engine.ModelShape)")
    parser.add_argument("--server-cpus", help='pin each server to these CPUs ("0-7"; default: no pinning)')
    parser.add_argument("--client-cpus", help='pin the client processes to these CPUs ("8-15")')
    parser.add_argument("--out", type=Path, help="write OUT.json, OUT.md and OUT.png")
    options = parser.parse_args()
    outcome = asyncio.run(main(options))
    summary = summarize(outcome, options.reference)
    print(summary)
    if options.out:
        options.out.parent.mkdir(parents=True, exist_ok=True)
        options.out.with_suffix(".json").write_text(json.dumps(outcome, indent=1, default=str))
        options.out.with_suffix(".md").write_text(summary)
        plot(outcome, options.out.with_suffix(".png"))
