"""The token-streaming example: the engine in-process, the server over real HTTP, the load test.

Without a GPU everything runs on the simulated device with the CPU stand-in; the GPU lane runs the
same tests on the GPU (the server and the engine pick it when there is one).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
aiohttp = pytest.importorskip("aiohttp")

from tests.helpers import ENVIRONMENT, call, running_server  # noqa: E402

if TYPE_CHECKING:
    from collections.abc import Iterator
    from types import ModuleType

ROOT = Path(__file__).parent.parent
STREAMING = ROOT / "examples" / "llm_streaming"


@pytest.fixture
def engine_module(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(STREAMING))
    import engine  # examples/llm_streaming/engine.py

    return engine


def small_shape(engine: ModuleType) -> object:
    return engine.ModelShape(slots=4, window=16, hidden=256, layers=2, heads=4)


async def drain(request: object) -> list[int]:
    tokens = []
    while (token := await request.tokens.get()) is not None:  # type: ignore[attr-defined]
        tokens.append(token)
    return tokens


@pytest.mark.asyncio
@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", ["aiogpu", "aiogpu-poll", "aiogpu-thread", "to_thread", "blocking"])
async def test_more_requests_than_slots_each_get_their_own_tokens(engine_module: ModuleType, mode: str) -> None:
    engine = engine_module.Engine(mode, small_shape(engine_module))
    try:
        prompts = [[5 + index, 6, 7] for index in range(10)]  # 10 requests, 4 slots: admitted as slots free up
        began = time.perf_counter()
        requests = [engine.submit(prompt, 6 + index % 3) for index, prompt in enumerate(prompts)]
        streams = await asyncio.wait_for(asyncio.gather(*(drain(request) for request in requests)), 60)
        # The steps ran back to back: their waits and the host's work between them fill the time.
        assert engine.host_s > 0
        assert engine.waited_s > 0
        assert engine.host_s + engine.waited_s <= time.perf_counter() - began
        if engine.where.startswith("the simulated device"):
            assert engine.waited_s >= engine.steps * engine_module.SIMULATED_STEP_SECONDS * 0.9
        assert [len(tokens) for tokens in streams] == [6 + index % 3 for index in range(10)]
        assert all(0 <= token < engine_module.VOCABULARY for tokens in streams for token in tokens)
        again = engine.submit(prompts[0], 6)
        assert await drain(again) == streams[0]  # greedy decoding: the same prompt gives the same tokens
        await asyncio.wait_for(engine.wait_idle(), 10)
        assert engine.slots_in_use == 0
        assert engine.waiting == 0
        assert engine.tokens_generated == sum(map(len, streams)) + 6
    finally:
        engine.close()


@pytest.mark.asyncio
@pytest.mark.timeout(120)
async def test_a_cancelled_request_gives_its_slot_back(engine_module: ModuleType) -> None:
    engine = engine_module.Engine("aiogpu", small_shape(engine_module))
    try:
        long = [engine.submit([9, 9, 9], 4096) for _ in range(4)]  # every slot taken for a long time
        queued = engine.submit([1, 2, 3], 3)  # waits for a slot
        for request in long:
            assert await asyncio.wait_for(request.tokens.get(), 30) is not None
        assert engine.slots_in_use == 4
        assert engine.waiting == 1
        engine.cancel(long[0])  # the client went away
        assert await asyncio.wait_for(drain(queued), 30) != []  # it got the slot
        for request in long[1:]:
            engine.cancel(request)
        await asyncio.wait_for(engine.wait_idle(), 30)
        assert engine.slots_in_use == 0
        assert all(request.produced < 4096 for request in long)
        # A request cancelled before it got a slot leaves the queue at once.
        blockers = [engine.submit([4], 4096) for _ in range(4)]
        for request in blockers:
            assert await asyncio.wait_for(request.tokens.get(), 30) is not None
        never = engine.submit([4], 10)
        assert engine.waiting == 1
        engine.cancel(never)
        assert engine.waiting == 0
        for request in blockers:
            engine.cancel(request)
        await asyncio.wait_for(engine.wait_idle(), 30)
    finally:
        engine.close()


def test_bad_requests_are_refused_with_the_reason(engine_module: ModuleType) -> None:
    engine = engine_module.Engine("aiogpu", small_shape(engine_module))
    try:
        with pytest.raises(ValueError, match="prompt must be a non-empty list"):
            engine.submit([], 4)
        with pytest.raises(ValueError, match=r"prompt must be .* in \[0, 32000\)"):
            engine.submit([32_000], 4)
        with pytest.raises(ValueError, match="max_tokens must be an int from 1 to 4096, got 0"):
            engine.submit([1], 0)
        with pytest.raises(ValueError, match="mode must be one of"):
            engine_module.Engine("sometimes")
    finally:
        engine.close()


def test_the_floors_time_a_step_on_its_own(engine_module: ModuleType) -> None:
    engine = engine_module.Engine("aiogpu", small_shape(engine_module))
    try:
        floors = engine.measure_floors(20)
        # On the simulated device a step is SIMULATED_STEP_SECONDS of GPU time (on a GPU, the model's).
        assert floors["gpu_step_s"] > 0
        assert floors["pipeline_step_s"] >= floors["gpu_step_s"] * 0.95  # one step in flight: never faster
        if "simulated" in engine.where:
            assert floors["gpu_step_s"] == pytest.approx(engine_module.SIMULATED_STEP_SECONDS, rel=0.05)
        with pytest.raises(ValueError, match="steps must be a positive int, got 0"):
            engine.measure_floors(0)
    finally:
        engine.close()


@pytest.mark.asyncio
@pytest.mark.timeout(60)
async def test_the_floors_refuse_a_busy_engine(engine_module: ModuleType) -> None:
    engine = engine_module.Engine("aiogpu", small_shape(engine_module))
    try:
        request = engine.submit([1, 2, 3], 4096)
        with pytest.raises(RuntimeError, match="measure_floors needs an idle engine"):
            engine.measure_floors(5)
        engine.cancel(request)
        await asyncio.wait_for(engine.wait_idle(), 30)
    finally:
        engine.close()


def test_a_goal_the_floor_puts_out_of_reach_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(STREAMING))
    import loadtest  # examples/llm_streaming/loadtest.py

    figures = {
        ("aiogpu", "capacity"): 1000.0,
        ("to_thread", "capacity"): 950.0,  # a floor of 1045 tokens/s allows aiogpu at most 1.1x this
        ("blocking", "capacity"): 600.0,  # and at most 1.74x this
    }

    def median(mode: str, phase: str, metric: str) -> float:
        return figures.get((mode, phase), 1.0) if metric == "tokens_per_second" else 1.0

    rows = loadtest.goals(median, {"gpu_tokens_per_second": 1045.0})
    assert rows[2] == "| tokens/s at capacity, aiogpu / to_thread >= 1.15 | 1.05 | 1.10 | no: out of reach |"
    assert rows[3] == "| tokens/s at capacity, aiogpu / blocking >= 1.5 | 1.67 | 1.74 | yes |"
    assert rows[6] == "| at 80 %: aiogpu /health p99 <= 5 ms | 1.00 |  | yes |"
    assert loadtest.goals(median, None)[2] == "| tokens/s at capacity, aiogpu / to_thread >= 1.15 | 1.05 |  | no |"


@pytest.fixture(scope="module")
def server_url() -> Iterator[str]:
    shape = ["--slots", "8", "--window", "16", "--hidden", "256", "--layers", "2", "--heads", "4"]
    with running_server([sys.executable, str(STREAMING / "server.py"), *shape]) as url:
        yield url


async def stream_tokens(session: aiohttp.ClientSession, url: str, prompt: list[int], max_tokens: int) -> list[int]:
    async with session.post(url + "/generate", json={"prompt": prompt, "max_tokens": max_tokens}) as response:
        assert response.status == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        tokens: list[int] = []
        async for line in response.content:
            if line.startswith(b"data: [DONE]"):
                return tokens
            if line.startswith(b"data: "):
                tokens.append(int(line[6:]))
    raise AssertionError(f"the stream ended without [DONE] after {tokens}")


def stats(url: str) -> dict[str, float]:
    status, body = call(url + "/stats")
    assert status == 200, body
    assert isinstance(body, dict)
    return body


def wait_until_idle(url: str, seconds: float = 30.0) -> dict[str, float]:
    deadline = time.monotonic() + seconds
    while (now := stats(url))["slots_in_use"] or now["waiting"]:
        assert time.monotonic() < deadline, f"slots still held: {now}"
        time.sleep(0.05)
    return now


@pytest.mark.slow
@pytest.mark.asyncio
@pytest.mark.timeout(150)
async def test_the_server_streams_tokens_and_refuses_bad_input(server_url: str) -> None:
    async with aiohttp.ClientSession() as session:
        first = await stream_tokens(session, server_url, [5, 6, 7], 5)
        assert len(first) == 5
        assert await stream_tokens(session, server_url, [5, 6, 7], 5) == first
        async with session.post(server_url + "/generate", json={"prompt": [], "max_tokens": 5}) as response:
            assert response.status == 422
            assert "prompt must be a non-empty list" in await response.text()
    assert wait_until_idle(server_url)["tokens"] >= 10


@pytest.mark.slow
@pytest.mark.asyncio
@pytest.mark.timeout(150)
async def test_a_client_that_disconnects_frees_its_slot(server_url: str) -> None:
    async with aiohttp.ClientSession() as session:
        response = await session.post(server_url + "/generate", json={"prompt": [1, 2, 3], "max_tokens": 4096})
        assert response.status == 200
        received = 0
        async for line in response.content:
            received += line.startswith(b"data: ")
            if received == 3:
                break
        assert stats(server_url)["slots_in_use"] == 1
        response.close()  # drop the connection mid-stream
    before = stats(server_url)["tokens"]
    after = await asyncio.to_thread(wait_until_idle, server_url)
    assert after["tokens"] - before < 4096  # decoding stopped long before max_tokens


@pytest.mark.slow
@pytest.mark.asyncio
@pytest.mark.timeout(150)
async def test_health_answers_while_every_slot_streams(server_url: str) -> None:
    async with aiohttp.ClientSession() as session:
        streams = [asyncio.create_task(stream_tokens(session, server_url, [index + 3], 200)) for index in range(24)]
        latencies = []
        while not all(task.done() for task in streams):
            started = time.monotonic()
            async with session.get(server_url + "/health") as response:
                assert response.status == 200
                assert (await response.json())["status"] == "ok"
            latencies.append(time.monotonic() - started)
            await asyncio.sleep(0.02)
        results = await asyncio.gather(*streams)
    assert [len(tokens) for tokens in results] == [200] * 24
    assert len(latencies) >= 5
    assert max(latencies) < 1.0, latencies  # answered between steps, not after the streams


def test_the_servers_own_counters_give_its_rates(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(STREAMING))
    import loadtest  # examples/llm_streaming/loadtest.py

    bins = {"wait_bin_s": 0.001}
    before = {"steps": 100, "tokens": 6_000, "waited_s": 0.5, "host_s": 0.0625, "uptime_s": 10.0, **bins}
    before["wait_bins"] = {3: 40, 4: 60}
    after = {"steps": 600, "tokens": 30_000, "waited_s": 2.5, "host_s": 0.1875, "uptime_s": 12.5, **bins}
    after["wait_bins"] = {3: 40, 4: 555, 9: 5}  # 500 steps since: 495 in [4, 5) ms, then 5 in [9, 10)
    assert loadtest.server_side(before, after) == {
        "server_tokens_per_second": 9_600.0,
        "steps_per_second": 200.0,
        "slots_busy": 48.0,
        "wait_ms_per_step": 4.0,
        "wait_p99_ms": pytest.approx(5.0),
        "host_ms_per_step": 0.25,
    }
    after["wait_bins"][9] = 6  # one more slow step: the 99th percentile falls among the slow ones
    assert loadtest.server_side(before, after)["wait_p99_ms"] == pytest.approx(10.0)
    idle = loadtest.server_side(before, {**before, "uptime_s": 11.0})
    assert idle == dict.fromkeys(loadtest.SERVER_METRICS, 0.0)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_load_test_reports_every_mode(tmp_path: Path) -> None:
    out = tmp_path / "llm"
    command = [sys.executable, str(STREAMING / "loadtest.py"), "--modes", "aiogpu", "to_thread", "blocking"]
    command += [
        "--repeats",
        "1",
        "--seconds",
        "1",
        "--warmup",
        "0.3",
        "--drain",
        "5",
        "--concurrency",
        "16",
        "--clients",
        "2",
        "--rates",
        "0.5",
        "0.8",
    ]
    command += ["--slots", "8", "--window", "16", "--hidden", "256", "--layers", "2", "--heads", "4", "--out", str(out)]
    result = subprocess.run(command, env=ENVIRONMENT, capture_output=True, text=True, timeout=280, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    measured = json.loads(out.with_suffix(".json").read_text())
    floors, rows = measured["floors"], measured["rows"]
    assert floors["slots"] == 8
    assert floors["gpu_tokens_per_second"] == pytest.approx(8 / floors["gpu_step_s"])
    assert floors["pipeline_step_s"] >= floors["gpu_step_s"] > 0
    assert {(row["mode"], row["phase"]) for row in rows} == {
        (mode, phase) for mode in ("aiogpu", "to_thread", "blocking") for phase in ("capacity", "50%", "80%")
    }
    for row in rows:
        assert row["errors"] == 0, row
        assert row["tokens_per_second"] > 0, row
        assert row["ttft_p99_ms"] >= row["ttft_p50_ms"] > 0, row
        assert row["cpu_cores"] > 0, row
        assert 0 < row["slots_busy"] <= 8, row
        assert 0 < row["steps_per_second"] * floors["gpu_step_s"] < 1.1, row  # no faster than the GPU steps
        assert row["wait_p99_ms"] >= row["wait_ms_per_step"] * 0.5, row  # binned, but from the same waits
        busy_ms = row["wait_ms_per_step"] + row["host_ms_per_step"]
        assert 0 < busy_ms * row["steps_per_second"] < 1_000 * 1.05, row  # a step's parts fit in its share of a second
        assert 0.5 < row["server_tokens_per_second"] / row["tokens_per_second"] < 2, row  # the same tokens, both ends
    summary = out.with_suffix(".md").read_text()
    header = (
        "| phase | mode | server tokens/s | steps/s | slots busy | GPU stepping | wait ms | wait p99 ms | host ms | late ms |"
    )
    assert header in summary
    assert "| goal | measured | the most the GPU's floor allows | met |" in summary
    assert f"({floors['gpu_tokens_per_second']:.0f} tokens/s)" in summary
    assert out.with_suffix(".png").stat().st_size > 10_000
