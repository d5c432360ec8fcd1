"""The examples run as tests: on the GPU where there is one, otherwise on the simulated device."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).parent.parent / "examples"


def test_overlap_example_keeps_the_loop_responsive() -> None:
    root = EXAMPLES.parent
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / "01_overlap_host_and_gpu.py")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=root,
        env=environment,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert lines[0].startswith("aiogpu demo on ")
    ticks = {line.split()[0]: int(re.search(r"ticker ran +(\d+) times", line)[1]) for line in lines[1:]}  # type: ignore[index]
    assert set(ticks) == {"await", "event.synchronize()"}
    assert ticks["await"] > 10 * max(ticks["event.synchronize()"], 1)
