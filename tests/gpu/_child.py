"""What the GPU tests run in child processes: a kernel fault, and the far end of an IPC event.

A kernel fault is sticky: it makes the CUDA context unusable for the rest of its process, so
the pytest process never faults. ``python -m tests.gpu._child fault STRATEGY LOOP`` (run from
the project root) faults the GPU under 16 awaiting tasks and prints, as one JSON line, what
each of them raised. :func:`await_shared_event` is the target of a spawned
``multiprocessing.Process`` that awaits an event another process records.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import typing
from typing import TYPE_CHECKING, Any

import anyio

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
EVENTS = 4
AWAITERS_PER_EVENT = 4
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
    """Fault the GPU while tasks await events recorded behind the fault; report what they raised."""
    device = aiogpu.Device(0)
    outcomes: list[dict[str, Any]] = []
    errors: list[aiogpu.CudaError] = []

    async def awaiter(event: aiogpu.Event) -> None:
        try:
            await event.wait(strategy=strategy)
        except aiogpu.CudaError as exc:
            errors.append(exc)
            outcomes.append({"raised": "CudaError", "name": exc.name, "is_context_lost": exc.is_context_lost})
        except Exception as exc:
            outcomes.append({"raised": type(exc).__name__, "message": str(exc)})
        else:
            outcomes.append({"raised": None})

    with aiogpu.Stream(device) as stream, Latch(device) as latch:
        # Load the test kernels before holding the stream: a first load may synchronize the context.
        launch_spin(stream, 0)
        await stream.wait_idle(strategy=strategy)
        latch.block(stream)
        launch_fault(stream)  # runs, and faults, once the latch opens
        events = [stream.record() for _ in range(EVENTS)]
        with anyio.fail_after(FAULT_TIMEOUT):
            async with anyio.create_task_group() as tg:
                for event in events:
                    for _ in range(AWAITERS_PER_EVENT):
                        tg.start_soon(awaiter, event)
                await anyio.wait_all_tasks_blocked()
                pending_before_release = not any(event.is_done for event in events)
                latch.release()
    return {
        "loop": running_loop(),
        "pending_before_release": pending_before_release,
        "outcomes": outcomes,
        "distinct_errors": len({id(error) for error in errors}),
    }


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
