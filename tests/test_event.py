"""Event: creation options, recording, queries, timing, IPC handles, pickling, lifetime, repr."""

from __future__ import annotations

import pickle

import anyio
import pytest

import aiogpu
from aiogpu.testing import Latch, SimulatedDriver, launch_spin


def test_options_are_reported(device: aiogpu.Device) -> None:
    with aiogpu.Event(device) as plain:
        assert (plain.is_timing_enabled, plain.is_blocking_sync, plain.is_ipc_enabled) == (False, False, False)
        assert plain.device is device
        assert not plain.is_recorded
    with aiogpu.Event(device, timing=True, blocking_sync=True) as timed:
        assert (timed.is_timing_enabled, timed.is_blocking_sync) == (True, True)
    with device.create_event(interprocess=True) as shared:
        assert shared.is_ipc_enabled and not shared.is_timing_enabled


def test_interprocess_with_timing_is_rejected(device: aiogpu.Device) -> None:
    with pytest.raises(ValueError, match="interprocess event cannot record timing"):
        aiogpu.Event(device, timing=True, interprocess=True)


@pytest.mark.parametrize("option", ["timing", "blocking_sync", "interprocess"])
def test_options_must_be_bools(device: aiogpu.Device, option: str) -> None:
    with pytest.raises(TypeError, match=f"{option} must be a bool, got 1"):
        aiogpu.Event(device, **{option: 1})  # type: ignore[arg-type]


def test_device_must_be_a_device() -> None:
    with pytest.raises(TypeError, match="device must be an aiogpu.Device, got 0"):
        aiogpu.Event(0)  # type: ignore[arg-type]


def test_record_and_query(device: aiogpu.Device) -> None:
    with aiogpu.Stream(device) as stream, Latch(device) as latch, aiogpu.Event(device) as event:
        latch.block(stream)
        event.record(stream)
        assert event.is_recorded
        assert not event.is_done
        latch.release()
        stream.synchronize()
        assert event.is_done


def test_record_without_stream_uses_the_default_stream(device: aiogpu.Device) -> None:
    with aiogpu.Event(device) as event:
        event.record()
        device.default_stream.synchronize()
        assert event.is_done


def test_record_rejects_foreign_objects(device: aiogpu.Device) -> None:
    with aiogpu.Event(device) as event, pytest.raises(TypeError, match=r"record\(\) expects an aiogpu.Stream"):
        event.record(0)  # type: ignore[arg-type]


def test_record_on_a_stream_of_another_device_is_rejected(sim: SimulatedDriver) -> None:
    with aiogpu.Event(sim.device(0)) as event, aiogpu.Stream(sim.device(1)) as stream:
        with pytest.raises(ValueError, match="cannot record an event of device 0 on a stream of device 1"):
            event.record(stream)
        assert not event.is_recorded


def test_unrecorded_event_is_an_error_everywhere(device: aiogpu.Device) -> None:
    with aiogpu.Event(device, timing=True) as event, aiogpu.Event(device, timing=True) as other:
        other.record()
        with pytest.raises(aiogpu.EventStateError, match="cannot query an event that was never recorded"):
            _ = event.is_done
        with pytest.raises(aiogpu.EventStateError, match="never recorded"):
            event.synchronize()
        with pytest.raises(aiogpu.EventStateError, match="never recorded"):
            event.elapsed_time(other)
        with aiogpu.Stream(device) as stream, pytest.raises(aiogpu.EventStateError, match="never recorded"):
            stream.wait_for(event)


def test_synchronize_blocks_until_done(device: aiogpu.Device) -> None:
    with aiogpu.Stream(device) as stream:
        launch_spin(stream, 0.02)
        with stream.record(blocking_sync=True) as event:
            event.synchronize()
            assert event.is_done


def test_elapsed_time_measures_device_time(device: aiogpu.Device) -> None:
    with aiogpu.Stream(device) as stream:
        start = stream.record(timing=True)
        launch_spin(stream, 0.03)
        end = stream.record(timing=True)
        end.synchronize()
        assert 25 <= start.elapsed_time(end) < 1000
        assert end - start == pytest.approx(start.elapsed_time(end))


def test_elapsed_time_errors(device: aiogpu.Device) -> None:
    with aiogpu.Stream(device) as stream, Latch(device) as latch:
        untimed = stream.record()
        start = stream.record(timing=True)
        start.synchronize()  # done before the latch holds the stream: only the end is pending
        latch.block(stream)
        pending = stream.record(timing=True)
        with pytest.raises(aiogpu.EventStateError, match="the start event was created without timing"):
            untimed.elapsed_time(start)
        with pytest.raises(aiogpu.EventStateError, match="the end event was created without timing"):
            start.elapsed_time(untimed)
        with pytest.raises(aiogpu.EventStateError, match="the end event has not completed yet"):
            start.elapsed_time(pending)
        with pytest.raises(TypeError, match=r"elapsed_time\(\) expects an aiogpu.Event"):
            start.elapsed_time(1.0)  # type: ignore[arg-type]
        with pytest.raises(TypeError):
            _ = start - 1.0  # type: ignore[operator]
        latch.release()


def test_elapsed_time_across_devices_is_rejected(sim: SimulatedDriver) -> None:
    first = sim.device(0).default_stream.record(timing=True)
    second = sim.device(1).default_stream.record(timing=True)
    with pytest.raises(ValueError, match="different devices"):
        first.elapsed_time(second)


def test_close_is_idempotent_and_final(device: aiogpu.Device) -> None:
    event = device.default_stream.record()
    event.close()
    event.close()
    assert event.is_closed
    with pytest.raises(aiogpu.ClosedResourceError, match="this Event is closed"):
        _ = event.is_done
    with pytest.raises(aiogpu.ClosedResourceError):
        event.record()
    with pytest.raises(aiogpu.ClosedResourceError):
        event.synchronize()


def test_close_destroys_the_handle(sim: SimulatedDriver) -> None:
    before = sim.statistics().live_events
    with aiogpu.Event(sim.device(0)):
        assert sim.statistics().live_events == before + 1
    assert sim.statistics().live_events == before


def test_dropped_event_is_destroyed_by_the_collector(sim: SimulatedDriver) -> None:
    before = sim.statistics().live_events
    aiogpu.Event(sim.device(0))
    assert sim.statistics().live_events == before


def test_repr_makes_no_driver_call(sim: SimulatedDriver, monkeypatch: pytest.MonkeyPatch) -> None:
    event = aiogpu.Event(sim.device(0), timing=True)

    def forbidden(*args: object) -> None:
        raise AssertionError("repr called the driver")

    for name in ("event_query", "event_record", "context_get_current", "stream_query"):
        monkeypatch.setattr(sim, name, forbidden)
    assert repr(event) == f"<aiogpu.Event device=0 handle={event.handle:#x} unrecorded timing>"
    event.close()
    assert repr(event).endswith("closed timing>")


def test_ipc_handle_round_trip_and_pickling(sim: SimulatedDriver) -> None:
    device = sim.device(0)
    with aiogpu.Stream(device) as stream, Latch(device) as latch:
        event = aiogpu.Event(device, interprocess=True)
        latch.block(stream)
        event.record(stream)
        handle = event.ipc_handle()
        assert isinstance(handle, aiogpu.IpcEventHandle)
        assert len(handle.data) == 64
        assert handle.device == 0
        assert pickle.loads(pickle.dumps(handle)) == handle
        with pytest.raises(ValueError, match="exported by this process"):
            aiogpu.Event.from_ipc_handle(handle)
        # The simulator opens handles in-process, standing in for another process.
        elsewhere = aiogpu.IpcEventHandle(handle.data, handle.device, pid=handle.pid + 1)
        with aiogpu.Event.from_ipc_handle(elsewhere, sim.device(0)) as imported:
            assert imported.is_recorded and imported.is_ipc_enabled
            assert not imported.is_done
            latch.release()
            stream.synchronize()
            assert imported.is_done


def test_ipc_misuse(device: aiogpu.Device) -> None:
    with aiogpu.Event(device) as event, pytest.raises(aiogpu.EventStateError, match="interprocess=True"):
        event.ipc_handle()
    with pytest.raises(TypeError, match="pickled"):
        pickle.dumps(aiogpu.Event(device))
    with pytest.raises(TypeError, match="expects an aiogpu.IpcEventHandle"):
        aiogpu.Event.from_ipc_handle(b"\0" * 64)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="must be 64 bytes"):
        aiogpu.IpcEventHandle(b"short", 0, 1)


@pytest.mark.anyio
async def test_await_twice_and_async_record(sim: SimulatedDriver) -> None:
    device = sim.device(0)
    with aiogpu.Stream(device) as stream:
        work = sim.launch(stream)
        event = stream.record()
        async with anyio.create_task_group() as tg:
            tg.start_soon(event.wait)
            await anyio.wait_all_tasks_blocked()
            work.release()
        await event
        await stream.record()
