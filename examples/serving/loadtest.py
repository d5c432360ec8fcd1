"""A bounded HTTP load test of the example servers: aiogpu against blocking and to_thread waits.

For each mode it starts the server in its own process on loopback, waits for ``/health``, then
runs two phases of ``--seconds`` each (after a warm-up) while a probe asks ``/health`` every
10 ms: capacity (``--concurrency`` clients posting ``/predict`` back to back) and a bounded load
(``--rate`` requests per second, whatever the answers). It reports requests per second, request
latency p50 / p99 and ``/health`` p99, prints a line per phase and writes JSON to ``--out``.

Run:  python examples/serving/loadtest.py [--server fastapi|aiohttp] [--seconds 10] [--concurrency 64]
"""

# /// script
# dependencies = ["aiogpu", "aiohttp", "fastapi", "uvicorn", "torch"]
# ///

from __future__ import annotations

import argparse
import asyncio
import json
import random
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import aiohttp

HERE = Path(__file__).parent
MODES = ("aiogpu", "blocking", "to_thread")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] if ordered else float("nan")


async def wait_until_healthy(session: aiohttp.ClientSession, url: str, server: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 180  # a GPU server loads torch and builds its model first
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"the server exited with {server.returncode}")
        try:
            async with session.get(url + "/health") as response:
                if response.status == 200:
                    return
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(0.2)
    raise RuntimeError("the server did not become healthy within 180 s")


async def load(url: str, seconds: float, concurrency: int, warmup: float, rate: float | None = None) -> dict[str, float]:
    """Closed loop (``rate=None``: ``concurrency`` clients back to back, the server's capacity)
    or open loop (``rate`` requests per second whatever the answers, at most ``concurrency``
    pending: a bounded load that every mode can sustain); ``/health`` is probed throughout."""
    latencies: list[float] = []
    health: list[float] = []
    errors = 0
    connector = aiohttp.TCPConnector(limit=concurrency + 4)
    async with aiohttp.ClientSession(connector=connector) as session:
        started = time.monotonic()
        measure_from, stop_at = started + warmup, started + warmup + seconds
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

        async def probe() -> None:
            while (now := time.monotonic()) < stop_at:
                async with session.get(url + "/health") as response:
                    await response.read()
                if now >= measure_from:
                    health.append(time.monotonic() - now)
                await asyncio.sleep(0.01)

        async def one(scheduled: float, slots: asyncio.Semaphore) -> None:
            async with slots:
                await predict(shared_rng, scheduled)  # latency from when it was due

        async def open_loop() -> None:
            slots, pending, sent = asyncio.Semaphore(concurrency), set(), 0
            assert rate is not None
            while (due := started + sent / rate) < stop_at:
                await asyncio.sleep(max(0.0, due - time.monotonic()))
                task = asyncio.create_task(one(due, slots))
                pending.add(task)
                task.add_done_callback(pending.discard)
                sent += 1
            await asyncio.gather(*pending)

        if rate is None:
            await asyncio.gather(probe(), *(client() for _ in range(concurrency)))
        else:
            await asyncio.gather(probe(), open_loop())
    return {
        "requests_per_second": len(latencies) / seconds,
        "p50_ms": statistics.median(latencies) * 1e3 if latencies else float("nan"),
        "p99_ms": percentile(latencies, 0.99) * 1e3,
        "health_p99_ms": percentile(health, 0.99) * 1e3,
        "health_max_ms": max(health) * 1e3 if health else float("nan"),
        "errors": errors,
    }


def start_server(server_kind: str, mode: str, port: int) -> subprocess.Popen[bytes]:
    command = [sys.executable, str(HERE / f"{server_kind}_server.py"), "--mode", mode, "--port", str(port)]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def stop_server(server: subprocess.Popen[bytes]) -> str:
    """Stop the server; its output (it prints what it serves on)."""
    server.terminate()
    return server.communicate(timeout=30)[0].decode(errors="replace")


async def run_mode(server_kind: str, mode: str, arguments: argparse.Namespace) -> dict[str, object]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = start_server(server_kind, mode, port)
    try:
        async with aiohttp.ClientSession() as session:
            await wait_until_healthy(session, url, server)
        capacity = await load(url, arguments.seconds, arguments.concurrency, arguments.warmup)
        report(mode, "capacity", capacity)
        bounded = await load(url, arguments.seconds, arguments.concurrency, arguments.warmup, arguments.rate)
        report(mode, f"{arguments.rate:g}/s", bounded)
    finally:
        output = stop_server(server)
    where = next((line for line in output.splitlines() if line.startswith("serving on")), "?")
    return {"mode": mode, "server": where, "capacity": capacity, "bounded": bounded}


def report(mode: str, phase: str, result: dict[str, float]) -> None:
    print(
        f"{mode:10} {phase:9} {result['requests_per_second']:7.0f} req/s  p50 {result['p50_ms']:7.1f} ms"
        f"  p99 {result['p99_ms']:7.1f} ms  /health p99 {result['health_p99_ms']:7.1f} ms"
        f" (max {result['health_max_ms']:6.1f})  errors {result['errors']:.0f}",
        flush=True,
    )


async def main(arguments: argparse.Namespace) -> None:
    print(f"{arguments.server} server, {arguments.concurrency} clients, {arguments.seconds:g} s per mode", flush=True)
    rows = [await run_mode(arguments.server, mode, arguments) for mode in MODES]
    by_mode = {row["mode"]: row for row in rows}
    capacity = {mode: row["capacity"]["requests_per_second"] for mode, row in by_mode.items()}  # type: ignore[index]
    ratio = capacity["aiogpu"] / max(capacity["blocking"], 1e-9)
    print(f"aiogpu / blocking throughput: {ratio:.2f}x; served by {rows[0]['server'].removeprefix('serving on ')}")
    if arguments.out:
        arguments.out.write_text(
            json.dumps({"server": arguments.server, "concurrency": arguments.concurrency, "rows": rows}, indent=1)
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--server", choices=("fastapi", "aiohttp"), default="fastapi")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--rate", type=float, default=500.0, help="requests per second of the bounded phase")
    parser.add_argument("--out", type=Path)
    asyncio.run(main(parser.parse_args()))
