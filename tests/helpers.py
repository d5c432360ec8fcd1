"""Helpers shared by the tests."""

from __future__ import annotations

import asyncio
import gc
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from aiogpu._wait import _thread
from aiogpu.testing import SimulatedDriver


def settle_waiter_threads(timeout: float = 10.0) -> _thread.PoolStatistics:
    """Let abandoned waiter jobs finish (their GPU work must be complete) and idle threads exit."""
    gc.collect()
    pool = _thread.pool()
    assert pool.wait_quiet(timeout), f"waiter jobs still running: {pool.statistics()}"
    pool.stop_idle_threads()
    return pool.statistics()


def in_waiter_thread() -> bool:
    """Whether the calling thread is one of aiogpu's waiter threads."""
    return threading.current_thread().name.startswith("aiogpu-waiter")


def waiter_thread_queries(
    sim: SimulatedDriver, monkeypatch: pytest.MonkeyPatch, enough: int = 1
) -> tuple[list[float], threading.Event]:
    """When waiter threads queried an event, and a latch set once they have done so ``enough`` times."""
    times: list[float] = []
    reached = threading.Event()
    query = sim.event_query

    def noted(event: int) -> bool:
        if in_waiter_thread():
            times.append(time.perf_counter())
            if len(times) >= enough:
                reached.set()
        return query(event)

    monkeypatch.setattr(sim, "event_query", noted)
    return times, reached


@contextmanager
def eager_tasks() -> Iterator[None]:
    """asyncio's eager task factory (Python 3.12) on the running loop for the block; skips on
    uvloop, which passes the factory an argument it does not take."""
    loop = asyncio.get_running_loop()
    if not isinstance(loop, asyncio.BaseEventLoop):
        pytest.skip("uvloop passes an argument asyncio's eager task factory does not take")
    loop.set_task_factory(asyncio.eager_task_factory)  # type: ignore[attr-defined]
    try:
        yield
    finally:
        loop.set_task_factory(None)
