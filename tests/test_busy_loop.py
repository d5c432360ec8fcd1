"""A wait parked on a busy loop is seen at the loop's next iteration, not the busy task's next one.

While the loop thread runs Python without a pause, a thread that saw a completion (a waiter
thread, the timer) waits for the GIL before it can poke the loop, often until after the busy
task's next step has begun; and a loop timer joins the ready queue behind the tasks already
there. So the strategies that watch on the loop (``auto``, ``poll``) look at their parked
waits from a loop callback once per iteration while the loop is busy, on asyncio and uvloop
(where a park resumes its task in that callback; not on trio, nor with
``AIOGPU_PUBLIC_ASYNCIO``). These tests lose every thread's poke (as a GIL-starved thread's is
lost for a whole step) and check that a wait completed during one step resumes before the next.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import TYPE_CHECKING

import anyio
import anyio.lowlevel
import pytest

import aiogpu
from aiogpu._wait import _busy, _policy, _watcher
from aiogpu.testing import Latch

if TYPE_CHECKING:
    from collections.abc import Callable

STEP = 0.02  # seconds of pure Python in each of the busy task's steps
ROUNDS = 6


@pytest.fixture
def threads_never_poke(monkeypatch: pytest.MonkeyPatch) -> None:
    """The waiter and timer threads' pokes are lost: only what the loop does itself wakes a wait."""
    monkeypatch.setattr(_watcher.Watcher, "_poke_threadsafe", lambda self: True)


@pytest.fixture
def looks(monkeypatch: pytest.MonkeyPatch) -> Counter[object]:
    """How many times each busy look's chain ran (``BusyLook._each_iteration``), by chain: one
    chain per park."""
    ran: Counter[object] = Counter()
    each_iteration = _busy.BusyLook._each_iteration

    def counted(self: _busy.BusyLook, chain: object) -> None:
        ran[chain] += 1
        each_iteration(self, chain)

    monkeypatch.setattr(_busy.BusyLook, "_each_iteration", counted)
    return ran


#: A chain on an idle loop stops within a few iterations; one that kept itself going would run
#: through its whole park: hundreds of iterations in the milliseconds a back-off park lasts.
FEW = 20


def busy_step(seconds: float, halfway: list[Latch]) -> None:
    """Run Python for ``seconds``, releasing the latches in ``halfway`` halfway through."""
    middle, end = time.perf_counter() + seconds / 2, time.perf_counter() + seconds
    while time.perf_counter() < middle:
        pass
    for latch in halfway:
        latch.release()
    while time.perf_counter() < end:
        pass


@pytest.mark.asyncio
@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["auto", "poll"])
@pytest.mark.usefixtures("threads_never_poke")
async def test_a_wait_completed_during_a_busy_step_resumes_before_the_next_step(
    device: aiogpu.Device, strategy: aiogpu.WaitStrategy
) -> None:
    stream = aiogpu.Stream(device)
    log: list[str] = []
    to_release: list[list[object]] = []  # [steps to go, latch]: the busy task releases it
    finished = False

    async def busy() -> None:
        while not finished:
            due = [latch for countdown, latch in to_release if countdown == 0]
            to_release[:] = [[countdown - 1, latch] for countdown, latch in to_release if countdown]  # type: ignore[operator]
            log.append("step")
            busy_step(STEP, due)  # type: ignore[arg-type]
            if due:
                log.append("released")
            await asyncio.sleep(0)

    async def waiter() -> None:
        for _ in range(ROUNDS):
            with Latch(device) as latch:
                latch.block(stream)
                event = stream.record()
                # Released in the step after next: by then the wait's first close watch is
                # over and it is parked (on a waiter thread and a back-off loop timer).
                to_release.append([1, latch])
                with anyio.fail_after(5):  # without a poke, only the loop's own look wakes it
                    await event.wait(strategy=strategy)
                log.append("woke")
                event.close()

    busy_task = asyncio.create_task(busy())
    try:
        await waiter()
    finally:
        finished = True
        await busy_task
        stream.close()
    # Steps that started between a release and the wake-up it allowed: none, but for the
    # first round (the watcher learns that the loop is busy while its first park lasts).
    late = []
    steps = None
    for entry in log:
        if entry == "released":
            steps = 0
        elif entry == "step" and steps is not None:
            steps += 1
        elif entry == "woke":
            late.append(steps)
            steps = None
    assert len(late) == ROUNDS
    assert late[1:] == [0] * (ROUNDS - 1), f"steps between a completion and its wake-up, per round: {late}"


@pytest.mark.asyncio
async def test_an_idle_loop_is_not_kept_awake_by_the_look(
    device: aiogpu.Device, monkeypatch: pytest.MonkeyPatch, looks: Counter[object]
) -> None:
    # However busy the loop was before, a look that finds it idle stops: the loop sleeps.
    monkeypatch.setattr(_policy, "loop_was_busy", lambda elapsed, cpu: True)
    stream = aiogpu.Stream(device)
    with Latch(device) as latch:
        latch.block(stream)
        with stream.record() as event:
            async with anyio.create_task_group() as group:
                group.start_soon(event.wait)
                await anyio.sleep(0.05)  # the wait parks, wakes on its back-off schedule, parks again
                runs = looks.copy()
                latch.release()
    stream.close()
    # Each park looks on its first iteration and stops on its second, or within a few where
    # this host is slow: an idle loop is not kept spinning through the look.
    assert runs, "no park looked"
    assert max(runs.values()) <= FEW, max(runs.values())


class _Clock:
    """The wall and loop-thread CPU clocks ``_busy`` reads, moved only by the test: a real
    clock would let a collection or page fault between two idle iterations read as loop work."""

    def __init__(self) -> None:
        self.wall = self.cpu = 1.0

    def perf_counter(self) -> float:
        return self.wall

    def thread_time(self) -> float:
        return self.cpu

    def run_python(self, seconds: float) -> None:
        self.wall += seconds
        self.cpu += seconds


class _LoopOfLooks:
    """A backend stand-in: each iteration of its loop runs the look queued during the one before,
    and ``busy`` seconds of other work first, as long as the loop has some."""

    #: what an iteration with nothing to do costs the loop itself
    IDLE_ITERATION = 2e-6

    def __init__(self, clock: _Clock) -> None:
        self.clock = clock
        self.queued: list[Callable[[], object]] = []

    def look_each_iteration(self, callback: Callable[[], object]) -> bool:
        self.queued.append(callback)
        return True

    def run(self, iterations: int, busy: float = 0.0) -> int:
        """Run up to ``iterations`` iterations; returns how many ran a look."""
        ran = 0
        for _ in range(iterations):
            if not self.queued:
                break
            self.clock.run_python(busy or self.IDLE_ITERATION)
            self.queued.pop(0)()
            ran += 1
        return ran


def test_a_look_that_takes_long_does_not_keep_an_idle_loop_looking(monkeypatch: pytest.MonkeyPatch) -> None:
    # A look's own time must not count as the loop's work: a slow one (many parked streams)
    # would otherwise make every later iteration of an idle loop look busy, and look again.
    clock = _Clock()
    monkeypatch.setattr(_busy, "time", clock)
    looked = 0

    def slow_look() -> bool:
        nonlocal looked
        looked += 1
        clock.run_python(4 * _policy.BUSY_MIN_ITERATION)
        return False  # nothing parked is done

    loop = _LoopOfLooks(clock)
    look = _busy.BusyLook(loop, slow_look)  # type: ignore[arg-type]
    look.busy = True
    look.park(lambda: True)
    assert loop.run(2, busy=2 * _policy.BUSY_LOOK) == 2  # busy: the second iteration looks
    assert looked == 2
    assert loop.run(50) == 1  # idle from here: the next iteration stops the chain
    assert looked == 2
    assert not loop.queued
