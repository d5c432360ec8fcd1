"""A kernel fault on the real GPU reaches every awaiting task as a sticky ``CudaError``.

A fault (``CUDA_ERROR_ILLEGAL_ADDRESS``) makes the CUDA context unusable for the rest of its
process, so each case runs in a child process (``tests/gpu/_child.py``), once per wait
strategy and event loop: the child holds 4 streams with a ``Latch``, enqueues the faulting
kernel behind it on one of them, records 5 events on each, starts 5 awaiting tasks per event
(100 in all) and a 1 kHz ticker task, releases the latch and reports, as JSON, what each task
raised, how long after the release, and whether the ticker kept ticking.
"""

from __future__ import annotations

import json
import subprocess
import sys
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import pytest

import aiogpu
from tests.gpu._child import LOOPS, check_fault_report

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
#: Starting Python and CUDA, then the child's own 10 s bound on the awaiters.
CHILD_TIMEOUT = 90


def run_child(*args: str) -> dict[str, Any]:
    """Run ``python -m tests.gpu._child ARGS`` from the project root; return its JSON report."""
    result = subprocess.run(
        [sys.executable, "-m", "tests.gpu._child", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT,
        check=False,
    )
    assert result.returncode == 0, f"the child exited with {result.returncode}:\n{result.stdout}\n{result.stderr}"
    lines = result.stdout.strip().splitlines()
    assert lines, f"the child printed no report:\n{result.stderr}"
    report: dict[str, Any] = json.loads(lines[-1])
    return report


@pytest.mark.alone  # how soon the fault is reported, with no other test's work on the GPU
@pytest.mark.timeout(CHILD_TIMEOUT + 30)
@pytest.mark.parametrize(
    "loop",
    [pytest.param(name, marks=pytest.mark.skipif(find_spec(name) is None, reason=f"{name} is not installed")) for name in LOOPS],
)
def test_fault_raises_a_sticky_cuda_error_in_every_awaiter(strategy: aiogpu.WaitStrategy, loop: str) -> None:
    report = run_child("fault", strategy, loop)
    check_fault_report(report, strategy, loop)
