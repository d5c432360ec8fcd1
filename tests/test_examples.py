"""The examples run as tests: on the GPU where there is one, otherwise on the simulated device."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # each example runs in a child interpreter

EXAMPLES = Path(__file__).parent.parent / "examples"


def run_example(name: str) -> subprocess.CompletedProcess[str]:
    root = EXAMPLES.parent
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}
    return subprocess.run(
        [sys.executable, str(EXAMPLES / name)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=root,
        env=environment,
    )


def test_overlap_example_keeps_the_loop_responsive() -> None:
    result = run_example("01_overlap_host_and_gpu.py")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert lines[0].startswith("aiogpu demo on ")
    ticks = {line.split()[0]: int(re.search(r"ticker ran +(\d+) times", line)[1]) for line in lines[1:]}  # type: ignore[index]
    assert set(ticks) == {"await", "event.synchronize()"}
    assert ticks["await"] > 10 * max(ticks["event.synchronize()"], 1)


def test_pipeline_example_checks_every_byte_and_reports_the_overlap() -> None:
    result = run_example("02_pipeline_overlap.py")
    assert result.returncode == 0, result.stderr  # a wrong byte exits non-zero
    lines = result.stdout.strip().splitlines()
    assert lines[0].startswith("aiogpu pipeline on ")
    assert re.match(r"serial \(1 coroutine\) +[\d.]+ ms$", lines[1])
    assert re.match(r"pipelined \(3 coroutines\) +[\d.]+ ms: [\d.]+x faster, every byte checked$", lines[2])
