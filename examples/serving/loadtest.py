"""A bounded HTTP load test of the micro-batched example servers: every way of waiting, repeated.

It starts one server per mode (``--modes``), each in its own process on loopback, side by side,
and waits for each one's ``/health``. Then each repeat measures every mode in turn, the order
rotated from repeat to repeat, in two phases of ``--seconds`` each (after a warm-up): capacity
(``--concurrency`` clients posting ``/predict`` back to back) and a bounded load (``--rate``
requests per second, whatever the answers). Taking the modes in turn, repeat after repeat, spreads
each over the same stretch of time: a virtual machine's cores can run Python at half speed for
seconds at a time (``benchmarks/README.md``). The load comes from ``--clients`` processes of
aiohttp clients, and a separate process asks ``/health`` every 10 ms, so neither the clients'
work nor their event loop's delays count in the server's figures. ``--engine LABEL=TREE`` adds a
server that waits like ``aiogpu`` with aiogpu imported from another source tree (mode
``aiogpu@LABEL``): two engines compared in one run, on one machine. ``--answers-per-turn`` sets
how many of a batch's answers every server hands out per loop iteration; ``--also-answers-per-turn
N`` adds an ``aiogpu`` server that hands out ``N`` (mode ``aiogpu@N-a-turn``, or
``aiogpu@all-at-once`` for 0). It reports requests per second, request latency p50 / p99,
``/health`` p99 and the server's ``/stats`` over the phase (batches, requests a batch, how late the
waits were, where each request's time in the server went, CPU), prints them per phase and writes
JSON to ``--out``.

Run:  python examples/serving/loadtest.py [--server fastapi|aiohttp] [--repeats 3] [--seconds 10]
          [--rate 1000] [--modes aiogpu aiogpu-thread to_thread blocking] [--engine LABEL=TREE]
          [--answers-per-turn 1] [--also-answers-per-turn N ...]
"""

# /// script
# dependencies = ["aiogpu", "aiohttp", "fastapi", "uvicorn", "torch"]
# ///

from __future__ import annotations

import argparse
import asyncio
import json
import math
import multiprocessing
import random
import statistics
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import aiohttp

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parent))  # loadtools.py, shared with the other load tests
from loadtools import (  # noqa: E402
    call_json,
    cpu_list,
    engines,
    free_port,
    percentile,
    pin,
    probe_health,
    server_mode,
    stop_server,
    wait_until_healthy,
)
from model import REQUEST_PHASES, answers_per_turn_argument  # noqa: E402  (beside this file)

MODES = ("aiogpu", "aiogpu-thread", "to_thread", "blocking")
START_MARGIN = 1.0  # seconds for the worker processes to be ready before a phase starts


def load_worker(
    url: str, started: float, warmup: float, seconds: float, concurrency: int, rate: float | None, offset: float
) -> dict[str, object]:
    """In its own process: one client's share of a phase (see :func:`load`)."""
    return asyncio.run(load(url, started, warmup, seconds, concurrency, rate, offset))


async def load(
    url: str, started: float, warmup: float, seconds: float, concurrency: int, rate: float | None, offset: float
) -> dict[str, object]:
    """Closed loop (``rate=None``: ``concurrency`` clients back to back, the server's capacity)
    or open loop (``rate`` requests per second from ``started + offset``, whatever the answers,
    at most ``concurrency`` pending); the latencies of requests due in the measured window."""
    await asyncio.sleep(max(0.0, started - time.monotonic()))
    latencies: list[float] = []
    errors = 0
    measure_from, stop_at = started + warmup, started + warmup + seconds
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:
        shared_rng = random.Random()

        async def predict(rng: random.Random, since: float) -> None:
            """One /predict request; its latency counts from ``since`` if that is in the measured window."""
            nonlocal errors
            body = {"tokens": [rng.randrange(32_000) for _ in range(rng.randint(16, 128))]}
            try:
                async with session.post(url + "/predict", json=body) as response:
                    await response.read()
                    ok = response.status == 200
            except aiohttp.ClientError:
                ok = False
            if since >= measure_from:
                if ok:
                    latencies.append(time.monotonic() - since)
                else:
                    errors += 1

        async def client() -> None:
            rng = random.Random()
            while (now := time.monotonic()) < stop_at:
                await predict(rng, now)

        async def one(scheduled: float, slots: asyncio.Semaphore) -> None:
            async with slots:
                await predict(shared_rng, scheduled)  # latency from when it was due

        async def open_loop() -> None:
            slots, pending, sent = asyncio.Semaphore(concurrency), set(), 0
            assert rate is not None
            while (due := started + offset + sent / rate) < stop_at:
                await asyncio.sleep(max(0.0, due - time.monotonic()))
                task = asyncio.create_task(one(due, slots))
                pending.add(task)
                task.add_done_callback(pending.discard)
                sent += 1
            await asyncio.gather(*pending)

        if rate is None:
            await asyncio.gather(*(client() for _ in range(concurrency)))
        else:
            await open_loop()
    return {"latencies": latencies, "errors": errors}


async def run_phase(
    workers: ProcessPoolExecutor, port: int, arguments: argparse.Namespace, rate: float | None
) -> dict[str, object]:
    """One phase: ``--clients`` load processes and the ``/health`` probe, over the same window,
    and the server's ``/stats`` for the batches it ran in that window."""
    loop = asyncio.get_running_loop()
    url = f"http://127.0.0.1:{port}"
    clients = arguments.clients
    started = time.monotonic() + START_MARGIN
    measure_from, stop_at = started + arguments.warmup, started + arguments.warmup + arguments.seconds
    shares = [
        loop.run_in_executor(
            workers,
            load_worker,
            url,
            started,
            arguments.warmup,
            arguments.seconds,
            math.ceil(arguments.concurrency / clients),
            None if rate is None else rate / clients,
            0.0 if rate is None else index / rate,  # the clients' sends interleave
        )
        for index in range(clients)
    ]
    health = loop.run_in_executor(workers, probe_health, port, measure_from, stop_at)
    await asyncio.sleep(max(0.0, measure_from - time.monotonic()))
    await asyncio.to_thread(call_json, port, "/stats", "DELETE")
    results = await asyncio.gather(*shares)
    batches = await asyncio.to_thread(call_json, port, "/stats")
    health_latencies = await health
    latencies = [latency for result in results for latency in result["latencies"]]  # type: ignore[attr-defined]
    return {
        "requests_per_second": len(latencies) / arguments.seconds,
        "p50_ms": statistics.median(latencies) * 1e3 if latencies else float("nan"),
        "p99_ms": percentile(latencies, 0.99) * 1e3,
        "health_p99_ms": percentile(health_latencies, 0.99) * 1e3,
        "health_max_ms": max(health_latencies) * 1e3 if health_latencies else float("nan"),
        "errors": sum(result["errors"] for result in results),  # type: ignore[misc]
        "batches": batches,
    }


def answers_variant(answers_per_turn: int) -> str:
    """The mode of an ``aiogpu`` server that hands out ``answers_per_turn`` answers a loop turn."""
    return f"aiogpu@{answers_per_turn}-a-turn" if answers_per_turn else "aiogpu@all-at-once"


def start_server(
    server_kind: str, mode: str, port: int, engine_trees: dict[str, str], answers_per_turn: int
) -> subprocess.Popen[bytes]:
    server_mode_, environment = server_mode(mode, engine_trees)
    command = [sys.executable, str(HERE / f"{server_kind}_server.py"), "--mode", server_mode_, "--port", str(port)]
    command += ["--answers-per-turn", str(answers_per_turn)]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=environment)


async def measure_mode(workers: ProcessPoolExecutor, port: int, mode: str, arguments: argparse.Namespace) -> dict[str, object]:
    """One mode's capacity, then its bounded phase, on its running server."""
    capacity = await run_phase(workers, port, arguments, None)
    report(mode, "capacity", capacity)
    bounded = await run_phase(workers, port, arguments, arguments.rate)
    report(mode, f"{arguments.rate:g}/s", bounded)
    return {"mode": mode, "capacity": capacity, "bounded": bounded}


def report(mode: str, phase: str, result: dict[str, Any]) -> None:
    print(
        f"{mode:13} {phase:9} {result['requests_per_second']:7.0f} req/s  p50 {result['p50_ms']:7.1f} ms"
        f"  p99 {result['p99_ms']:7.1f} ms  /health p99 {result['health_p99_ms']:7.1f} ms"
        f" (max {result['health_max_ms']:6.1f})  errors {result['errors']:.0f}",
        flush=True,
    )
    batches = result["batches"]
    if batches["batches"]:
        print(
            f"{'':23} {batches['batches']:7.0f} batches of {batches['mean_size']:4.1f} requests; GPU batch"
            f" waits p50 {batches['wait_p50_ms']:.2f} / p99 {batches['wait_p99_ms']:.2f} ms, of which after the"
            f" GPU's end p50 {batches['late_p50_ms']:.2f} / p99 {batches['late_p99_ms']:.2f} ms;"
            f" CPU: loop {batches['loop_cores']:.2f}, all {batches['cores']:.2f} cores",
            flush=True,
        )
    if batches.get("in_app_p50_ms") is not None:
        phases = ", ".join(
            f"{phase.replace('_', ' ')} {batches[f'{phase}_p50_ms']:.2f} / {batches[f'{phase}_p99_ms']:.2f}"
            for phase in REQUEST_PHASES
        )
        print(f"{'':23} requests in the server, p50 / p99 ms: {phases}", flush=True)


def capacity_ratio(rows: list[dict[str, object]], mode: str, reference: str) -> float:
    """The median over repeats of ``mode``'s capacity over ``reference``'s."""
    capacity = {(row["repeat"], row["mode"]): row["capacity"]["requests_per_second"] for row in rows}  # type: ignore[index]
    ratios = [capacity[repeat, mode] / max(capacity[repeat, reference], 1e-9) for repeat, m in capacity if m == mode]
    return statistics.median(ratios)


async def main(arguments: argparse.Namespace) -> None:
    print(
        f"{arguments.server} server, {arguments.concurrency} connections from {arguments.clients} client processes, "
        f"{arguments.seconds:g} s per phase, answers per loop turn: {arguments.answers_per_turn or 'all'}",
        flush=True,
    )
    engine_trees = engines(arguments.engine)
    variants = {answers_variant(n): n for n in arguments.also_answers_per_turn}  # aiogpu servers
    answers_per_turn = dict.fromkeys(arguments.modes + list(engine_trees), arguments.answers_per_turn) | variants
    modes = list(answers_per_turn)
    spawn = multiprocessing.get_context("spawn")  # clean processes: no copy of this one's state
    client_cpus = cpu_list(arguments.client_cpus)
    servers: dict[str, tuple[int, subprocess.Popen[bytes]]] = {}
    rows: list[dict[str, object]] = []
    try:
        for mode in modes:  # side by side: they load torch and capture their graphs together
            port = free_port()
            server_mode_ = "aiogpu" if mode in variants else mode
            servers[mode] = port, start_server(arguments.server, server_mode_, port, engine_trees, answers_per_turn[mode])
            pin(servers[mode][1].pid, cpu_list(arguments.server_cpus))
        for port, server in servers.values():
            await asyncio.to_thread(wait_until_healthy, port, server)
        with ProcessPoolExecutor(arguments.clients + 1, mp_context=spawn, initializer=pin, initargs=(0, client_cpus)) as workers:
            for repeat in range(arguments.repeats):
                turn = repeat % len(modes)
                for mode in modes[turn:] + modes[:turn]:
                    rows.append({"repeat": repeat, **await measure_mode(workers, servers[mode][0], mode, arguments)})
    finally:
        where = {mode: stop_server(server) for mode, (_, server) in servers.items()}
    for row in rows:
        row["server"] = where[row["mode"]]  # type: ignore[index]
    for reference in ("to_thread", "blocking"):
        for mode in ("aiogpu", *engine_trees, *variants):
            if mode in modes and reference in modes:
                ratio = capacity_ratio(rows, mode, reference)
                print(f"{mode} / {reference} capacity: {ratio:.2f}x (median of {arguments.repeats})", flush=True)
    print(f"served by {where[modes[0]].removeprefix('serving on ')}", flush=True)
    if arguments.out:
        arguments.out.write_text(
            json.dumps(
                {
                    "server": arguments.server,
                    "concurrency": arguments.concurrency,
                    "clients": arguments.clients,
                    "answers_per_turn": answers_per_turn,
                    "engines": engine_trees,
                    "rows": rows,
                },
                indent=1,
            )
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--server", choices=("fastapi", "aiohttp"), default="fastapi")
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--concurrency", type=int, default=64, help="connections, shared by the client processes")
    parser.add_argument("--clients", type=int, default=2, help="client processes generating the load")
    parser.add_argument("--rate", type=float, default=1000.0, help="requests per second of the bounded phase")
    parser.add_argument(
        "--answers-per-turn",
        type=answers_per_turn_argument,
        default=1,
        help="the servers' --answers-per-turn (0: a batch's all at once)",
    )
    parser.add_argument(
        "--also-answers-per-turn",
        type=answers_per_turn_argument,
        nargs="*",
        default=[],
        metavar="N",
        help="also run an aiogpu server with --answers-per-turn N, as mode aiogpu@N-a-turn (aiogpu@all-at-once for 0)",
    )
    parser.add_argument("--server-cpus", help='pin the servers to these CPUs ("0-7"; default: no pinning)')
    parser.add_argument("--client-cpus", help='pin the client processes to these CPUs ("8-15")')
    parser.add_argument(
        "--engine",
        action="append",
        metavar="LABEL=TREE",
        help="also run an aiogpu server importing aiogpu from the source tree TREE, as mode aiogpu@LABEL",
    )
    parser.add_argument("--out", type=Path)
    asyncio.run(main(parser.parse_args()))
