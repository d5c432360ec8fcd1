"""A cancellation storm: 100,000 waits over asyncio, uvloop and trio, every strategy mixed, a
fifth of them cancelled at random and a fifth under random deadlines. Every wait left alone
completes (and only once its work is done), and afterwards nothing is left over: no pending
wait, no waiter-thread job or thread, no doorbell listener, no event handle, at most the
bounded pool of the callback strategy's helper streams.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from typing import Any

import anyio
import pytest

import aiogpu
from aiogpu._wait import _doorbell, _helpers, _thread
from aiogpu.testing import SimulatedDriver
from tests.helpers import settle_waiter_threads

pytestmark = pytest.mark.slow  # a storm of cancellations

WAITS = 100_000
LOOPS: list[tuple[str, dict[str, Any]]] = [("asyncio", {}), ("asyncio", {"use_uvloop": True}), ("trio", {})]
STRATEGIES: list[aiogpu.WaitStrategy] = ["auto", "poll", "thread", "callback"]
STREAMS = 8
WAITS_PER_ROUND = 1000
WORK_SECONDS = (0.0, 50e-6, 200e-6, 1e-3)  # simulated GPU time per stream and round


async def storm(sim: SimulatedDriver, waits: int, seed: int) -> Counter[str]:
    rng = random.Random(seed)
    device = sim.device(0)
    outcomes: Counter[str] = Counter()
    streams = [aiogpu.Stream(device) for _ in range(STREAMS)]

    async def left_alone(event: aiogpu.Event, strategy: aiogpu.WaitStrategy) -> None:
        await event.wait(strategy=strategy)
        assert event.is_done  # woken only once the work is done
        outcomes["completed"] += 1

    async def under_deadline(event: aiogpu.Event, strategy: aiogpu.WaitStrategy, seconds: float) -> None:
        with anyio.move_on_after(seconds):
            await event.wait(strategy=strategy)
            assert event.is_done
            outcomes["completed before its deadline"] += 1
            return
        outcomes["timed out"] += 1

    async def cancellable(event: aiogpu.Event, strategy: aiogpu.WaitStrategy, scope: anyio.CancelScope) -> None:
        with scope:
            await event.wait(strategy=strategy)
            assert event.is_done
            outcomes["completed before its cancellation"] += 1
            return
        outcomes["cancelled"] += 1

    with anyio.fail_after(600):  # a hang fails the test
        for _ in range(0, waits, WAITS_PER_ROUND):
            events = []
            for stream in streams:
                sim.launch(stream, seconds=rng.choice(WORK_SECONDS))
                events.append(stream.record())
            scopes = []
            async with anyio.create_task_group() as tg:
                for _ in range(WAITS_PER_ROUND):
                    event, strategy, fate = rng.choice(events), rng.choice(STRATEGIES), rng.random()
                    if fate < 0.2:
                        tg.start_soon(under_deadline, event, strategy, rng.uniform(0, 1e-3))
                    elif fate < 0.4:
                        scopes.append(anyio.CancelScope())
                        tg.start_soon(cancellable, event, strategy, scopes[-1])
                    else:
                        outcomes["left alone"] += 1
                        tg.start_soon(left_alone, event, strategy)
                for _ in range(rng.randrange(3)):  # cancel after zero to two checkpoints
                    await anyio.lowlevel.checkpoint()
                for scope in scopes:
                    scope.cancel()
            assert aiogpu.pending_waits() == []
            for event in events:
                event.close()
    for stream in streams:
        stream.close()
    return outcomes


@pytest.mark.timeout(900)
def test_cancellation_storm_leaves_nothing_behind() -> None:
    sim = SimulatedDriver(devices=1, forbid_blocking_on_event_loop=True)
    device = sim.device(0)
    totals: Counter[str] = Counter()
    started = time.monotonic()
    for index, (backend, options) in enumerate(LOOPS):
        share = WAITS // len(LOOPS) + (1 if index < WAITS % len(LOOPS) else 0)
        share = -(-share // WAITS_PER_ROUND) * WAITS_PER_ROUND  # whole rounds
        totals += anyio.run(storm, sim, share, index, backend=backend, backend_options=options)
    elapsed = time.monotonic() - started
    waits = sum(totals.values()) - totals["left alone"]
    assert waits >= WAITS, totals
    assert totals["completed"] == totals["left alone"], totals  # every wait left alone completed
    assert totals["cancelled"] > 0 and totals["timed out"] > 0, totals
    pool = settle_waiter_threads()
    assert (pool.threads, pool.queued_jobs, pool.running_jobs, pool.subscribers) == (0, 0, 0, 0), pool
    assert not _doorbell.doorbell()._listeners, "a watcher still listens to the doorbell"
    statistics = sim.statistics()
    helpers = len(_helpers.helper_streams(sim, device._context))
    assert helpers <= _helpers.KEEP_IDLE_HELPERS
    assert (statistics.live_events, statistics.live_streams - helpers) == (0, 0), statistics
    assert statistics.lifetime_violations == 0
    print(f"\n{waits} waits in {elapsed:.1f} s: {dict(totals)}; pool after: {pool}")
    assert _thread.pool().statistics().threads == 0
