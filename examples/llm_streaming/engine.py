"""Continuous batching for a token-streaming server: one scheduler coroutine, one decode step at a time.

On a GPU the model is a Llama built by ``transformers`` from a config with random weights (no
download), in bf16. Each step runs the model over a fixed window of the last ``WINDOW`` tokens
of every slot, without a KV cache: the step's shape never changes, so it is captured once as a
CUDA graph and the loop only copies the inputs in, replays the graph and copies the sampled
tokens out. (A KV cache would make steps cheaper on the GPU; it changes nothing about how the
host waits for them.) Without a GPU a CPU stand-in runs on aiogpu's simulated device: a fixed
step time of simulated GPU work and tokens computed in Python.

The scheduler runs forever:

1. launch step N for every occupied slot (inputs copied from pinned host memory);
2. while step N runs on the GPU, prepare step N+1 on the host: admit waiting requests into
   free slots (their prompts go into the next input buffer) and let go of cancelled ones;
3. wait for step N (``mode``); then hand each slot's token to its request, whose server-sent
   event stream writes it while step N+1 runs, and free the slots of finished requests.

Step N+1 needs step N's tokens (they are its inputs, and a request that ended frees its slot), so
one step is in flight at a time: the GPU idles from the moment step N ends until the loop
launches step N+1. That gap, and what the loop gets done while the GPU works, are what the way of
waiting decides (``mode``):

``aiogpu``           ``await event`` (``auto``): the loop serves clients meanwhile.
``aiogpu-poll``      ``await event.wait(strategy="poll")``: the same, with no thread at all.
``aiogpu-thread``    ``await event.wait(strategy="thread")``: nothing watches on the loop.
``aiogpu-callback``  ``await event.wait(strategy="callback")``: the GPU rings a doorbell.
``to_thread``        ``await asyncio.to_thread(event.synchronize)``: a thread hand-off per step.
``blocking``         ``event.synchronize()`` on the loop: nothing else runs until the step ends.

The engine counts where a step's time goes on the host: ``waited_s`` from each launch to the
scheduler running again after its wait (the GPU's time plus how late the wait noticed), and
``host_s`` from there to the next launch (handing out tokens, admitting requests, launching),
and ``wait_bins`` how many waits took each quarter of a millisecond (``WAIT_BIN_S``).

``Engine.measure_floors`` times the least a step can take, to read the load test's tokens/s
against (``python engine.py --floors`` prints them as JSON).
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import aiogpu
from aiogpu.testing import SimulatedDriver, launch_spin

if TYPE_CHECKING:
    from collections.abc import Callable

MODES = ("aiogpu", "aiogpu-poll", "aiogpu-thread", "aiogpu-callback", "to_thread", "blocking")
VOCABULARY = 32_000
END_OF_TEXT = 2  # a request stops at this token or at its max_tokens, whichever comes first
PAD = 0
SIMULATED_STEP_SECONDS = 0.004
WAIT_BIN_S = 0.00025  # the width of ``Engine.wait_bins``' bins


@dataclass
class ModelShape:
    """The decoder's size and the batch it decodes (the defaults make GPU steps of a few ms)."""

    slots: int = 64  # requests decoded together, one token each per step
    window: int = 64  # tokens of context each step reads per slot
    hidden: int = 1024
    layers: int = 8
    heads: int = 16


@dataclass(eq=False)
class Request:
    """One client's generation: tokens arrive on ``tokens`` (``None`` after the last)."""

    prompt: list[int]
    max_tokens: int
    tokens: asyncio.Queue[int | None] = field(default_factory=asyncio.Queue)
    produced: int = 0
    slot: int | None = None
    finished: bool = False
    cancelled: bool = False


@dataclass(eq=False)
class _Step:
    event: aiogpu.Event
    owners: list[Request | None]  # each slot's request when the step was launched
    read_tokens: Callable[[], list[int]]
    launched: float  # time.perf_counter() once it was enqueued


class Engine:
    """The model, its slots and the scheduler: ``submit`` queues a request, whose tokens arrive on
    its ``tokens`` queue, and ``cancel`` drops one."""

    def __init__(self, mode: str = "aiogpu", shape: ModelShape | None = None) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        self.mode = mode
        self.shape = shape or ModelShape()
        try:
            device = aiogpu.Device(0)
        except aiogpu.CudaUnavailableError:
            device = SimulatedDriver().device(0)
            self._model: _Model = _StandIn(device, self.shape)
            self.where = "the simulated device (no GPU)"
        else:
            self._model = _Llama(device, self.shape)
            self.where = f"GPU {device.ordinal}: {device.name}"
        self.stream = self._model.stream
        self._done = aiogpu.Event(device)  # re-recorded each step: one step is in flight at a time
        self._owners: list[Request | None] = [None] * self.shape.slots
        self._waiting: deque[Request] = deque()
        self._arrived = asyncio.Event()
        self._idle = asyncio.Event()  # no request holds a slot or waits for one
        self._idle.set()
        self._scheduler: asyncio.Task[None] | None = None
        self.steps = 0
        self.tokens_generated = 0
        self.waited_s = 0.0  # summed over steps: launch to the scheduler running after the wait
        self.host_s = 0.0  # summed over steps followed at once by another: wait's end to that launch
        self.wait_bins: Counter[int] = Counter()  # bin (waited // WAIT_BIN_S) -> steps

    # -- the server's side ---------------------------------------------------------------------
    def submit(self, prompt: list[int], max_tokens: int) -> Request:
        """Queue a request for a slot; its tokens arrive on ``request.tokens``."""
        if not prompt or not all(isinstance(t, int) and 0 <= t < VOCABULARY for t in prompt):
            raise ValueError(f"prompt must be a non-empty list of token ids in [0, {VOCABULARY})")
        if not isinstance(max_tokens, int) or not 1 <= max_tokens <= 4096:
            raise ValueError(f"max_tokens must be an int from 1 to 4096, got {max_tokens!r}")
        request = Request(prompt, max_tokens)
        self._waiting.append(request)
        self._idle.clear()
        self._arrived.set()
        if self._scheduler is None or self._scheduler.done():
            self._scheduler = asyncio.get_running_loop().create_task(self._schedule())
        return request

    def cancel(self, request: Request) -> None:
        """Stop decoding ``request`` (a client went away): its slot is freed before the next step."""
        if request.finished:
            return
        request.cancelled = request.finished = True
        if request.slot is None:
            try:
                self._waiting.remove(request)
            except ValueError:
                pass
            self._check_idle()

    @property
    def slots_in_use(self) -> int:
        return sum(owner is not None for owner in self._owners)

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    async def wait_idle(self) -> None:
        """Return once no request holds a slot or waits for one."""
        await self._idle.wait()

    def measure_floors(self, steps: int = 200) -> dict[str, float]:
        """Seconds a step takes with every slot busy and no client at all (blocks the thread):

        ``gpu_step_s``
            the GPU's own time, with ``steps`` steps enqueued back to back: no way of waiting,
            and no server, can step faster;
        ``pipeline_step_s``
            one step in flight as the scheduler runs them, the host spinning in
            ``synchronize()`` for each and doing the scheduler's own work between them (reading
            the tokens, advancing the contexts, launching the next): the least any way of
            waiting can take per step in this server.

        Call it on an engine that serves nothing: it uses the slots' buffers.
        """
        if not isinstance(steps, int) or steps < 1:
            raise ValueError(f"steps must be a positive int, got {steps!r}")
        if self.slots_in_use or self._waiting:
            raise RuntimeError("measure_floors needs an idle engine: it uses every slot")
        every = [True] * self.shape.slots
        slots = list(range(self.shape.slots))
        self._model.launch(every)  # warm-up: the first step pays for lazy set-up
        self.stream.synchronize()
        device = self.stream.device
        with aiogpu.Event(device, timing=True) as start, aiogpu.Event(device, timing=True) as end:
            self.stream.record(start)
            for _ in range(steps):
                self._model.launch(every)
            self.stream.record(end)
            end.synchronize()
            gpu_step = start.elapsed_time(end) / 1e3 / steps
        began = time.perf_counter()
        for _ in range(steps):
            read_tokens = self._model.launch(every)
            self.stream.record(self._done)
            self._done.synchronize()
            self._model.advance(slots, read_tokens())
        pipeline_step = (time.perf_counter() - began) / steps
        return {"gpu_step_s": gpu_step, "pipeline_step_s": pipeline_step}

    def close(self) -> None:
        if self._scheduler is not None:
            self._scheduler.cancel()
        self._done.close()
        self.stream.close()

    # -- the scheduler -------------------------------------------------------------------------
    async def _schedule(self) -> None:
        step: _Step | None = None
        while True:
            if step is None:
                self._admit()
                if not any(self._owners):
                    self._arrived.clear()
                    await self._arrived.wait()
                    continue
                step = self._launch()
            self._admit()  # while step N runs: waiting requests take free slots for step N+1
            await self._wait(step.event)
            woke = time.perf_counter()
            waited = woke - step.launched
            self.waited_s += waited
            self.wait_bins[int(waited / WAIT_BIN_S)] += 1
            self._deliver(step)
            step = self._launch() if any(self._owners) else None
            if step is not None:
                self.host_s += step.launched - woke

    def _admit(self) -> None:
        for slot, owner in enumerate(self._owners):
            if owner is not None and owner.cancelled:
                owner.slot = self._owners[slot] = None
            if self._owners[slot] is None and self._waiting:
                request = self._owners[slot] = self._waiting.popleft()
                request.slot = slot
                self._model.admit(slot, request.prompt)
        self._check_idle()

    def _launch(self) -> _Step:
        read_tokens = self._model.launch([owner is not None for owner in self._owners])
        self.stream.record(self._done)
        self.steps += 1
        return _Step(self._done, list(self._owners), read_tokens, time.perf_counter())

    async def _wait(self, event: aiogpu.Event) -> None:
        if self.mode == "aiogpu":
            await event
        elif self.mode.startswith("aiogpu-"):
            await event.wait(strategy=self.mode.removeprefix("aiogpu-"))  # type: ignore[arg-type]
        elif self.mode == "to_thread":
            await asyncio.to_thread(event.synchronize)
        else:
            event.synchronize()  # blocks the loop: what aiogpu replaces
            await asyncio.sleep(0)  # then lets the clients' tasks run before the next step

    def _deliver(self, step: _Step) -> None:
        tokens = step.read_tokens()
        continuing: list[int] = []
        for slot, request in enumerate(step.owners):
            if request is None or request.finished:
                continue
            token = tokens[slot]
            request.produced += 1
            self.tokens_generated += 1
            request.tokens.put_nowait(token)
            if token == END_OF_TEXT or request.produced >= request.max_tokens:
                request.finished = True
                request.tokens.put_nowait(None)
                request.slot = self._owners[slot] = None
            else:
                continuing.append(slot)
        self._model.advance(continuing, [tokens[slot] for slot in continuing])
        self._check_idle()

    def _check_idle(self) -> None:
        if not self._waiting and not any(self._owners):
            self._idle.set()


def window_of(prompt: list[int], window: int) -> list[int]:
    """The last ``window`` tokens of ``prompt``, left-padded."""
    tail = prompt[-window:]
    return [PAD] * (window - len(tail)) + tail


class _Model:
    """A step's work on its ``stream``: ``admit`` a prompt into a slot, ``advance`` slots'
    contexts by the tokens they decoded, ``launch`` a step (returning how to read its tokens
    once it is done)."""

    stream: aiogpu.Stream

    def admit(self, slot: int, prompt: list[int]) -> None:
        raise NotImplementedError

    def advance(self, slots: list[int], tokens: list[int]) -> None:
        raise NotImplementedError

    def launch(self, active: list[bool]) -> Callable[[], list[int]]:
        raise NotImplementedError


class _StandIn(_Model):
    """The simulated device: ``SIMULATED_STEP_SECONDS`` of GPU time a step, tokens from a hash."""

    def __init__(self, device: aiogpu.Device, shape: ModelShape) -> None:
        self.stream = aiogpu.Stream(device)
        self._window = shape.window
        self._contexts = [[PAD] * shape.window for _ in range(shape.slots)]

    def admit(self, slot: int, prompt: list[int]) -> None:
        self._contexts[slot] = window_of(prompt, self._window)

    def advance(self, slots: list[int], tokens: list[int]) -> None:
        for slot, token in zip(slots, tokens, strict=True):
            context = self._contexts[slot]
            del context[0]
            context.append(token)

    def launch(self, active: list[bool]) -> Callable[[], list[int]]:
        launch_spin(self.stream, SIMULATED_STEP_SECONDS)  # simulated GPU time
        tokens = [next_token(context) if on else PAD for context, on in zip(self._contexts, active, strict=True)]
        return lambda: tokens


def next_token(context: list[int]) -> int:
    """The stand-in's deterministic "model": the same context always gives the same token."""
    value = 0
    for token in context[-8:]:
        value = (value * 1_000_003 + token) % 2_147_483_647
    return 3 + value % (VOCABULARY - 3)  # never PAD or END_OF_TEXT: requests run to max_tokens


class _Llama(_Model):
    """A random-weight Llama on the GPU, one step captured as a CUDA graph.

    The host keeps every slot's context in ordinary memory, where the scheduler edits it while
    step N runs, and copies it into pinned memory only to launch step N+1 (step N is done then).
    """

    def __init__(self, device: aiogpu.Device, shape: ModelShape) -> None:
        import torch
        from transformers import LlamaConfig, LlamaForCausalLM

        self._torch = torch
        torch.set_num_threads(1)  # the host's tensors are tiny: no OpenMP pool spinning beside the loop
        cuda = torch.device("cuda", device.ordinal)
        config = LlamaConfig(
            vocab_size=VOCABULARY,
            hidden_size=shape.hidden,
            intermediate_size=shape.hidden * 8 // 3 // 64 * 64,
            num_hidden_layers=shape.layers,
            num_attention_heads=shape.heads,
            num_key_value_heads=shape.heads,
            max_position_embeddings=shape.window,
        )
        config._attn_implementation = "sdpa"
        torch.manual_seed(0)
        with torch.device(cuda):
            model = LlamaForCausalLM(config).to(torch.bfloat16).eval()
        self._staging = torch.zeros((shape.slots, shape.window), dtype=torch.int64, pin_memory=True)
        self._tokens = torch.zeros(shape.slots, dtype=torch.int64, pin_memory=True)
        self._host = torch.zeros((shape.slots, shape.window), dtype=torch.int64)  # the contexts, kept current
        self._ids = torch.zeros((shape.slots, shape.window), dtype=torch.int64, device=cuda)
        self._window = shape.window

        last_only = {"logits_to_keep": 1} if "logits_to_keep" in inspect.signature(model.forward).parameters else {}

        def step() -> torch.Tensor:
            with torch.inference_mode():
                logits = model(input_ids=self._ids, use_cache=False, **last_only).logits[:, -1, :]
                return logits.argmax(dim=-1)

        side = torch.cuda.Stream(cuda)  # capture needs cuBLAS and the allocator warmed up off the default stream
        side.wait_stream(torch.cuda.current_stream(cuda))
        with torch.cuda.stream(side):
            for _ in range(2):
                step()
        torch.cuda.current_stream(cuda).wait_stream(side)
        self._graph = torch.cuda.CUDAGraph()
        with torch.cuda.device(cuda), torch.cuda.graph(self._graph):
            self._next = step()
        torch.cuda.synchronize(cuda)
        # torch's own stream, adopted: torch frees its pinned buffers only after the work that
        # used them, recording events on that stream, so the stream must outlive them. An
        # adopted stream stays torch's (closing the engine does not destroy it).
        self._torch_stream = torch.cuda.Stream(cuda)
        self.stream = aiogpu.Stream.adopt(self._torch_stream)

    def admit(self, slot: int, prompt: list[int]) -> None:
        self._host[slot] = self._torch.tensor(window_of(prompt, self._window))

    def advance(self, slots: list[int], tokens: list[int]) -> None:
        rows = self._torch.tensor(slots, dtype=self._torch.int64)
        self._host[rows, :-1] = self._host[rows, 1:]
        self._host[rows, -1] = self._torch.tensor(tokens, dtype=self._torch.int64)

    def launch(self, active: list[bool]) -> Callable[[], list[int]]:
        torch = self._torch
        self._staging.copy_(self._host)
        with torch.cuda.stream(self._torch_stream):
            self._ids.copy_(self._staging, non_blocking=True)
            self._graph.replay()
            self._tokens.copy_(self._next, non_blocking=True)
        tokens = self._tokens
        return lambda: tokens.tolist()


if __name__ == "__main__":
    import argparse
    import json

    parser = argparse.ArgumentParser(description="Print the engine's floors (Engine.measure_floors) as JSON.")
    parser.add_argument("--floors", action="store_true", required=True)
    parser.add_argument("--steps", type=int, default=200)
    defaults = ModelShape()
    for name in ("slots", "window", "hidden", "layers", "heads"):
        parser.add_argument(f"--{name}", type=int, default=getattr(defaults, name), help="model shape (ModelShape)")
    options = parser.parse_args()
    shape = ModelShape(options.slots, options.window, options.hidden, options.layers, options.heads)
    engine = Engine("blocking", shape)
    try:
        floors = engine.measure_floors(options.steps)
    finally:
        engine.close()
    print(json.dumps({"served_by": engine.where, "slots": shape.slots, **floors}))
