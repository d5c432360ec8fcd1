"""The model behind both example servers, micro-batched, on a pool of streams over every GPU.

On a GPU it is a torch network with random weights (nothing is downloaded): token embeddings,
32 bf16 MLP blocks over every token, mean-pooled to 16 outputs — GPU-bound batches of 32
requests of up to 128 tokens. Without a GPU it runs on aiogpu's simulated device
with a CPU stand-in: 4 ms of simulated GPU time per batch and outputs computed in Python.

How a request waits for its batch (``mode``):

``aiogpu``     ``await`` the batch's event: the loop serves other requests meanwhile.
``blocking``   ``event.synchronize()`` in the handler: the loop stops until the GPU is done.
``to_thread``  ``await asyncio.to_thread(event.synchronize)``: a thread hand-off per batch.
"""

from __future__ import annotations

import argparse
import asyncio
import math
from dataclasses import dataclass, field

import aiogpu

MODES = ("aiogpu", "blocking", "to_thread")
TOKENS = 128
OUTPUTS = 16
VOCABULARY = 32_000
BLOCKS = 32  # bf16 MLP blocks over every token: GPU-bound batches


def server_arguments(description: str) -> argparse.Namespace:
    """The example servers' command line: ``--mode`` and ``--port``."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--mode", choices=MODES, default="aiogpu")
    parser.add_argument("--port", type=int, default=8000)
    return parser.parse_args()


@dataclass
class _Request:
    tokens: list[int]
    answer: asyncio.Future[list[float]] = field(default_factory=lambda: asyncio.get_running_loop().create_future())


class Model:
    def __init__(self, mode: str = "aiogpu", *, max_batch: int = 32, batch_window: float = 0.002) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        self.mode = mode
        self.max_batch = max_batch
        self.batch_window = batch_window
        try:
            devices = [aiogpu.Device(ordinal) for ordinal in range(aiogpu.Device.count())]
        except aiogpu.CudaUnavailableError:
            devices = []
        if devices:
            self.where = ", ".join(f"GPU {device.ordinal}: {device.name}" for device in devices)
            self._networks = {device: _torch_network(device) for device in devices}
        else:
            from aiogpu.testing import SimulatedDriver

            self._simulator = SimulatedDriver()
            devices = [self._simulator.device(0)]
            self.where = "the simulated device (no GPU)"
            self._networks = {}
        self.streams = aiogpu.StreamPool(devices, streams_per_device=2)
        self._pending: list[_Request] = []
        self._arrived = asyncio.Event()  # a request is pending
        self._full = asyncio.Event()  # a whole batch is pending
        self._batcher: asyncio.Task[None] | None = None
        self._batches: set[asyncio.Task[None]] = set()
        self.batches_run = 0

    async def predict(self, tokens: list[int]) -> list[float]:
        """The model's 16 outputs for up to 128 token ids (batched with concurrent requests)."""
        if not tokens or len(tokens) > TOKENS or not all(isinstance(t, int) and 0 <= t < VOCABULARY for t in tokens):
            raise ValueError(f"tokens must be 1 to {TOKENS} ints in [0, {VOCABULARY})")
        request = _Request(tokens)
        self._pending.append(request)
        self._arrived.set()
        if len(self._pending) >= self.max_batch:
            self._full.set()
        if self._batcher is None:
            self._batcher = asyncio.create_task(self._batch_forever())
        return await request.answer

    async def _batch_forever(self) -> None:
        while True:
            if not self._pending:
                self._arrived.clear()
                await self._arrived.wait()
            try:  # let the batch fill for a moment, unless it is full already
                await asyncio.wait_for(self._full.wait(), self.batch_window)
            except asyncio.TimeoutError:
                pass
            batch, self._pending = self._pending[: self.max_batch], self._pending[self.max_batch :]
            self._full.clear()
            if len(self._pending) >= self.max_batch:
                self._full.set()
            task = asyncio.create_task(self._run(batch))  # batches run concurrently, one per stream
            self._batches.add(task)
            task.add_done_callback(self._batches.discard)

    async def _run(self, batch: list[_Request]) -> None:
        try:
            async with self.streams.stream() as stream:
                outputs, done = self._enqueue(stream, batch)
                if self.mode == "aiogpu":
                    await done
                elif self.mode == "blocking":
                    done.synchronize()
                else:
                    await asyncio.to_thread(done.synchronize)
                done.close()
                answers = outputs()
        except Exception as error:  # every request of the batch gets the failure
            for request in batch:
                if not request.answer.done():
                    request.answer.set_exception(error)
            return
        self.batches_run += 1
        for request, answer in zip(batch, answers, strict=True):
            if not request.answer.done():
                request.answer.set_result(answer)

    def _enqueue(self, stream: aiogpu.Stream, batch: list[_Request]):  # type: ignore[no-untyped-def]
        """Enqueue the batch's work on ``stream`` (nothing waits here); return (read outputs, event)."""
        network = self._networks.get(stream.device)
        if network is None:  # the simulated device: 4 ms of GPU time, outputs computed on the CPU
            self._simulator.launch(stream, seconds=0.004)
            done = stream.record()
            return (lambda: [_stand_in(request.tokens) for request in batch]), done
        import torch

        with torch.cuda.stream(torch.cuda.ExternalStream(stream.handle, device=stream.device.ordinal)):
            ids = torch.zeros((len(batch), TOKENS), dtype=torch.int64)
            for row, request in enumerate(batch):
                ids[row, : len(request.tokens)] = torch.tensor(request.tokens)
            result = network(ids.pin_memory().to(f"cuda:{stream.device.ordinal}", non_blocking=True))
            host = torch.empty(result.shape, dtype=result.dtype, pin_memory=True)
            host.copy_(result, non_blocking=True)  # device to host, on the same stream
        done = stream.record()
        return (lambda: host.float().tolist()), done


def _stand_in(tokens: list[int]) -> list[float]:
    return [math.tanh(sum(tokens) * (index + 1) / 1e6) for index in range(OUTPUTS)]


def _torch_network(device: aiogpu.Device):  # type: ignore[no-untyped-def]
    import torch
    from torch import nn

    class Network(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(VOCABULARY, 2048)
            self.blocks = nn.ModuleList(
                nn.Sequential(nn.Linear(2048, 8192), nn.GELU(), nn.Linear(8192, 2048)) for _ in range(BLOCKS)
            )
            self.head = nn.Linear(2048, OUTPUTS)

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            x = self.embed(ids)
            for block in self.blocks:
                x = x + block(x)
            return torch.tanh(self.head(x.mean(dim=1)))

    torch.manual_seed(0)
    with torch.inference_mode():
        network = Network().to(device=f"cuda:{device.ordinal}", dtype=torch.bfloat16).eval()
    return torch.inference_mode()(network)
