"""A per-request inference server on FastAPI + uvicorn: no batching, one stream per request.

POST /predict {"tokens": [ints]} -> {"outputs": [16 floats]}; GET /health (with ``in_flight``,
the requests being served, those whose client left included). Each request borrows
a stream, enqueues its own forward pass (a 24-layer bf16 MLP over 1,024 tokens, random weights),
records an event and waits for it: the simplest GPU service there is. Without a GPU a CPU
stand-in runs on aiogpu's simulated device.

``--lend pool`` (the default) borrows streams from an :class:`aiogpu.StreamPool`, which serves
waiting requests first come, first served. ``--lend queue`` hands them out through an
``asyncio.Queue`` instead, as is often written; the queue is not fair (a getter that was woken
but had not run yet loses the stream to a newcomer and waits again), so under load some requests
wait for a stream far longer than the rest. ``loadtest_wrk.py`` measures both.

``--mode``: ``aiogpu`` (``await stream.record()``), ``aiogpu-STRATEGY`` (``poll``, ``thread`` or
``callback``), ``to_thread`` (``await asyncio.to_thread(event.synchronize)``) or ``blocking``.

Run:  python examples/serving/per_request_server.py [--mode aiogpu] [--lend pool] [--port 8000]
"""

# /// script
# dependencies = ["aiogpu", "fastapi", "uvicorn", "torch"]
# ///

from __future__ import annotations

import argparse
import asyncio
import gc
import math
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

import uvicorn
from fastapi import FastAPI, HTTPException
from pydantic import BaseModel

import aiogpu
from aiogpu.testing import SimulatedDriver, launch_spin

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable

MODES = ("aiogpu", "aiogpu-poll", "aiogpu-thread", "aiogpu-callback", "to_thread", "blocking")
STREAMS = 8
TOKENS = 1024
VOCABULARY = 32_000
OUTPUTS = 16
SIMULATED_SECONDS = 0.0015  # the stand-in's GPU time per request


class Prediction(BaseModel):
    tokens: list[int]


class Service:
    """The network on every stream it may run on, and how requests borrow those streams."""

    def __init__(self, mode: str, lend: str) -> None:
        self.mode = mode
        try:
            device = aiogpu.Device(0)
        except aiogpu.CudaUnavailableError:
            device = SimulatedDriver().device(0)
            self.where = "the simulated device (no GPU)"
            self._network = None
        else:
            self._network = _Network(device)
            self.where = f"GPU {device.ordinal}: {device.name}"
        self.pool = aiogpu.StreamPool([device], streams_per_device=STREAMS)
        self.in_flight = 0  # requests validated and not yet answered (a client that left still counts)
        self._queue: asyncio.Queue[aiogpu.Stream] | None = None
        if lend == "queue":
            self._queue = asyncio.Queue()
            for _ in range(STREAMS):
                self._queue.put_nowait(aiogpu.Stream(device))

    def close(self) -> None:
        """Free the network's buffers, then the streams. The order matters: torch's pinned-memory
        allocator records an event on every stream a buffer was used on when it frees the buffer,
        and on a destroyed stream that crashes the process (at whatever garbage collection frees
        the buffer)."""
        if self._network is not None:
            self._network.close()
        if self._queue is not None:
            while not self._queue.empty():
                self._queue.get_nowait().close()
        self.pool.close()

    async def predict(self, tokens: list[int]) -> list[float]:
        if not tokens or len(tokens) > TOKENS or not all(isinstance(t, int) and 0 <= t < VOCABULARY for t in tokens):
            raise ValueError(f"tokens must be 1 to {TOKENS} ints in [0, {VOCABULARY})")
        self.in_flight += 1
        try:
            if self._queue is None:
                async with self.pool.stream() as stream:
                    return await self._run(stream, tokens)
            stream = await self._queue.get()
            try:
                return await self._run(stream, tokens)
            finally:
                self._queue.put_nowait(stream)
        finally:
            self.in_flight -= 1

    async def _run(self, stream: aiogpu.Stream, tokens: list[int]) -> list[float]:
        if self._network is None:
            launch_spin(stream, SIMULATED_SECONDS)  # simulated GPU time
            read = lambda: [math.tanh(sum(tokens) * (i + 1) / 1e6) for i in range(OUTPUTS)]  # noqa: E731
        else:
            read = self._network.enqueue(stream, tokens)
        done = stream.record()
        try:
            if self.mode == "aiogpu":
                await done
            elif self.mode.startswith("aiogpu-"):
                await done.wait(strategy=self.mode.removeprefix("aiogpu-"))  # type: ignore[arg-type]
            elif self.mode == "to_thread":
                await asyncio.to_thread(done.synchronize)
            else:
                done.synchronize()
        finally:
            done.close()
        return read()


class _Network:
    """A 24-layer bf16 MLP over 1,024 tokens, mean-pooled to 16 outputs; pinned output buffers
    per stream (a stream serves one request at a time)."""

    def __init__(self, device: aiogpu.Device) -> None:
        import torch
        from torch import nn

        self._torch = torch
        self._cuda = torch.device("cuda", device.ordinal)
        torch.manual_seed(0)
        layers: list[nn.Module] = [nn.Embedding(VOCABULARY, 1024)]
        for _ in range(24):
            layers += [nn.Linear(1024, 1024), nn.GELU()]
        layers.append(nn.Linear(1024, OUTPUTS))
        self._model = nn.Sequential(*layers).to(self._cuda, torch.bfloat16).eval()
        self._outputs: dict[int, torch.Tensor] = {}

    def enqueue(self, stream: aiogpu.Stream, tokens: list[int]) -> Callable[[], list[float]]:
        torch = self._torch
        output = self._outputs.get(stream.handle)
        if output is None:
            output = self._outputs[stream.handle] = torch.empty(OUTPUTS, dtype=torch.bfloat16, pin_memory=True)
        ids = torch.tensor(tokens + [0] * (TOKENS - len(tokens)), dtype=torch.int64).pin_memory()
        with torch.inference_mode(), torch.cuda.stream(torch.cuda.ExternalStream(stream.handle, device=self._cuda)):
            result = self._model(ids.to(self._cuda, non_blocking=True)).mean(dim=0)
            output.copy_(result, non_blocking=True)
        return lambda: output.float().tolist()

    def close(self) -> None:
        self._outputs.clear()  # freed while their streams exist (Service.close)


def create_app(mode: str, lend: str) -> FastAPI:
    service = Service(mode, lend)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        gc.collect()
        gc.freeze()  # torch and the framework live as long as the server: keep full collections off them
        print(f"serving on {service.where}, waiting with {mode}, streams lent by {lend}", flush=True)
        yield
        service.close()

    app = FastAPI(lifespan=lifespan)

    @app.post("/predict")
    async def predict(request: Prediction) -> dict[str, list[float]]:
        try:
            return {"outputs": await service.predict(request.tokens)}
        except ValueError as error:
            raise HTTPException(status_code=422, detail=str(error)) from None

    @app.get("/health")
    async def health() -> dict[str, object]:
        return {"status": "ok", "mode": mode, "in_flight": service.in_flight}

    return app


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=MODES, default="aiogpu")
    parser.add_argument("--lend", choices=("pool", "queue"), default="pool")
    parser.add_argument("--port", type=int, default=8000)
    options = parser.parse_args()
    uvicorn.run(create_app(options.mode, options.lend), host="127.0.0.1", port=options.port, log_level="warning")
