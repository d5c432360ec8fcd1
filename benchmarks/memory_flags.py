"""Study: a memory-flag timeline as a completion check (GPU only; the simulated device has no
stream memory operations).

The idea (NVIDIA's cuda-async, gpu-async-reactor): after each recording, enqueue
``cuStreamWriteValue64(stream, flag, sequence)`` into mapped page-locked host memory; "is it
done?" becomes a memory read instead of a ``cuEventQuery``. Before aiogpu relies on it, this
measures, in one process and run:

1. whether the device supports it (``CAN_USE_64_BIT_STREAM_MEM_OPS``; the legacy
   ``CAN_USE_STREAM_MEM_OPS_V1``, which the unversioned ``cuStreamWriteValue64`` export needs);
2. what each piece costs on the host: a recording, a flag write, a query, a memory read;
3. whether the flag and the event agree (a flag seen while the event still reads pending would
   make ``await event`` return before ``event.is_done``);
4. how many operations can be enqueued behind a stream held by a latch before the enqueueing
   call itself blocks (past it, a run that enqueues before releasing hangs), for event
   recordings and for flag writes (each in a child process, with a watchdog that opens the
   latch after 5 s).

Writes ``memory_flags.json`` to ``--out`` and prints a line per measurement.

Run:  python -m benchmarks.memory_flags [--out DIR]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiogpu
from aiogpu._driver import check  # calls a cuda.bindings function, raises CudaError
from aiogpu.testing import launch_spin

from .host_costs import per_call_us

ORDERING_TRIALS = 2_000


def study(device: aiogpu.Device) -> dict[str, Any]:
    from cuda.bindings import driver as cu

    result: dict[str, Any] = {}
    for name in ("CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS", "CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_MEM_OPS_V1"):
        attribute = getattr(cu.CUdevice_attribute, name, None)
        result[name] = None if attribute is None else check(cu.cuDeviceGetAttribute, attribute, device.ordinal)
    with device._activated(), aiogpu.Stream(device) as stream:
        flags = cu.CU_MEMHOSTALLOC_DEVICEMAP | cu.CU_MEMHOSTALLOC_PORTABLE
        host = int(check(cu.cuMemHostAlloc, 4096, flags))
        try:
            flag_address = int(check(cu.cuMemHostGetDevicePointer, host, 0))
            words = memoryview((ctypes.c_uint64 * 512).from_address(host)).cast("B").cast("Q")
            words[0] = words[1] = 0
            event = aiogpu.Event(device)
            handle, stream_handle = event.handle, stream.handle
            event.record(stream)
            stream.synchronize()
            costs = {
                "cuEventQuery (done), cuda.bindings": per_call_us(lambda: cu.cuEventQuery(handle), 100_000, warm_up=0),
                "memory read of a flag": per_call_us(lambda: words[1], 100_000, warm_up=0),
                "cuEventRecord, cuda.bindings": per_call_us(lambda: cu.cuEventRecord(handle, stream_handle), 5_000, warm_up=0),
                "Event.record (aiogpu)": per_call_us(lambda: event.record(stream), 5_000, warm_up=0),
                "cuStreamWriteValue64, cuda.bindings": per_call_us(
                    lambda: cu.cuStreamWriteValue64(stream_handle, flag_address + 8, 1, 0), 5_000, warm_up=0
                ),
            }
            stream.synchronize()
            launch_spin(stream, 0.5)
            event.record(stream)
            costs["cuEventQuery (pending), cuda.bindings"] = per_call_us(lambda: cu.cuEventQuery(handle), 20_000, warm_up=0)
            stream.synchronize()
            result["host_us_per_call"] = costs
            for what, cost in costs.items():
                print(f"cost  {what:42} {cost:6.3f} us", flush=True)

            # Does the legacy (unversioned) export work where only the v2 operations are supported?
            legacy = ctypes.CDLL("libcuda.so.1").cuStreamWriteValue64
            legacy.argtypes = (ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_uint)
            legacy.restype = ctypes.c_int
            code = legacy(stream_handle, flag_address + 16, 7, 0)
            stream.synchronize()
            result["legacy export"] = {"result": code, "written": words[2] == 7}
            print(f"legacy cuStreamWriteValue64 export: result {code}, value written: {words[2] == 7}", flush=True)

            flag_before_event = event_before_flag = 0
            for sequence in range(1, 2 * ORDERING_TRIALS + 1):
                launch_spin(stream, 10e-6)
                check(cu.cuEventRecord, handle, stream_handle)
                check(cu.cuStreamWriteValue64, stream_handle, flag_address, sequence, 0)
                deadline = time.perf_counter() + 2.0
                if sequence <= ORDERING_TRIALS:  # watch the flag, then ask the event
                    while words[0] < sequence:
                        if time.perf_counter() > deadline:
                            raise RuntimeError(f"flag write {sequence} never became visible")
                    flag_before_event += cu.cuEventQuery(handle)[0] != cu.CUresult.CUDA_SUCCESS
                else:  # watch the event, then read the flag
                    while cu.cuEventQuery(handle)[0] != cu.CUresult.CUDA_SUCCESS:
                        if time.perf_counter() > deadline:
                            raise RuntimeError("event never completed")
                    event_before_flag += words[0] < sequence
            result["ordering"] = {
                "trials": ORDERING_TRIALS,
                "flag seen, event still pending": flag_before_event,
                "event done, flag not yet seen": event_before_flag,
            }
            print(f"ordering over {ORDERING_TRIALS} trials each: {result['ordering']}", flush=True)
            event.close()
        finally:
            stream.synchronize()
            check(cu.cuMemFreeHost, host)
    return result


_HELD_CHILD = r"""
import sys, threading, time, ctypes
import aiogpu
from aiogpu.testing import Latch, launch_spin
from cuda.bindings import driver as cu
streams_count, per_stream, kind = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
device = aiogpu.Device(0)
with device._activated():
    host = int(cu.cuMemHostAlloc(4096, cu.CU_MEMHOSTALLOC_DEVICEMAP | cu.CU_MEMHOSTALLOC_PORTABLE)[1])
    flag = int(cu.cuMemHostGetDevicePointer(host, 0)[1])
    streams = [aiogpu.Stream(device, nonblocking=True) for _ in range(streams_count)]
    latch = Latch(device)
    enqueued = [0]
    stalled = []
    def watchdog():
        time.sleep(5)
        stalled.append(enqueued[0])
        latch.release()
    threading.Thread(target=watchdog, daemon=True).start()
    for stream in streams:
        latch.block(stream)
    for i in range(per_stream):
        for k, stream in enumerate(streams):
            launch_spin(stream, 20e-6)
            if kind == "event":
                stream.record()
            else:
                r = cu.cuStreamWriteValue64(stream.handle, flag + 8 * k, i + 1, 0)
                assert r[0] == cu.CUresult.CUDA_SUCCESS, r
            enqueued[0] += 2
    latch.release()
    for stream in streams:
        stream.synchronize()
    print("STALLED_AT" if stalled else "OK", stalled[0] if stalled else enqueued[0])
"""


def held_stream_limits() -> list[dict[str, Any]]:
    rows = []
    for streams, per_stream in ((1, 400), (1, 1_000), (8, 1_250), (64, 100), (64, 160)):
        for kind in ("event", "flag"):
            child = subprocess.run(
                [sys.executable, "-c", _HELD_CHILD, str(streams), str(per_stream), kind],
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
            words = (child.stdout.strip().splitlines() or ["ERROR"])[-1].split()
            row = {
                "streams": streams,
                "operations_per_stream": 2 * per_stream,
                "kind": f"kernel + {'event record' if kind == 'event' else 'flag write'}",
                "enqueue_blocked": words[0] == "STALLED_AT",
                "operations_enqueued_when_blocked": int(words[1]) if words[0] == "STALLED_AT" else None,
                "error": child.stderr.strip()[-300:] if words[0] not in ("OK", "STALLED_AT") else None,
            }
            rows.append(row)
            print(f"held stream: {row}", flush=True)
    return rows


def main(out: Path) -> None:
    device = aiogpu.Device(0)
    result = {"device": device.name, "date": time.strftime("%Y-%m-%d"), "study": study(device)}
    result["held_stream_limits"] = held_stream_limits()
    out.mkdir(parents=True, exist_ok=True)
    (out / "memory_flags.json").write_text(json.dumps(result, indent=1))
    print(f"wrote {out / 'memory_flags.json'}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    main(parser.parse_args().out)
