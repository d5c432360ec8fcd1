"""Testing the service without a GPU, with aiogpu's pytest plugin.

Run: ``pytest -p aiogpu.testing.pytest_plugin examples/testing_a_service`` (or put
``pytest_plugins = ["aiogpu.testing.pytest_plugin"]`` in your conftest.py). anyio's plugin
runs the async tests.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import anyio
import pytest
from service import Service

if TYPE_CHECKING:
    from aiogpu.testing import SimulatedDriver


@pytest.mark.anyio
async def test_a_request_waits_for_its_gpu_work(simulated_gpu: SimulatedDriver) -> None:
    held = []
    service = Service(enqueue=lambda stream: held.append(simulated_gpu.launch(stream)))  # held until released
    answers: list[str] = []

    async def request() -> None:
        answers.append(await service.handle("a"))

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(request)
            await anyio.wait_all_tasks_blocked()
            assert answers == []  # the GPU work is not done: the request is still waiting
            held[0].release()
    assert answers == ["a: ok"]
    service.close()


@pytest.mark.anyio
async def test_a_gpu_fault_becomes_an_error_response(simulated_gpu: SimulatedDriver) -> None:
    service = Service()
    simulated_gpu.fail_next_record("CUDA_ERROR_ILLEGAL_ADDRESS")
    with anyio.fail_after(5):
        assert await service.handle("b") == "b: failed (CUDA_ERROR_ILLEGAL_ADDRESS)"
    service.close()


@pytest.mark.anyio
@pytest.mark.simulated_gpu(record_latency=0.002)  # every recorded piece of work takes 2 ms
async def test_concurrent_requests_all_complete(simulated_gpu: SimulatedDriver) -> None:
    service = Service(streams=2)
    answers: list[str] = []

    async def request(name: str) -> None:
        answers.append(await service.handle(name))

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            for name in "cdefgh":
                tg.start_soon(request, name)
    assert sorted(answers) == [f"{name}: ok" for name in "cdefgh"]
    service.close()


@pytest.mark.anyio
@pytest.mark.simulated_gpu(hold_recordings=True)  # no recorded work completes until released
async def test_a_request_times_out_when_the_gpu_is_stuck(simulated_gpu: SimulatedDriver) -> None:
    service = Service(streams=1, timeout=0.05)
    with anyio.fail_after(5):
        assert await service.handle("i") == "i: timed out"
        simulated_gpu.release_recordings()  # the GPU catches up: later requests complete
        assert await service.handle("j") == "j: ok"
    service.close()
