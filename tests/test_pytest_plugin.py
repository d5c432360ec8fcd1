"""aiogpu's pytest plugin, run the way a user runs it: a pytest session over their tests."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # each test runs a pytest session in a subprocess

pytest_plugins = ["pytester"]

ROOT = Path(__file__).parent.parent
EXAMPLE = ROOT / "examples" / "testing_a_service"


@pytest.fixture(autouse=True)
def importable_aiogpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """The pytest subprocess imports this aiogpu, installed or not."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))


def test_the_service_example_passes_with_the_plugin(pytester: pytest.Pytester) -> None:
    for name in ("service.py", "test_service.py"):
        shutil.copy(EXAMPLE / name, pytester.path / name)
    result = pytester.runpytest_subprocess("-p", "aiogpu.testing.pytest_plugin", "-p", "no:cacheprovider", "-v")
    outcomes = result.parseoutcomes()
    assert outcomes.get("passed", 0) >= 4, result.stdout.str()  # once per anyio backend installed
    assert "failed" not in outcomes, result.stdout.str()
    assert "errors" not in outcomes, result.stdout.str()
    for test in (
        "test_a_request_waits_for_its_gpu_work",
        "test_a_gpu_fault_becomes_an_error_response",
        "test_concurrent_requests_all_complete",
        "test_a_request_times_out_when_the_gpu_is_stuck",
    ):
        result.stdout.fnmatch_lines([f"*::{test}*PASSED*"])


def test_marker_options_reach_the_driver_and_bad_ones_are_refused(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import pytest
        import aiogpu

        @pytest.mark.simulated_gpu(devices=3)
        def test_three_devices(simulated_gpu, simulated_device):
            assert aiogpu.Device.count() == 3
            assert aiogpu.Device(0) is simulated_device
            assert simulated_device.driver_name == "simulated"

        def test_default_is_one_device(simulated_gpu):
            assert aiogpu.Device.count() == 1

        @pytest.mark.simulated_gpu(record_latency=-1)
        def test_bad_option(simulated_gpu):
            pass
        """
    )
    result = pytester.runpytest_subprocess("-p", "aiogpu.testing.pytest_plugin", "-p", "no:cacheprovider", "-q")
    result.assert_outcomes(passed=2, errors=1)
    result.stdout.fnmatch_lines(["*record_latency must be a finite non-negative number*"])


def test_the_device_is_the_real_driver_again_after_the_test(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        from aiogpu import _driver

        def test_installed(simulated_gpu):
            assert _driver.default_driver() is simulated_gpu

        def test_restored():
            assert _driver.default_driver().name != "simulated"
        """
    )
    result = pytester.runpytest_subprocess("-p", "aiogpu.testing.pytest_plugin", "-p", "no:cacheprovider", "-q")
    result.assert_outcomes(passed=2)


def test_held_recordings_stay_pending_until_the_test_releases_them(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import anyio
        import pytest
        import aiogpu

        pytestmark = pytest.mark.anyio

        @pytest.fixture(params=["asyncio", "trio"])
        def anyio_backend(request):
            return request.param

        @pytest.mark.simulated_gpu(hold_recordings=True)
        async def test_held_from_the_start(simulated_gpu):
            with aiogpu.Stream() as first, aiogpu.Stream() as second:
                events = [first.record(), second.record()]
                with anyio.move_on_after(0.05) as waited:
                    await events[0]
                assert waited.cancelled_caught and not any(event.is_done for event in events)
                simulated_gpu.release_recordings()
                with anyio.fail_after(5):
                    for event in events:
                        await event
                    await first.record()  # no longer held
                for event in events:
                    event.close()

        async def test_held_from_a_call_and_released_by_the_fixture(simulated_gpu):
            with aiogpu.Stream() as stream:
                with stream.record() as before:
                    simulated_gpu.hold_recordings()
                    with stream.record() as held:
                        assert before.is_done and not held.is_done
        """
    )
    result = pytester.runpytest_subprocess("-p", "aiogpu.testing.pytest_plugin", "-p", "no:cacheprovider", "-q")
    result.assert_outcomes(passed=4)
