"""The ``poll`` strategy: query the event from the loop thread; no threads at all.

A short busy phase (query, then yield to every other ready task) catches work that finishes
within ~100 µs at near-zero latency; after that the task sleeps between queries, doubling the
sleep up to a cap, so a long wait costs a few hundred driver calls per second at most.
Cancellation lands in a sleep or a yield, so it is immediate and leaves nothing behind.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import anyio
import anyio.lowlevel

if TYPE_CHECKING:
    from . import WaitTarget

BUSY_SECONDS = 100e-6
FIRST_SLEEP = 0.25e-3
MAX_SLEEP = 2e-3


async def wait(target: WaitTarget) -> None:
    query = target._driver.event_query
    handle = target._handle
    busy_until = time.perf_counter() + BUSY_SECONDS
    while time.perf_counter() < busy_until:
        await anyio.lowlevel.checkpoint()
        if query(handle):
            return
    delay = FIRST_SLEEP
    while True:
        await anyio.sleep(delay)
        if query(handle):
            return
        delay = min(delay * 2, MAX_SLEEP)
