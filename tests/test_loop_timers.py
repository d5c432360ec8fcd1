"""The loop's own timers stay on time while aiogpu waits (asyncio's own loops, private backend).

asyncio rounds the timeout of its sleep up to whole milliseconds, so a loop that goes to sleep
at a moment of the watcher's choosing would sleep up to 1 ms past its next timer. Before the
watcher parks, it asks the timer thread to wake the loop just after that timer is due, if the
watcher itself would wake it later. How much that saves is measured on the GPU
(``benchmarks/wake.py``'s ticker lag); these tests check when it is asked for. Only the
private asyncio backend knows the loop's timers: with the public one (and on uvloop) nothing is
kept, and these tests check that too.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

import pytest

import aiogpu
from aiogpu._wait import _policy, _registry, _timer, _watcher
from aiogpu._wait._backends import _asyncio_private

if TYPE_CHECKING:
    from collections.abc import Callable

    from aiogpu.testing import SimulatedDriver


@pytest.fixture
def timer_calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[float, object]]:
    """Every call the timer thread was asked for: (when, by ``time.perf_counter``; the callback)."""
    asked: list[tuple[float, object]] = []
    call_at = _timer.Timer.call_at

    def recording(self: _timer.Timer, when: float, callback: Callable[[], None]) -> int:
        asked.append((when, callback))
        return call_at(self, when, callback)

    monkeypatch.setattr(_timer.Timer, "call_at", recording)
    return asked


def _kept(timer_calls: list[tuple[float, object]]) -> list[float]:
    """When the timer thread was asked to wake a loop for one of the loop's own timers."""
    wake_loop = _watcher.Watcher._wake_loop_threadsafe
    return [when for when, callback in timer_calls if getattr(callback, "__func__", None) is wake_loop]


def _reads_timers() -> bool:
    """Whether the running loop's watcher knows the loop's timers (the private asyncio backend:
    uvloop's timers are out of reach, and the public backend does not read asyncio's)."""
    backend = _registry.current().backend
    return isinstance(backend, _asyncio_private.PrivateAsyncioBackend) and backend._own_loop


def _due(loop: asyncio.AbstractEventLoop, handle: asyncio.TimerHandle) -> float:
    """When ``handle`` is due, by ``time.perf_counter`` (the clock the timer thread keeps)."""
    return time.perf_counter() + (handle.when() - loop.time())


@pytest.mark.asyncio
@pytest.mark.parametrize("strategy", ["auto", "thread", "callback", "poll"])
@pytest.mark.slow
async def test_a_loop_timer_due_while_the_watcher_parks_is_kept_once(
    sim: SimulatedDriver,
    timer_calls: list[tuple[float, object]],
    strategy: aiogpu.WaitStrategy,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The pending work is asked about once a second: the first park, right after the wait's
    # close watch, already wakes the loop after the timer is due, and every later one sees the
    # same earliest timer. (With the usual back-off the last park before it keeps it, unless
    # the loop stalls past the timer meanwhile, as a loaded test machine's does.)
    monkeypatch.setattr(_policy, "COLD_POLL", dict.fromkeys(_policy.COLD_POLL, (1.0, 1.0)))
    monkeypatch.setattr(_policy, "KEEP_TIMER_HORIZON", 1.0)  # the first park comes 0.2 s early
    loop = asyncio.get_running_loop()
    with aiogpu.Stream(sim.device(0)) as stream:
        work = sim.launch(stream)  # held until the timer has fired
        fired = asyncio.Event()
        timer = loop.call_later(0.2, fired.set)
        due = _due(loop, timer)
        task = asyncio.create_task(stream.record().wait(strategy=strategy))
        try:
            await asyncio.wait_for(fired.wait(), 5)
        finally:
            timer.cancel()
            work.release()
            await asyncio.wait_for(task, 5)
    kept = _kept(timer_calls)
    if strategy == "poll":  # it starts no thread, the timer thread included
        assert timer_calls == []
        return
    if not _reads_timers():
        assert kept == []
        return
    assert len(kept) == 1, kept
    assert abs(kept[0] - _policy.KEEP_TIMER_MARGIN - due) < 1e-3, (kept[0], due)


@pytest.mark.asyncio(loop_factories=["asyncio"])
async def test_only_a_timer_due_before_the_watcher_wakes_and_within_the_horizon_is_kept(
    timer_calls: list[tuple[float, object]], monkeypatch: pytest.MonkeyPatch
) -> None:
    loop = asyncio.get_running_loop()
    if not _reads_timers():
        pytest.skip("needs the private asyncio backend: only it knows the loop's timers")
    watcher = _registry.current()
    far = loop.call_later(10 * _policy.KEEP_TIMER_HORIZON, lambda: None)
    try:
        watcher._keep_loop_timer(_due(loop, far) + 1.0)
        assert _kept(timer_calls) == [], "a timer beyond the horizon was kept"
    finally:
        far.cancel()

    monkeypatch.setattr(_policy, "KEEP_TIMER_HORIZON", 10.0)  # however slowly this machine runs
    cancelled = loop.call_later(0.1, lambda: None)
    near = loop.call_later(0.5, lambda: None)
    cancelled.cancel()  # still first in the loop's heap: looked past
    try:
        due = _due(loop, near)
        watcher._keep_loop_timer(due - 0.1)
        assert _kept(timer_calls) == [], "kept a timer the watcher wakes the loop before"
        watcher._keep_loop_timer(due + 0.1)
        kept = _kept(timer_calls)
        assert len(kept) == 1
        assert abs(kept[0] - _policy.KEEP_TIMER_MARGIN - due) < 1e-3, (kept[0], due)
        watcher._keep_loop_timer(due + 0.1)
        assert len(_kept(timer_calls)) == 1, "the same timer was kept twice"
    finally:
        near.cancel()


@pytest.mark.asyncio
async def test_earliest_timer_reads_the_loop_without_changing_it() -> None:
    loop = asyncio.get_running_loop()
    backend = _registry.current().backend
    if not _reads_timers():
        assert backend.earliest_timer() is None
        return
    handles = [loop.call_later(delay, lambda: None) for delay in (0.5, 0.1, 0.3, 0.2)]
    try:
        handles[1].cancel()
        handles[3].cancel()
        heap = list(loop._scheduled)  # type: ignore[attr-defined]
        found = backend.earliest_timer()
        assert found is not None
        when, delay = found
        assert when == handles[2].when()
        assert 0 < delay <= 0.3
        assert loop._scheduled == heap  # type: ignore[attr-defined]
    finally:
        for handle in handles:
            handle.cancel()
    assert backend.earliest_timer() is None, "only cancelled timers left"
