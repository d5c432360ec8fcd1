"""What the examples' load tests share: ports, percentiles, waiting for a server and stopping it,
probing ``/health``, asking a server for JSON, reading a process's CPU time, and comparing
another aiogpu engine in the same run. Each load test puts this folder on ``sys.path``."""

from __future__ import annotations

import http.client
import json
import os
import socket
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import subprocess


#: Every port ``free_port`` has handed out in this process.
_handed_out: set[int] = set()


def free_port() -> int:
    """A port free now that this process has not handed out before: the server given the last
    one may not have bound it yet, and the system can offer it again meanwhile."""
    while True:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = int(probe.getsockname()[1])
        if port not in _handed_out:
            _handed_out.add(port)
            return port


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] if ordered else float("nan")


def wait_until_healthy(port: int, server: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 180  # a GPU server loads torch and captures its graphs first
    while time.monotonic() < deadline:
        if server.poll() is not None:
            output = server.communicate()[0].decode(errors="replace") if server.stdout else ""
            raise RuntimeError(f"the server exited with {server.returncode}; its last output:\n{output[-2000:]}")
        try:
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            connection.request("GET", "/health")
            if connection.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError("the server did not become healthy within 180 s")


def stop_server(server: subprocess.Popen[bytes]) -> str:
    """Stop an example server; the line it printed about what it serves on (``serving on ...``),
    or ``?`` where it printed none."""
    server.terminate()
    output = server.communicate(timeout=30)[0].decode(errors="replace")
    return next((line for line in output.splitlines() if line.startswith("serving on")), "?")


def call_json(port: int, path: str, method: str = "GET", timeout: float = 10.0) -> object:
    """The JSON a local server answers to ``method path``; ``RuntimeError`` for a status other
    than 200 (``OSError`` where it does not answer)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        connection.request(method, path)
        response = connection.getresponse()
        body = response.read()
    finally:
        connection.close()
    if response.status != 200:
        raise RuntimeError(f"{method} {path} answered {response.status}: {body.decode(errors='replace')}")
    return json.loads(body)


def probe_health(port: int, measure_from: float, stop_at: float) -> list[float]:
    """In its own process: ``/health`` every 10 ms over one kept-alive connection; the latencies
    of those sent in [measure_from, stop_at)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    latencies = []
    while (now := time.monotonic()) < stop_at:
        connection.request("GET", "/health")
        connection.getresponse().read()
        if now >= measure_from:
            latencies.append(time.monotonic() - now)
        time.sleep(max(0.0, now + 0.01 - time.monotonic()))
    return latencies


def cpu_list(text: str | None) -> set[int] | None:
    """CPUs named like taskset's ``-c`` list ("0-7,12"), or ``None`` for no pinning."""
    if not text:
        return None
    cpus: set[int] = set()
    for part in text.split(","):
        first, _, last = part.partition("-")
        cpus.update(range(int(first), int(last or first) + 1))
    return cpus


def pin(pid: int, cpus: set[int] | None) -> None:
    """Keep process ``pid`` (and the threads it starts from now on) on ``cpus``: the server and
    the load generators then never take turns on one core, a noise source of its own."""
    if cpus is not None:
        os.sched_setaffinity(pid, cpus)


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time of process ``pid`` and all its threads so far (Linux)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def engines(values: list[str] | None) -> dict[str, str]:
    """``--engine LABEL=TREE`` values as ``{"aiogpu@LABEL": TREE}``: each an extra mode whose server
    waits like ``aiogpu`` with aiogpu imported from the source tree ``TREE``, so that an engine is
    compared with this one's in the same run, on the same machine. ``ValueError`` names a value
    that is not ``LABEL=TREE`` with a folder holding an ``aiogpu`` package."""
    modes = {}
    for value in values or []:
        label, _, tree = value.partition("=")
        if not label or not tree or not os.path.isfile(os.path.join(tree, "aiogpu", "__init__.py")):
            raise ValueError(f"--engine takes LABEL=TREE, TREE a folder holding the aiogpu package; got {value!r}")
        modes[f"aiogpu@{label}"] = os.path.abspath(tree)
    return modes


def server_mode(mode: str, engine_trees: dict[str, str]) -> tuple[str, dict[str, str] | None]:
    """The ``--mode`` a load test's ``mode`` starts its server with, and the server's environment
    (``None``: this process's): an ``engines`` mode is ``aiogpu`` with its tree first on
    ``PYTHONPATH``."""
    tree = engine_trees.get(mode)
    if tree is None:
        return mode, None
    path = os.pathsep.join(filter(None, [tree, os.environ.get("PYTHONPATH")]))
    return "aiogpu", {**os.environ, "PYTHONPATH": path}
