"""The serving examples answer real HTTP on the simulated device (the GPU lane runs them on the GPU).

Each server starts in its own process, as a user starts it; the load test runs briefly against
the FastAPI one in all three modes.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import time
from contextlib import AbstractContextManager
from pathlib import Path

import pytest

from tests.helpers import ENVIRONMENT, call, fake_wrk, running_server

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("aiohttp")

ROOT = Path(__file__).parent.parent
SERVING = ROOT / "examples" / "serving"


def server(kind: str) -> AbstractContextManager[str]:
    return running_server([sys.executable, str(SERVING / f"{kind}_server.py")])


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
        status, stats = call(url + "/stats")
        assert status == 200, stats
        assert isinstance(stats, dict)
        assert stats["batches"] == health["batches"]
        assert stats["mean_size"] == 1  # one request at a time
        # a wait holds the GPU's time (4 ms simulated) and what came after its end
        assert stats["wait_p99_ms"] >= stats["wait_p50_ms"] > stats["late_p50_ms"] >= 0
        assert stats["wait_p50_ms"] >= 4
        assert 0 < stats["loop_cores"] <= stats["cores"] + 0.05  # the loop's thread is one of the process's
        # each answered request's time in the server, phase by phase: its batch's wait among them
        assert stats["batch_wait_p50_ms"] >= 4
        phases = ("queued", "batch_wait", "answering", "resuming")
        assert all(stats[f"{phase}_p50_ms"] >= 0 for phase in phases), stats
        assert stats["in_app_p99_ms"] >= stats["in_app_p50_ms"] >= stats["batch_wait_p50_ms"]
        status, cleared = call(url + "/stats", method="DELETE")
        assert isinstance(cleared, dict)
        assert {name: value for name, value in cleared.items() if not name.endswith("cores")} == {
            "batches": 0,
            "mean_size": None,
            **{f"{name}_{q}_ms": None for name in ("wait", "late", *phases, "in_app") for q in ("p50", "p99")},
        }


def run_load_test(*arguments: str) -> subprocess.CompletedProcess[str]:
    """The micro-batched load test, short and light (1 s phases, 8 connections, 50 requests/s)."""
    light = ["--seconds", "1", "--warmup", "0.5", "--concurrency", "8", "--rate", "50"]
    result = subprocess.run(
        [sys.executable, str(SERVING / "loadtest.py"), *light, *arguments],
        env=ENVIRONMENT,
        capture_output=True,
        text=True,
        timeout=220,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result


@pytest.mark.timeout(240)
@pytest.mark.slow
def test_load_test_measures_every_mode_in_turn(tmp_path: Path) -> None:
    out = tmp_path / "loadtest.json"
    result = run_load_test("--repeats", "2", "--out", str(out))
    lines = result.stdout.strip().splitlines()
    measured = [line.split()[:2] for line in lines if "errors 0" in line]
    for mode in ("aiogpu", "aiogpu-thread", "to_thread", "blocking"):
        # every mode's two phases, once a repeat
        assert measured.count([mode, "capacity"]) == measured.count([mode, "50/s"]) == 2, result.stdout
    assert any(line.startswith("aiogpu / to_thread capacity: ") for line in lines), result.stdout
    assert any(line.startswith("aiogpu / blocking capacity: ") for line in lines), result.stdout
    rows = json.loads(out.read_text())["rows"]
    # the order rotated: the second repeat starts with the first's second mode
    assert [(row["repeat"], row["mode"]) for row in rows][:5] == [
        (0, "aiogpu"),
        (0, "aiogpu-thread"),
        (0, "to_thread"),
        (0, "blocking"),
        (1, "aiogpu-thread"),
    ]
    # one device for every mode: the GPU, or the simulated device
    assert len({row["server"].split(", waiting with")[0] for row in rows}) == 1, rows
    assert all(row["server"].startswith("serving on ") for row in rows), rows
    # each phase's batches, from the server's /stats over the phase
    assert all(row[phase]["batches"]["batches"] >= 1 for row in rows for phase in ("capacity", "bounded")), rows
    assert any("batches of" in line for line in lines), result.stdout


def test_an_engine_to_compare_is_a_mode_whose_server_imports_aiogpu_from_its_tree(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(SERVING.parent))
    import loadtools  # examples/loadtools.py

    assert loadtools.engines(None) == {}
    assert loadtools.engines([f"main={ROOT}"]) == {"aiogpu@main": str(ROOT)}
    for wrong in ("main", f"={ROOT}", "main=", f"main={tmp_path}"):  # tmp_path holds no aiogpu package
        with pytest.raises(ValueError, match="--engine takes LABEL=TREE"):
            loadtools.engines([wrong])
    trees = loadtools.engines([f"main={ROOT}"])
    assert loadtools.server_mode("to_thread", trees) == ("to_thread", None)
    mode, environment = loadtools.server_mode("aiogpu@main", trees)
    assert mode == "aiogpu"
    assert environment is not None
    assert environment["PYTHONPATH"].split(os.pathsep)[0] == str(ROOT)


def test_free_ports_are_never_handed_out_twice(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(SERVING.parent))
    import loadtools  # examples/loadtools.py

    offered = iter([5001, 5002, 5001, 5002, 5003])  # the system offers a port again before its server bound it

    class Probe:
        def __enter__(self) -> Probe:
            return self

        def __exit__(self, *exc_info: object) -> None:
            pass

        def bind(self, address: tuple[str, int]) -> None:
            self.port = next(offered)

        def getsockname(self) -> tuple[str, int]:
            return ("127.0.0.1", self.port)

    monkeypatch.setattr(loadtools, "_handed_out", set())
    monkeypatch.setattr(loadtools.socket, "socket", Probe)
    assert [loadtools.free_port() for _ in range(3)] == [5001, 5002, 5003]


def test_a_server_that_exits_before_it_is_healthy_is_reported_with_its_output(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(SERVING.parent))
    import loadtools  # examples/loadtools.py

    code = "import sys; print('[Errno 98] address already in use'); sys.exit(3)"
    server = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    server.wait()
    with pytest.raises(RuntimeError, match=r"(?s)exited with 3; its last output:.*address already in use"):
        loadtools.wait_until_healthy(loadtools.free_port(), server)


@pytest.mark.timeout(240)
@pytest.mark.slow
def test_the_load_test_runs_an_engine_and_answers_per_turn_to_compare_beside_the_modes(tmp_path: Path) -> None:
    out = tmp_path / "loadtest.json"
    result = run_load_test(
        *("--modes", "to_thread", "--engine", f"same={ROOT}", "--also-answers-per-turn", "0", "3"),
        *("--repeats", "1", "--out", str(out)),
    )
    written = json.loads(out.read_text())
    assert written["engines"] == {"aiogpu@same": str(ROOT)}
    modes = ["to_thread", "aiogpu@same", "aiogpu@all-at-once", "aiogpu@3-a-turn"]
    assert [row["mode"] for row in written["rows"]] == modes
    assert written["answers_per_turn"] == dict(zip(modes, [1, 1, 0, 3], strict=True))
    assert all(row["server"].endswith("waiting with aiogpu") for row in written["rows"][1:])
    for mode in modes[1:]:
        assert f"{mode} / to_thread capacity: " in result.stdout


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
    model.close()


@pytest.mark.asyncio
@pytest.mark.parametrize(("answers_per_turn", "turns"), [(1, 6), (4, 2), (0, 1)])
async def test_a_batchs_answers_go_out_so_many_per_loop_turn(
    monkeypatch: pytest.MonkeyPatch, answers_per_turn: int, turns: int
) -> None:
    import asyncio

    monkeypatch.syspath_prepend(str(SERVING))
    import model as serving  # examples/serving/model.py

    model = serving.Model(answers_per_turn=answers_per_turn)  # no GPU here: the simulated device
    turn = 0

    async def count_turns() -> None:
        nonlocal turn
        while True:
            turn += 1
            await asyncio.sleep(0)

    async def predict(tokens: list[int]) -> int:
        await model.predict(tokens)
        return turn  # the loop turn its handler ran again on

    counter = asyncio.create_task(count_turns())
    try:
        returned = await asyncio.wait_for(asyncio.gather(*(predict([index + 1]) for index in range(6))), 10)
    finally:
        counter.cancel()
        model.close()
        await asyncio.gather(counter, return_exceptions=True)
    assert model.batches_run == 1  # one batch of six
    assert len(set(returned)) == turns, returned
    assert returned == sorted(returned)  # answered in the batch's order
    stats = model.batches.summary()
    assert stats["in_app_p50_ms"] >= stats["batch_wait_p50_ms"] >= 4  # the simulated 4 ms of GPU time


@pytest.mark.asyncio
async def test_a_requests_phases_add_up_to_its_time_in_the_server(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(SERVING))
    import model as serving  # examples/serving/model.py

    model = serving.Model()  # no GPU here: the simulated device
    try:
        await model.predict([1, 2, 3])
    finally:
        model.close()
    stats = model.batches.summary()  # of one request: its p50s are its phases
    phases = [stats[f"{phase}_p50_ms"] for phase in serving.REQUEST_PHASES[:-1]]
    assert all(phase >= 0 for phase in phases), stats
    assert stats["batch_wait_p50_ms"] >= 4  # the simulated 4 ms of GPU time
    assert sum(phases) == pytest.approx(stats["in_app_p50_ms"], rel=1e-9)


def test_answers_per_turn_must_not_be_negative(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(SERVING))
    import model as serving  # examples/serving/model.py

    with pytest.raises(ValueError, match="answers_per_turn must be 0 .all at once. or more, got -1"):
        serving.Model(answers_per_turn=-1)


@pytest.mark.slow
@pytest.mark.timeout(150)
@pytest.mark.parametrize("lend", ["pool", "queue"])
def test_the_per_request_server_predicts_with_either_way_of_lending_streams(lend: str) -> None:
    with running_server([sys.executable, str(SERVING / "per_request_server.py"), "--lend", lend]) as url:
        status, body = call(url + "/predict", {"tokens": list(range(1, 513))})
        assert status == 200, body
        assert isinstance(body, dict)
        assert len(body["outputs"]) == 16
        assert call(url + "/predict", {"tokens": list(range(1, 513))})[1] == body
        status, error = call(url + "/predict", {"tokens": [40_000]})
        assert status == 422, error
        assert "tokens must be 1 to 1024 ints" in str(error)
        status, stats = call(url + "/stats")
        assert status == 200, stats
        assert isinstance(stats, dict)
        assert stats["requests"] == 2  # the refused request is not counted
        assert stats["total"]["max_ms"] >= stats["wait"]["max_ms"] > 0


@pytest.mark.anyio
async def test_the_per_request_server_counts_requests_in_flight(monkeypatch: pytest.MonkeyPatch) -> None:
    import anyio

    monkeypatch.syspath_prepend(str(SERVING))
    import per_request_server  # examples/serving/per_request_server.py

    service = per_request_server.Service("aiogpu", "pool")  # the GPU, or the simulated device
    try:
        assert len(await service.predict([1, 2, 3])) == 16
        assert service.in_flight == 0
        with pytest.raises(ValueError, match="tokens must be"):
            await service.predict([])
        assert service.in_flight == 0  # refused before it was counted

        assert service.phases.summary()["requests"] == 1  # the refused one is not counted
        gate = anyio.Event()

        async def held(stream: object, tokens: list[int], marks: list[float]) -> list[float]:  # GPU work the test ends
            marks.append(time.perf_counter())  # enqueued
            await gate.wait()
            marks += [time.perf_counter()] * 2  # waited, read
            return [0.0] * 16

        monkeypatch.setattr(service, "_run", held)
        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:  # answered
                for _ in range(3):
                    tg.start_soon(service.predict, [4, 5, 6])
                await anyio.wait_all_tasks_blocked()
                assert (service.in_flight, service.pool.in_use) == (3, 3)
                gate.set()
            assert (service.in_flight, service.pool.in_use) == (0, 0)
            assert service.phases.summary()["requests"] == 4
            gate = anyio.Event()
            async with anyio.create_task_group() as tg:  # let go, as when their clients leave
                for _ in range(3):
                    tg.start_soon(service.predict, [4, 5, 6])
                await anyio.wait_all_tasks_blocked()
                assert service.in_flight == 3
                tg.cancel_scope.cancel()
            assert (service.in_flight, service.pool.in_use) == (0, 0)
            assert service.phases.summary()["requests"] == 4  # requests let go are not answered ones
    finally:
        service.close()
    monkeypatch.undo()
    del service, held
    gc.collect()  # on the GPU: were the network's buffers still alive, torch would free them here and abort


def test_phases_split_each_answered_request_into_its_parts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(SERVING))
    import per_request_server  # examples/serving/per_request_server.py

    phases = per_request_server.Phases()
    assert phases.summary()["requests"] == 0
    for step in range(1, 101):  # request i: 1 ms for a stream, i ms enqueueing, 2i ms waiting, no reading
        start = 10.0 * step
        phases.add(
            [start, start + 0.001, start + 0.001 * (1 + step), start + 0.001 * (1 + 3 * step), start + 0.001 * (1 + 3 * step)]
        )
    summary = phases.summary()
    assert summary["requests"] == 100
    assert summary["stream"] == pytest.approx({"mean_ms": 1.0, "p50_ms": 1.0, "p99_ms": 1.0, "max_ms": 1.0})
    assert summary["enqueue"] == pytest.approx({"mean_ms": 50.5, "p50_ms": 51.0, "p99_ms": 99.0, "max_ms": 100.0})
    assert summary["wait"] == pytest.approx({"mean_ms": 101.0, "p50_ms": 102.0, "p99_ms": 198.0, "max_ms": 200.0})
    assert summary["read"] == pytest.approx({"mean_ms": 0.0, "p50_ms": 0.0, "p99_ms": 0.0, "max_ms": 0.0})
    assert summary["total"] == pytest.approx({"mean_ms": 152.5, "p50_ms": 154.0, "p99_ms": 298.0, "max_ms": 301.0})
    with pytest.raises(ValueError, match="expected 5 marks"):
        phases.add([0.0, 1.0])  # every phase must be marked
    phases.clear()
    assert phases.summary()["requests"] == 0


def test_the_wrk_load_test_waits_for_the_warm_ups_requests(monkeypatch: pytest.MonkeyPatch) -> None:
    import http.server
    import json
    import threading

    monkeypatch.syspath_prepend(str(SERVING))
    import loadtest_wrk  # examples/serving/loadtest_wrk.py

    answers = [2, 1, 0]  # in_flight, as /health reports it poll after poll

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = json.dumps({"status": "ok", "in_flight": answers.pop(0) if len(answers) > 1 else answers[0]}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), Health) as health:
        threading.Thread(target=health.serve_forever, daemon=True).start()
        try:
            loadtest_wrk.wait_until_drained(health.server_address[1])
            assert answers == [0]  # it asked until the count reached 0
            answers[0] = 5
            with pytest.raises(RuntimeError, match="still had 5 requests in flight"):
                loadtest_wrk.wait_until_drained(health.server_address[1], timeout=0.2)
        finally:
            health.shutdown()


def test_the_wrk_load_test_reads_and_clears_the_servers_phases(monkeypatch: pytest.MonkeyPatch) -> None:
    import http.server
    import json
    import threading

    monkeypatch.syspath_prepend(str(SERVING))
    import loadtest_wrk  # examples/serving/loadtest_wrk.py
    import per_request_server  # examples/serving/per_request_server.py

    phases = per_request_server.Phases()
    phases.add([0.0, 0.002, 0.003, 0.013, 0.014])
    phases.add_app(0.016)

    class Stats(http.server.BaseHTTPRequestHandler):
        def answer(self, status: int, body: object) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            assert self.path == "/stats"
            self.answer(200, phases.summary())

        def do_DELETE(self) -> None:
            phases.clear()
            self.answer(200, {"cleared": True})

        def log_message(self, *args: object) -> None:
            pass

    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), Stats) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            port = server.server_address[1]
            read = loadtest_wrk.server_phases(port)
            assert read["requests"] == 1
            line = loadtest_wrk.phase_line(read)  # type: ignore[arg-type]
            assert (
                line
                == "stream 2.0 / 2.0  enqueue 1.0 / 1.0  wait 10.0 / 10.0  read 1.0 / 1.0  total 14.0 / 14.0  app 16.0 / 16.0"
            )
            loadtest_wrk.server_phases(port, "DELETE")
            assert loadtest_wrk.server_phases(port)["requests"] == 0
        finally:
            server.shutdown()


def test_the_wrk_summary_gives_every_run_of_every_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(SERVING))
    import loadtest_wrk  # examples/serving/loadtest_wrk.py

    def row(mode: str, repeat: int, rates: list[float], p99s: list[float], wait_p99: float) -> dict[str, object]:
        parts = {part: {"p50_ms": 0.5, "p99_ms": 1.0, "max_ms": 2.0} for part in ("stream", "enqueue", "read", "total", "app")}
        parts["wait"] = {"p50_ms": 1.0, "p99_ms": wait_p99, "max_ms": 9.0}
        slices = [
            {"round": n, "requests_per_second": rate, "p99_ms": p99}
            for n, (rate, p99) in enumerate(zip(rates, p99s, strict=True))
        ]
        figures = {"requests_per_second": sum(rates) / len(rates), "p50_ms": 100.0, "p99_ms": max(p99s), "max_ms": 400.0}
        return {
            "repeat": repeat,
            "mode": mode,
            "cpu_cores": 1.0,
            **figures,
            "timeouts": 0,
            "non_2xx": 0,
            "phases": parts,
            "slices": slices,
        }

    rows = [
        row("aiogpu", 0, [600.0, 580.8], [200.0, 222.0], 5.5),
        row("to_thread", 0, [550.0, 590.0], [210.0, 163.0], 4.0),
        row("aiogpu", 1, [597.0, 597.0], [156.0, 150.0], 6.3),  # no to_thread in this repeat: no rounds
    ]
    lines = loadtest_wrk.summarize(rows).splitlines()
    assert lines[2] == "| aiogpu | 590, 597 | 100, 100 | 222, 156 | 400, 400 | 0, 0 | 0, 0 | 1.00, 1.00 |"
    assert lines[3] == "| to_thread | 570 | 100 | 210 | 400 | 0 | 0 | 1.00 |"
    assert lines[5] == "Rounds against `to_thread` (its slice of the same round, seconds apart): more req/s; lower p99:"
    assert lines[7] == "- aiogpu: 1 and 1 of 2"  # round 0 more and lower; round 1 neither
    assert lines[11:13] == ["| way of waiting | stream | enqueue | wait | read | total | app |", "|---|---|---|---|---|---|---|"]
    assert lines[13] == "| aiogpu | 1.0, 1.0 | 1.0, 1.0 | 5.5, 6.3 | 1.0, 1.0 | 1.0, 1.0 | 1.0, 1.0 |"
    assert lines[14] == "| to_thread | 1.0 | 1.0 | 4.0 | 1.0 | 1.0 | 1.0 |"
    assert loadtest_wrk.rounds_won(rows, rows[1]) is None  # the reference itself
    assert loadtest_wrk.rounds_won(rows, rows[2]) is None  # no reference in its repeat


def test_the_wrk_load_test_pools_a_modes_slices_by_their_requests(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(SERVING))
    import loadtest_wrk  # examples/serving/loadtest_wrk.py

    def piece(requests: int, seconds: float, latency_ms: float, **more: float) -> dict[str, object]:
        figures = {"max_ms": latency_ms, "timeouts": 0, "non_2xx": 0, "cpu_seconds": seconds, "wall_seconds": 2 * seconds}
        return {"requests": requests, "seconds": seconds, "quantiles_ms": [latency_ms] * 4, **figures, **more}

    # 900 requests at 10 ms and 100 at 500 ms: the pooled p99 is the slow slice's, the p50 the fast one's.
    pooled = loadtest_wrk.pool([piece(900, 2.0, 10.0, timeouts=3), piece(100, 2.0, 500.0, non_2xx=1)])
    assert pooled == {
        "requests_per_second": 250.0,
        "p50_ms": 10.0,
        "p99_ms": 500.0,
        "max_ms": 500.0,
        "timeouts": 3,
        "non_2xx": 1,
        "cpu_cores": 0.5,
    }
    # 995 fast and 5 slow: under 1 % slow, so the p99 stays the fast one's.
    assert loadtest_wrk.pool([piece(995, 2.0, 10.0), piece(5, 2.0, 500.0)])["p99_ms"] == 10.0


@pytest.mark.timeout(200)
@pytest.mark.slow
def test_the_wrk_load_test_interleaves_every_modes_slices(tmp_path: Path) -> None:
    out = tmp_path / "wrk.json"
    command = [
        sys.executable,
        str(SERVING / "loadtest_wrk.py"),
        "--wrk",
        str(fake_wrk(tmp_path)),
        "--modes",
        "aiogpu",
        "to_thread",
        "--loop",
        "asyncio",
    ]
    result = subprocess.run(
        [*command, "--repeats", "1", "--slices", "2", "--seconds", "1", "--warmup", "1", "--out", str(out)],
        env=ENVIRONMENT,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    rows = json.loads(out.read_text())
    assert [row["mode"] for row in rows] == ["aiogpu", "to_thread"]
    for row in rows:
        assert row["server"].startswith("serving on ")  # the GPU, or the simulated device
        assert row["server"].endswith(f", waiting with {row['mode']}, streams lent by pool, on asyncio")
        assert [piece["round"] for piece in row["slices"]] == [0, 1]
        assert all(piece["requests"] > 0 and len(piece["quantiles_ms"]) == 1000 for piece in row["slices"])
        assert row["requests_per_second"] > 0
        assert row["max_ms"] >= row["p99_ms"] >= row["p50_ms"] > 0
        assert row["phases"]["requests"] == sum(piece["requests"] for piece in row["slices"])  # the warm-up's were cleared
        assert row["phases"]["app"]["mean_ms"] >= row["phases"]["total"]["mean_ms"] > 0  # the app's time holds the handler's
    assert "- aiogpu: " in out.with_suffix(".md").read_text()
    assert result.stdout.count("  slice ") == 4


WRK_OUTPUT = """Running 8s test @ http://127.0.0.1:8000/predict
  2 threads and 64 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency   120.51ms   40.12ms   1.20s    80.00%
    Req/Sec   260.00     30.00   310.00     70.00%
  Latency Distribution
     50%  118.20ms
     75%  140.00ms
     90%  170.00ms
     99%  401.50ms
  4123 requests in 8.00s, 1.00MB read
  Socket errors: connect 0, read 0, write 0, timeout 6
  Non-2xx or 3xx responses: 2
Requests/sec:    515.37
Transfer/sec:    128.00KB
"""
#: What ``loadtest_wrk``'s ``done`` hook adds: requests, duration (µs), 1,000 latency quantiles (µs).
SLICE_LINE = "slice: 4123 8000000 " + " ".join(str(100 * q) for q in range(1, 1001)) + "\n"


def test_the_wrk_report_is_read_with_its_units(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(SERVING))
    import loadtest_wrk  # examples/serving/loadtest_wrk.py

    figures = loadtest_wrk.parse_wrk(WRK_OUTPUT + SLICE_LINE)
    quantiles = figures.pop("quantiles_ms")
    assert figures == {
        "requests": 4123,
        "seconds": 8.0,
        "requests_per_second": 4123 / 8.0,
        "p50_ms": 118.2,
        "p99_ms": 401.5,
        "max_ms": 1200.0,
        "timeouts": 6,
        "non_2xx": 2,
    }
    assert len(quantiles) == 1000
    assert (quantiles[0], quantiles[-1]) == (0.1, 100.0)
    without_timeouts = WRK_OUTPUT.replace("  Socket errors: connect 0, read 0, write 0, timeout 6\n", "") + SLICE_LINE
    assert loadtest_wrk.parse_wrk(without_timeouts)["timeouts"] == 0
    with pytest.raises(ValueError, match="slice"):
        loadtest_wrk.parse_wrk(WRK_OUTPUT)  # a wrk run without the done hook
    with pytest.raises(ValueError, match="slice"):
        loadtest_wrk.parse_wrk("wrk: connection refused")
