"""Awaitable transfers through pooled pinned memory, on the simulated device (whose device memory
is host memory) and, where there is one, the GPU (tests/gpu/test_interop.py copies torch and
CuPy arrays).
"""

from __future__ import annotations

import ctypes
import gc
import threading
from functools import partial

import anyio
import pytest

import aiogpu
from aiogpu import _pinned
from aiogpu.testing import Latch, SimulatedDriver

pytestmark = pytest.mark.anyio


class SimulatedArray:
    """A ``uint32`` CUDA array in the simulated driver's device memory."""

    def __init__(self, sim: SimulatedDriver, data: bytes, *, readonly: bool = False) -> None:
        self.memory = sim.allocate(len(data))
        self.memory.view()[:] = data
        self.__cuda_array_interface__ = {
            "data": (self.memory.pointer, readonly),
            "shape": (len(data) // 4,),
            "typestr": "<u4",
            "strides": None,
            "version": 3,
        }

    def contents(self) -> bytes:
        return bytes(self.memory.view())


async def test_copy_to_host_waits_for_the_producer_and_returns_the_bytes(sim: SimulatedDriver) -> None:
    device = sim.device(0)
    source = SimulatedArray(sim, bytes(range(64)))
    with aiogpu.PinnedPool(device) as pool, aiogpu.Stream(device) as producer, Latch(device) as latch:
        latch.block(producer)  # the producer's work is not done yet
        copied: list[aiogpu.PinnedBuffer] = []

        async def copy() -> None:
            copied.append(await aiogpu.copy_to_host(source, after=producer, pool=pool))

        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                tg.start_soon(copy)
                await anyio.wait_all_tasks_blocked()
                assert copied == []  # ordered after the producer's work
                assert not producer.is_idle
                latch.release()
        (buffer,) = copied
        assert buffer.nbytes == 64
        assert bytes(buffer.view()) == bytes(range(64))
        buffer.release()
        assert pool.idle_bytes == 4096  # kept for reuse


async def test_copy_to_device_from_bytes_and_from_a_pinned_buffer(sim: SimulatedDriver) -> None:
    device = sim.device(0)
    destination = SimulatedArray(sim, bytes(32))
    with aiogpu.PinnedPool(device) as pool, aiogpu.Stream(device) as stream:
        with anyio.fail_after(10):
            await aiogpu.copy_to_device(destination, b"\x07" * 32, after=stream, pool=pool)
        assert destination.contents() == b"\x07" * 32
        with pool.take(32) as staged:
            staged.view()[:] = b"\x09" * 32
            with anyio.fail_after(10):
                await aiogpu.copy_to_device(destination, staged, after=stream, pool=pool)
        assert destination.contents() == b"\x09" * 32


async def test_a_copy_does_not_queue_behind_another_producers_unfinished_work(sim: SimulatedDriver) -> None:
    device = sim.device(0)
    with (
        aiogpu.PinnedPool(device) as pool,
        aiogpu.Stream(device) as busy,
        aiogpu.Stream(device) as ready,
        Latch(device) as latch,
    ):
        latch.block(busy)
        results: dict[str, bytes] = {}

        async def copy(name: str, producer: aiogpu.Stream) -> None:
            with await aiogpu.copy_to_host(SimulatedArray(sim, name.encode() * 4), after=producer, pool=pool) as buffer:
                results[name] = bytes(buffer.view())

        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                tg.start_soon(copy, "busy", busy)  # enqueued first, held by the latch
                await anyio.wait_all_tasks_blocked()
                await copy("ready", ready)  # finishes while the busy producer's copy waits
                assert results == {"ready": b"ready" * 4}
                assert pool.side_stream(busy) is not pool.side_stream(ready)
                latch.release()
        assert results["busy"] == b"busy" * 4


async def test_memory_of_cancelled_copies_comes_back_only_when_every_copy_is_done(sim: SimulatedDriver) -> None:
    """Two copies out of one buffer, after two producers (two side streams), both cancelled:
    the one cancelled last may finish first; the memory must wait for the other one too."""
    device = sim.device(0)
    first, second = SimulatedArray(sim, bytes(16)), SimulatedArray(sim, bytes(16))
    with (
        aiogpu.PinnedPool(device) as pool,
        aiogpu.Stream(device) as slow,
        aiogpu.Stream(device) as fast,
        Latch(device) as slow_latch,
        Latch(device) as fast_latch,
    ):
        slow_latch.block(slow)
        fast_latch.block(fast)
        source = pool.take(16)
        source.view()[:] = b"A" * 16
        async with anyio.create_task_group() as tg:  # both copies enqueued, then both cancelled
            tg.start_soon(partial(aiogpu.copy_to_device, first, source, after=slow, pool=pool))
            tg.start_soon(partial(aiogpu.copy_to_device, second, source, after=fast, pool=pool))
            await anyio.wait_all_tasks_blocked()
            tg.cancel_scope.cancel()
        fast_latch.release()
        await pool.side_stream(fast).wait_idle()  # the copy cancelled last is done, the other is not
        reused = pool.take(16)
        assert reused.pointer != source.pointer  # still in use by the slow producer's copy
        reused.view()[:] = b"B" * 16
        slow_latch.release()
        await pool.side_stream(slow).wait_idle()
        assert first.contents() == second.contents() == b"A" * 16
        reused.release()


async def test_side_streams_are_kept_for_recent_producers_only(sim: SimulatedDriver) -> None:
    from aiogpu._pinned import SIDE_STREAMS

    device = sim.device(0)
    producers = [aiogpu.Stream(device) for _ in range(SIDE_STREAMS + 1)]
    with aiogpu.PinnedPool(device) as pool:
        first = pool.side_stream(producers[0])
        assert pool.side_stream(producers[0]) is first  # one per producer
        for producer in producers[1:]:
            pool.side_stream(producer)  # one more than kept: the least recently used goes
        assert first.is_closed
        assert not pool.side_stream(producers[-1]).is_closed
        live = sim.statistics().live_streams
    assert sim.statistics().live_streams == live - SIDE_STREAMS  # close() closes every side stream
    for producer in producers:
        producer.close()


async def test_buffers_are_reused_and_the_idle_bound_is_kept(sim: SimulatedDriver) -> None:
    device = sim.device(0)
    with aiogpu.PinnedPool(device, max_idle_bytes=4096) as pool:
        first = pool.take(100)
        pointer = first.pointer
        first.release()
        first.release()  # idempotent
        again = pool.take(4000)  # the same 4 KiB size class
        assert again.pointer == pointer
        bigger = pool.take(5000)  # 8 KiB class: a new allocation
        again.release()
        bigger.release()  # over max_idle_bytes: freed, not kept
        assert pool.idle_bytes == 4096
        assert sim.statistics().live_host_buffers == 1
        with pytest.raises(aiogpu.ClosedResourceError):
            again.view()
    assert sim.statistics().live_host_buffers == 0


async def test_a_cancelled_copy_keeps_its_memory_until_the_gpu_is_done(sim: SimulatedDriver) -> None:
    device = sim.device(0)
    source = SimulatedArray(sim, bytes(range(16)))
    with aiogpu.PinnedPool(device) as pool, aiogpu.Stream(device) as producer, Latch(device) as latch:
        latch.block(producer)
        with anyio.move_on_after(0.02) as scope:
            await aiogpu.copy_to_host(source, after=producer, pool=pool)
        assert scope.cancelled_caught
        in_flight = pool.take(16)  # the cancelled copy's memory is not lent again meanwhile
        assert pool.idle_bytes == 0
        latch.release()
        await pool.side_stream(producer).wait_idle()
        in_flight.release()
        reused = pool.take(16)  # now both buffers are back
        assert pool.idle_bytes == 4096
        reused.release()
    assert sim.statistics().live_host_buffers == 0


async def test_bad_input_is_refused_clearly(sim: SimulatedDriver) -> None:
    device = sim.device(0)
    other = sim.device(1)
    with aiogpu.PinnedPool(device) as pool, aiogpu.Stream(device) as stream, aiogpu.Stream(other) as elsewhere:
        with pytest.raises(TypeError, match="expected a CUDA array"):
            await aiogpu.copy_to_host(b"not on the device", after=stream, pool=pool)
        strided = SimulatedArray(sim, bytes(64))
        strided.__cuda_array_interface__["strides"] = (8,)
        strided.__cuda_array_interface__["shape"] = (8,)
        with pytest.raises(ValueError, match="not C-contiguous"):
            await aiogpu.copy_to_host(strided, after=stream, pool=pool)
        with pytest.raises(ValueError, match="the pool is for device 0, the stream for device 1"):
            await aiogpu.copy_to_host(SimulatedArray(sim, bytes(8)), after=elsewhere, pool=pool)
        with pytest.raises(TypeError, match="after must be an aiogpu.Stream"):
            await aiogpu.copy_to_host(SimulatedArray(sim, bytes(8)), after=None, pool=pool)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="the pool is for device 0, the stream for device 1"):
            pool.side_stream(elsewhere)
        with pytest.raises(ValueError, match="the source has 4 bytes, the destination 8"):
            await aiogpu.copy_to_device(SimulatedArray(sim, bytes(8)), b"1234", after=stream, pool=pool)
        with pytest.raises(ValueError, match="read-only"):
            await aiogpu.copy_to_device(SimulatedArray(sim, bytes(8), readonly=True), bytes(8), after=stream, pool=pool)
        with pytest.raises(TypeError, match="bytes-like or a PinnedBuffer"):
            await aiogpu.copy_to_device(SimulatedArray(sim, bytes(8)), 12345678, after=stream, pool=pool)
        with pytest.raises(ValueError, match="nbytes must be positive"):
            pool.take(0)
        with pytest.raises(ValueError, match="64-bit address, got -1"):
            await aiogpu.copy_to_host((-1, 8), after=stream, pool=pool)
        with pytest.raises(ValueError, match="nbytes must be non-negative, got -1"):
            await aiogpu.copy_to_host((0x1000, -1), after=stream, pool=pool)
        with pytest.raises(TypeError, match="of ints; nbytes is 8.0"):
            await aiogpu.copy_to_host((0x1000, 8.0), after=stream, pool=pool)
        with pytest.raises(TypeError, match="of ints; device pointer is '0x1000'"):
            await aiogpu.copy_to_host(("0x1000", 8), after=stream, pool=pool)
    with pytest.raises(aiogpu.ClosedResourceError):
        pool.take(8)
    with pytest.raises(ValueError, match="max_idle_bytes must be non-negative"):
        aiogpu.PinnedPool(device, max_idle_bytes=-1)


async def test_failed_or_abandoned_copies_leak_no_memory(sim: SimulatedDriver) -> None:
    device = sim.device(0)
    source = SimulatedArray(sim, bytes(16))
    with aiogpu.PinnedPool(device) as pool:
        closed_stream = aiogpu.Stream(device)
        closed_stream.close()
        for _ in range(3):  # fails before anything is enqueued: the buffer goes back
            with pytest.raises(aiogpu.ClosedResourceError):
                await aiogpu.copy_to_host(source, after=closed_stream, pool=pool)
        assert pool.idle_bytes == 4096
        released = pool.take(16)
        released.release()
        with pytest.raises(aiogpu.ClosedResourceError, match="given back"):
            await aiogpu.copy_to_device(SimulatedArray(sim, bytes(16)), released, after=device.default_stream, pool=pool)
    assert sim.statistics().live_host_buffers == 0
    # Closed while a copy is awaited, then the copy is cancelled: freed once the GPU is done.
    pool = aiogpu.PinnedPool(device)
    with aiogpu.Stream(device) as producer, Latch(device) as latch:
        latch.block(producer)
        async with anyio.create_task_group() as tg:
            scope = anyio.CancelScope()

            async def copy() -> None:
                with scope:
                    await aiogpu.copy_to_host(source, after=producer, pool=pool)

            tg.start_soon(copy)
            await anyio.wait_all_tasks_blocked()
            pool.close()
            scope.cancel()
        assert sim.statistics().live_host_buffers == 1  # the GPU may still write it
        assert any(thread.name == "aiogpu-pinned-free" for thread in threading.enumerate())
        latch.release()
        assert await anyio.to_thread.run_sync(_pinned.freer().wait_done, 10)  # freed once the copy is over
        assert sim.statistics().live_host_buffers == 0


async def test_a_copy_that_never_ends_holds_up_no_other_closed_pools_memory(
    sim: SimulatedDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Closed pools' memory held by cancelled copies is freed by one thread for the process: it
    # must not wait for one copy before freeing another's memory.
    device = sim.device(0)
    source = SimulatedArray(sim, bytes(16))
    freed = threading.Event()
    host_free = sim.host_free
    monkeypatch.setattr(sim, "host_free", lambda pointer: (host_free(pointer), freed.set())[0])
    pools = [aiogpu.PinnedPool(device), aiogpu.PinnedPool(device)]
    with aiogpu.Stream(device) as stuck, aiogpu.Stream(device) as later, Latch(device) as held, Latch(device) as brief:
        held.block(stuck)
        brief.block(later)
        async with anyio.create_task_group() as tg:
            tg.start_soon(partial(aiogpu.copy_to_host, source, after=stuck, pool=pools[0]))
            tg.start_soon(partial(aiogpu.copy_to_host, source, after=later, pool=pools[1]))
            await anyio.wait_all_tasks_blocked()
            for pool in pools:
                pool.close()
            tg.cancel_scope.cancel()
        assert sim.statistics().live_host_buffers == 2
        brief.release()
        assert await anyio.to_thread.run_sync(freed.wait, 10)  # the later copy's memory, first
        assert sim.statistics().live_host_buffers == 1
        held.release()
        assert await anyio.to_thread.run_sync(_pinned.freer().wait_done, 10)
        assert sim.statistics().live_host_buffers == 0


async def test_a_bad_device_pointer_is_a_cuda_error_as_on_a_gpu(sim: SimulatedDriver) -> None:
    """The simulated device refuses memory it did not allocate (the copy would read or write
    wherever the pointer points: a null pointer crashed the process), with the error a GPU gives."""
    device = sim.device(0)
    with aiogpu.PinnedPool(device) as pool, aiogpu.Stream(device) as stream, sim.allocate(16) as memory:
        memory.view()[:] = bytes(range(16))
        bad = [(0, 16), (memory.pointer + 8, 16), (memory.pointer - 1, 4), (memory.pointer + 16, 1)]
        for source in bad:
            with pytest.raises(aiogpu.CudaError, match="^cuMemcpyAsync: CUDA_ERROR_INVALID_VALUE: invalid argument") as raised:
                await aiogpu.copy_to_host(source, after=stream, pool=pool)
            assert raised.value.name == "CUDA_ERROR_INVALID_VALUE" and raised.value.func == "cuMemcpyAsync"
            with pytest.raises(aiogpu.CudaError, match="CUDA_ERROR_INVALID_VALUE"):
                await aiogpu.copy_to_device(source, bytes(source[1]), after=stream, pool=pool)
        assert pool.idle_bytes == 4096  # every buffer taken for a refused copy came back
        assert stream.is_idle and not sim.statistics().lifetime_violations
        with await aiogpu.copy_to_host((memory.pointer + 8, 8), after=stream, pool=pool) as tail:
            assert bytes(tail.view()) == bytes(range(8, 16))  # the context is fine: the error is not sticky
        with pool.take(16) as pinned, await aiogpu.copy_to_host((pinned.pointer, 16), after=stream, pool=pool) as copied:
            assert copied.nbytes == 16  # pinned host memory is the simulator's too
    with aiogpu.PinnedPool(device) as pool, pytest.raises(aiogpu.CudaError, match="CUDA_ERROR_INVALID_VALUE"):
        await aiogpu.copy_to_host(memory, after=device.default_stream, pool=pool)  # freed memory is refused too
    assert sim.statistics().live_device_buffers == sim.statistics().live_host_buffers == 0


def test_the_simulated_driver_checks_every_copy_and_free() -> None:
    sim = SimulatedDriver()
    device = sim.device(0)
    with aiogpu.Stream(device) as stream, device._activated():
        host = sim.host_alloc(64)
        memory = sim.allocate(64)
        for destination, source, nbytes in [(host, 0, 8), (0, host, 8), (host, memory.pointer, 65), (host + 60, host, 8)]:
            with pytest.raises(aiogpu.CudaError, match="^cuMemcpyAsync: CUDA_ERROR_INVALID_VALUE"):
                sim.memcpy_async(destination, source, nbytes, stream.handle)
        with pytest.raises(aiogpu.CudaError, match="CUDA_ERROR_INVALID_VALUE"):
            sim.memcpy_async(host, memory.pointer, -1, stream.handle)
        memory.view()[:] = b"\x05" * 64
        sim.memcpy_async(host, memory.pointer, 64, stream.handle)
        stream.synchronize()
        assert ctypes.string_at(host, 64) == b"\x05" * 64
        with pytest.raises(aiogpu.CudaError, match="^cuMemFreeHost: CUDA_ERROR_INVALID_VALUE"):
            sim.host_free(memory.pointer)  # device memory is not page-locked host memory
        sim.host_free(host)
        with pytest.raises(aiogpu.CudaError, match="CUDA_ERROR_INVALID_VALUE"):
            sim.memcpy_async(memory.pointer, host, 8, stream.handle)  # freed
        memory.free()
        memory.free()  # idempotent
        with pytest.raises(aiogpu.ClosedResourceError, match="freed"):
            memory.view()
    assert sim.statistics().live_host_buffers == sim.statistics().live_device_buffers == 0
    assert sim.statistics().lifetime_violations == 1  # the device pointer handed to cuMemFreeHost


def test_allocate_refuses_bad_input(sim: SimulatedDriver) -> None:
    with pytest.raises(ValueError, match="nbytes must be at least 1, got 0"):
        sim.allocate(0)
    with pytest.raises(TypeError, match="nbytes must be an int"):
        sim.allocate(8.0)  # type: ignore[arg-type]
    with pytest.raises(aiogpu.CudaError, match="^cuMemAlloc: CUDA_ERROR_INVALID_DEVICE"):
        sim.allocate(8, device=2)
    with sim.allocate(8, device=1) as memory:
        assert repr(memory) == f"<aiogpu.testing.SimulatedBuffer device=1 8 bytes at {memory.pointer:#x}>"
        assert memory.__cuda_array_interface__["shape"] == (8,)
    assert repr(memory).startswith("<aiogpu.testing.SimulatedBuffer device=1 freed at")
    sim.allocate(8)  # dropped: freed when collected
    gc.collect()
    assert sim.statistics().live_device_buffers == 0


def test_one_pinned_pool_serves_loops_in_several_threads_at_once(sim: SimulatedDriver) -> None:
    """A PinnedPool holds nothing of a loop: an asyncio loop and a trio run, each in a thread of
    its own, copy through one pool at once, and every byte and buffer comes back."""
    device = sim.device(0)
    started = threading.Barrier(2, timeout=10)
    failures: list[BaseException] = []

    def copies(backend: str, fill: int) -> None:
        async def main() -> None:
            source = SimulatedArray(sim, bytes([fill]) * 64)
            with aiogpu.Stream(device) as stream, anyio.fail_after(10):
                await anyio.to_thread.run_sync(started.wait)
                for _ in range(50):
                    await aiogpu.copy_to_device(source, bytes([fill]) * 64, after=stream, pool=pool)
                    with await aiogpu.copy_to_host(source, after=stream, pool=pool) as copied:
                        assert bytes(copied.view()) == bytes([fill]) * 64
            source.memory.free()

        try:
            anyio.run(main, backend=backend)
        except BaseException as exc:  # reported by the test's thread
            failures.append(exc)

    with aiogpu.PinnedPool(device, max_idle_bytes=4096) as pool:
        threads = [threading.Thread(target=copies, args=args) for args in (("asyncio", 1), ("trio", 2))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert failures == []
        assert pool.idle_bytes <= 4096
        anyio.run(lambda: aiogpu.copy_to_device(SimulatedArray(sim, bytes(8)), bytes(8), after=device.default_stream, pool=pool))
    assert sim.statistics().live_host_buffers == 0


def test_threads_asking_for_one_producers_side_stream_at_once_share_one(
    sim: SimulatedDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two threads ask a pool for the same producer's side stream while the first is still
    creating it (the driver call can block): the second waits for it, and no second stream is
    made and left unclosed."""
    device = sim.device(0)
    entered = [threading.Event(), threading.Event()]
    go_on = threading.Event()
    create = sim.stream_create
    made = 0

    def slow_create(flags: int, priority: int) -> int:
        nonlocal made
        made += 1
        entered[min(made, 2) - 1].set()
        if made == 1:
            assert go_on.wait(10)
        return create(flags, priority)

    with aiogpu.Stream(device) as producer, aiogpu.PinnedPool(device) as pool:
        monkeypatch.setattr(sim, "stream_create", slow_create)
        sides: list[aiogpu.Stream | None] = [None, None]

        def ask(index: int) -> None:
            sides[index] = pool.side_stream(producer)

        threads = [threading.Thread(target=ask, args=(index,)) for index in range(2)]
        threads[0].start()
        assert entered[0].wait(10)
        threads[1].start()
        # The second thread waits on the pool's lock; without it, it would make a stream of its
        # own at once: give it the chance before the first one goes on.
        entered[1].wait(0.5)
        go_on.set()
        for thread in threads:
            thread.join(10)
        assert made == 1
        assert sides[0] is not None and sides[0] is sides[1]
