"""Helpers shared by the tests."""

from __future__ import annotations

import asyncio
import gc
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from aiogpu._wait import _helpers, _thread
from aiogpu.testing import SimulatedDriver


def settle_waiter_threads(timeout: float = 10.0) -> _thread.PoolStatistics:
    """Let abandoned waiter jobs finish (their GPU work must be complete) and idle threads exit."""
    gc.collect()
    pool = _thread.pool()
    assert pool.wait_quiet(timeout), f"waiter jobs still running: {pool.statistics()}"
    pool.stop_idle_threads()
    return pool.statistics()


def in_waiter_thread() -> bool:
    """Whether the calling thread is one of aiogpu's waiter threads."""
    return threading.current_thread().name.startswith("aiogpu-waiter")


def waiter_thread_queries(
    sim: SimulatedDriver, monkeypatch: pytest.MonkeyPatch, enough: int = 1
) -> tuple[list[float], threading.Event]:
    """When waiter threads queried an event, and a latch set once they have done so ``enough`` times."""
    times: list[float] = []
    reached = threading.Event()
    query = sim.event_query

    def noted(event: int) -> bool:
        if in_waiter_thread():
            times.append(time.perf_counter())
            if len(times) >= enough:
                reached.set()
        return query(event)

    monkeypatch.setattr(sim, "event_query", noted)
    return times, reached


@contextmanager
def eager_tasks() -> Iterator[None]:
    """asyncio's eager task factory (Python 3.12) on the running loop for the block; skips on
    uvloop, which passes the factory an argument it does not take."""
    loop = asyncio.get_running_loop()
    if not isinstance(loop, asyncio.BaseEventLoop):
        pytest.skip("uvloop passes an argument asyncio's eager task factory does not take")
    loop.set_task_factory(asyncio.eager_task_factory)  # type: ignore[attr-defined]
    try:
        yield
    finally:
        loop.set_task_factory(None)


# -- example servers, started as their users start them -------------------------------------------
ROOT = Path(__file__).parent.parent
#: The environment of an example's process: it imports this checkout's aiogpu, installed or not.
ENVIRONMENT = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: never through a proxy


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def call(url: str, body: object | None = None, method: str | None = None) -> tuple[int, object]:
    """GET ``url`` (POST ``body`` as JSON if given, or ``method``); the status and the decoded answer."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"}, method=method)
    try:
        with _DIRECT.open(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


@contextmanager
def running_server(command: list[str]) -> Iterator[str]:
    """Run ``command --port PORT`` until ``/health`` answers 200; its base URL; stopped on exit."""
    port = free_port()
    process = subprocess.Popen([*command, "--port", str(port)], env=ENVIRONMENT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert process.poll() is None, process.communicate()[0].decode()
            try:
                if call(url + "/health")[0] == 200:
                    break
            except (urllib.error.URLError, ConnectionError):
                pass
            assert time.monotonic() < deadline, "the server never became healthy"
            time.sleep(0.1)
        yield url
    finally:
        process.terminate()
        process.communicate(timeout=30)


def armer_caught_up(timeout: float = 20.0) -> None:
    """Block until the armer thread (``callback`` waits) has run everything queued before this
    call (FIFO): it files a helper stream after arming, which can be after the wait woke."""
    done = threading.Event()
    _helpers._armer().submit(done.set)
    assert done.wait(timeout)


#: Stands in for ``wrk`` where there is none: posts the script's body for a moment, one request at
#: a time, and reports what it saw as ``wrk --latency`` with ``loadtest_wrk``'s ``done`` hook does.
FAKE_WRK = """import json, re, sys, time, urllib.request
script, url = sys.argv[sys.argv.index("-s") + 1], sys.argv[-1]
body = json.loads(re.search(r"wrk.body = (.*)", open(script).read()).group(1)).encode()
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
latencies, started = [], time.perf_counter()
while time.perf_counter() - started < 0.3:
    sent = time.perf_counter()
    request = urllib.request.Request(url, body, {"Content-Type": "application/json"})
    opener.open(request, timeout=10).read()
    latencies.append((time.perf_counter() - sent) * 1e3)
elapsed, ordered = time.perf_counter() - started, sorted(latencies)
quantiles = [ordered[min(len(ordered) - 1, int(i / 1000 * len(ordered)))] for i in range(1, 1001)]
print(f"  Thread Stats   Avg      Stdev     Max   +/- Stdev")
print(f"    Latency   {sum(ordered) / len(ordered):.2f}ms   0.00ms   {ordered[-1]:.2f}ms   90.00%")
print("  Latency Distribution")
print(f"     50%   {ordered[len(ordered) // 2]:.2f}ms")
print(f"     99%   {ordered[int(0.99 * (len(ordered) - 1))]:.2f}ms")
print(f"Requests/sec:   {len(ordered) / elapsed:.2f}")
print(f"slice: {len(ordered)} {int(elapsed * 1e6)} " + " ".join(str(int(q * 1e3)) for q in quantiles))
"""


def fake_wrk(folder: Path) -> Path:
    """An executable ``FAKE_WRK`` in ``folder``."""
    wrk = folder / "wrk"
    wrk.write_text(f"#!{sys.executable}\n{FAKE_WRK}")
    wrk.chmod(0o755)
    return wrk
