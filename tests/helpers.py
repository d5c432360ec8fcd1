"""Helpers shared by the tests."""

from __future__ import annotations

import gc

from aiogpu._wait import _thread


def settle_waiter_threads(timeout: float = 10.0) -> _thread.PoolStatistics:
    """Let abandoned waiter jobs finish (their GPU work must be complete) and idle threads exit."""
    gc.collect()
    pool = _thread.pool()
    assert pool.wait_quiet(timeout), f"waiter jobs still running: {pool.statistics()}"
    pool.stop_idle_threads()
    return pool.statistics()
