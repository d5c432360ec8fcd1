"""What the GPU tests run in child processes: a kernel fault, and the far end of an IPC event.

A kernel fault is sticky: it makes the CUDA context unusable for the rest of its process, so
the pytest process never faults. ``python -m tests.gpu._child fault STRATEGY LOOP`` (run from
the project root) faults the GPU under 100 awaiting tasks on 4 streams and prints, as one JSON
line, what each of them raised and when. :func:`await_shared_event` is the target of a spawned
``multiprocessing.Process`` that awaits an event another process records.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math
import time
import typing
from typing import TYPE_CHECKING, Any

import anyio
import anyio.lowlevel

import aiogpu
from aiogpu.testing import Latch, launch_fault, launch_spin

if TYPE_CHECKING:
    from multiprocessing.queues import Queue

#: Event loops by name, as ``anyio.run`` arguments: (backend, backend options).
LOOPS: dict[str, tuple[str, dict[str, Any]]] = {
    "asyncio": ("asyncio", {}),
    "uvloop": ("asyncio", {"use_uvloop": True}),
    "trio": ("trio", {}),
}
STREAMS = 4
EVENTS_PER_STREAM = 5
AWAITERS_PER_EVENT = 5  # 100 awaiting tasks in all
TICK = 1e-3  # the ticker task's period (s)
TICKS_AFTER = 10  # ticks the loop must still run once every awaiter has raised
FAULT_TIMEOUT = 10.0
IPC_TIMEOUT = 30.0


def running_loop() -> str:
    """The name of the loop running the caller: ``"asyncio"``, ``"uvloop"`` or ``"trio"``."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:  # not asyncio: anyio runs nothing else but trio
        return "trio"
    return type(loop).__module__.partition(".")[0]


# -- a kernel fault under awaiting tasks -----------------------------------------------------
async def fault_under_awaiters(strategy: aiogpu.WaitStrategy) -> dict[str, Any]:
    """Fault the GPU while 100 tasks await events on 4 streams and a ticker keeps the loop
    busy; report what each task raised, how long after the fault, and how the ticker fared."""
    device = aiogpu.Device(0)
    outcomes: list[dict[str, Any]] = []
    errors: list[aiogpu.CudaError] = []
    released_at = 0.0
    ticks: list[float] = []

    async def awaiter(event: aiogpu.Event) -> None:
        try:
            await event.wait(strategy=strategy)
        except aiogpu.CudaError as exc:
            errors.append(exc)
            outcomes.append(
                {
                    "raised": "CudaError",
                    "name": exc.name,
                    "is_context_lost": exc.is_context_lost,
                    "says_unusable": "no longer usable" in str(exc),
                    "after_ms": (time.monotonic() - released_at) * 1e3,
                }
            )
        except Exception as exc:
            outcomes.append({"raised": type(exc).__name__, "message": str(exc)})
        else:
            outcomes.append({"raised": None})

    all_raised_at = math.inf
    ticked_after = anyio.Event()  # TICKS_AFTER ticks once every awaiter has raised

    async def ticker() -> None:
        while True:
            ticks.append(now := time.monotonic())
            if now > all_raised_at and sum(tick > all_raised_at for tick in ticks[-TICKS_AFTER:]) == TICKS_AFTER:
                ticked_after.set()
            await anyio.sleep(TICK)

    streams = [aiogpu.Stream(device) for _ in range(STREAMS)]
    with Latch(device) as latch:
        # Load the test kernels before holding the streams: a first load may synchronize the context.
        launch_spin(streams[0], 0)
        await streams[0].wait_idle(strategy=strategy)
        for stream in streams:
            latch.block(stream)
        launch_fault(streams[0])  # runs, and faults, once the latch opens
        for stream in streams[1:]:
            stream.wait_for(streams[0])  # their work comes after the fault, so none of it completes
        events = [stream.record() for stream in streams for _ in range(EVENTS_PER_STREAM)]
        with anyio.fail_after(FAULT_TIMEOUT):
            async with anyio.create_task_group() as tg:
                tg.start_soon(ticker)
                async with anyio.create_task_group() as awaiters:
                    for event in events:
                        for _ in range(AWAITERS_PER_EVENT):
                            awaiters.start_soon(awaiter, event)
                    # Every awaiter has joined its event's wait. (Not ``wait_all_tasks_blocked``,
                    # which timed out here once, poll on uvloop: it retries only when no task
                    # looks runnable, and a watcher woken by cold polls on whole milliseconds,
                    # as its own 100 ms sleeps are, can look runnable whenever it looks.)
                    joined = len(events) * AWAITERS_PER_EVENT
                    while sum(wait.waiters for wait in aiogpu.pending_waits()) < joined:
                        await anyio.lowlevel.checkpoint()
                    pending_before_release = not any(event.is_done for event in events)
                    released_at = time.monotonic()
                    latch.release()
                all_raised_at = time.monotonic()
                await ticked_after.wait()  # the loop goes on serving other tasks
                tg.cancel_scope.cancel()
    during = [tick for tick in ticks if released_at <= tick <= all_raised_at]
    return {
        "loop": running_loop(),
        "pending_before_release": pending_before_release,
        "outcomes": outcomes,
        "distinct_errors": len({id(error) for error in errors}),
        "ticks_during_fault": len(during),
        "max_tick_gap_ms": max((b - a for a, b in itertools.pairwise(ticks)), default=0.0) * 1e3,
    }


#: Every awaiter must have its CudaError this soon after the faulting kernel is let run.
FAULT_REPORTED_WITHIN_MS = 200


def check_fault_report(
    report: dict[str, Any],
    strategy: str,
    loop: str,
    *,
    max_tick_gap_ms: float | None = 50.0,
    reported_within_ms: float = FAULT_REPORTED_WITHIN_MS,
) -> None:
    """What :func:`fault_under_awaiters` must have seen, on the GPU and on the simulator alike
    (``max_tick_gap_ms=None``: the ticker need only have gone on ticking after the fault)."""
    assert report["loop"] == loop
    assert report["pending_before_release"], "the events completed before the latch was released"
    outcomes = report["outcomes"]
    assert len(outcomes) == STREAMS * EVENTS_PER_STREAM * AWAITERS_PER_EVENT == 100, outcomes
    for outcome in outcomes:
        assert outcome["raised"] == "CudaError", outcome
        assert outcome["is_context_lost"], outcome
        assert outcome["says_unusable"], outcome  # the message says the context is gone for good
        assert outcome["after_ms"] <= reported_within_ms, outcome
    assert report["distinct_errors"] == len(outcomes), "awaiters shared an exception object"
    if max_tick_gap_ms is not None:
        assert report["max_tick_gap_ms"] < max_tick_gap_ms, report  # the loop kept serving the ticker throughout
    slowest = max(outcome["after_ms"] for outcome in outcomes)
    print(
        f"{strategy}/{loop}: last of 100 awaiters raised {slowest:.1f} ms after the fault was let run; "
        f"ticker's longest gap {report['max_tick_gap_ms']:.1f} ms"
    )


# -- the far end of an interprocess event ----------------------------------------------------
def await_shared_event(shared: aiogpu.Event | aiogpu.IpcEventHandle, strategy: aiogpu.WaitStrategy, reports: Queue[str]) -> None:
    """Open an event exported by the parent, report ``"waiting"`` while awaiting it, then ``"done"``.

    ``shared`` is the parent's ``IpcEventHandle``, or its ``Event`` (which pickles through its
    IPC handle and arrives already open).
    """
    event = shared if isinstance(shared, aiogpu.Event) else aiogpu.Event.from_ipc_handle(shared)
    with event:
        anyio.run(_await_and_report, event, strategy, reports)


async def _await_and_report(event: aiogpu.Event, strategy: aiogpu.WaitStrategy, reports: Queue[str]) -> None:
    async def awaiter() -> None:
        await event.wait(strategy=strategy)
        reports.put("done")

    with anyio.fail_after(IPC_TIMEOUT):
        async with anyio.create_task_group() as tg:
            tg.start_soon(awaiter)
            await anyio.wait_all_tasks_blocked()
            reports.put("waiting")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.gpu._child", description="Child processes of the GPU tests.")
    scenarios = parser.add_subparsers(dest="scenario", required=True)
    fault = scenarios.add_parser("fault", help="fault the GPU under awaiting tasks; print a JSON report")
    fault.add_argument("strategy", choices=typing.get_args(aiogpu.WaitStrategy))
    fault.add_argument("loop", choices=list(LOOPS))
    args = parser.parse_args(argv)
    backend, options = LOOPS[args.loop]
    report = anyio.run(fault_under_awaiters, args.strategy, backend=backend, backend_options=options)
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
