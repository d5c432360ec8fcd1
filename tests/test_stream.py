"""Stream: creation options, adoption of foreign streams, record, wait_for, queries, lifetime."""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING

import anyio
import pytest

import aiogpu
from aiogpu.testing import Latch, SimulatedDriver

if TYPE_CHECKING:
    from collections.abc import Callable


class ProtocolStream:
    """A stand-in for torch/CuPy/Numba/cuda.core streams: only ``__cuda_stream__``."""

    def __init__(self, handle: int, version: int = 0) -> None:
        self.handle = handle
        self.version = version

    def __cuda_stream__(self) -> tuple[int, int]:
        return (self.version, self.handle)


def test_priority_and_flags(device: aiogpu.Device) -> None:
    lowest, highest = device.stream_priority_range
    assert highest <= lowest
    with aiogpu.Stream(device, priority=highest, nonblocking=True) as stream:
        assert stream.priority == highest
        assert stream.is_nonblocking
        assert stream.is_owned
    with device.create_stream() as stream:
        assert stream.priority == lowest
        assert not stream.is_nonblocking


def test_priority_out_of_range_is_rejected(device: aiogpu.Device) -> None:
    lowest, highest = device.stream_priority_range
    with pytest.raises(ValueError, match=rf"between {highest} \(highest\) and {lowest} \(lowest\).*got {lowest + 1}"):
        aiogpu.Stream(device, priority=lowest + 1)
    with pytest.raises(TypeError, match="priority must be an int"):
        aiogpu.Stream(device, priority=0.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="nonblocking must be a bool"):
        aiogpu.Stream(device, nonblocking="yes")  # type: ignore[arg-type]


def test_record_returns_new_or_given_event(device: aiogpu.Device) -> None:
    with aiogpu.Stream(device) as stream:
        event = stream.record(timing=True)
        assert event.is_recorded and event.is_timing_enabled
        assert stream.record(event) is event
        with pytest.raises(ValueError, match="options apply to a new event"):
            stream.record(event, timing=True)
        with pytest.raises(TypeError, match="expected an aiogpu.Event"):
            stream.record("event")  # type: ignore[arg-type]


def test_wait_for_orders_work_across_streams(device: aiogpu.Device) -> None:
    with aiogpu.Stream(device) as first, aiogpu.Stream(device) as second, Latch(device) as latch:
        latch.block(first)
        held = first.record()
        second.wait_for(held)
        after_event = second.record()
        second.wait_for(first)
        after_stream = second.record()
        second.wait_for(device)
        assert not after_event.is_done and not after_stream.is_done
        latch.release()
        second.synchronize()
        assert after_event.is_done and after_stream.is_done


def soon(condition: Callable[[], bool], seconds: float = 10.0) -> bool:
    """Whether ``condition()`` holds within ``seconds`` (a bounded ``synchronize``: work that a
    wrong model holds for good fails the test instead of hanging it)."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(1e-4)
    return True


def test_the_legacy_default_stream_waits_for_blocking_streams_only(device: aiogpu.Device) -> None:
    # CUDA's implicit synchronization, which the simulator models too: an operation on the
    # legacy default stream waits for the work queued before it on every blocking stream.
    with (
        aiogpu.Stream(device) as blocking,
        aiogpu.Stream(device, nonblocking=True) as nonblocking,
        Latch(device) as holds_blocking,
        Latch(device) as holds_nonblocking,
    ):
        holds_nonblocking.block(nonblocking)
        free = device.default_stream.record()
        assert soon(lambda: free.is_done)  # a non-blocking stream's work: not waited for
        holds_blocking.block(blocking)
        after = device.default_stream.record()
        assert not after.is_done
        holds_blocking.release()
        assert soon(lambda: after.is_done)
        assert not nonblocking.is_idle


def test_blocking_streams_wait_for_the_legacy_default_stream(device: aiogpu.Device) -> None:
    with aiogpu.Stream(device) as blocking, aiogpu.Stream(device, nonblocking=True) as nonblocking, Latch(device) as latch:
        latch.block(device.default_stream)
        free = nonblocking.record()
        assert soon(lambda: free.is_done)
        behind = blocking.record()
        assert not behind.is_done
        latch.release()
        assert soon(lambda: behind.is_done)


def test_a_wait_for_finished_work_on_the_legacy_stream_still_orders_it(device: aiogpu.Device) -> None:
    # cuStreamWaitEvent on the legacy default stream is an operation there even when the event
    # is complete: a blocking stream's later work waits for what the legacy stream waits for.
    with (
        aiogpu.Stream(device) as held,
        aiogpu.Stream(device) as blocking,
        aiogpu.Stream(device, nonblocking=True) as nonblocking,
        Latch(device) as latch,
    ):
        finished = nonblocking.record()
        assert soon(lambda: finished.is_done)
        latch.block(held)
        device.default_stream.wait_for(finished)
        behind = blocking.record()
        assert not behind.is_done
        latch.release()
        assert soon(lambda: behind.is_done)


def test_per_thread_default_streams_are_per_thread_and_synchronize_with_the_legacy_stream(device: aiogpu.Device) -> None:
    per_thread = aiogpu.Stream.adopt(2, device=device)  # CU_STREAM_PER_THREAD: the calling thread's own
    with per_thread, aiogpu.Stream(device) as blocking, Latch(device) as holds_blocking, Latch(device) as holds_per_thread:
        holds_blocking.block(blocking)
        free = per_thread.record()
        assert soon(lambda: free.is_done)  # it does not wait for other blocking streams
        holds_per_thread.block(per_thread)
        assert not per_thread.is_idle
        seen: list[bool] = []
        other_thread = threading.Thread(target=lambda: seen.append(per_thread.is_idle))
        other_thread.start()
        other_thread.join()
        assert seen == [True]  # another thread's per-thread stream is its own
        behind_both = device.default_stream.record()
        holds_blocking.release()
        assert soon(lambda: blocking.is_idle)
        assert not behind_both.is_done  # the legacy stream waits for the per-thread stream too
        holds_per_thread.release()
        assert soon(lambda: behind_both.is_done)


@pytest.mark.anyio
async def test_waits_on_two_threads_per_thread_streams_do_not_queue_behind_each_other(device: aiogpu.Device) -> None:
    # One adopted CU_STREAM_PER_THREAD wrapper is a different stream on each thread: a wait
    # recorded on this thread's must not queue behind one recorded, held, on another thread's.
    per_thread = aiogpu.Stream.adopt(2, device=device)
    with per_thread, Latch(device) as holds_other, Latch(device) as holds_mine:

        def record_on_another_thread() -> aiogpu.Event:
            holds_other.block(per_thread)
            return per_thread.record()

        behind_other = await anyio.to_thread.run_sync(record_on_another_thread)
        holds_mine.block(per_thread)
        mine = per_thread.record()
        await assert_not_queued_behind(behind_other, holds_other, mine, holds_mine)


async def assert_not_queued_behind(held: aiogpu.Event, holds: Latch, later: aiogpu.Event, holds_later: Latch) -> None:
    """A wait for ``later`` ends once ``holds_later`` is released, while a wait for ``held``
    started before it is still pending: the two were not queued as one stream."""
    later_done = anyio.Event()

    async def wait_for_later() -> None:
        await later.wait()
        later_done.set()

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(held.wait)
            await anyio.wait_all_tasks_blocked()
            tg.start_soon(wait_for_later)
            await anyio.wait_all_tasks_blocked()
            holds_later.release()
            await later_done.wait()
            assert not held.is_done
            holds.release()


@pytest.mark.anyio
async def test_a_thread_that_reuses_an_exited_threads_ident_has_its_own_per_thread_stream(device: aiogpu.Device) -> None:
    # Thread idents are reused once a thread exits (on Linux the next thread usually gets the
    # same one): a wait recorded on the new thread's per-thread stream must not queue behind
    # one still held on the exited thread's.
    per_thread = aiogpu.Stream.adopt(2, device=device)

    def record_on_a_new_thread(latch: Latch) -> aiogpu.Event:
        recorded: list[aiogpu.Event] = []

        def record() -> None:
            latch.block(per_thread)
            recorded.append(per_thread.record())

        thread = threading.Thread(target=record)
        thread.start()
        thread.join()
        return recorded[0]

    with per_thread, Latch(device) as holds_first, Latch(device) as holds_second:
        first = record_on_a_new_thread(holds_first)
        second = record_on_a_new_thread(holds_second)
        await assert_not_queued_behind(first, holds_first, second, holds_second)


def test_wait_for_rejects_other_things(device: aiogpu.Device) -> None:
    with aiogpu.Stream(device) as stream, pytest.raises(TypeError, match="expects an aiogpu Event, Stream or Device, got 5"):
        stream.wait_for(5)  # type: ignore[arg-type]


def test_wait_for_across_devices(sim: SimulatedDriver) -> None:
    with aiogpu.Stream(sim.device(0)) as first, aiogpu.Stream(sim.device(1)) as second, Latch(sim.device(0)) as latch:
        latch.block(first)
        second.wait_for(first)
        after = second.record()
        assert not after.is_done
        latch.release()
        second.synchronize()
        assert after.is_done


def test_is_idle_and_synchronize(device: aiogpu.Device) -> None:
    with aiogpu.Stream(device) as stream, Latch(device) as latch:
        assert stream.is_idle
        latch.block(stream)
        assert not stream.is_idle
        latch.release()
        stream.synchronize()
        assert stream.is_idle


def test_cuda_stream_protocol(device: aiogpu.Device) -> None:
    with aiogpu.Stream(device) as stream:
        assert stream.__cuda_stream__() == (0, stream.handle)
        assert aiogpu.Stream.adopt(stream) is stream


def test_adopt_protocol_object_and_raw_handle(device: aiogpu.Device) -> None:
    with aiogpu.Stream(device) as owner:
        foreign = ProtocolStream(owner.handle)
        borrowed = aiogpu.Stream.adopt(foreign, device=device)
        assert borrowed.handle == owner.handle
        assert borrowed == owner and hash(borrowed) == hash(owner)
        assert not borrowed.is_owned
        assert borrowed.device is device
        raw = aiogpu.Stream.adopt(owner.handle, device=device)
        assert raw == owner
        event = borrowed.record()
        borrowed.close()
        raw.close()
        owner.synchronize()  # closing the borrowed streams did not destroy the stream
        assert event.is_done


def test_adopt_finds_the_device_from_the_context(sim: SimulatedDriver) -> None:
    with sim.installed(), aiogpu.Stream(sim.device(1)) as owner:
        assert aiogpu.Stream.adopt(owner.handle).device is sim.device(1)
        with pytest.raises(ValueError, match="belongs to device 1, not device 0"):
            aiogpu.Stream.adopt(owner.handle, device=sim.device(0))


def test_adopt_default_stream_handle_needs_the_device(sim: SimulatedDriver) -> None:
    with sim.installed():
        sim.device(1).set_current()
        with pytest.raises(ValueError, match="stream handle 0 means the default stream of whichever device is current"):
            aiogpu.Stream.adopt(0)
        stream = aiogpu.Stream.adopt(0, device=sim.device(1))
        assert stream == sim.device(1).default_stream
        sim.context_set_current(0)


def test_adopt_keeps_the_owner_alive_while_open(device: aiogpu.Device) -> None:
    with aiogpu.Stream(device) as owner:
        foreign = ProtocolStream(owner.handle)
        borrowed = aiogpu.Stream.adopt(foreign, device=device)
        assert borrowed._owner is foreign
        borrowed.close()
        assert borrowed._owner is None


@pytest.mark.parametrize(
    ("obj", "error", "message"),
    [
        ("stream", TypeError, "expected an object with a __cuda_stream__"),
        (True, TypeError, "cannot adopt True"),
        (-1, ValueError, "64-bit address"),
        (2**64, ValueError, "64-bit address"),
        (ProtocolStream(-5), ValueError, "64-bit address"),
        (ProtocolStream(0x1000, version=1), ValueError, "protocol version 1"),
    ],
)
def test_adopt_rejects_bad_input(sim: SimulatedDriver, obj: object, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        aiogpu.Stream.adopt(obj, device=sim.device(0))


def test_adopt_rejects_a_bad_protocol_result(sim: SimulatedDriver) -> None:
    class Broken:
        def __cuda_stream__(self) -> object:
            return "not a tuple"

    class Attribute:
        __cuda_stream__ = (0, 0)

    with pytest.raises(TypeError, match="must return"):
        aiogpu.Stream.adopt(Broken(), device=sim.device(0))
    with pytest.raises(TypeError, match="must be a method"):
        aiogpu.Stream.adopt(Attribute(), device=sim.device(0))


def test_adopt_rejects_a_stream_of_a_non_primary_context(sim: SimulatedDriver, monkeypatch: pytest.MonkeyPatch) -> None:
    with aiogpu.Stream(sim.device(0)) as owner:
        monkeypatch.setattr(sim, "stream_context", lambda handle: 0x1234)
        monkeypatch.setattr(sim, "context_device", lambda context: 0)
        with pytest.raises(ValueError, match="not device 0's primary context"):
            aiogpu.Stream.adopt(owner.handle, device=sim.device(0))


def test_close_is_idempotent_and_final(sim: SimulatedDriver) -> None:
    before = sim.statistics().live_streams
    stream = aiogpu.Stream(sim.device(0))
    assert sim.statistics().live_streams == before + 1
    stream.close()
    stream.close()
    assert sim.statistics().live_streams == before
    assert stream.is_closed
    for use in (stream.record, stream.synchronize, stream.__cuda_stream__, lambda: stream.is_idle):
        with pytest.raises(aiogpu.ClosedResourceError, match="this Stream is closed"):
            use()


def test_default_stream_is_borrowed_and_renewed_after_close(device: aiogpu.Device) -> None:
    default = device.default_stream
    assert default.handle == 0 and not default.is_owned
    assert device.default_stream is default
    default.close()
    assert not device.default_stream.is_closed


def test_repr(sim: SimulatedDriver) -> None:
    stream = aiogpu.Stream(sim.device(1))
    assert repr(stream) == f"<aiogpu.Stream device=1 handle={stream.handle:#x} owned>"
    assert repr(sim.device(0).default_stream) == "<aiogpu.Stream device=0 handle=0x0 borrowed>"
    stream.close()
    assert repr(stream).endswith("closed>")


def test_streams_aiogpu_creates_are_never_mistaken_for_earlier_ones(sim: SimulatedDriver) -> None:
    """CUDA reuses a destroyed stream's address at once; the wake engine queues waits per stream
    and relies on each queue completing in order, so a new stream must not share an old one's
    queue. Wrappers of one foreign stream do share it (it is one stream)."""
    device = sim.device(0)
    first = aiogpu.Stream(device)
    again = aiogpu.Stream._borrow(device, first.handle, owner=None)  # as if created at the same address
    assert first._wait_key != again._wait_key
    borrowed = [aiogpu.Stream.adopt(first.handle, device=device) for _ in range(2)]
    assert borrowed[0]._wait_key == borrowed[1]._wait_key != first._wait_key
    for stream in (*borrowed, again, first):
        stream.close()


def test_recordings_from_two_threads_are_numbered_in_the_order_the_stream_got_them(
    sim: SimulatedDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The wake engine completes a stream's waits in this order and infers "done" from later
    # ones: a thread switched out between the driver's record and the numbering must not let
    # another thread's later recording take a smaller number.
    device = sim.device(0)
    in_driver_order: list[int] = []
    record = sim.event_record

    def record_then_switch(event: int, stream: int) -> None:
        record(event, stream)
        in_driver_order.append(event)
        time.sleep(0)  # lets the other thread run, as a GIL hand-off after the call would

    monkeypatch.setattr(sim, "event_record", record_then_switch)
    with aiogpu.Stream(device) as stream:
        events = [[aiogpu.Event(device) for _ in range(300)] for _ in range(2)]

        def record_all(mine: list[aiogpu.Event]) -> None:
            for event in mine:
                stream.record(event)

        threads = [threading.Thread(target=record_all, args=(mine,)) for mine in events]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        numbered = sorted((event for mine in events for event in mine), key=lambda event: event._record_sequence)
        assert [event.handle for event in numbered] == in_driver_order
        for mine in events:
            for event in mine:
                event.close()
