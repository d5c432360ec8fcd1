"""Soak on the real GPU: a million awaits leave resident memory flat and threads bounded.

The same load as ``tests/test_soak.py`` (``tests/soak.py``, in a child process), with
``launch_spin`` kernels of 2 to 4 ms as the work. ``pytest -s`` shows the figures.
"""

from __future__ import annotations

import pytest

from tests.test_soak import AWAITS, CHILD_TIMEOUT, check_report, run_soak

pytestmark = pytest.mark.gpu


@pytest.mark.timeout(CHILD_TIMEOUT + 60)
def test_a_million_awaits_on_the_gpu() -> None:
    report = run_soak("gpu")
    assert report["device"].startswith("gpu"), report["device"]
    check_report(report, AWAITS)
