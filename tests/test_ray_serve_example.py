"""The Ray Serve example on a local Ray cluster: the replica keeps answering while GPU work is awaited.

The replica runs on the simulated device with its GPU work held by a latch (``hold_gpu_work``),
so requests stay pending, deterministically, until the test releases them through the
deployment's handle. Meanwhile the replica's loop must answer ``/health`` and Ray Serve's own
health checks: a replica that blocked its loop on the GPU would answer neither. Needs the
``ray`` extra (``pip install -e '.[test,ray]'``); skipped without it.
"""

from __future__ import annotations

import json
import socket
import sys
import tempfile
import time
import urllib.error
import urllib.request
import warnings
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ray = pytest.importorskip("ray")
with warnings.catch_warnings():
    # ray.serve declares its configuration with pydantic-1-style Field arguments.
    warnings.filterwarnings("ignore", "Using extra keyword arguments on `Field`", DeprecationWarning)
    serve = pytest.importorskip("ray.serve")

EXAMPLE = Path(__file__).parent.parent / "examples" / "ray_serve"
DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: never through a proxy
PROMPT = 30.0  # seconds: a free loop answers in milliseconds, one blocked on held GPU work never (room for a busy host)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def call(url: str, body: object | None = None, timeout: float = 60) -> tuple[int, dict[str, Any]]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with DIRECT.open(request, timeout=timeout) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, {"error": error.read().decode()}


def poll_health(url: str, until: str, condition: Callable[[dict[str, Any]], bool], deadline: float = 120) -> dict[str, Any]:
    """GET /health until ``condition(body)``; every answer must come promptly."""
    give_up = time.monotonic() + deadline
    while True:
        try:
            status, body = call(url + "/health", timeout=PROMPT)
        except TimeoutError:
            pytest.fail(f"/health did not answer within {PROMPT} s: the replica's loop is blocked")
        assert status == 200, body
        if condition(body):
            return body
        assert time.monotonic() < give_up, f"never {until}: {body}"
        time.sleep(0.1)  # between polls; nothing here waits for the GPU work


@pytest.fixture
def example(monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    monkeypatch.syspath_prepend(str(EXAMPLE))
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Using extra keyword arguments on `Field`", DeprecationWarning)
        import app  # examples/ray_serve/app.py
    yield app
    sys.modules.pop("app", None)


@pytest.fixture
def cluster() -> Iterator[str]:
    # A short path: Ray's sockets live under it, and a Unix socket path has at most 107 bytes.
    with tempfile.TemporaryDirectory(prefix="ray", dir="/tmp") as scratch:
        # working_dir: the replicas import the example from the directory Ray ships to them.
        ray.init(
            num_cpus=2,
            include_dashboard=False,
            _temp_dir=scratch,
            runtime_env={"working_dir": str(EXAMPLE), "excludes": ["__pycache__"]},
            log_to_driver=True,
        )
        try:
            port = free_port()
            serve.start(http_options={"host": "127.0.0.1", "port": port})
            yield f"http://127.0.0.1:{port}"
        finally:
            try:
                serve.shutdown()
            finally:
                ray.shutdown()


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_replica_answers_health_checks_while_gpu_work_is_awaited(example: ModuleType, cluster: str) -> None:
    url = cluster
    deployment = example.Predictor.options(health_check_period_s=1, health_check_timeout_s=PROMPT)
    handle = serve.run(deployment.bind(streams=2, hold_gpu_work=True), name="ray-serve-example", route_prefix="/")
    idle = poll_health(url, "healthy", lambda body: True)
    assert idle["where"] == "the simulated device (no GPU)"
    assert idle["gpu_waits"] == 0

    requests = [[1, 2, 3], [40, 50]]
    with ThreadPoolExecutor(len(requests)) as pool:
        answers = [pool.submit(call, url + "/predict", {"tokens": tokens}) for tokens in requests]
        # Both requests reach their awaits: the replica's loop reports them pending.
        held = poll_health(
            url,
            "both requests awaiting the GPU",
            lambda body: body["gpu_waits"] == len(requests) or any(answer.done() for answer in answers),
        )
        assert not any(answer.done() for answer in answers), [answer.result() for answer in answers if answer.done()]
        # Ray Serve's own health checks go on answering (the controller calls check_health every second).
        poll_health(url, "checked by Ray twice more", lambda body: body["health_checks"] >= held["health_checks"] + 2)
        started = time.monotonic()
        assert handle.check_health.remote().result(timeout_s=PROMPT) is None
        assert time.monotonic() - started < PROMPT
        assert not any(answer.done() for answer in answers), "the GPU work finished while held"
        status, _ = call(url + "/predict", {"tokens": [-1]}, timeout=PROMPT)  # bad input is answered too
        assert status == 422
        assert poll_health(url, "still awaiting", lambda body: True)["gpu_waits"] == len(requests)

        handle.release_gpu_work.remote().result(timeout_s=PROMPT)
        for tokens, answer in zip(requests, answers, strict=True):
            status, body = answer.result(timeout=120)
            assert status == 200, body
            assert body == {"outputs": example.stand_in(tokens)}
    assert poll_health(url, "idle", lambda body: True)["gpu_waits"] == 0
