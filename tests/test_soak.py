"""Soak on the simulated device: a million awaits leave resident memory flat and threads bounded.

The load (``tests/soak.py``) runs in a child process, so that its memory and threads are its
own: 8 streams, 4 recorded events per stream per round (new events closed every round, and
re-recorded ones), 128 request tasks per round each awaiting its stream's 4 events, the four
wait strategies mixed. ``pytest -s`` shows the figures; the assertion messages carry them too.
``tests/gpu/test_soak.py`` runs the same on the real GPU.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from aiogpu._wait import _thread
from tests import soak

pytestmark = pytest.mark.slow  # a million awaits in a child process

ROOT = Path(__file__).resolve().parents[1]
AWAITS = 1_000_000
#: The issue's bound on resident memory growth after warm-up.
RSS_GROWTH_LIMIT = 10_000_000
#: About a minute on a slow two-core machine; the bound leaves room for a loaded one.
CHILD_TIMEOUT = 540
#: Python threads the soak may have: the main thread; the timer, arming and doorbell threads
#: (one each per process); at most ``MAX_THREADS`` waiter threads serving waits; and waiter
#: threads whose wait was dropped (the watcher saw the work done first, or took over watching it
#: on the loop) while they still sleep towards the predicted completion or finish in the driver.
#: Those do not count against ``MAX_THREADS``; each serves one recording, and one round records
#: ``STREAMS * STAGES`` events. (Measured: 20 with the strategies mixed, 32 with ``thread`` alone.)
THREAD_LIMIT = 1 + 3 + _thread.MAX_THREADS + soak.STREAMS * soak.STAGES


def run_soak(device: str, awaits: int = AWAITS, strategy: str = "mixed", loop: str = "asyncio") -> dict[str, Any]:
    """Run ``python -m tests.soak`` from the project root; return its JSON report."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    command = [sys.executable, "-m", "tests.soak", "--device", device, "--awaits", str(awaits)]
    command += ["--strategy", strategy, "--loop", loop]
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=CHILD_TIMEOUT, check=False)
    assert result.returncode == 0, f"the soak exited with {result.returncode}:\n{result.stdout}\n{result.stderr}"
    lines = result.stdout.strip().splitlines()
    assert lines, f"the soak printed no report:\n{result.stderr}"
    report: dict[str, Any] = json.loads(lines[-1])
    return report


def summary(report: dict[str, Any]) -> str:
    mib = 1024 * 1024
    trail = ", ".join(f"{sample['awaits']}: {sample['rss'] / mib:.2f}" for sample in report["rss_samples"])
    return (
        f"{report['device']} {report['loop']} {report['strategy']}: {report['awaits']:,} awaits "
        f"({report['awaits_pending_at_start']:,} found their work pending) in {report['elapsed_s']:.1f} s, "
        f"{report['awaits_per_s']:,.0f} awaits/s; RSS {report['rss_baseline'] / mib:.2f} MiB after "
        f"{report['warmup_awaits']:,} awaits of warm-up, {report['rss_end'] / mib:.2f} MiB at the end: "
        f"growth {report['rss_growth'] / 1e6:+.3f} MB (awaits: MiB {trail}); threads at most "
        f"{report['threads_max']} (kernel count {report['os_threads_max']}), {report['threads_end']} at the end"
    )


def check_report(report: dict[str, Any], awaits: int) -> None:
    """What every soak must show, whatever the device."""
    figures = summary(report)
    print(f"\nsoak: {figures}")
    assert report["awaits_started"] == awaits, figures
    assert report["awaits"] == awaits, f"not every await returned: {figures}"
    # Held rounds hold the work until every task has started: their first awaits all went
    # through the wake engine, not the already-done shortcut.
    assert report["awaits_pending_at_start"] >= report["held_round_tasks"] > 0, figures
    assert report["rss_growth"] < RSS_GROWTH_LIMIT, f"resident memory grew by {report['rss_growth']:,} bytes: {figures}"
    assert report["threads_max"] <= THREAD_LIMIT, f"more threads than the engine's bound ({THREAD_LIMIT}): {figures}"
    assert report["waiter_subscribers_end"] == 0, f"a wait left its subscription behind: {figures}"


@pytest.mark.timeout(CHILD_TIMEOUT + 60)
def test_a_million_awaits_on_the_simulated_device() -> None:
    report = run_soak("simulated")
    check_report(report, AWAITS)
    figures = summary(report)
    assert report["sim_lifetime_violations"] == 0, figures
    # Every round closed its events; the waiter threads' own helper events went with the threads.
    assert report["events_created"] >= 30_000, figures
    assert report["waiter_jobs_settled"], figures
    assert report["sim_live_events"] == 0, (
        f"{report['sim_live_events']} simulated events still alive out of {report['events_created']:,} created: {figures}"
    )
