"""The ways of waiting that the wake benchmark compares: the floor, today's patterns, aiogpu's.

Each latency waiter is ``make(stream) -> (wait, close)``: ``wait()`` records an event on the
stream (behind the work just launched) and waits for it. torch and cuda.core flavours are
used where those libraries are installed (the GPU machine), aiogpu events otherwise.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import importlib.util
import math
import os
import platform
import time
import warnings
from typing import TYPE_CHECKING, Any, get_args

import aiogpu

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    Wait = Callable[[], Awaitable[None]]
    Maker = Callable[[aiogpu.Stream], tuple[Wait, Callable[[], None]]]

#: aiogpu's wait strategies, as the installed aiogpu names them.
STRATEGIES: tuple[str, ...] = get_args(aiogpu.WaitStrategy)


def _import(name: str) -> Any:
    if importlib.util.find_spec(name.split(".")[0]) is None:
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return importlib.import_module(name)


def environment(device: aiogpu.Device, simulated: bool) -> dict[str, Any]:
    """What a run's figures were measured on (device, driver, date, Python, aiogpu)."""
    info: dict[str, Any] = {
        "device": device.name,
        "simulated": simulated,
        "aiogpu": aiogpu.__version__,
        "date": datetime.date.today().isoformat(),
        "python": platform.python_version(),
        "cuda_device_max_connections": os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS", "driver default"),
    }
    if not simulated:
        from cuda.bindings import driver

        _, version = driver.cuDriverGetVersion()
        info["cuda_driver_api"] = f"{version // 1000}.{version % 1000 // 10}"
        with contextlib.suppress(Exception):
            import subprocess

            info["driver"] = subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader", f"--id={device.ordinal}"],
                capture_output=True,
                text=True,
                check=True,
            ).stdout.strip()
    return info


def _aiogpu_event_waiter(**options: Any) -> Callable[[Callable[[aiogpu.Event], Awaitable[None] | None]], Maker]:
    def with_wait(wait_on: Callable[[aiogpu.Event], Awaitable[None] | None]) -> Maker:
        def make(stream: aiogpu.Stream) -> tuple[Wait, Callable[[], None]]:
            event = aiogpu.Event(stream.device, **options)

            async def wait() -> None:
                event.record(stream)
                waiting = wait_on(event)
                if waiting is not None:
                    await waiting

            return wait, event.close

        return make

    return with_wait


def _floor(event: aiogpu.Event) -> None:
    event.synchronize()  # a spinning cuEventSynchronize on the loop: the latency floor


def _strategy(strategy: str) -> Maker:
    return _aiogpu_event_waiter()(lambda event: event.wait(strategy=strategy))  # type: ignore[arg-type]


async def _to_thread_aiogpu(event: aiogpu.Event) -> None:
    await asyncio.to_thread(event.synchronize)


async def _query_sleep(event: aiogpu.Event, delay: float) -> None:
    while not event.is_done:
        await asyncio.sleep(delay)


def _torch_waiter(kind: str) -> Maker | None:
    torch = _import("torch")
    if torch is None or not torch.cuda.is_available():
        return None

    def make(stream: aiogpu.Stream) -> tuple[Wait, Callable[[], None]]:
        external = torch.cuda.ExternalStream(stream.handle, device=stream.device.ordinal)
        event = torch.cuda.Event()

        async def wait() -> None:
            event.record(external)
            if kind == "to_thread":
                await asyncio.to_thread(event.synchronize)
            else:
                delay = 0.0 if kind == "sleep0" else 1e-3
                while not event.query():
                    await asyncio.sleep(delay)

        return wait, lambda: None

    return make


def _cuda_core_waiter() -> Maker | None:
    core = _import("cuda.core")
    if core is None:
        return None

    def make(stream: aiogpu.Stream) -> tuple[Wait, Callable[[], None]]:
        device = core.Device(stream.device.ordinal)
        device.set_current()
        borrowed = device.create_stream(stream)
        event = borrowed.record()

        async def wait() -> None:
            borrowed.record(event)
            await asyncio.to_thread(event.sync)

        return wait, event.close

    return make


#: The ``thread`` strategy on a blocking-sync event: its waiter thread sleeps in the driver.
THREAD_BLOCKING_SYNC = "aiogpu thread, blocking-sync event"


def latency_waiters(device: aiogpu.Device) -> list[tuple[str, Maker]]:
    """(name, maker) pairs; the first is the floor."""
    simulated = device.driver_name == "simulated"
    waiters: list[tuple[str, Maker | None]] = [
        ("floor: sync spin on the loop", _aiogpu_event_waiter()(_floor)),
        ("sync, blocking-sync event, on the loop", _aiogpu_event_waiter(blocking_sync=True)(lambda event: event.synchronize())),
        ("to_thread(torch Event.synchronize)", None if simulated else _torch_waiter("to_thread")),
        ("to_thread(cuda.core Event.sync)", None if simulated else _cuda_core_waiter()),
        ("to_thread(aiogpu Event.synchronize)", _aiogpu_event_waiter()(_to_thread_aiogpu)),
        ("torch query + sleep(0)", None if simulated else _torch_waiter("sleep0")),
        ("torch query + sleep(1 ms)", None if simulated else _torch_waiter("sleep1ms")),
        ("query + sleep(0)", _aiogpu_event_waiter()(lambda event: _query_sleep(event, 0))),
        ("query + sleep(1 ms)", _aiogpu_event_waiter()(lambda event: _query_sleep(event, 1e-3))),
    ]
    waiters += [(f"aiogpu {strategy}", _strategy(strategy)) for strategy in get_args(aiogpu.WaitStrategy)]
    waiters.append((THREAD_BLOCKING_SYNC, _aiogpu_event_waiter(blocking_sync=True)(lambda event: event.wait(strategy="thread"))))
    if not simulated:  # what the second way of launching a host function would change for ``callback``
        from . import host_functions

        waiters += host_functions.waiters()
    return [(name, make) for name, make in waiters if make is not None]


# -- fan-out ------------------------------------------------------------------------------------
FANOUT_GPU_FLOOR = "floor: sync last event per stream"
FANOUT_TASK_FLOOR = "floor + waking the tasks (plain futures)"
FANOUT_STREAM_ORDER_FLOOR = "floor + waking each stream's tasks when it is done (plain futures)"
FANOUT_WAITERS = (
    FANOUT_GPU_FLOOR,
    FANOUT_TASK_FLOOR,
    FANOUT_STREAM_ORDER_FLOOR,
    "query + sleep(0) per waiter",
    *(f"aiogpu {s}" for s in get_args(aiogpu.WaitStrategy)),
)


def fanout_tasks(
    name: str, targets: list[aiogpu.Event], per_stream: list[list[aiogpu.Event]]
) -> tuple[Callable[[], Awaitable[float]], list[asyncio.Task[None]]]:
    """Start the waiters for ``name`` now (parked before the release); return "await them all"
    and the tasks (the loop holds tasks only weakly: keep them until the clock has stopped).
    Awaiting them all returns when the first task woke (``time.perf_counter()``; NaN for the
    GPU floor, which has no task).

    The GPU floor has no waiting tasks at all. The task floor: one spinning synchronize per
    stream, then resolving a plain future that each task awaits, in the order the tasks were
    created (no task runs before the GPU is done); every waiter-based row is measured against
    it too. The stream-order floor resolves them as a waking engine does, in the order their
    work completes: a stream's tasks once its last event is done, stream after stream, each
    stream's tasks running before the next stream is synchronized, so they run while the GPU
    finishes the rest (the least a loop can do through futures, but for one synchronize per
    stream). The floors let go of each future once it is set, so that it is freed as its task
    ends, inside the timed window, as an aiogpu wait's future is. Every waiting task counts itself done on a shared
    countdown (``asyncio.gather`` would add a Python callback per task that costs more than the
    wake-up being measured).
    """

    async def synchronize_last() -> float:
        for events in per_stream:
            events[-1].synchronize()
        return math.nan

    if name == FANOUT_GPU_FLOOR:
        return synchronize_last, []
    loop = asyncio.get_running_loop()
    countdown = _Countdown(loop, len(targets))
    if name in (FANOUT_TASK_FLOOR, FANOUT_STREAM_ORDER_FLOOR):
        futures: list[asyncio.Future[None]] = [loop.create_future() for _ in targets]
        waits: list[Awaitable[None]] = list(futures)
    elif name.startswith("query"):
        waits = [_query_sleep(event, 0) for event in targets]
    else:
        strategy = name.removeprefix("aiogpu ")
        waits = [event.wait(strategy=strategy) for event in targets]  # type: ignore[arg-type]
    tasks = [loop.create_task(countdown.after(wait)) for wait in waits]

    by_stream: list[list[asyncio.Future[None]]] = [[] for _ in per_stream]
    if name == FANOUT_STREAM_ORDER_FLOOR:  # grouped before the release: not timed
        stream_of = {id(event): index for index, events in enumerate(per_stream) for event in events}
        for target, future in zip(targets, futures, strict=True):
            by_stream[stream_of[id(target)]].append(future)
        futures.clear()  # held by the groups now

    async def wake_stream_by_stream() -> None:
        for events, stream_futures in zip(per_stream, by_stream, strict=True):
            events[-1].synchronize()
            for future in stream_futures:
                future.set_result(None)
            stream_futures.clear()
            await asyncio.sleep(0)  # they run before the next stream is looked at

    async def wait_all() -> float:
        if name == FANOUT_TASK_FLOOR:
            await synchronize_last()
            for future in futures:
                future.set_result(None)
            futures.clear()
        elif name == FANOUT_STREAM_ORDER_FLOOR:
            await wake_stream_by_stream()
        await countdown.done
        return countdown.first_done

    return wait_all, tasks


class _Countdown:
    """``done`` resolves once ``count`` waits have finished, or with the first one's error."""

    def __init__(self, loop: asyncio.AbstractEventLoop, count: int) -> None:
        self.done: asyncio.Future[None] = loop.create_future()
        self._left = count
        self._first = count - 1  # ``_left`` once the first wait has finished
        self.first_done = math.nan  # when it did (``time.perf_counter()``)

    async def after(self, wait: Awaitable[None]) -> None:
        try:
            await wait
        except Exception as exc:
            if not self.done.done():
                self.done.set_exception(exc)
            return
        self._left -= 1
        if self._left == self._first:
            self.first_done = time.perf_counter()
        if not self._left:
            self.done.set_result(None)
