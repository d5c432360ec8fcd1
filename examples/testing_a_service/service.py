"""A small async GPU service: the kind of code the aiogpu pytest plugin lets you test without a GPU.

Each request takes a stream from a pool, enqueues its GPU work (a real service would call its
model here: torch, CuPy, ...), records an event and awaits it; a GPU fault becomes an error
response and GPU work that takes too long a timeout response, not a hung request.
"""

from __future__ import annotations

from collections.abc import Callable

import anyio

import aiogpu

Enqueue = Callable[[aiogpu.Stream], None]


class Service:
    def __init__(self, streams: int = 2, enqueue: Enqueue | None = None, timeout: float = 10.0) -> None:
        device = aiogpu.Device(0)  # under the plugin's simulated_gpu fixture: a simulated device
        self.streams = [aiogpu.Stream(device, nonblocking=True) for _ in range(streams)]
        self._free = list(self.streams)
        self._available = anyio.Semaphore(streams)
        self._enqueue = enqueue or (lambda stream: None)
        self._timeout = timeout

    async def handle(self, request: str) -> str:
        async with self._available:
            stream = self._free.pop()
            try:
                self._enqueue(stream)
                done = stream.record()
                try:
                    with anyio.move_on_after(self._timeout) as waited:
                        await done
                except aiogpu.CudaError as error:
                    return f"{request}: failed ({error.name})"
                finally:
                    done.close()  # a pending wait keeps the event alive until it ends
                return f"{request}: timed out" if waited.cancelled_caught else f"{request}: ok"
            finally:
                self._free.append(stream)

    def close(self) -> None:
        for stream in self.streams:
            stream.close()
