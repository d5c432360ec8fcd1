"""The model behind both example servers, micro-batched, on a pool of streams over every GPU.

On a GPU it is a torch network with random weights (nothing is downloaded): token embeddings,
32 bf16 MLP blocks over every token, mean-pooled to 16 outputs. Batches are padded to 32
requests of 128 tokens and replayed from a CUDA graph (one per stream, captured at start-up),
as servers do to keep launch overhead off the event loop: every batch costs the GPU the same
time, and the loop only copies the inputs in and launches one graph. Without a GPU it runs on
aiogpu's simulated device with a CPU stand-in: 4 ms of simulated GPU time per batch and
outputs computed in Python.

The batcher takes a stream before it takes requests, so while every stream is busy requests
gather into the next batch instead of queueing as many small ones. ``Model.batches`` keeps, for
the last batches, how many requests each carried and how late its wait noticed the GPU's end
(``BatchStats``): the two things a way of waiting can change here; and where each request's
time in the server went (``REQUEST_PHASES``).

A finished batch's answers go out ``answers_per_turn`` at a time, one loop iteration apart: the
fewer per turn, the sooner the loop looks at a health check that arrived meanwhile, but each
group of answers waits one loop iteration more than the group before it
(``benchmarks/results/serving.md`` measures the trade).

How a request waits for its batch (``mode``):

``aiogpu``         ``await`` the batch's event: the loop serves other requests meanwhile.
``aiogpu-thread``  ``await event.wait(strategy="thread")``: the same, watched off the loop.
``blocking``       ``event.synchronize()`` in the handler: the loop stops until the GPU is done.
``to_thread``      ``await asyncio.to_thread(event.synchronize)``: a thread hand-off per batch.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import itertools
import math
import time
from collections import deque
from dataclasses import dataclass, field

import aiogpu

MODES = ("aiogpu", "aiogpu-thread", "blocking", "to_thread")
TOKENS = 128
OUTPUTS = 16
VOCABULARY = 32_000
BLOCKS = 32  # bf16 MLP blocks over every token: GPU-bound batches
HUNG_AFTER = 10.0  # seconds a batch may take before /health reports the server stuck


def server_arguments(description: str) -> argparse.Namespace:
    """The example servers' command line: ``--mode``, ``--port`` and ``--answers-per-turn``."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--mode", choices=MODES, default="aiogpu")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument(
        "--answers-per-turn",
        type=answers_per_turn_argument,
        default=1,
        help="a batch's answers handed out per loop iteration (0: all at once); see Model",
    )
    return parser.parse_args()


def answers_per_turn_argument(text: str) -> int:
    """An ``--answers-per-turn`` value: 0 (all at once) or a positive count."""
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected 0 (all at once) or a positive count, got {text!r}")
    return int(text)


class BatchStats:
    """The last 10,000 batches run: how many requests each carried, how long its wait took
    (from its launch to its task running again) and how much of that came after the GPU had
    finished it (*late*: the wait less the GPU's own time from the launch to the batch's end,
    timed with events); where the last 10,000 requests answered spent their time in the server
    (``REQUEST_PHASES``); and the CPU the loop's thread and the whole process took meanwhile.
    Used from the loop's thread only."""

    def __init__(self) -> None:
        self._batches: deque[tuple[int, float, float]] = deque(maxlen=10_000)
        self._requests: deque[tuple[float, ...]] = deque(maxlen=10_000)
        self._since = _clocks()

    def add(self, size: int, wait: float, gpu: float) -> None:
        """One batch of ``size`` requests, waited for ``wait`` seconds, ``gpu`` of which the GPU ran it."""
        self._batches.append((size, wait, wait - gpu))

    def add_request(self, request: _Request, returned: float) -> None:
        """One request answered, its handler running again at ``returned`` (``time.perf_counter()``)."""
        marks = (request.arrived, request.launched, request.resumed, request.answered, returned)
        self._requests.append((*(later - earlier for earlier, later in itertools.pairwise(marks)), returned - request.arrived))

    def clear(self) -> None:
        self._batches.clear()
        self._requests.clear()
        self._since = _clocks()

    def summary(self) -> dict[str, float | None]:
        """``{"batches", "mean_size", "wait_p50_ms", "wait_p99_ms", "late_p50_ms", "late_p99_ms",
        "loop_cores", "cores"}``, and ``PHASE_p50_ms`` and ``PHASE_p99_ms`` for each of
        ``REQUEST_PHASES`` (the batches' and requests' figures ``None`` before any; the cores are
        CPU time over wall time since the last ``clear``)."""
        sizes = [size for size, _, _ in self._batches]
        wall, loop_cpu, cpu = (now - then for now, then in zip(_clocks(), self._since, strict=True))
        summary: dict[str, float | None] = {
            "batches": len(sizes),
            "mean_size": sum(sizes) / len(sizes) if sizes else None,
            "loop_cores": loop_cpu / wall,
            "cores": cpu / wall,
        }
        columns = [("wait", self._batches, 1), ("late", self._batches, 2)]
        columns += [(name, self._requests, index) for index, name in enumerate(REQUEST_PHASES)]
        for name, rows, column in columns:
            ordered = sorted(row[column] for row in rows)
            for label, share in (("p50", 0.5), ("p99", 0.99)):
                summary[f"{name}_{label}_ms"] = ordered[round(share * (len(ordered) - 1))] * 1e3 if ordered else None
        return summary


#: Where a request's time in the server goes: until its batch is launched, the batch's wait for
#: the GPU (launch to its task running again), until its answer is set (the batch's answers go
#: out ``answers_per_turn`` per loop iteration), until its handler runs again, and all of it.
REQUEST_PHASES = ("queued", "batch_wait", "answering", "resuming", "in_app")


def _clocks() -> tuple[float, float, float]:
    """Wall time, this thread's CPU time and the process's."""
    return time.perf_counter(), time.thread_time(), time.process_time()


@dataclass
class _Request:
    tokens: list[int]
    answer: asyncio.Future[list[float]] = field(default_factory=lambda: asyncio.get_running_loop().create_future())
    arrived: float = field(default_factory=time.perf_counter)  # these four: time.perf_counter()
    launched: float = 0.0  # its batch about to be enqueued (the batch wait counts from here)
    resumed: float = 0.0  # its batch's task running again after the wait
    answered: float = 0.0  # its answer set


class Model:
    def __init__(
        self,
        mode: str = "aiogpu",
        *,
        max_batch: int = 32,
        batch_window: float = 0.002,
        streams_per_device: int = 2,
        answers_per_turn: int = 1,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        if answers_per_turn < 0:
            raise ValueError(f"answers_per_turn must be 0 (all at once) or more, got {answers_per_turn}")
        self.mode = mode
        self.answers_per_turn = answers_per_turn
        self.max_batch = max_batch
        self.batch_window = batch_window
        try:
            devices = [aiogpu.Device(ordinal) for ordinal in range(aiogpu.Device.count())]
        except aiogpu.CudaUnavailableError:
            devices = []
        self._graphs: dict[aiogpu.Device, list[_Graph]] = {}  # graphs not yet bound to a stream
        self._graph_of: dict[aiogpu.Stream, _Graph] = {}  # each stream replays its own graph
        if devices:
            self.where = ", ".join(f"GPU {device.ordinal}: {device.name}" for device in devices)
            for device in devices:
                network = _torch_network(device)
                self._graphs[device] = [_Graph(network, device, max_batch) for _ in range(streams_per_device)]
        else:
            from aiogpu.testing import SimulatedDriver

            self._simulator = SimulatedDriver()
            devices = [self._simulator.device(0)]
            self.where = "the simulated device (no GPU)"
        self.streams = aiogpu.StreamPool(devices, streams_per_device=streams_per_device)
        self._pending: list[_Request] = []
        self._arrived = asyncio.Event()  # a request is pending
        self._full = asyncio.Event()  # a whole batch is pending
        self._batcher: asyncio.Task[None] | None = None
        self._batches: set[asyncio.Task[None]] = set()
        self.batches_run = 0
        self.batches = BatchStats()

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
        outputs = await request.answer
        self.batches.add_request(request, time.perf_counter())
        return outputs

    def close(self) -> None:
        """Stop taking batches; free the graphs' buffers, then the streams. The order matters:
        torch's pinned-memory allocator records an event on every stream a buffer was used on
        when it frees the buffer, and on a destroyed stream that crashes the process."""
        if self._batcher is not None:
            self._batcher.cancel()
        self._graph_of.clear()
        self._graphs.clear()
        self.streams.close()

    def health(self) -> tuple[bool, dict[str, object]]:
        """Whether the server is healthy, and the ``/health`` body: unhealthy while a GPU wait
        has been pending longer than ``HUNG_AFTER`` seconds (work that will never finish)."""
        stuck = [wait for wait in aiogpu.pending_waits() if wait.age > HUNG_AFTER]
        body: dict[str, object] = {"status": "stuck" if stuck else "ok", "mode": self.mode, "batches": self.batches_run}
        if stuck:
            body["oldest_wait_s"] = round(stuck[0].age, 1)
        return not stuck, body

    async def _batch_forever(self) -> None:
        while True:
            if not self._pending:
                self._arrived.clear()
                await self._arrived.wait()
            stream = await self.streams.acquire()  # while all are busy, requests gather meanwhile
            try:  # let the batch fill for a moment, unless it is full already
                await asyncio.wait_for(self._full.wait(), self.batch_window)
            except asyncio.TimeoutError:
                pass
            except BaseException:
                self.streams.release(stream)
                raise
            batch, self._pending = self._pending[: self.max_batch], self._pending[self.max_batch :]
            self._full.clear()
            if len(self._pending) >= self.max_batch:
                self._full.set()
            task = asyncio.create_task(self._run(stream, batch))  # batches run concurrently, one per stream
            self._batches.add(task)
            task.add_done_callback(self._batches.discard)

    async def _run(self, stream: aiogpu.Stream, batch: list[_Request]) -> None:
        graph = self._graph_of.get(stream)
        if graph is None and self._graphs.get(stream.device):  # one per stream of the device
            graph = self._graph_of[stream] = self._graphs[stream.device].pop()
        try:
            started = stream.record(timing=True)  # the stream is idle: the batch's GPU time starts here
            launched = time.perf_counter()
            outputs, done = self._enqueue(stream, graph, batch)
            if self.mode == "aiogpu":
                await done
            elif self.mode == "aiogpu-thread":
                await done.wait(strategy="thread")
            elif self.mode == "blocking":
                done.synchronize()
            else:
                await asyncio.to_thread(done.synchronize)
            resumed = time.perf_counter()
            waited = resumed - launched
            self.batches.add(len(batch), waited, started.elapsed_time(done) / 1e3)
            started.close()
            done.close()
            answers = outputs()
        except Exception as error:  # every request of the batch gets the failure
            for request in batch:
                if not request.answer.done():
                    request.answer.set_exception(error)
            return
        finally:
            self.streams.release(stream)
        self.batches_run += 1
        per_turn = self.answers_per_turn or len(batch)
        for index, (request, answer) in enumerate(zip(batch, answers, strict=True)):
            if not request.answer.done():
                request.launched, request.resumed, request.answered = launched, resumed, time.perf_counter()
                request.answer.set_result(answer)
            if index % per_turn == per_turn - 1:
                # The answered requests' handlers write their responses in the next iteration; the
                # loop looks for new requests (a health check) before the next few are answered.
                await asyncio.sleep(0)

    def _enqueue(self, stream: aiogpu.Stream, graph: _Graph | None, batch: list[_Request]):  # type: ignore[no-untyped-def]
        """Enqueue the batch's work on ``stream`` (nothing waits here); return (read outputs, a
        timed event after the work)."""
        if graph is None:  # the simulated device: 4 ms of GPU time, outputs computed on the CPU
            self._simulator.launch(stream, seconds=0.004)
            done = stream.record(timing=True)
            return (lambda: [_stand_in(request.tokens) for request in batch]), done
        outputs = graph.enqueue(stream, [request.tokens for request in batch])
        graph.last = stream.record(timing=True)
        return outputs, graph.last


class _Graph:
    """The network captured as a CUDA graph over a full padded batch, with its own buffers.

    Bound to one stream, so its batches run in order on the device; its host buffers are
    reused by the next batch, which waits for the last one's copies if that batch was abandoned.
    """

    def __init__(self, network, device: aiogpu.Device, rows: int) -> None:  # type: ignore[no-untyped-def]
        import torch

        cuda = torch.device("cuda", device.ordinal)
        self.host_ids = torch.zeros((rows, TOKENS), dtype=torch.int64, pin_memory=True)
        self.ids = torch.zeros((rows, TOKENS), dtype=torch.int64, device=cuda)
        warm_up = torch.cuda.Stream(cuda)  # capture needs cuBLAS and the allocator warmed up off the default stream
        warm_up.wait_stream(torch.cuda.current_stream(cuda))
        with torch.cuda.stream(warm_up):
            for _ in range(2):
                network(self.ids)
        torch.cuda.current_stream(cuda).wait_stream(warm_up)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.device(cuda), torch.cuda.graph(self.graph):
            self.outputs = network(self.ids)
        self.host_outputs = torch.empty(self.outputs.shape, dtype=self.outputs.dtype, pin_memory=True)
        self.last: aiogpu.Event | None = None  # the last batch's completion

    def enqueue(self, stream: aiogpu.Stream, rows: list[list[int]]):  # type: ignore[no-untyped-def]
        """Copy ``rows`` in, replay, copy the outputs out, all on ``stream``; return the reader."""
        import torch

        if self.last is not None and not self.last.is_closed and not self.last.is_done:  # after a cancelled batch only
            self.last.synchronize()  # its copy may not have read host_ids yet
        self.host_ids.zero_()
        for row, tokens in enumerate(rows):
            self.host_ids[row, : len(tokens)] = torch.tensor(tokens)
        with torch.cuda.stream(torch.cuda.ExternalStream(stream.handle, device=stream.device.ordinal)):
            self.ids.copy_(self.host_ids, non_blocking=True)
            self.graph.replay()
            self.host_outputs.copy_(self.outputs, non_blocking=True)
        return lambda: self.host_outputs[: len(rows)].float().tolist()


def freeze_startup_objects() -> None:
    """Move everything alive at start-up (torch, the network, the web framework) out of the
    garbage collector's sight: they live as long as the server, and full collections that walk
    them would stall the loop for tens of milliseconds under load."""
    gc.collect()
    gc.freeze()


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
