"""aiogpu with other CUDA libraries on the real GPU: adopting their streams, lending ours.

``Stream.adopt`` borrows a stream of torch, CuPy, Numba, cuda.core, or a raw ``CUstream``
(``int`` or ``cuda.bindings.driver.CUstream``): same handle, same device, awaitable, and still
its owner's after aiogpu closes the wrapper; ``Event.adopt`` likewise awaits their events. The
other way round, cuda.core and CuPy (through ``__cuda_stream__``), torch
(``torch.cuda.ExternalStream``) and Numba (``cuda.external_stream``) enqueue work on an aiogpu
stream that ``wait_idle`` then awaits, and their streams wait for aiogpu events. Each library
is optional: its tests skip without it.
"""

from __future__ import annotations

import warnings
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

import anyio
import pytest
from cuda.bindings import driver as cu

import aiogpu
from aiogpu.testing import Latch

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

pytestmark = pytest.mark.gpu

TIMEOUT = 10.0


def import_library(name: str) -> Any:
    """``pytest.importorskip(name)``, ignoring warnings the library itself raises on import."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return pytest.importorskip(name)


def import_torch() -> Any:
    torch = import_library("torch")
    if not torch.cuda.is_available():
        pytest.skip("this torch cannot use CUDA")
    return torch


def check(result: cu.CUresult) -> None:
    assert result == cu.CUresult.CUDA_SUCCESS, result


# -- streams other libraries own ------------------------------------------------------------------
@dataclass(frozen=True)
class ForeignStream:
    """A stream another library owns, as ``Stream.adopt`` receives it."""

    stream: object
    handle: int  # its CUstream address, as its owner reports it
    use: Callable[[], None]  # enqueue a little work through the owner, and wait for it


@contextmanager
def torch_stream(device: aiogpu.Device) -> Iterator[ForeignStream]:
    torch = import_torch()
    stream = torch.cuda.Stream(device=device.ordinal)

    def use() -> None:
        with torch.cuda.stream(stream):
            total = torch.arange(4, device=f"cuda:{device.ordinal}").sum()
        stream.synchronize()
        assert total.item() == 6

    yield ForeignStream(stream, stream.cuda_stream, use)


@contextmanager
def cupy_stream(device: aiogpu.Device) -> Iterator[ForeignStream]:
    cupy = import_library("cupy")
    with cupy.cuda.Device(device.ordinal):
        stream = cupy.cuda.Stream(non_blocking=True)

    def use() -> None:
        with cupy.cuda.Device(device.ordinal), stream:
            copied = cupy.asarray([1, 2, 3]).get()  # copies only: no kernel to compile
        stream.synchronize()
        assert copied.tolist() == [1, 2, 3]

    yield ForeignStream(stream, stream.ptr, use)


@contextmanager
def numba_stream(device: aiogpu.Device) -> Iterator[ForeignStream]:
    numba_cuda = import_library("numba.cuda")
    numpy = import_library("numpy")
    with numba_cuda.gpus[device.ordinal]:
        stream = numba_cuda.stream()

    def use() -> None:
        with numba_cuda.gpus[device.ordinal]:
            copied = numba_cuda.to_device(numpy.arange(4), stream=stream).copy_to_host(stream=stream)
        stream.synchronize()
        assert copied.tolist() == [0, 1, 2, 3]

    yield ForeignStream(stream, int(stream.handle), use)


@contextmanager
def cuda_core_stream(device: aiogpu.Device) -> Iterator[ForeignStream]:
    cuda_core = import_library("cuda.core")
    core_device = cuda_core.Device(device.ordinal)
    core_device.set_current()
    stream = core_device.create_stream()

    def use() -> None:
        event = stream.record()
        stream.sync()
        assert event.is_done

    try:
        yield ForeignStream(stream, int(stream.handle), use)
    finally:
        stream.close()


@contextmanager
def driver_stream(device: aiogpu.Device, *, as_int: bool) -> Iterator[ForeignStream]:
    """A stream made with ``cuStreamCreate``, passed as its address or as a ``CUstream``."""
    device.set_current()
    result, stream = cu.cuStreamCreate(0)
    check(result)

    def use() -> None:
        (result,) = cu.cuStreamSynchronize(stream)
        check(result)

    try:
        yield ForeignStream(int(stream) if as_int else stream, int(stream), use)
    finally:
        cu.cuStreamDestroy(stream)


FOREIGN_STREAMS: dict[str, Callable[[aiogpu.Device], AbstractContextManager[ForeignStream]]] = {
    "torch": torch_stream,
    "cupy": cupy_stream,
    "numba": numba_stream,
    "cuda.core": cuda_core_stream,
    "int": partial(driver_stream, as_int=True),
    "CUstream": partial(driver_stream, as_int=False),
}


@pytest.mark.anyio
@pytest.mark.parametrize("owner", FOREIGN_STREAMS)
async def test_adopted_stream_is_borrowed_and_awaitable(gpu: aiogpu.Device, owner: str) -> None:
    with FOREIGN_STREAMS[owner](gpu) as foreign:
        stream = aiogpu.Stream.adopt(foreign.stream)
        assert stream.handle == foreign.handle
        assert stream.device is gpu
        assert not stream.is_owned
        with Latch(gpu) as latch:
            latch.block(stream)
            event = stream.record()
            assert not event.is_done
            latch.release()
            with anyio.fail_after(TIMEOUT):
                await event
        stream.close()


@pytest.mark.parametrize("owner", FOREIGN_STREAMS)
def test_closing_an_adopted_stream_leaves_it_to_its_owner(gpu: aiogpu.Device, owner: str) -> None:
    with FOREIGN_STREAMS[owner](gpu) as foreign:
        stream = aiogpu.Stream.adopt(foreign.stream)
        stream.close()
        assert stream.is_closed
        foreign.use()


# -- aiogpu streams lent to other libraries -------------------------------------------------------
@pytest.mark.anyio
async def test_cuda_core_enqueues_on_an_aiogpu_stream(gpu: aiogpu.Device) -> None:
    cuda_core = import_library("cuda.core")
    core_device = cuda_core.Device(gpu.ordinal)
    core_device.set_current()
    with aiogpu.Stream(gpu) as stream, Latch(gpu) as latch:
        core_stream = core_device.create_stream(stream)  # through __cuda_stream__
        assert int(core_stream.handle) == stream.handle
        latch.block(stream)
        core_event = core_stream.record()
        assert not core_event.is_done
        latch.release()
        with anyio.fail_after(TIMEOUT):
            await stream.wait_idle()
        assert core_event.is_done


@pytest.mark.anyio
async def test_torch_enqueues_on_an_aiogpu_stream(gpu: aiogpu.Device) -> None:
    torch = import_torch()
    with aiogpu.Stream(gpu) as stream, Latch(gpu) as latch:
        external = torch.cuda.ExternalStream(stream.handle, device=gpu.ordinal)
        # Allocate and load the kernel now: either may synchronize, never behind a held latch.
        with torch.cuda.stream(external):
            values = torch.arange(4, device=f"cuda:{gpu.ordinal}")
            result = torch.empty_like(values)
            torch.mul(values, 2, out=result)
        with anyio.fail_after(TIMEOUT):
            await stream.wait_idle()
        latch.block(stream)
        with torch.cuda.stream(external):
            torch.mul(values, 3, out=result)
        assert not external.query()
        latch.release()
        with anyio.fail_after(TIMEOUT):
            await stream.wait_idle()
        assert external.query()
        assert result.tolist() == [0, 3, 6, 9]


def cupy_records_on(stream: aiogpu.Stream) -> Callable[[], bool]:
    cupy = import_library("cupy")
    with cupy.cuda.Device(stream.device.ordinal):
        event = cupy.cuda.Event()
        event.record(cupy.cuda.Stream.from_external(stream))  # through __cuda_stream__
    return lambda: bool(event.done)


def numba_records_on(stream: aiogpu.Stream) -> Callable[[], bool]:
    numba_cuda = import_library("numba.cuda")
    with numba_cuda.gpus[stream.device.ordinal]:
        event = numba_cuda.event()
        event.record(numba_cuda.external_stream(stream.handle))
    return lambda: bool(event.query())


@pytest.mark.anyio
@pytest.mark.parametrize("library", ["cupy", "numba"])
async def test_library_records_on_an_aiogpu_stream(gpu: aiogpu.Device, library: str) -> None:
    records_on = {"cupy": cupy_records_on, "numba": numba_records_on}[library]
    with aiogpu.Stream(gpu) as stream, Latch(gpu) as latch:
        latch.block(stream)
        is_done = records_on(stream)
        assert not is_done()
        latch.release()
        with anyio.fail_after(TIMEOUT):
            await stream.wait_idle()
        assert is_done()


@pytest.mark.anyio
@pytest.mark.parametrize("owner", FOREIGN_STREAMS)
async def test_a_foreign_stream_waits_for_an_aiogpu_event(gpu: aiogpu.Device, owner: str) -> None:
    """Events go to other libraries as dependencies of their streams (torch and CuPy cannot wrap
    a foreign event): ``Stream.adopt(their_stream).wait_for(event)``."""
    with FOREIGN_STREAMS[owner](gpu) as foreign, aiogpu.Stream(gpu) as producer, Latch(gpu) as latch:
        latch.block(producer)
        ready = producer.record()
        consumer = aiogpu.Stream.adopt(foreign.stream)
        consumer.wait_for(ready)
        assert not consumer.is_idle  # their stream now waits for our event
        latch.release()
        with anyio.fail_after(TIMEOUT):
            await consumer.wait_idle()
        consumer.close()
        ready.close()
        foreign.use()


# -- events other libraries own -------------------------------------------------------------------
@dataclass(frozen=True)
class ForeignEvent:
    """An event another library owns, recorded by its owner on a stream aiogpu holds."""

    event: object
    handle: int  # its CUevent address, as its owner reports it
    device: bool  # whether Event.adopt can tell the device without device=
    query: Callable[[], bool]  # the owner's own "is it done?"


@contextmanager
def torch_event(device: aiogpu.Device, stream: aiogpu.Stream) -> Iterator[ForeignEvent]:
    torch = import_torch()
    event = torch.cuda.Event()
    event.record(torch.cuda.ExternalStream(stream.handle, device=device.ordinal))
    yield ForeignEvent(event, event.cuda_event, True, event.query)


@contextmanager
def cupy_event(device: aiogpu.Device, stream: aiogpu.Stream) -> Iterator[ForeignEvent]:
    cupy = import_library("cupy")
    with cupy.cuda.Device(device.ordinal):
        event = cupy.cuda.Event()
        event.record(cupy.cuda.Stream.from_external(stream))  # through __cuda_stream__
    yield ForeignEvent(event, event.ptr, False, lambda: bool(event.done))


@contextmanager
def cuda_core_event(device: aiogpu.Device, stream: aiogpu.Stream) -> Iterator[ForeignEvent]:
    cuda_core = import_library("cuda.core")
    core_device = cuda_core.Device(device.ordinal)
    core_device.set_current()
    event = core_device.create_stream(stream).record()
    try:
        yield ForeignEvent(event, int(event.handle), True, lambda: bool(event.is_done))
    finally:
        event.close()


@contextmanager
def numba_event(device: aiogpu.Device, stream: aiogpu.Stream) -> Iterator[ForeignEvent]:
    numba_cuda = import_library("numba.cuda")
    with numba_cuda.gpus[device.ordinal]:
        event = numba_cuda.event()
        event.record(numba_cuda.external_stream(stream.handle))
    yield ForeignEvent(event, int(event.handle), False, lambda: bool(event.query()))


FOREIGN_EVENTS: dict[str, Callable[[aiogpu.Device, aiogpu.Stream], AbstractContextManager[ForeignEvent]]] = {
    "torch": torch_event,
    "cupy": cupy_event,
    "cuda.core": cuda_core_event,
    "numba": numba_event,
}


@pytest.mark.anyio
@pytest.mark.parametrize("owner", FOREIGN_EVENTS)
async def test_adopted_event_is_awaitable_and_stays_its_owners(gpu: aiogpu.Device, owner: str) -> None:
    with aiogpu.Stream(gpu) as stream, Latch(gpu) as latch:
        latch.block(stream)
        with FOREIGN_EVENTS[owner](gpu, stream) as foreign:
            event = aiogpu.Event.adopt(foreign.event, device=None if foreign.device else gpu)
            assert event.handle == foreign.handle
            assert event.device is gpu
            assert not event.is_owned
            assert not event.is_done
            assert not foreign.query()
            woke = anyio.Event()

            async def waiter() -> None:
                await event
                woke.set()

            with anyio.fail_after(TIMEOUT):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(waiter)
                    await anyio.wait_all_tasks_blocked()
                    assert not woke.is_set()
                    latch.release()
            event.close()
            assert foreign.query()  # closing the wrapper left the owner's event alive


# -- awaitable transfers with framework arrays ----------------------------------------------------
@pytest.mark.anyio
async def test_torch_tensor_round_trip_through_pinned_memory(gpu: aiogpu.Device) -> None:
    torch = import_torch()
    numpy = import_library("numpy")
    producer = torch.cuda.Stream(device=gpu.ordinal)
    with aiogpu.PinnedPool(gpu) as pool:
        stream = aiogpu.Stream.adopt(producer)
        with torch.cuda.stream(producer):
            tensor = torch.arange(100_000, dtype=torch.int32, device=f"cuda:{gpu.ordinal}") * 3
        with anyio.fail_after(TIMEOUT):
            copied = await aiogpu.copy_to_host(tensor, after=stream, pool=pool)  # after the multiply
        expected = numpy.arange(100_000, dtype=numpy.int32) * 3
        assert numpy.array_equal(numpy.frombuffer(copied.view(), dtype=numpy.int32), expected)
        copied.release()
        target = torch.zeros(100_000, dtype=torch.int32, device=f"cuda:{gpu.ordinal}")
        with anyio.fail_after(TIMEOUT):
            await aiogpu.copy_to_device(target, expected[::-1].copy(), after=stream, pool=pool)
        assert numpy.array_equal(target.cpu().numpy(), expected[::-1])
        stream.close()


@pytest.mark.anyio
async def test_cupy_array_round_trip_through_pinned_memory(gpu: aiogpu.Device) -> None:
    cupy = import_library("cupy")
    numpy = import_library("numpy")
    with aiogpu.PinnedPool(gpu) as pool, aiogpu.Stream(gpu) as stream, cupy.cuda.Device(gpu.ordinal):
        values = numpy.linspace(0, 1, 4096, dtype=numpy.float64)
        array = cupy.empty(4096, dtype=cupy.float64)
        with anyio.fail_after(TIMEOUT):
            await aiogpu.copy_to_device(array, values, after=stream, pool=pool)
            copied = await aiogpu.copy_to_host(array, after=stream, pool=pool)
        assert numpy.array_equal(numpy.frombuffer(copied.view(), dtype=numpy.float64), values)
        copied.release()


@pytest.mark.anyio
async def test_raw_device_buffer_round_trip_through_pinned_memory(gpu: aiogpu.Device) -> None:
    """A ``(device_pointer, nbytes)`` pair from ``cuMemAlloc``: no library in between."""
    gpu.set_current()
    result, pointer = cu.cuMemAlloc(4096)
    check(result)
    data = bytes(range(256)) * 16
    try:
        with aiogpu.PinnedPool(gpu) as pool, aiogpu.Stream(gpu) as stream:
            with anyio.fail_after(TIMEOUT):
                await aiogpu.copy_to_device((int(pointer), 4096), data, after=stream, pool=pool)
                with await aiogpu.copy_to_host((int(pointer), 4096), after=stream, pool=pool) as copied:
                    assert bytes(copied.view()) == data
    finally:
        check(cu.cuMemFree(pointer)[0])


@pytest.mark.anyio
async def test_numba_array_round_trip_through_pinned_memory(gpu: aiogpu.Device) -> None:
    numba_cuda = import_library("numba.cuda")
    numpy = import_library("numpy")
    values = numpy.arange(1000, dtype=numpy.float32) / 7
    with aiogpu.PinnedPool(gpu) as pool, aiogpu.Stream(gpu) as stream, numba_cuda.gpus[gpu.ordinal]:
        array = numba_cuda.device_array(1000, dtype=numpy.float32)
        with anyio.fail_after(TIMEOUT):
            await aiogpu.copy_to_device(array, values, after=stream, pool=pool)
            with await aiogpu.copy_to_host(array, after=stream, pool=pool) as copied:
                assert numpy.array_equal(numpy.frombuffer(copied.view(), dtype=numpy.float32), values)
        assert numpy.array_equal(array.copy_to_host(), values)  # Numba sees what was copied in
