"""The examples run on the real GPU, as a user runs them, and say so.

Examples fall back to aiogpu's simulated device where there is no GPU; on the GPU lane they
must use the GPU: the output names it and never mentions the simulated device.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import aiogpu

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE_TIMEOUT = 120


@pytest.mark.timeout(EXAMPLE_TIMEOUT + 30)
@pytest.mark.parametrize("name", ["01_overlap_host_and_gpu.py", "02_pipeline_overlap.py"])
def test_example_runs_on_the_gpu(gpu: aiogpu.Device, name: str) -> None:
    path = ROOT / "examples" / name
    assert path.is_file(), f"{path} is missing"
    # The example imports this checkout's aiogpu, installed or not.
    python_path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    result = subprocess.run(
        [sys.executable, str(path)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": python_path},
        capture_output=True,
        text=True,
        timeout=EXAMPLE_TIMEOUT,
        check=False,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "GPU" in result.stdout, output
    assert gpu.name in result.stdout, output
    assert "simulated" not in output.lower(), output
