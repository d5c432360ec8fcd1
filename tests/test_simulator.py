"""The simulated driver's CUDA semantics: streams, events, waits, time, faults, contexts, IPC.

Everything here runs without a GPU. Pending work is held (``sim.launch(stream)``) and released
by the test, or timed (``sim.launch(stream, seconds=...)``) and waited for with ``await`` or a
blocking driver call; nothing sleeps to let the simulated GPU finish. Tests that need a
thread parked in a synchronize call use ``sim.wait_until_blocked``.
"""

from __future__ import annotations

import dataclasses
import math
import os
import pydoc
import threading
import time
from contextlib import contextmanager
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
import pytest

import aiogpu
from aiogpu import _driver
from aiogpu._driver import EVENT_DISABLE_TIMING, EVENT_INTERPROCESS, STREAM_NON_BLOCKING
from aiogpu._wait import _thread
from aiogpu.testing import Latch, SimulatedDriver, launch_fault
from tests.helpers import waiter_thread_queries

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

T = TypeVar("T")

ILLEGAL_ADDRESS = "CUDA_ERROR_ILLEGAL_ADDRESS"


# -- helpers --------------------------------------------------------------------------------------
@contextmanager
def raises_cuda(name: str, func: str | None = None) -> Iterator[pytest.ExceptionInfo[aiogpu.CudaError]]:
    """Expect a ``CudaError`` with this result name (and driver function, if given)."""
    with pytest.raises(aiogpu.CudaError) as excinfo:
        yield excinfo
    assert excinfo.value.name == name, str(excinfo.value)
    if func is not None:
        assert excinfo.value.func == func, str(excinfo.value)


def in_fresh_thread(function: Callable[[], T]) -> T:
    """Run ``function`` on a new thread (no CUDA context current there) and return or raise its outcome."""
    outcome: list[tuple[bool, Any]] = []

    def target() -> None:
        try:
            outcome.append((True, function()))
        except BaseException as exc:
            outcome.append((False, exc))

    thread = threading.Thread(target=target, name="simulator-test-thread")
    thread.start()
    thread.join(30)
    assert not thread.is_alive(), "the fresh thread did not finish"
    ok, value = outcome[0]
    if not ok:
        raise value
    return value  # type: ignore[no-any-return]


class Background:
    """Run a (blocking) call on its own thread; ``join`` re-raises what it raised."""

    def __init__(self, function: Callable[[], object]) -> None:
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(function,), name="simulator-test-background", daemon=True)
        self._thread.start()

    def _run(self, function: Callable[[], object]) -> None:
        try:
            function()
        except BaseException as exc:
            self.error = exc

    def is_alive(self) -> bool:
        return self._thread.is_alive()

    def join(self) -> None:
        self._thread.join(30)
        assert not self._thread.is_alive(), "the background call did not return"
        if self.error is not None:
            raise self.error


@contextmanager
def current(sim: SimulatedDriver, device: aiogpu.Device) -> Iterator[None]:
    """Push ``device``'s primary context on this thread for the block (driver-level calls)."""
    sim.context_push(device._context)
    try:
        yield
    finally:
        sim.context_pop()


# -- devices and construction ----------------------------------------------------------------------
@pytest.mark.parametrize("devices", [-1, True, 1.5, "2", None])
def test_devices_must_be_a_non_negative_int(devices: object) -> None:
    with pytest.raises(ValueError, match="devices must be a non-negative int"):
        SimulatedDriver(devices=devices)  # type: ignore[arg-type]


def test_zero_devices_means_cuda_is_unavailable() -> None:
    empty = SimulatedDriver(devices=0)
    assert empty.device_count() == 0
    assert aiogpu.Device.count(driver=empty) == 0
    with pytest.raises(aiogpu.CudaUnavailableError, match="reports no devices"):
        empty.device(0)


def test_devices_names_and_primary_contexts(sim: SimulatedDriver) -> None:
    assert sim.device_count() == 2
    first, second = sim.device(0), sim.device(1)
    assert first is sim.device(0)
    assert first is aiogpu.Device(0, driver=sim)
    assert (first.ordinal, second.ordinal) == (0, 1)
    assert (first.name, second.name) == ("Simulated GPU 0", "Simulated GPU 1")
    assert first.driver_name == second.driver_name == "simulated"
    assert first._context != second._context
    assert sim.primary_context_retain(1) == second._context
    assert sim.context_device(first._context) == 0
    assert sim.context_device(second._context) == 1
    with pytest.raises(ValueError, match="device ordinal 2 is out of range"):
        sim.device(2)
    with raises_cuda("CUDA_ERROR_INVALID_DEVICE", "cuDeviceGetName"):
        sim.device_name(2)
    with raises_cuda("CUDA_ERROR_INVALID_DEVICE", "cuDevicePrimaryCtxRetain"):
        sim.primary_context_retain(-1)


def test_stream_priorities_and_flags() -> None:
    sim = SimulatedDriver(priority_range=(2, -3))
    device = sim.device(0)
    assert device.stream_priority_range == (2, -3)
    with aiogpu.Stream(device) as lowest, aiogpu.Stream(device, priority=-3, nonblocking=True) as highest:
        assert lowest.priority == 2
        assert not lowest.is_nonblocking
        assert highest.priority == -3
        assert highest.is_nonblocking
    with pytest.raises(ValueError, match="between -3 \\(highest\\) and 2 \\(lowest\\)"):
        aiogpu.Stream(device, priority=-4)
    with current(sim, device):
        # The driver clamps out-of-range priorities, as cuStreamCreateWithPriority does.
        clamped_high = sim.stream_create(STREAM_NON_BLOCKING, -100)
        clamped_low = sim.stream_create(0, 100)
    assert sim.stream_priority(clamped_high) == -3
    assert sim.stream_flags(clamped_high) == STREAM_NON_BLOCKING
    assert sim.stream_priority(clamped_low) == 2
    assert sim.stream_flags(clamped_low) == 0
    sim.stream_destroy(clamped_high)
    sim.stream_destroy(clamped_low)


# -- streams run in order ----------------------------------------------------------------------------
def test_held_work_blocks_later_work_on_its_stream_only(sim: SimulatedDriver) -> None:
    device = sim.device(0)
    with aiogpu.Stream(device) as held, aiogpu.Stream(device) as other:
        work = sim.launch(held)
        later = sim.launch(held, seconds=0)
        after = held.record()
        assert not work.is_done
        assert not later.is_done  # zero-second work still waits for the work before it
        assert not after.is_done
        assert not held.is_idle
        # Another stream of the same device runs on.
        sim.launch(other, seconds=0)
        unrelated = other.record()
        assert unrelated.is_done
        assert other.is_idle
        assert device.default_stream.is_idle
        work.release()
        assert work.is_done
        assert later.is_done
        assert after.is_done
        assert held.is_idle


def test_blocking_synchronize_of_short_work_never_misses_its_completion(sim: SimulatedDriver) -> None:
    # Short timed work can finish between the blocked thread's look and its choice of how
    # long to sleep; that sleep must then be zero, not "until something changes" (a hang).
    device = sim.device(0)
    with aiogpu.Stream(device) as stream:
        event = aiogpu.Event(device, blocking_sync=True)
        finished = threading.Event()

        def synchronize_many() -> None:
            for _ in range(300):
                sim.launch(stream, seconds=20e-6)
                event.record(stream)
                event.synchronize()
            finished.set()

        worker = threading.Thread(target=synchronize_many, daemon=True)
        worker.start()
        assert finished.wait(10), "a blocking synchronize of completed work never returned"
        worker.join()
        event.close()


def test_releasing_later_work_first_does_not_reorder_a_stream(sim: SimulatedDriver) -> None:
    with aiogpu.Stream(sim.device(0)) as stream:
        first = sim.launch(stream)
        after_first = stream.record()
        second = sim.launch(stream)
        after_second = stream.record()
        second.release()
        assert not second.is_done
        assert not after_first.is_done
        assert not after_second.is_done
        first.release()
        assert first.is_done
        assert second.is_done
        assert after_first.is_done
        assert after_second.is_done
        assert stream.is_idle


def test_release_is_idempotent_and_the_first_outcome_wins(sim: SimulatedDriver) -> None:
    device = sim.device(0)
    with aiogpu.Stream(device) as stream:
        work = sim.launch(stream)
        work.release()
        work.release()
        work.fail(ILLEGAL_ADDRESS)  # too late: the work was already released
        event = stream.record()
        assert event.is_done
        assert work.is_done
        assert stream.is_idle
        with aiogpu.Event(device):  # the context is fine
            pass


def test_work_on_a_closed_stream_still_runs(sim: SimulatedDriver) -> None:
    device = sim.device(0)
    stream = aiogpu.Stream(device)
    work = sim.launch(stream)
    event = stream.record()
    stream.close()  # cuStreamDestroy: enqueued work still runs to completion
    assert sim.statistics().live_streams == 0
    assert not event.is_done
    work.release()
    assert work.is_done
    assert event.is_done
    event.close()


def test_latch_holds_every_stream_it_blocks(sim: SimulatedDriver) -> None:
    device = sim.device(0)
    with aiogpu.Stream(device) as first, aiogpu.Stream(device) as second, Latch(device) as latch:
        latch.block(first)
        latch.block(second)
        events = [first.record(), second.record()]
        assert not any(event.is_done for event in events)
        latch.release()
        assert all(event.is_done for event in events)
        with aiogpu.Stream(sim.device(1)) as elsewhere, pytest.raises(ValueError, match="expected an aiogpu.Stream of"):
            latch.block(elsewhere)
    with pytest.raises(ValueError, match="the latch is closed"):
        latch.block(first)


# -- events capture a stream position ----------------------------------------------------------------
def test_event_captures_the_stream_position_at_record_time(sim: SimulatedDriver) -> None:
    with aiogpu.Stream(sim.device(0)) as stream:
        before_anything = stream.record()
        first = sim.launch(stream)
        captured = stream.record()
        second = sim.launch(stream)  # enqueued after the record: does not delay it
        everything = stream.record()
        assert before_anything.is_done
        assert not captured.is_done
        first.release()
        assert captured.is_done
        assert not everything.is_done
        assert not stream.is_idle
        second.release()
        assert everything.is_done
        assert stream.is_idle


def test_rerecording_captures_anew(sim: SimulatedDriver) -> None:
    device = sim.device(0)
    with aiogpu.Stream(device) as held, aiogpu.Stream(device) as idle, aiogpu.Event(device) as event:
        work = sim.launch(held)
        event.record(held)
        assert not event.is_done
        event.record(idle)  # the new recording replaces the pending one
        assert event.is_done
        held.record(event)  # and back onto the held stream
        assert not event.is_done
        work.release()
        assert event.is_done
        again = sim.launch(held)
        assert event.is_done  # work after the last recording does not count
        held.record(event)
        assert not event.is_done
        again.release()
        assert event.is_done


def test_unrecorded_event_is_complete_in_the_driver_but_refused_by_aiogpu(sim: SimulatedDriver) -> None:
    with aiogpu.Event(sim.device(0)) as event:
        assert sim.event_query(event.handle)  # CUDA reports an empty event as complete
        sim.event_synchronize(event.handle)
        with pytest.raises(aiogpu.EventStateError, match="never recorded"):
            _ = event.is_done
        with pytest.raises(aiogpu.EventStateError, match="never recorded"):
            event.synchronize()


def test_events_on_the_default_stream(sim: SimulatedDriver) -> None:
    device = sim.device(0)
    default = device.default_stream
    assert default.handle == 0
    assert not default.is_owned
    work = sim.launch(default)
    event = aiogpu.Event(device)
    event.record()  # no stream: the device's default stream
    assert not event.is_done
    assert not default.is_idle
    assert sim.device(1).default_stream.is_idle  # another device's default stream is another stream
    work.release()
    assert event.is_done
    assert default.is_idle
    event.close()


# -- cross-stream waits --------------------------------------------------------------------------------
def test_wait_for_event_waits_for_the_captured_work_only(sim: SimulatedDriver) -> None:
    device = sim.device(0)
    with aiogpu.Stream(device) as a, aiogpu.Stream(device) as b:
        captured_work = sim.launch(a)
        captured = a.record()
        later_work = sim.launch(a)  # after the record: b does not wait for it
        b_before = b.record()
        b.wait_for(captured)
        b_after = b.record()
        assert b_before.is_done  # work enqueued on b before the wait is not delayed
        assert not b_after.is_done
        assert not b.is_idle
        captured_work.release()
        assert b_after.is_done
        assert b.is_idle
        assert not a.is_idle
        later_work.release()
        assert a.is_idle


def test_wait_for_stream_captures_its_work_at_call_time(sim: SimulatedDriver) -> None:
    device = sim.device(0)
    with aiogpu.Stream(device) as a, aiogpu.Stream(device) as b:
        first = sim.launch(a)
        events_before = sim.statistics().live_events
        b.wait_for(a)
        assert sim.statistics().live_events == events_before  # the marker event is closed at once
        second = sim.launch(a)
        b_after = b.record()
        assert not b_after.is_done
        first.release()
        assert b_after.is_done
        assert not a.is_idle
        second.release()


def test_wait_for_device_waits_for_its_default_stream(sim: SimulatedDriver) -> None:
    device = sim.device(0)
    # Both non-blocking: a blocking b would wait for the default stream's later work as well.
    with aiogpu.Stream(device, nonblocking=True) as b, aiogpu.Stream(device, nonblocking=True) as unrelated:
        held_unrelated = sim.launch(unrelated)  # not the default stream (nor synchronized with it): not waited for
        on_default = sim.launch(device.default_stream)
        b.wait_for(device)
        after_default = sim.launch(device.default_stream)
        b_after = b.record()
        assert not b_after.is_done
        on_default.release()
        assert b_after.is_done
        assert not device.default_stream.is_idle
        after_default.release()
        held_unrelated.release()


def test_wait_for_works_across_devices(sim: SimulatedDriver) -> None:
    first, second = sim.device(0), sim.device(1)
    with aiogpu.Stream(first) as producer, aiogpu.Stream(second) as consumer:
        work = sim.launch(producer)
        consumer.wait_for(producer)
        consumed = consumer.record()
        assert consumed.device is second
        assert not consumed.is_done
        work.release()
        assert consumed.is_done


def test_a_wait_uses_the_recording_current_at_the_call(sim: SimulatedDriver) -> None:
    device = sim.device(0)
    with aiogpu.Stream(device) as a, aiogpu.Stream(device) as b, aiogpu.Stream(device) as idle:
        work = sim.launch(a)
        event = a.record()
        b.wait_for(event)
        event.record(idle)  # cuStreamWaitEvent already took the old recording
        assert event.is_done
        b_after = b.record()
        assert not b_after.is_done
        work.release()
        assert b_after.is_done


def test_waiting_for_completed_or_unrecorded_events_adds_no_dependency(sim: SimulatedDriver) -> None:
    device = sim.device(0)
    with aiogpu.Stream(device) as a, aiogpu.Stream(device) as b, aiogpu.Event(device) as unrecorded:
        done = a.record()
        work = sim.launch(a)  # after the record
        b.wait_for(done)
        sim.stream_wait_event(b.handle, unrecorded.handle)  # CUDA: waiting for an empty event is a no-op
        assert b.is_idle
        with b.record() as b_after:
            assert b_after.is_done
        with pytest.raises(aiogpu.EventStateError, match="cannot wait for an event that was never recorded"):
            b.wait_for(unrecorded)
        with pytest.raises(TypeError, match="wait_for\\(\\) expects"):
            b.wait_for(0)  # type: ignore[arg-type]
        work.release()


def test_a_stream_waiting_on_its_own_work_goes_on(sim: SimulatedDriver) -> None:
    with aiogpu.Stream(sim.device(0)) as stream:
        work = sim.launch(stream)
        stream.wait_for(stream)  # redundant, and legal: the stream already runs in order
        after = stream.record()
        work.release()
        assert after.is_done
        assert stream.is_idle


def test_streams_waiting_on_each_other_in_turn_complete(sim: SimulatedDriver) -> None:
    device = sim.device(0)
    with aiogpu.Stream(device) as a, aiogpu.Stream(device) as b:
        on_a = sim.launch(a)
        b.wait_for(a)  # b: wait for a's first work, then its own
        on_b = sim.launch(b)
        a.wait_for(b)  # a: then wait for b's work
        a_after = a.record()
        b_after = b.record()
        on_a.release()
        assert not a_after.is_done
        on_b.release()
        assert b_after.is_done
        assert a_after.is_done


def test_a_wait_completes_when_the_captured_work_does_not_later_work(sim: SimulatedDriver) -> None:
    device = sim.device(0)
    with aiogpu.Stream(device) as a, aiogpu.Stream(device) as b:
        start = a.record(timing=True)
        sim.launch(a, seconds=0.02)
        captured = a.record()
        sim.launch(a, seconds=0.5)  # after the capture
        b.wait_for(captured)
        sim.launch(b, seconds=0.2)  # runs from ~0.02 s to ~0.22 s
        end = b.record(timing=True)
        a.synchronize()  # ~0.52 s: long after b's work has finished
        assert end.is_done
        assert start.elapsed_time(end) < 400


# -- timed work ----------------------------------------------------------------------------------------
@pytest.mark.anyio
async def test_timed_work_completes_after_its_time(sim: SimulatedDriver) -> None:
    with aiogpu.Stream(sim.device(0)) as stream:
        started = time.monotonic()  # the simulator's clock
        work = sim.launch(stream, seconds=0.02)
        event = stream.record(timing=True)
        with anyio.fail_after(10):
            await event
        assert time.monotonic() - started >= 0.018
        assert work.is_done
        assert event.is_done
        assert stream.is_idle


def test_timed_work_starts_when_the_work_before_it_finishes(sim: SimulatedDriver) -> None:
    with aiogpu.Stream(sim.device(0)) as stream:
        held = sim.launch(stream)
        start = stream.record(timing=True)
        timed = sim.launch(stream, seconds=0.02)
        end = stream.record(timing=True)
        assert not timed.is_done
        released = time.monotonic()
        held.release()
        end.synchronize()
        assert time.monotonic() - released >= 0.018
        assert timed.is_done
        elapsed = start.elapsed_time(end)
        assert 18 <= elapsed < 1000
        assert end - start == elapsed


def test_timed_work_runs_back_to_back(sim: SimulatedDriver) -> None:
    with aiogpu.Stream(sim.device(0)) as stream:
        start = stream.record(timing=True)
        sim.launch(stream, seconds=0.02)
        middle = stream.record(timing=True)
        sim.launch(stream, seconds=0.03)
        end = stream.record(timing=True)
        stream.synchronize()
        assert 18 <= start.elapsed_time(middle) < 1000
        assert 28 <= middle.elapsed_time(end) < 1000
        assert 48 <= start.elapsed_time(end) < 1000


def test_long_timed_work_is_pending_and_does_not_delay_other_streams(sim: SimulatedDriver) -> None:
    device = sim.device(0)
    with aiogpu.Stream(device) as slow, aiogpu.Stream(device) as fast:
        long_work = sim.launch(slow, seconds=600)
        slow_event = slow.record()
        short_work = sim.launch(fast, seconds=0.02)
        fast_event = fast.record(blocking_sync=True)
        fast_event.synchronize()
        assert short_work.is_done
        assert fast.is_idle
        assert not long_work.is_done
        assert not slow_event.is_done
        assert not slow.is_idle
        with pytest.raises(ValueError, match="only held work"):
            long_work.release()


def test_zero_second_work_completes_at_once(sim: SimulatedDriver) -> None:
    with aiogpu.Stream(sim.device(0)) as stream:
        work = sim.launch(stream, seconds=0)
        assert work.is_done
        assert stream.is_idle


def test_elapsed_time_refusals(sim: SimulatedDriver) -> None:
    device = sim.device(0)
    with aiogpu.Stream(device) as stream:
        untimed = stream.record()
        start = stream.record(timing=True)
        work = sim.launch(stream)
        end = stream.record(timing=True)
        with pytest.raises(aiogpu.EventStateError, match="the end event has not completed yet"):
            start.elapsed_time(end)
        with raises_cuda("CUDA_ERROR_NOT_READY", "cuEventElapsedTime"):
            sim.event_elapsed_time(start.handle, end.handle)
        work.release()
        assert start.elapsed_time(end) >= 0
        with pytest.raises(aiogpu.EventStateError, match="the start event was created without timing"):
            untimed.elapsed_time(end)
        with raises_cuda("CUDA_ERROR_INVALID_HANDLE", "cuEventElapsedTime"):
            sim.event_elapsed_time(untimed.handle, end.handle)
        with (
            aiogpu.Event(device, timing=True) as unrecorded,
            raises_cuda("CUDA_ERROR_INVALID_HANDLE", "cuEventElapsedTime"),
        ):
            sim.event_elapsed_time(start.handle, unrecorded.handle)
        with (
            aiogpu.Stream(sim.device(1)) as elsewhere,
            elsewhere.record(timing=True) as other,
            pytest.raises(ValueError, match="different devices"),
        ):
            start.elapsed_time(other)


def test_never_ending_work_does_not_break_blocking_waits_elsewhere(sim: SimulatedDriver) -> None:
    device = sim.device(0)
    with aiogpu.Stream(device) as forever, aiogpu.Stream(device) as stream:
        try:
            sim.launch(forever, seconds=math.inf)
        except ValueError:
            return  # refusing a non-finite time would be a fix as well
        work = sim.launch(stream)
        event = stream.record(blocking_sync=True)
        waiter = Background(event.synchronize)
        while waiter.is_alive() and not sim.wait_until_blocked(timeout=0.05):
            pass
        work.release()
        waiter.join()
        assert event.is_done


# -- failures are sticky --------------------------------------------------------------------------------
def _assert_context_lost(operation: Callable[[], object]) -> None:
    with pytest.raises(aiogpu.CudaError) as excinfo:
        operation()
    assert excinfo.value.name == ILLEGAL_ADDRESS, str(excinfo.value)
    assert excinfo.value.is_context_lost


@pytest.mark.parametrize("how", ["fail", "launch_error", "launch_fault"])
def test_a_fault_is_sticky_for_its_context_only(sim: SimulatedDriver, how: str) -> None:
    device, other_device = sim.device(0), sim.device(1)
    stream = aiogpu.Stream(device)
    other = aiogpu.Stream(device)
    completed = other.record()
    before = stream.record()  # recorded before the fault: complete
    assert completed.is_done
    assert before.is_done
    work = None
    if how == "fail":
        work = sim.launch(stream)
        work.fail(ILLEGAL_ADDRESS)
    elif how == "launch_error":
        work = sim.launch(stream, error=ILLEGAL_ADDRESS)
    else:
        launch_fault(stream)
    with raises_cuda(ILLEGAL_ADDRESS, "cuStreamQuery") as excinfo:
        _ = stream.is_idle
    assert excinfo.value.is_context_lost
    if work is not None:
        assert not work.is_done  # faulted work never completes
    # From now on, every query, record and create in device 0's context fails.
    for operation in (
        lambda: stream.is_idle,
        lambda: before.is_done,
        lambda: completed.is_done,
        lambda: other.is_idle,
        lambda: device.default_stream.is_idle,
        lambda: completed.record(other),
        lambda: before.record(stream),
        lambda: other.record(),
        lambda: other.wait_for(completed),
        lambda: aiogpu.Event(device),
        lambda: aiogpu.Stream(device),
        lambda: device.stream_priority_range,
        before.synchronize,
        other.synchronize,
    ):
        _assert_context_lost(operation)
    # The other device knows nothing of it.
    with aiogpu.Stream(other_device) as fine:
        held = sim.launch(fine)
        event = fine.record()
        assert not event.is_done
        held.release()
        assert event.is_done
        assert fine.is_idle
        with aiogpu.Event(other_device) as created:
            created.record(fine)
            assert created.is_done
    # Closing what lived in the lost context is quiet.
    for resource in (stream, other, completed, before):
        resource.close()


def test_a_fault_happens_when_the_work_runs(sim: SimulatedDriver) -> None:
    device = sim.device(0)
    with aiogpu.Stream(device) as stream:
        first = sim.launch(stream)
        faulty = sim.launch(stream)
        after = stream.record()
        faulty.fail(ILLEGAL_ADDRESS)  # it faults once it runs, behind the held work
        assert not after.is_done
        with aiogpu.Event(device):
            pass
        first.release()
        _assert_context_lost(lambda: after.is_done)
        _assert_context_lost(lambda: aiogpu.Event(device))
        assert first.is_done
        assert not faulty.is_done


def test_faults_take_any_result_name_or_value() -> None:
    sim = SimulatedDriver(devices=1)
    device = sim.device(0)
    stream = aiogpu.Stream(device)
    sim.launch(stream, error=int(_driver.result_code("CUDA_ERROR_LAUNCH_FAILED")))
    with raises_cuda("CUDA_ERROR_LAUNCH_FAILED") as excinfo:
        _ = stream.is_idle
    assert excinfo.value.is_context_lost
    assert int(excinfo.value.result) == int(_driver.result_code("CUDA_ERROR_LAUNCH_FAILED"))
    with raises_cuda("CUDA_ERROR_LAUNCH_FAILED", "cuEventCreate"):
        aiogpu.Event(device)
    stream.close()


@pytest.mark.anyio
async def test_awaiting_work_that_faults_raises(sim: SimulatedDriver, strategy: aiogpu.WaitStrategy) -> None:
    device = sim.device(0)
    errors: list[aiogpu.CudaError] = []
    with aiogpu.Stream(device) as stream:
        work = sim.launch(stream)
        event = stream.record()

        async def waiter() -> None:
            try:
                await event.wait(strategy=strategy)
            except aiogpu.CudaError as exc:
                errors.append(exc)

        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                tg.start_soon(waiter)
                await anyio.wait_all_tasks_blocked()
                work.fail(ILLEGAL_ADDRESS)
        assert len(errors) == 1
        assert errors[0].name == ILLEGAL_ADDRESS
        assert errors[0].is_context_lost
        with anyio.fail_after(10), raises_cuda(ILLEGAL_ADDRESS):
            await event.wait(strategy=strategy)


def test_a_fault_is_seen_from_every_stream_of_its_context(sim: SimulatedDriver) -> None:
    device = sim.device(0)
    with aiogpu.Stream(device) as faulty, aiogpu.Stream(device) as other:
        completed = other.record()
        sim.launch(faulty, error=ILLEGAL_ADDRESS)  # faulty is idle: the fault happens now
        _assert_context_lost(lambda: completed.is_done)
        _assert_context_lost(lambda: other.is_idle)
        _assert_context_lost(lambda: aiogpu.Event(device))


# -- spinning versus blocking synchronization ----------------------------------------------------------------
def test_a_default_event_spins_in_synchronize(sim: SimulatedDriver) -> None:
    with aiogpu.Stream(sim.device(0)) as stream:
        work = sim.launch(stream)
        event = stream.record()
        assert not event.is_blocking_sync
        waiter = Background(event.synchronize)
        assert sim.wait_until_blocked()
        work.release()
        waiter.join()
        statistics = sim.statistics()
        assert statistics.spin_synchronizations == 1
        assert statistics.blocking_synchronizations == 0


def test_a_blocking_sync_event_sleeps_in_synchronize(sim: SimulatedDriver) -> None:
    with aiogpu.Stream(sim.device(0)) as stream:
        work = sim.launch(stream)
        event = aiogpu.Event(stream.device, blocking_sync=True)
        event.record(stream)
        assert event.is_blocking_sync
        waiter = Background(event.synchronize)
        assert sim.wait_until_blocked()
        work.release()
        waiter.join()
        statistics = sim.statistics()
        assert statistics.blocking_synchronizations == 1
        assert statistics.spin_synchronizations == 0
        event.close()


def test_synchronize_on_completed_work_counts_nothing(sim: SimulatedDriver) -> None:
    with aiogpu.Stream(sim.device(0)) as stream:
        spinning = stream.record()
        sleeping = stream.record(blocking_sync=True)
        spinning.synchronize()
        sleeping.synchronize()
        stream.synchronize()
        statistics = sim.statistics()
        assert statistics.spin_synchronizations == 0
        assert statistics.blocking_synchronizations == 0


def test_synchronize_outside_a_loop_counts_only_waits_on_pending_work(sim: SimulatedDriver) -> None:
    with aiogpu.Stream(sim.device(0)) as stream:
        sim.launch(stream, seconds=0.2)
        spinning = stream.record()
        sleeping = stream.record(blocking_sync=True)
        sleeping.synchronize()  # right after the launch: the work is still running
        spinning.synchronize()  # now complete: not counted
        statistics = sim.statistics()
        assert statistics.blocking_synchronizations == 1
        assert statistics.spin_synchronizations == 0


@pytest.mark.anyio
async def test_blocking_on_the_event_loop_is_refused(sim: SimulatedDriver) -> None:
    with aiogpu.Stream(sim.device(0)) as stream:
        work = sim.launch(stream)
        spinning = stream.record()
        sleeping = stream.record(blocking_sync=True)
        for blocking_call in (spinning.synchronize, sleeping.synchronize, stream.synchronize):
            with pytest.raises(RuntimeError, match="would block a thread that is running an event loop"):
                blocking_call()
        statistics = sim.statistics()
        assert statistics.spin_synchronizations == statistics.blocking_synchronizations == 0
        work.release()
        spinning.synchronize()  # complete: returns without blocking
        sleeping.synchronize()
        stream.synchronize()


@pytest.mark.anyio
async def test_the_thread_strategy_never_spins(sim: SimulatedDriver, monkeypatch: pytest.MonkeyPatch) -> None:
    _, polled = waiter_thread_queries(sim, monkeypatch)
    with aiogpu.Stream(sim.device(0)) as stream:
        work = sim.launch(stream)
        events = [stream.record() for _ in range(3)]
        assert not any(event.is_blocking_sync for event in events)
        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                for event in events:  # in record order (trio may start tasks in any order)
                    tg.start_soon(partial(event.wait, strategy="thread"))
                    await anyio.wait_all_tasks_blocked()
                assert await anyio.to_thread.run_sync(polled.wait, 10.0)
                # One waiter thread for the stream: it waits for the oldest event only, since
                # the stream completes the others after it.
                assert _thread.pool().statistics().running_jobs == 1
                work.release()
        assert all(event.is_done for event in events)
        statistics = sim.statistics()
        assert statistics.spin_synchronizations == statistics.blocking_synchronizations == 0


@pytest.mark.anyio
async def test_the_poll_strategy_never_synchronizes(sim: SimulatedDriver) -> None:
    with aiogpu.Stream(sim.device(0)) as stream:
        work = sim.launch(stream)
        event = stream.record()
        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                tg.start_soon(partial(event.wait, strategy="poll"))
                await anyio.wait_all_tasks_blocked()
                work.release()
        statistics = sim.statistics()
        assert statistics.spin_synchronizations == statistics.blocking_synchronizations == 0


# -- contexts ----------------------------------------------------------------------------------------------
def test_creating_without_a_current_context_fails(sim: SimulatedDriver) -> None:
    device = sim.device(0)
    with aiogpu.Event(device, interprocess=True) as shared:
        shared.record()
        data = shared.ipc_handle().data

    def attempt(call: Callable[[], object], func: str) -> None:
        with raises_cuda("CUDA_ERROR_INVALID_CONTEXT", func):
            in_fresh_thread(call)

    attempt(lambda: sim.event_create(0), "cuEventCreate")
    attempt(lambda: sim.stream_create(0, 0), "cuStreamCreateWithPriority")
    attempt(sim.stream_priority_range, "cuCtxGetStreamPriorityRange")
    attempt(lambda: sim.ipc_open_event_handle(data), "cuIpcOpenEventHandle")
    attempt(lambda: sim.stream_query(0), "cuStreamQuery")
    attempt(sim.context_pop, "cuCtxPopCurrent")
    assert in_fresh_thread(sim.context_get_current) == 0

    def create_and_close() -> aiogpu.Device:
        with aiogpu.Event(device) as event:  # aiogpu makes the context current itself, on any thread
            return event.device

    assert in_fresh_thread(create_and_close) is device


def test_default_stream_handles_resolve_through_the_current_context(sim: SimulatedDriver) -> None:
    first, second = sim.device(0), sim.device(1)
    work = sim.launch(first.default_stream)

    def check() -> None:
        for handle in (0, 1, 2):
            with raises_cuda("CUDA_ERROR_INVALID_CONTEXT", "cuStreamQuery"):
                sim.stream_query(handle)
        sim.context_push(first._context)
        # 0 and CU_STREAM_LEGACY name the legacy default stream; CU_STREAM_PER_THREAD this thread's own
        assert [sim.stream_query(handle) for handle in (0, 1, 2)] == [False, False, True]
        sim.context_push(second._context)
        assert [sim.stream_query(handle) for handle in (0, 1, 2)] == [True, True, True]
        assert sim.stream_context(0) == second._context
        sim.context_pop()
        assert sim.stream_context(0) == first._context
        work.release()
        assert sim.stream_query(0)
        sim.context_pop()

    in_fresh_thread(check)


def test_context_stack_push_pop_and_set_current(sim: SimulatedDriver) -> None:
    first, second = sim.device(0)._context, sim.device(1)._context

    def check() -> list[int]:
        seen = [sim.context_get_current()]
        sim.context_set_current(0)  # nothing current: a no-op
        seen.append(sim.context_get_current())
        sim.context_set_current(first)  # empty stack: binds it
        seen.append(sim.context_get_current())
        sim.context_push(second)
        seen.append(sim.context_get_current())
        sim.context_set_current(first)  # replaces the top of the stack
        seen.append(sim.context_get_current())
        sim.context_pop()  # back to what was under it
        seen.append(sim.context_get_current())
        sim.context_set_current(0)  # unbinds: pops the top
        seen.append(sim.context_get_current())
        with raises_cuda("CUDA_ERROR_INVALID_CONTEXT", "cuCtxPopCurrent"):
            sim.context_pop()
        return seen

    assert in_fresh_thread(check) == [0, 0, first, second, first, first, 0]


def test_the_current_context_is_per_thread(sim: SimulatedDriver) -> None:
    first, second = sim.device(0), sim.device(1)

    def bind_second() -> int:
        second.set_current()
        return sim.context_get_current()

    first.set_current()
    try:
        assert in_fresh_thread(bind_second) == second._context
        assert sim.context_get_current() == first._context
        assert in_fresh_thread(sim.context_get_current) == 0
        # Another driver's contexts are separate as well.
        assert SimulatedDriver().context_get_current() == 0
    finally:
        sim.context_set_current(0)
    assert sim.context_get_current() == 0


def test_unknown_context_handles_are_refused(sim: SimulatedDriver) -> None:
    bogus = 0x1234
    with raises_cuda("CUDA_ERROR_INVALID_CONTEXT", "cuCtxSetCurrent"):
        sim.context_set_current(bogus)
    with raises_cuda("CUDA_ERROR_INVALID_CONTEXT", "cuCtxPushCurrent"):
        sim.context_push(bogus)
    with raises_cuda("CUDA_ERROR_INVALID_CONTEXT", "cuCtxGetDevice"):
        sim.context_device(bogus)
    assert sim.context_get_current() == 0


def test_public_calls_restore_the_current_context(sim: SimulatedDriver) -> None:
    first, second = sim.device(0), sim.device(1)

    def check() -> None:
        first.set_current()
        with aiogpu.Stream(second) as stream, aiogpu.Event(second) as event:
            event.record(second.default_stream)
            stream.record(event)
            assert second.stream_priority_range == (0, -5)
            assert sim.context_get_current() == first._context
            assert sim.stream_context(stream.handle) == second._context
        sim.context_pop()
        assert sim.context_get_current() == 0

    in_fresh_thread(check)


def test_resources_belong_to_the_context_current_at_creation(sim: SimulatedDriver) -> None:
    first, second = sim.device(0), sim.device(1)
    with current(sim, second):
        stream = sim.stream_create(0, 0)
        event = sim.event_create(EVENT_DISABLE_TIMING)
    assert sim.stream_context(stream) == second._context
    with raises_cuda("CUDA_ERROR_INVALID_HANDLE", "cuEventRecord"), aiogpu.Stream(first) as other:
        sim.event_record(event, other.handle)
    sim.event_record(event, stream)  # a created stream needs no current context
    assert sim.event_query(event)
    sim.event_destroy(event)
    sim.stream_destroy(stream)


def test_recording_an_event_on_another_devices_stream(sim: SimulatedDriver) -> None:
    first, second = sim.device(0), sim.device(1)
    with aiogpu.Event(first) as event, aiogpu.Stream(second) as stream:
        with pytest.raises(ValueError, match="cannot record an event of device 0 on a stream of device 1"):
            stream.record(event)
        with pytest.raises(ValueError, match="cannot record an event of device 0 on a stream of device 1"):
            event.record(stream)
        assert not event.is_recorded
        with raises_cuda("CUDA_ERROR_INVALID_HANDLE", "cuEventRecord"):
            sim.event_record(event.handle, stream.handle)
        with current(sim, second), raises_cuda("CUDA_ERROR_INVALID_HANDLE", "cuEventRecord"):
            sim.event_record(event.handle, 0)  # device 1's default stream
        with current(sim, first):
            sim.event_record(event.handle, 0)  # device 0's default stream
        assert sim.event_query(event.handle)


def test_destroyed_handles_are_invalid() -> None:
    sim = SimulatedDriver()  # not the fixture's: this test commits lifetime violations on purpose
    with current(sim, sim.device(0)):
        stream = sim.stream_create(0, 0)
        event = sim.event_create(0)
    sim.event_destroy(event)
    sim.stream_destroy(stream)
    with raises_cuda("CUDA_ERROR_INVALID_HANDLE", "cuEventDestroy"):
        sim.event_destroy(event)
    with raises_cuda("CUDA_ERROR_INVALID_HANDLE", "cuEventQuery"):
        sim.event_query(event)
    with raises_cuda("CUDA_ERROR_INVALID_HANDLE", "cuStreamDestroy"):
        sim.stream_destroy(stream)
    with raises_cuda("CUDA_ERROR_INVALID_HANDLE", "cuStreamQuery"):
        sim.stream_query(stream)
    assert sim.statistics().live_events == sim.statistics().live_streams == 0
    assert sim.statistics().lifetime_violations == 2  # the second destroy of each


def test_destroying_an_event_a_thread_synchronizes_on_is_a_violation() -> None:
    import threading

    sim = SimulatedDriver()
    with aiogpu.Stream(sim.device(0)) as stream:
        work = sim.launch(stream)
        event = stream.record(blocking_sync=True)
        waiter = threading.Thread(target=event.synchronize)
        waiter.start()
        assert sim.wait_until_blocked(1)
        sim.event_destroy(event.handle)  # behind aiogpu's back: what its lifetimes prevent
        work.release()
        waiter.join(10)
    assert sim.statistics().lifetime_violations == 1


def test_destroying_the_default_stream_is_a_cuda_error(sim: SimulatedDriver) -> None:
    with current(sim, sim.device(0)), pytest.raises(aiogpu.CudaError):
        sim.stream_destroy(0)


# -- interprocess events ---------------------------------------------------------------------------------------
def test_interprocess_events_export_a_handle(sim: SimulatedDriver) -> None:
    device = sim.device(1)
    with aiogpu.Event(device, interprocess=True) as shared, aiogpu.Event(device) as private:
        shared.record()
        handle = shared.ipc_handle()
        assert isinstance(handle, aiogpu.IpcEventHandle)
        assert len(handle.data) == _driver.IPC_HANDLE_SIZE
        assert (handle.device, handle.pid) == (1, os.getpid())
        assert shared.ipc_handle() == handle
        with pytest.raises(ValueError, match="exported by this process"):
            aiogpu.Event.from_ipc_handle(handle)
        with pytest.raises(aiogpu.EventStateError, match="interprocess=True"):
            private.ipc_handle()
        with raises_cuda("CUDA_ERROR_INVALID_VALUE", "cuIpcGetEventHandle"):
            sim.ipc_get_event_handle(private.handle)
    with pytest.raises(ValueError, match="interprocess event cannot record timing"):
        aiogpu.Event(device, interprocess=True, timing=True)
    with current(sim, device), raises_cuda("CUDA_ERROR_INVALID_VALUE", "cuEventCreate"):
        sim.event_create(EVENT_INTERPROCESS)  # CUDA needs timing disabled on interprocess events


def test_an_opened_ipc_handle_names_the_same_event(sim: SimulatedDriver) -> None:
    device = sim.device(0)
    with aiogpu.Stream(device) as stream, aiogpu.Event(device, interprocess=True) as shared:
        shared.record(stream)
        data = shared.ipc_handle().data
        with current(sim, device):
            opened = sim.ipc_open_event_handle(data)
        assert opened != shared.handle
        assert sim.statistics().live_events == 2
        # Recorded through the opened handle, seen through the original one.
        work = sim.launch(stream)
        sim.event_record(opened, stream.handle)
        assert not sim.event_query(shared.handle)
        work.release()
        assert sim.event_query(shared.handle)
        assert sim.event_query(opened)
        # And the other way round.
        work = sim.launch(stream)
        shared.record(stream)
        assert not shared.is_done
        assert not sim.event_query(opened)
        work.release()
        assert sim.event_query(opened)
        sim.event_destroy(opened)  # the original lives on
        assert shared.is_done
        assert sim.statistics().live_events == 1


def test_ipc_open_refusals(sim: SimulatedDriver) -> None:
    device = sim.device(0)
    with aiogpu.Event(device, interprocess=True) as shared:
        shared.record()
        data = shared.ipc_handle().data
    with current(sim, device):
        with raises_cuda("CUDA_ERROR_INVALID_VALUE", "cuIpcOpenEventHandle"):
            sim.ipc_open_event_handle(data)  # its event is gone
        with raises_cuda("CUDA_ERROR_INVALID_VALUE", "cuIpcOpenEventHandle"):
            sim.ipc_open_event_handle(bytes(_driver.IPC_HANDLE_SIZE))


@pytest.mark.anyio
async def test_an_imported_event_is_awaitable(sim: SimulatedDriver) -> None:
    device = sim.device(0)
    with aiogpu.Stream(device) as stream, aiogpu.Event(device, interprocess=True) as shared:
        with pytest.raises(aiogpu.EventStateError, match="cannot export an event that was never recorded"):
            shared.ipc_handle()
        shared.record(stream)  # exported events must have been recorded: the importer trusts them
        # Present the handle as another process's (the simulator opens it in this one).
        foreign = dataclasses.replace(shared.ipc_handle(), pid=os.getpid() + 1)
        with aiogpu.Event.from_ipc_handle(foreign, device) as imported:
            assert imported.device is device
            assert imported.is_recorded
            assert imported.is_ipc_enabled
            assert not imported.is_timing_enabled
            work = sim.launch(stream)
            shared.record(stream)
            assert not imported.is_done
            with anyio.fail_after(10):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(imported.wait)
                    await anyio.wait_all_tasks_blocked()
                    work.release()
            assert imported.is_done
            assert shared.is_done


# -- installed -----------------------------------------------------------------------------------------------
def installed_default() -> object:
    """The default driver installed now (None: none made yet), without making one."""
    current = _driver.swap_default_driver(None)
    _driver.swap_default_driver(current)
    return current


def test_installed_makes_device_use_the_simulated_driver(sim: SimulatedDriver) -> None:
    before = installed_default()
    outer = SimulatedDriver(devices=1)
    with outer.installed() as installed:
        assert installed is outer
        assert aiogpu.Device(0)._driver is outer
        assert aiogpu.Device.count() == 1
        with sim.installed():
            device = aiogpu.Device(0)
            assert device is sim.device(0)
            assert device.driver_name == "simulated"
            assert aiogpu.Device.count() == 2
            with aiogpu.Event() as event, aiogpu.Stream() as stream:  # no device: Device(0)
                assert event.device is device
                assert stream.device is device
                adopted = aiogpu.Stream.adopt(stream.handle)  # found through the default driver
                assert adopted.device is device
                assert adopted == stream
                assert not adopted.is_owned
        assert aiogpu.Device(0) is outer.device(0)  # the previous default is back
    assert installed_default() is before


def test_installed_restores_the_default_after_an_exception(sim: SimulatedDriver) -> None:
    before = installed_default()

    def use_and_fail() -> None:
        with sim.installed():
            assert _driver.default_driver() is sim
            raise ZeroDivisionError

    with pytest.raises(ZeroDivisionError):
        use_and_fail()
    assert installed_default() is before


# -- statistics ------------------------------------------------------------------------------------------------
def test_live_counts_follow_create_and_close(sim: SimulatedDriver) -> None:
    def live() -> tuple[int, int, int]:
        statistics = sim.statistics()
        return statistics.live_events, statistics.live_streams, statistics.live_latches

    device = sim.device(0)
    assert live() == (0, 0, 0)
    _ = device.default_stream  # borrowed, never created: not counted
    assert live() == (0, 0, 0)
    event = aiogpu.Event(device)
    assert live() == (1, 0, 0)
    stream = aiogpu.Stream(sim.device(1))
    assert live() == (1, 1, 0)
    recorded = stream.record()
    assert live() == (2, 1, 0)
    latch = Latch(device)
    assert live() == (2, 1, 1)
    latch.block(device.default_stream)  # records a marker event
    assert live() == (3, 1, 1)
    latch.close()  # released: the marker has passed, latch and marker are freed
    assert live() == (2, 1, 0)
    for resource in (event, recorded, stream):
        resource.close()
    assert live() == (0, 0, 0)
    event.close()  # idempotent
    assert live() == (0, 0, 0)
    statistics = sim.statistics()
    assert statistics.spin_synchronizations == statistics.blocking_synchronizations == 0


def test_latches_are_freed_once_every_stream_has_passed_them(sim: SimulatedDriver) -> None:
    device = sim.device(0)
    with aiogpu.Stream(device) as stream:
        work = sim.launch(stream)
        latch = Latch(device)
        latch.block(stream)  # the marker sits behind the held work
        latch.close()
        statistics = sim.statistics()
        assert (statistics.live_latches, statistics.live_events) == (1, 1)  # the GPU could still read it
        work.release()
        statistics = sim.statistics()
        assert (statistics.live_latches, statistics.live_events) == (1, 1)  # freed lazily, at the next burial
        Latch(device).close()
        statistics = sim.statistics()
        assert (statistics.live_latches, statistics.live_events) == (0, 0)


def test_counts_are_per_driver(sim: SimulatedDriver) -> None:
    other = SimulatedDriver()
    with aiogpu.Event(sim.device(0)), aiogpu.Stream(other.device(0)):
        assert (sim.statistics().live_events, sim.statistics().live_streams) == (1, 0)
        assert (other.statistics().live_events, other.statistics().live_streams) == (0, 1)


# -- bad input to the test controls ----------------------------------------------------------------------------
@pytest.mark.parametrize("seconds", [-1, -0.001, math.nan, "0.1", [1]])
def test_launch_rejects_bad_seconds(sim: SimulatedDriver, seconds: object) -> None:
    with aiogpu.Stream(sim.device(0)) as stream:
        with pytest.raises(ValueError, match="seconds must be a finite non-negative number or None"):
            sim.launch(stream, seconds=seconds)  # type: ignore[arg-type]
        assert stream.is_idle  # nothing was enqueued


def test_unknown_result_names_are_refused(sim: SimulatedDriver) -> None:
    with aiogpu.Stream(sim.device(0)) as stream:
        work = sim.launch(stream)
        with pytest.raises(ValueError, match="unknown CUresult name"):
            work.fail("CUDA_ERROR_NO_SUCH_THING")
        event = stream.record()
        assert not event.is_done  # the bad fail() left the work held
        work.release()
        assert event.is_done


def test_a_launch_refused_for_a_bad_result_name_enqueues_nothing(sim: SimulatedDriver) -> None:
    with aiogpu.Stream(sim.device(0)) as stream:
        with pytest.raises(ValueError, match="unknown CUresult name 'ILLEGAL_ADDRESS'"):
            sim.launch(stream, error="ILLEGAL_ADDRESS")
        assert stream.is_idle


def test_only_held_work_can_be_released_or_failed(sim: SimulatedDriver) -> None:
    with aiogpu.Stream(sim.device(0)) as stream:
        timed = sim.launch(stream, seconds=0)
        faulty_stream = aiogpu.Stream(sim.device(1))
        faulty = sim.launch(faulty_stream, error=ILLEGAL_ADDRESS)
        for work in (timed, faulty):
            with pytest.raises(ValueError, match="only held work"):
                work.release()
            with pytest.raises(ValueError, match="only held work"):
                work.fail()
        assert timed.is_done
        faulty_stream.close()


def test_launch_on_another_drivers_stream_is_refused(sim: SimulatedDriver) -> None:
    other = SimulatedDriver()
    with aiogpu.Stream(other.device(0)) as foreign:
        with pytest.raises(ValueError, match="does not belong to this SimulatedDriver"):
            sim.launch(foreign)
        with pytest.raises(ValueError, match="does not belong to this SimulatedDriver"):
            sim.launch(other.device(0).default_stream, seconds=0)
        assert foreign.is_idle


def test_record_latency_makes_every_recording_take_that_long() -> None:
    sim = SimulatedDriver(record_latency=0.05)
    device = sim.device(0)
    with aiogpu.Stream(device) as stream:
        started = time.monotonic()
        event = stream.record()
        assert not event.is_done  # no launch(): the recording itself carries the latency
        event.synchronize()
        assert time.monotonic() - started >= 0.05
        event.close()
    with pytest.raises(ValueError, match="record_latency must be a finite number of seconds, got inf: .* hold_recordings=True"):
        SimulatedDriver(record_latency=math.inf)
    with pytest.raises(ValueError, match="record_latency must be a finite non-negative number"):
        SimulatedDriver(record_latency=-1)


def test_held_recordings_complete_in_stream_order_once_released(sim: SimulatedDriver) -> None:
    device = sim.device(0)
    with aiogpu.Stream(device) as stream, aiogpu.Stream(sim.device(1)) as other:
        sim.hold_recordings()
        sim.hold_recordings()  # idempotent
        first = stream.record()
        work = sim.launch(stream)  # held work of its own, after the held recording
        second = stream.record()
        elsewhere = other.record()
        assert not (first.is_done or second.is_done or elsewhere.is_done)
        sim.release_recordings()
        assert first.is_done and elsewhere.is_done
        assert not second.is_done  # still behind the work launched before it
        with stream.record() as later:
            assert not later.is_done  # behind that work too, but not held itself
            work.release()
            assert second.is_done and later.is_done
        sim.release_recordings()  # idempotent
        for event in (first, second, elsewhere):
            event.close()
    with pytest.raises(TypeError, match="hold_recordings must be a bool"):
        SimulatedDriver(hold_recordings=1)  # type: ignore[arg-type]


def test_fail_next_record_faults_the_next_recorded_work(sim: SimulatedDriver) -> None:
    device = sim.device(0)
    with aiogpu.Stream(device) as stream:
        before = stream.record()
        assert before.is_done
        sim.fail_next_record("CUDA_ERROR_LAUNCH_FAILED")
        failed = stream.record()
        with pytest.raises(aiogpu.CudaError) as caught:
            _ = failed.is_done
        assert caught.value.name == "CUDA_ERROR_LAUNCH_FAILED"
        assert caught.value.is_context_lost
    with pytest.raises(ValueError, match="unknown CUresult name"):
        sim.fail_next_record("NOT_AN_ERROR")


def test_help_shows_the_test_api_and_groups_the_driver_interface() -> None:
    """help(SimulatedDriver) leads with what a test uses; aiogpu's driver calls come after,
    under the private base that implements them."""
    text = pydoc.render_doc(SimulatedDriver, renderer=pydoc.plaintext)
    own, _, inherited = text.partition("Methods inherited from aiogpu.testing._simulated._calls.DriverCalls")
    calls = [name for name in vars(_driver.Driver) if not name.startswith("_") and callable(getattr(_driver.Driver, name))]
    assert len(calls) >= 30
    instruments = ["latch_create", "latch_block", "latch_release", "latch_destroy", "launch_spin", "launch_fault"]
    assert not set(instruments) & set(calls), "the test instruments are aiogpu.testing's, not the driver door's"
    for name in calls + instruments:
        assert f" |  {name}(" not in own, name
        assert f" |  {name}(" in inherited, name
    public = {name for name in vars(SimulatedDriver) if not name.startswith("_")}
    assert public == {
        "device",
        "installed",
        "launch",
        "fail_next_record",
        "hold_recordings",
        "release_recordings",
        "allocate",
        "statistics",
        "wait_until_blocked",
    }
    for name in public:
        assert getattr(SimulatedDriver, name).__doc__, name
