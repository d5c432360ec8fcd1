"""One Ray Serve replica per GPU, each awaiting its GPU with aiogpu.

Ray Serve takes a service past one process and one machine: it runs replicas of a deployment
as Ray actors, on every node of a cluster, behind one HTTP proxy. Here each replica asks Ray
for one GPU (``num_gpus=1``: Ray sets the replica's ``CUDA_VISIBLE_DEVICES``, so
``aiogpu.Device(0)`` is its GPU) and makes its own :class:`aiogpu.StreamPool` when Ray
constructs it, on the event loop that serves its requests. A request takes a stream, enqueues
its GPU work, records an event and awaits it: meanwhile the replica's loop answers other
requests and Ray Serve's health checks, which ``check_health`` turns into a real one (it fails
while a GPU wait is stuck, and Ray replaces the replica).

POST /predict {"tokens": [ints]} -> {"outputs": [16 floats]}; GET /health (503 while a GPU wait
is stuck: ``aiogpu.pending_waits``). The GPU work is a small torch computation standing in for
a model; without a GPU, one replica runs on aiogpu's simulated device with a CPU stand-in.

Run:  python examples/ray_serve/app.py [--port 8000]   (a local Ray cluster; Ctrl-C stops it)
 or:  cd examples/ray_serve && serve run --working-dir . app:build [gpus=N]   (N: the cluster's GPUs)
"""

# /// script
# dependencies = ["aiogpu", "ray[serve]", "torch"]
# ///

# No ``from __future__ import annotations``: Serve's class-based FastAPI views resolve the route
# parameters' annotations outside this module, so ``Prediction`` must be a class there, not a name.

import argparse
import math
import signal
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, HTTPException
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from ray import serve

import aiogpu

if TYPE_CHECKING:
    from collections.abc import Callable

    from ray.serve import Application

TOKENS = 128
OUTPUTS = 16
VOCABULARY = 32_000
SIMULATED_SECONDS = 0.004  # simulated GPU time per request
HUNG_AFTER = 60.0  # seconds a GPU wait may take before the replica reports itself stuck

# The helpers come before the deployment: Serve pickles the class when it is decorated, with
# the module's globals that exist at that point.


def stand_in(tokens: list[int]) -> list[float]:
    """The outputs the stand-in model gives for ``tokens`` (on the GPU and on the CPU alike)."""
    return [math.tanh(sum(tokens) * (index + 1) / 1e6) for index in range(OUTPUTS)]


def _enqueue_simulated(simulator: Any, stream: aiogpu.Stream, tokens: list[int]) -> "Callable[[], list[float]]":
    simulator.launch(stream, seconds=SIMULATED_SECONDS)  # simulated GPU time; outputs from the CPU
    return lambda: stand_in(tokens)


def _enqueue_on_gpu(stream: aiogpu.Stream, tokens: list[int]) -> "Callable[[], list[float]]":
    """Enqueue the stand-in model on ``stream`` (nothing waits here); return its output reader."""
    import torch

    cuda = torch.device("cuda", stream.device.ordinal)
    with torch.cuda.stream(torch.cuda.ExternalStream(stream.handle, device=cuda)):
        ids = torch.tensor(tokens, dtype=torch.float64).pin_memory().to(cuda, non_blocking=True)
        scale = torch.arange(1, OUTPUTS + 1, dtype=torch.float64, device=cuda)
        host = torch.empty(OUTPUTS, dtype=torch.float64, pin_memory=True)
        host.copy_(torch.tanh(ids.sum() * scale / 1e6), non_blocking=True)
    return host.tolist


api = FastAPI()


class Prediction(BaseModel):
    tokens: list[int]


@serve.deployment(max_ongoing_requests=64, health_check_period_s=10, health_check_timeout_s=30)
@serve.ingress(api)
class Predictor:
    """A replica: one GPU (or the simulated device), its own pool of streams.

    Args:
        streams: How many streams the replica's pool holds (requests beyond that wait for one).
        hold_gpu_work: Tests only: every request's GPU work waits until :meth:`release_gpu_work`
            (an :class:`aiogpu.testing.Latch` on the replica's device), so a test can see what
            the replica does while GPU work is pending, with no sleep.
    """

    def __init__(self, *, streams: int = 2, hold_gpu_work: bool = False) -> None:
        # Ray runs the constructor in the replica's process, on the loop that will serve its
        # requests: the pool and its streams belong to this replica and its loop alone.
        try:
            gpus = aiogpu.Device.count()
        except aiogpu.CudaUnavailableError:
            gpus = 0
        if gpus:
            device = aiogpu.Device(0)  # the one GPU Ray gave this replica
            self.where = f"GPU {device.name}"
            self._enqueue: Callable[[aiogpu.Stream, list[int]], Callable[[], list[float]]] = _enqueue_on_gpu
        else:
            from aiogpu.testing import SimulatedDriver

            simulator = SimulatedDriver()
            device = simulator.device(0)
            self.where = "the simulated device (no GPU)"
            self._enqueue = lambda stream, tokens: _enqueue_simulated(simulator, stream, tokens)
        self.streams = aiogpu.StreamPool([device], streams_per_device=streams)
        self._latch = None
        if hold_gpu_work:
            from aiogpu.testing import Latch

            self._latch = Latch(device)
        self.health_checks = 0

    @api.post("/predict")
    async def predict(self, request: Prediction) -> dict[str, list[float]]:
        tokens = request.tokens
        if not tokens or len(tokens) > TOKENS or not all(0 <= token < VOCABULARY for token in tokens):
            raise HTTPException(status_code=422, detail=f"tokens must be 1 to {TOKENS} ints in [0, {VOCABULARY})")
        async with self.streams.stream() as stream:
            if self._latch is not None:
                self._latch.block(stream)
            read_outputs = self._enqueue(stream, tokens)
            done = stream.record()
            try:
                await done  # the loop serves other requests and health checks meanwhile
            finally:
                done.close()
        return {"outputs": read_outputs()}

    @api.get("/health")
    async def health(self) -> JSONResponse:
        """For load balancers outside Ray: the loop's GPU waits, and how many of Ray's checks it answered."""
        waits = aiogpu.pending_waits()
        stuck = [wait for wait in waits if wait.age > HUNG_AFTER]
        body: dict[str, Any] = {
            "status": "stuck" if stuck else "ok",
            "where": self.where,
            "gpu_waits": len(waits),
            "health_checks": self.health_checks,
        }
        return JSONResponse(body, status_code=503 if stuck else 200)

    async def check_health(self) -> None:
        """Ray Serve's health check, called every ``health_check_period_s`` on the replica's loop.

        An answer at all shows the loop is free; raising marks the replica unhealthy (after
        three failures in a row Ray Serve replaces it). It is ``async`` so that Ray runs it on
        the loop, where ``aiogpu.pending_waits`` sees the loop's waits.
        """
        self.health_checks += 1
        stuck = [wait for wait in aiogpu.pending_waits() if wait.age > HUNG_AFTER]
        if stuck:
            raise RuntimeError(f"a GPU wait has been pending for {stuck[0].age:.0f} s on {self.where}")

    async def release_gpu_work(self) -> None:
        """Tests only: let the GPU work held by ``hold_gpu_work=True`` run."""
        if self._latch is None:
            raise RuntimeError("release_gpu_work needs a replica made with hold_gpu_work=True")
        self._latch.release()

    def __del__(self) -> None:
        # Ray Serve calls this when it stops the replica (after its requests finish).
        if (latch := getattr(self, "_latch", None)) is not None:
            latch.close()
        if (streams := getattr(self, "streams", None)) is not None:
            streams.close()


def build(args: dict[str, str]) -> "Application":
    """The application for ``serve run app:build [gpus=N]``: N replicas of one GPU each.

    ``gpus`` defaults to this machine's GPUs; with none, one replica on the simulated device.
    """
    if "gpus" in args:
        if not args["gpus"].isdigit():
            raise ValueError(f"gpus must be a whole number of GPUs, got {args['gpus']!r}")
        gpus = int(args["gpus"])
    else:
        try:
            gpus = aiogpu.Device.count()
        except aiogpu.CudaUnavailableError:
            gpus = 0
    return Predictor.options(num_replicas=max(gpus, 1), ray_actor_options={"num_gpus": 1 if gpus else 0}).bind()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=8000)
    arguments = parser.parse_args()
    import ray

    ray.init()  # a local cluster (or the one RAY_ADDRESS names)
    gpus = int(ray.cluster_resources().get("GPU", 0))
    serve.start(http_options={"host": "127.0.0.1", "port": arguments.port})
    serve.run(build({"gpus": str(gpus)}))
    replicas = f"{gpus} replica{'s' if gpus > 1 else ''}, one per GPU" if gpus else "1 replica on the simulated device (no GPU)"
    print(f"serving on http://127.0.0.1:{arguments.port} with {replicas}; Ctrl-C stops", flush=True)
    try:
        signal.pause()  # the replicas serve; this process only keeps the local cluster up
    except KeyboardInterrupt:
        pass
    finally:
        serve.shutdown()
        ray.shutdown()


if __name__ == "__main__":
    main()
