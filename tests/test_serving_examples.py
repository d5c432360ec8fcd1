"""The serving examples answer real HTTP on the simulated device (the GPU lane runs them on the GPU).

Each server starts in its own process, as a user starts it; the load test runs briefly against
the FastAPI one in all three modes.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("aiohttp")

ROOT = Path(__file__).parent.parent
SERVING = ROOT / "examples" / "serving"
DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: never through a proxy
ENVIRONMENT = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def call(url: str, body: object | None = None) -> tuple[int, object]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with DIRECT.open(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


@contextmanager
def server(kind: str) -> Iterator[str]:
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, str(SERVING / f"{kind}_server.py"), "--port", str(port)],
        env=ENVIRONMENT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
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


@pytest.mark.timeout(150)
@pytest.mark.parametrize("kind", ["fastapi", "aiohttp"])
@pytest.mark.slow
def test_server_predicts_and_stays_healthy(kind: str) -> None:
    with server(kind) as url:
        status, body = call(url + "/predict", {"tokens": [1, 2, 3]})
        assert status == 200, body
        assert isinstance(body, dict)
        outputs = body["outputs"]
        assert len(outputs) == 16
        assert all(isinstance(value, float) and -1 <= value <= 1 for value in outputs)
        status, again = call(url + "/predict", {"tokens": [1, 2, 3]})
        assert again == body  # the same input gives the same outputs
        status, error = call(url + "/predict", {"tokens": [-5]})
        assert status == 422, error
        status, health = call(url + "/health")
        assert status == 200
        assert isinstance(health, dict)
        assert health["status"] == "ok"
        assert health["batches"] >= 2


@pytest.mark.timeout(150)
@pytest.mark.slow
def test_load_test_reports_every_mode() -> None:
    result = subprocess.run(
        [sys.executable, str(SERVING / "loadtest.py"), "--seconds", "1", "--warmup", "0.5", "--concurrency", "8", "--rate", "50"],
        env=ENVIRONMENT,
        capture_output=True,
        text=True,
        timeout=140,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.strip().splitlines()
    for mode in ("aiogpu", "blocking", "to_thread"):
        for phase in ("capacity", "50/s"):
            assert any(line.split()[:2] == [mode, phase] and "errors 0" in line for line in lines), result.stdout
    assert "aiogpu / blocking throughput" in lines[-1]


@pytest.mark.anyio
async def test_health_fails_while_a_gpu_wait_is_stuck(monkeypatch: pytest.MonkeyPatch) -> None:
    import anyio

    import aiogpu
    from aiogpu.testing import Latch

    monkeypatch.syspath_prepend(str(SERVING))
    import model as serving  # examples/serving/model.py

    monkeypatch.setattr(serving, "HUNG_AFTER", 0.0)
    model = serving.Model()  # no GPU here: the simulated device
    device = model.streams.devices[0]
    with aiogpu.Stream(device) as stream, Latch(device) as latch:
        latch.block(stream)
        stuck = stream.record()
        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                tg.start_soon(stuck.wait)
                await anyio.wait_all_tasks_blocked()
                healthy, body = model.health()
                assert not healthy
                assert body["status"] == "stuck"
                latch.release()
        assert model.health() == (True, {"status": "ok", "mode": "aiogpu", "batches": 0})
        stuck.close()
    model.streams.close()
