"""``Event.adopt``: awaiting events other libraries own, without copying or destroying them.

On the simulated device the foreign owner is played by a raw handle (or an object shaped like
a torch, CuPy or cuda.core event); tests/gpu/test_interop.py adopts the real libraries' events.
"""

from __future__ import annotations

import ctypes
import gc
import weakref

import anyio
import pytest

import aiogpu
from aiogpu.testing import Latch, SimulatedDriver


def foreign(module: str, name: str = "Event", **attributes: object) -> object:
    """An object whose type claims to live in ``module`` (how ``Event.adopt`` tells libraries apart)."""
    return type(name, (), {"__module__": module, **attributes})()


@pytest.mark.anyio
async def test_adopted_handle_is_awaitable_and_never_destroyed(sim: SimulatedDriver) -> None:
    device = sim.device(0)
    owned = aiogpu.Event(device)
    with aiogpu.Stream(device) as stream, Latch(device) as latch:
        latch.block(stream)
        owned.record(stream)
        adopted = aiogpu.Event.adopt(owned.handle, device=device)
        assert adopted.handle == owned.handle
        assert not adopted.is_owned
        assert owned.is_owned
        assert "adopted" in repr(adopted)
        woke = anyio.Event()

        async def waiter() -> None:
            await adopted
            woke.set()

        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                tg.start_soon(waiter)
                await anyio.wait_all_tasks_blocked()
                assert not woke.is_set()
                latch.release()
    assert adopted.is_done
    adopted.close()
    assert owned.is_done  # the owner's event is still alive and usable
    owned.record(device.default_stream)
    owned.synchronize()
    owned.close()


@pytest.mark.anyio
async def test_records_through_the_owner_are_seen(sim: SimulatedDriver) -> None:
    device = sim.device(0)
    with aiogpu.Event(device) as owned, aiogpu.Stream(device) as stream, Latch(device) as latch:
        owned.record(stream)
        adopted = aiogpu.Event.adopt(owned.handle, device=device)
        assert adopted.is_done
        latch.block(stream)
        owned.record(stream)  # the owner re-records: the adopted wrapper sees the new work
        assert not adopted.is_done
        latch.release()
        with anyio.fail_after(10):
            await adopted
        adopted.close()


def test_adopting_keeps_the_owner_alive_until_closed(sim: SimulatedDriver) -> None:
    device = sim.device(0)
    with aiogpu.Event(device) as owned:
        owner = foreign("cupy.cuda.stream", ptr=owned.handle)
        alive = weakref.ref(owner)
        adopted = aiogpu.Event.adopt(owner, device=device)
        del owner
        gc.collect()
        assert alive() is not None
        adopted.close()
        assert adopted.is_closed


def test_library_shapes_are_read(sim: SimulatedDriver) -> None:
    device = sim.device(0)
    with aiogpu.Event(device) as owned:
        cuda_core = foreign(
            "cuda.core._event",
            handle=owned.handle,
            device=type("Device", (), {"device_id": 0})(),
            is_timing_disabled=True,
            is_sync_busy_waited=False,
            is_ipc_enabled=False,
        )
        adopted = aiogpu.Event.adopt(cuda_core, device=device)
        assert not adopted.is_timing_enabled
        assert adopted.is_blocking_sync
        torch_like = foreign("torch.cuda.streams", cuda_event=owned.handle, device=type("device", (), {"index": 0})())
        assert aiogpu.Event.adopt(torch_like, device=device).handle == owned.handle
        numba_like = foreign("numba.cuda.cudadrv.driver", handle=owned.handle)
        assert aiogpu.Event.adopt(numba_like, device=device).handle == owned.handle
        with pytest.raises(ValueError, match="does not say which device"):  # Numba events do not
            aiogpu.Event.adopt(numba_like)
        numba_ctypes = foreign("numba.cuda.cudadrv.driver", handle=ctypes.c_void_p(owned.handle))
        assert aiogpu.Event.adopt(numba_ctypes, device=device).handle == owned.handle
        assert aiogpu.Event.adopt(adopted) is adopted


def test_bad_input_is_refused_clearly(sim: SimulatedDriver) -> None:
    device = sim.device(0)
    with pytest.raises(TypeError, match="cannot adopt builtins.str as an event"):
        aiogpu.Event.adopt("0x1234", device=device)
    with pytest.raises(TypeError, match="cannot adopt True"):
        aiogpu.Event.adopt(True, device=device)
    with pytest.raises(ValueError, match="64-bit address"):
        aiogpu.Event.adopt(-1, device=device)
    with pytest.raises(ValueError, match="does not say which device"):
        aiogpu.Event.adopt(1234)
    with pytest.raises(TypeError, match="device must be an aiogpu.Device"):
        aiogpu.Event.adopt(1234, device=0)  # type: ignore[arg-type]
    never_recorded = foreign("torch.cuda.streams", cuda_event=0, device=None)
    with pytest.raises(aiogpu.EventStateError, match="never recorded"):
        aiogpu.Event.adopt(never_recorded, device=device)
    on_device_1 = foreign("torch.cuda.streams", cuda_event=1234, device=type("device", (), {"index": 1})())
    with pytest.raises(ValueError, match="belongs to device 1, not device 0"):
        aiogpu.Event.adopt(on_device_1, device=device)


@pytest.mark.anyio
async def test_an_adopted_event_re_recorded_by_its_owner_wakes_no_other_wait(
    sim: SimulatedDriver, strategy: aiogpu.WaitStrategy
) -> None:
    # Recorded through aiogpu on a stream, then by its owner on an idle one: done at once, it
    # must not pass for proof that the first stream's earlier work is done.
    device = sim.device(0)
    owned = aiogpu.Event(device)
    adopted = aiogpu.Event.adopt(owned.handle, device=device)
    with aiogpu.Stream(device) as stream, aiogpu.Stream(device) as idle, Latch(device) as first, Latch(device) as second:
        first.block(stream)
        before = [stream.record(), stream.record()]
        second.block(stream)
        held = stream.record()
        adopted.record(stream)
        woken: list[aiogpu.Event] = []
        three_woken = anyio.Event()

        async def waiter(event: aiogpu.Event) -> None:
            await event.wait(strategy=strategy)
            woken.append(event)
            if len(woken) == 3:
                three_woken.set()

        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                for event in [*before, held, adopted]:
                    tg.start_soon(waiter, event)
                await anyio.wait_all_tasks_blocked()
                sim.event_record(owned.handle, idle.handle)  # the owner re-records it
                first.release()
                await three_woken.wait()  # the earlier work's waits and the adopted event's
                await anyio.wait_all_tasks_blocked()
                assert held not in woken
                assert not held.is_done
                second.release()
        assert woken[-1] is held
    for event in [*before, held]:
        event.close()
    adopted.close()
    owned.close()
