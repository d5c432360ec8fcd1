"""The callback strategy on the real GPU: no GIL deadlock, even against GIL-holding driver calls.

A host function that takes the GIL deadlocks when another thread holds the GIL while it waits
for the driver's lock (numba-cuda #317, TensorRT-LLM #15855). aiogpu's host function is the C
library's ``sem_post``. To show that it is safe, thousands of callback waits run here while two
threads call the driver *holding the GIL* (through ``ctypes.PyDLL``, which does not release it),
one of them synchronizing a busy stream. With a Python host function this setup wedges.
"""

from __future__ import annotations

import ctypes
import threading

import anyio
import pytest

import aiogpu
from aiogpu._wait import _policy
from aiogpu.testing import launch_spin
from tests.helpers import settle_waiter_threads

pytestmark = [pytest.mark.gpu, pytest.mark.anyio]

WAITS = 2_000
STREAMS = 4


def hold_the_gil_in_the_driver(stream: int, stop: threading.Event, calls: list[int], synchronize: bool) -> None:
    libcuda = ctypes.PyDLL("libcuda.so.1")  # PyDLL: the GIL stays held during each call
    function = libcuda.cuStreamSynchronize if synchronize else libcuda.cuStreamQuery
    function.argtypes = (ctypes.c_void_p,)
    function.restype = ctypes.c_int
    while not stop.is_set():
        function(stream)
        calls[0] += 1


async def test_callback_waits_survive_gil_holding_driver_calls(gpu: aiogpu.Device) -> None:
    streams = [aiogpu.Stream(gpu, nonblocking=True) for _ in range(STREAMS)]
    busy = aiogpu.Stream(gpu, nonblocking=True)
    stop = threading.Event()
    calls = [[0], [0]]
    threads = [
        threading.Thread(target=hold_the_gil_in_the_driver, args=(busy.handle, stop, calls[0], True), daemon=True),
        threading.Thread(target=hold_the_gil_in_the_driver, args=(streams[0].handle, stop, calls[1], False), daemon=True),
    ]
    woke = 0

    async def wait_one(stream: aiogpu.Stream, event: aiogpu.Event) -> None:
        nonlocal woke
        await event.wait(strategy="callback")
        woke += 1

    for thread in threads:
        thread.start()
    try:
        with anyio.fail_after(120):
            for round_start in range(0, WAITS, 200):
                launch_spin(busy, 0.001)  # the GIL-holding synchronize has something to wait for
                async with anyio.create_task_group() as tg:
                    for index in range(round_start, round_start + 200):
                        stream = streams[index % STREAMS]
                        launch_spin(stream, 20e-6)
                        tg.start_soon(wait_one, stream, stream.record())
    finally:
        stop.set()
        for thread in threads:
            thread.join(30)
    assert woke == WAITS
    assert all(count[0] > 0 for count in calls), "the GIL-holding threads never called the driver"
    for stream in [*streams, busy]:
        stream.synchronize()
        stream.close()
    statistics = settle_waiter_threads()
    assert statistics.subscribers == statistics.running_jobs == 0


async def test_callback_wait_is_woken_by_the_gpu(gpu: aiogpu.Device, monkeypatch: pytest.MonkeyPatch) -> None:
    """With the watchdog's polls an hour apart, only the GPU's host function can wake the wait."""
    monkeypatch.setitem(_policy.COLD_POLL, "callback", (3600.0, 3600.0))
    with aiogpu.Stream(gpu) as stream:
        for _ in range(5):
            launch_spin(stream, 200e-6)
            with anyio.fail_after(10):
                await stream.record().wait(strategy="callback")
