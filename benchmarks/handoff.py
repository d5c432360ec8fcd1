"""How soon another thread can wake an idle event loop: the floor under every off-loop way of waiting.

A way of waiting that leaves the loop asleep while the GPU works (``thread``, ``callback``,
``to_thread``) ends with a thread telling the loop, which sleeps in ``select`` until then, to
resume the task. No such way wakes a task sooner after the work completes than that hand-off
takes, however fast it sees the completion. This times the hand-off alone, no GPU involved: a
thread sleeps until well after the loop fell asleep, notes the time and hands a callback to the
loop; latency is the time until the callback runs on the loop. On asyncio and uvloop
(``call_soon_threadsafe``) and trio (``TrioToken.run_sync_soon``), beside the operating system's
own floor: a thread that sets a ``threading.Event`` that another thread is blocked on.

Writes ``handoff.json`` to ``--out`` (with the GPU the machine has, if any: the hand-off does not
use it) and prints a line per way: the latency's p50 and p99.

Run:  python -m benchmarks.handoff [--quick] [--out DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import baselines
from .wake import open_device, percentile

if TYPE_CHECKING:
    from collections.abc import Callable

HANDOFFS = 2000
#: How long after the receiving side starts waiting the thread hands off: long enough that it
#: sleeps (a loop in ``select``, a thread in the kernel) when the hand-off comes.
ASLEEP_AFTER = 500e-6


class _Trial:
    """One hand-off: a thread that, ``ASLEEP_AFTER`` from now or a little later, notes the time
    and calls ``hand_off(arrive)``; ``arrive``, run by the receiving side, notes when it ran and
    calls ``done``."""

    __slots__ = ("_done", "handed", "received", "thread")

    def __init__(self, hand_off: Callable[[Callable[[], None]], object], done: Callable[[], object]) -> None:
        self.handed = self.received = 0.0
        self._done = done

        def fire() -> None:
            # Asleep meanwhile, not spinning: a spinning thread would hold the GIL, and the loop
            # would be waiting for it rather than asleep in ``select``.
            time.sleep(ASLEEP_AFTER)
            self.handed = time.perf_counter()
            hand_off(self.arrive)

        self.thread = threading.Thread(target=fire, daemon=True)
        self.thread.start()

    def arrive(self) -> None:
        self.received = time.perf_counter()
        self._done()

    def latency(self) -> float:
        self.thread.join()
        return self.received - self.handed


def asyncio_latencies(handoffs: int, new_loop: Callable[[], asyncio.AbstractEventLoop] | None = None) -> list[float]:
    """Seconds from a thread's ``call_soon_threadsafe`` to the callback, on an idle loop."""

    async def measure() -> list[float]:
        loop = asyncio.get_running_loop()
        latencies = []
        for _ in range(handoffs):
            woken = loop.create_future()
            trial = _Trial(loop.call_soon_threadsafe, functools.partial(woken.set_result, None))
            await woken
            latencies.append(trial.latency())
        return latencies

    if new_loop is None:
        return asyncio.run(measure())
    loop = new_loop()
    try:
        return loop.run_until_complete(measure())
    finally:
        loop.close()


def trio_latencies(handoffs: int) -> list[float]:
    """Seconds from a thread's ``TrioToken.run_sync_soon`` to the callback, on an idle trio run."""
    trio: Any = baselines._import("trio")

    async def measure() -> list[float]:
        token = trio.lowlevel.current_trio_token()
        latencies = []
        for _ in range(handoffs):
            woken = trio.Event()
            trial = _Trial(token.run_sync_soon, woken.set)
            await woken.wait()
            latencies.append(trial.latency())
        return latencies

    return trio.run(measure)  # type: ignore[no-any-return]


def thread_latencies(handoffs: int) -> list[float]:
    """Seconds from ``threading.Event.set`` to the blocked thread's return: the OS's own floor."""
    latencies = []
    for _ in range(handoffs):
        blocked = threading.Event()
        trial = _Trial(lambda arrive: blocked.set(), lambda: None)  # noqa: B023 (joined before the next)
        blocked.wait()
        trial.arrive()
        latencies.append(trial.latency())
    return latencies


def ways(handoffs: int) -> dict[str, Callable[[], list[float]]]:
    """Each way of handing off that this machine has, by name."""
    found: dict[str, Callable[[], list[float]]] = {
        "thread to a blocked thread (threading.Event)": lambda: thread_latencies(handoffs),
        "thread to asyncio (call_soon_threadsafe)": lambda: asyncio_latencies(handoffs),
    }
    uvloop = baselines._import("uvloop")
    if uvloop is not None:
        found["thread to uvloop (call_soon_threadsafe)"] = lambda: asyncio_latencies(handoffs, uvloop.new_event_loop)
    if baselines._import("trio") is not None:
        found["thread to trio (TrioToken.run_sync_soon)"] = lambda: trio_latencies(handoffs)
    return found


def measure(handoffs: int) -> list[dict[str, Any]]:
    rows = []
    for name, run in ways(handoffs).items():
        latencies = run()
        rows.append(
            {
                "way": name,
                "handoffs": handoffs,
                "p50_us": percentile(latencies, 0.5) * 1e6,
                "p99_us": percentile(latencies, 0.99) * 1e6,
            }
        )
    return rows


def main(out: Path, quick: bool) -> None:
    device, simulated = open_device()  # not used: it names the machine the figures come from
    environment = baselines.environment(device, simulated)
    if simulated:  # no GPU here: the figures are still this machine's own, none of them simulated
        environment.update(device="no GPU", simulated=False)
    print(json.dumps(environment), flush=True)
    handoffs = HANDOFFS // 20 if quick else HANDOFFS
    rows = measure(handoffs)
    for row in rows:
        print(
            f"handoff  {row['way']:46} p50 {row['p50_us']:7.1f} us  p99 {row['p99_us']:7.1f} us",
            flush=True,
        )
    out.mkdir(parents=True, exist_ok=True)
    (out / "handoff.json").write_text(json.dumps({"environment": environment, "rows": rows}, indent=1))
    print(f"wrote {out / 'handoff.json'}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    parser.add_argument("--quick", action="store_true", help="fewer hand-offs (a smoke run)")
    arguments = parser.parse_args()
    main(arguments.out, arguments.quick)
