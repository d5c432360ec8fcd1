"""Host cost of aiogpu's everyday calls, beside the driver calls under them and torch's events.

Creating, recording, querying and closing an event, and awaiting one whose work is done, each
timed over ``CALLS`` calls (after a warm-up), on one thread with no context current (as an
event loop thread that never touched CUDA itself). Beside them: the raw ``cuda.bindings``
calls the same operations make, the context push and pop that creating an event needs, and
``torch.cuda.Event`` where torch is installed. This is the profile that says whether a pool of
events would pay: a pool saves the driver's create and destroy and the context switch around
them, not aiogpu's own Python.

Writes ``host_costs.json`` to ``--out`` and prints a line per call. Without a GPU it times the
simulated driver (its own Python stands in for the driver calls) and says so.

Run:  python -m benchmarks.host_costs [--quick] [--out DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiogpu
from aiogpu._driver import check  # calls a cuda.bindings function, raises CudaError

from . import baselines
from .wake import open_device

if TYPE_CHECKING:
    from collections.abc import Callable

CALLS = 20_000
WARM_UP = 200


def per_call_us(call: Callable[[], object], calls: int, warm_up: int = WARM_UP) -> float:
    """µs per call of ``call``, timed over ``calls`` calls after ``warm_up`` untimed ones."""
    for _ in range(warm_up):
        call()
    started = time.perf_counter()
    for _ in range(calls):
        call()
    return (time.perf_counter() - started) / calls * 1e6


def aiogpu_costs(device: aiogpu.Device, calls: int) -> list[tuple[str, float]]:
    stream = aiogpu.Stream(device)
    event = aiogpu.Event(device)
    event.record(stream)
    try:
        rows = [
            ("aiogpu.Event(device) + close()", per_call_us(lambda: aiogpu.Event(device).close(), calls)),
            ("stream.record() + close(): a new event each time", per_call_us(lambda: stream.record().close(), calls)),
            ("stream.record(), dropped: destroyed by the GC's finalizer", per_call_us(stream.record, calls)),
            ("event.record(stream): re-recording one event", per_call_us(lambda: event.record(stream), calls)),
        ]
        stream.synchronize()
        rows.append(("event.is_done, done", per_call_us(lambda: event.is_done, calls)))

        async def await_done() -> float:
            async def one() -> None:
                await event

            for _ in range(WARM_UP):
                await one()
            started = time.perf_counter()
            for _ in range(calls):
                await one()
            return (time.perf_counter() - started) / calls * 1e6

        rows.append(("await event, done: a query and a checkpoint (asyncio)", asyncio.run(await_done())))
        return rows
    finally:
        event.close()
        stream.close()


def driver_costs(device: aiogpu.Device, calls: int) -> list[tuple[str, float]]:
    from cuda.bindings import driver as cu

    door = device._driver
    context = device._context

    def push_pop() -> None:
        door.context_push(context)
        door.context_pop()

    rows = [
        ("cuCtxGetCurrent", per_call_us(door.context_get_current, calls)),
        ("cuCtxPushCurrent + cuCtxPopCurrent", per_call_us(push_pop, calls)),
    ]
    with aiogpu.Stream(device) as stream, device._activated():
        flags = cu.CUevent_flags.CU_EVENT_DISABLE_TIMING
        check(cu.cuEventDestroy, check(cu.cuEventCreate, flags))  # unchecked below: a failure would be timed

        def create_destroy() -> None:
            _, created = cu.cuEventCreate(flags)
            cu.cuEventDestroy(created)

        rows.append(("cuEventCreate + cuEventDestroy", per_call_us(create_destroy, calls)))
        event = check(cu.cuEventCreate, flags)
        try:
            rows.append(("cuEventRecord", per_call_us(lambda: cu.cuEventRecord(event, stream.handle), calls)))
            stream.synchronize()
            rows.append(("cuEventQuery, done", per_call_us(lambda: cu.cuEventQuery(event), calls)))
        finally:
            cu.cuEventDestroy(event)
    return rows


def torch_costs(device: aiogpu.Device, calls: int) -> list[tuple[str, float]]:
    torch = baselines._import("torch")
    if torch is None or not torch.cuda.is_available():
        return []
    stream = torch.cuda.Stream(device=device.ordinal)
    event = torch.cuda.Event()
    event.record(stream)

    def create_record() -> None:
        torch.cuda.Event().record(stream)

    rows = [
        ("torch.cuda.Event() + record(stream), dropped", per_call_us(create_record, calls)),
        ("torch Event.record(stream): re-recording one event", per_call_us(lambda: event.record(stream), calls)),
    ]
    stream.synchronize()
    rows.append(("torch Event.query(), done", per_call_us(event.query, calls)))
    return rows


def main(out: Path, quick: bool) -> None:
    device, simulated = open_device()
    environment = baselines.environment(device, simulated)
    print(json.dumps(environment), flush=True)
    calls = CALLS // 20 if quick else CALLS
    groups = {"aiogpu": aiogpu_costs(device, calls)}
    if not simulated:
        groups["driver (cuda.bindings)"] = driver_costs(device, calls)
        groups["torch"] = torch_costs(device, calls)
    rows = [{"group": group, "call": name, "us": us} for group, measured in groups.items() for name, us in measured]
    label = "SIMULATED " if simulated else ""
    for row in rows:
        print(f"{label}{row['group']:24} {row['us']:7.2f} us  {row['call']}", flush=True)
    out.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"environment": environment, "calls": calls, "costs": rows}
    (out / "host_costs.json").write_text(json.dumps(result, indent=1))
    print(f"wrote {out / 'host_costs.json'}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    parser.add_argument("--quick", action="store_true", help="fewer calls (a smoke run)")
    arguments = parser.parse_args()
    main(arguments.out, arguments.quick)
