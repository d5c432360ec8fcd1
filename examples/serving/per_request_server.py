"""A per-request inference server on FastAPI + uvicorn: no batching, one stream per request.

POST /predict {"tokens": [ints]} -> {"outputs": [16 floats]}; GET /health (with ``in_flight``,
the requests being served, those whose client left included); GET /stats, how long answered
requests spent waiting for a stream, enqueueing, awaiting their work and reading it (mean, p50,
p99, max; DELETE /stats starts over). Each request borrows
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
``--loop``: uvicorn's ``auto`` (uvloop where it is installed), ``asyncio`` or ``uvloop``.

Run:  python examples/serving/per_request_server.py [--mode aiogpu] [--lend pool] [--loop auto]
          [--port 8000]
"""

# /// script
# dependencies = ["aiogpu", "fastapi", "uvicorn", "torch"]
# ///

from __future__ import annotations

import argparse
import asyncio
import gc
import math
import time
from collections import deque
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import uvicorn
from fastapi import FastAPI, HTTPException
from pydantic import BaseModel

import aiogpu
from aiogpu.testing import SimulatedDriver, launch_spin

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable

MODES = ("aiogpu", "aiogpu-poll", "aiogpu-thread", "aiogpu-callback", "to_thread", "blocking")
STREAMS = 8
TOKENS = 1024
VOCABULARY = 32_000
OUTPUTS = 16
SIMULATED_SECONDS = 0.0015  # the stand-in's GPU time per request
#: The phases of a request in ``Service.predict``, each ended by a mark: waiting for a stream,
#: enqueueing the work (and recording its event), awaiting it (the GPU's time and the wake-up),
#: reading the outputs.
PHASES = ("stream", "enqueue", "wait", "read")


class Prediction(BaseModel):
    tokens: list[int]


class Phases:
    """How long the last 100,000 answered requests spent in each of ``PHASES`` and in all
    (``total``), and in the web app (``app``: ``TimedApp``)."""

    def __init__(self) -> None:
        self._seconds = {name: deque[float](maxlen=100_000) for name in (*PHASES, "total", "app")}

    def add(self, marks: list[float]) -> None:
        """One answered request: ``time.perf_counter()`` at its start and at the end of each phase."""
        if len(marks) != len(PHASES) + 1:
            raise ValueError(f"expected {len(PHASES) + 1} marks (the start, then the end of each of {PHASES}), got {len(marks)}")
        for name, begin, end in zip(PHASES, marks[:-1], marks[1:], strict=True):
            self._seconds[name].append(end - begin)
        self._seconds["total"].append(marks[-1] - marks[0])

    def add_app(self, seconds: float) -> None:
        """One answer handed to the server ``seconds`` after the app was called for its request."""
        self._seconds["app"].append(seconds)

    def clear(self) -> None:
        for seconds in self._seconds.values():
            seconds.clear()

    def summary(self) -> dict[str, object]:
        """``{"requests": n, PHASE: {"mean_ms", "p50_ms", "p99_ms", "max_ms"}, ..., "total": {...},
        "app": {...}}``. The phases' means add up to the total's; their percentiles do not. The
        app's time holds the total's and the framework's work around it (reading and checking
        the body, writing the answer); a client's latency beyond it was spent before the app was
        called or after its answer was handed over."""
        summary: dict[str, object] = {"requests": len(self._seconds["total"])}
        for name, seconds in self._seconds.items():
            ordered = sorted(seconds) or [0.0]
            summary[name] = {
                "mean_ms": sum(ordered) / len(ordered) * 1e3,
                "p50_ms": _at(ordered, 0.5) * 1e3,
                "p99_ms": _at(ordered, 0.99) * 1e3,
                "max_ms": ordered[-1] * 1e3,
            }
        return summary


class TimedApp:
    """ASGI middleware: for each ``POST /predict``, the time from the app's call to the last
    byte of its answer handed to the server (``Phases.add_app``)."""

    def __init__(self, app: Callable[..., Awaitable[None]], phases: Phases) -> None:
        self.app = app
        self.phases = phases

    async def __call__(
        self, scope: dict[str, Any], receive: Callable[..., Awaitable[Any]], send: Callable[..., Awaitable[None]]
    ) -> None:
        if scope["type"] != "http" or scope["path"] != "/predict":
            return await self.app(scope, receive, send)
        called = time.perf_counter()

        async def timed_send(message: dict[str, Any]) -> None:
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                self.phases.add_app(time.perf_counter() - called)

        return await self.app(scope, receive, timed_send)


def _at(ordered: list[float], share: float) -> float:
    """The value a ``share`` of the way up ``ordered`` (the load tests' own ``percentile``: the
    server stands alone, without their helpers)."""
    return ordered[round(share * (len(ordered) - 1))]


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
        self.phases = Phases()
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
        marks = [time.perf_counter()]
        try:
            if self._queue is None:
                async with self.pool.stream() as stream:
                    marks.append(time.perf_counter())
                    outputs = await self._run(stream, tokens, marks)
            else:
                stream = await self._queue.get()
                marks.append(time.perf_counter())
                try:
                    outputs = await self._run(stream, tokens, marks)
                finally:
                    self._queue.put_nowait(stream)
        finally:
            self.in_flight -= 1
        self.phases.add(marks)
        return outputs

    async def _run(self, stream: aiogpu.Stream, tokens: list[int], marks: list[float]) -> list[float]:
        """Run the network on ``stream``; mark the end of enqueueing, waiting and reading."""
        if self._network is None:
            launch_spin(stream, SIMULATED_SECONDS)  # simulated GPU time
            read = lambda: [math.tanh(sum(tokens) * (i + 1) / 1e6) for i in range(OUTPUTS)]  # noqa: E731
        else:
            read = self._network.enqueue(stream, tokens)
        done = stream.record()
        marks.append(time.perf_counter())
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
        marks.append(time.perf_counter())
        outputs = read()
        marks.append(time.perf_counter())
        return outputs


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
        loop = "uvloop" if type(asyncio.get_running_loop()).__module__.startswith("uvloop") else "asyncio"
        print(f"serving on {service.where}, waiting with {mode}, streams lent by {lend}, on {loop}", flush=True)
        yield
        service.close()

    app = FastAPI(lifespan=lifespan)
    app.add_middleware(TimedApp, phases=service.phases)

    @app.post("/predict")
    async def predict(request: Prediction) -> dict[str, list[float]]:
        try:
            return {"outputs": await service.predict(request.tokens)}
        except ValueError as error:
            raise HTTPException(status_code=422, detail=str(error)) from None

    @app.get("/health")
    async def health() -> dict[str, object]:
        return {"status": "ok", "mode": mode, "in_flight": service.in_flight}

    @app.get("/stats")
    async def stats() -> dict[str, object]:
        """Where answered requests spent their time in the server (``Phases.summary``)."""
        return service.phases.summary()

    @app.delete("/stats")
    async def clear_stats() -> dict[str, object]:
        service.phases.clear()
        return {"cleared": True}

    return app


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=MODES, default="aiogpu")
    parser.add_argument("--lend", choices=("pool", "queue"), default="pool")
    parser.add_argument("--loop", choices=("auto", "asyncio", "uvloop"), default="auto")
    parser.add_argument("--port", type=int, default=8000)
    options = parser.parse_args()
    app = create_app(options.mode, options.lend)
    uvicorn.run(app, host="127.0.0.1", port=options.port, log_level="warning", loop=options.loop)
