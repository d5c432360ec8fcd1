"""``import aiogpu`` is inert: no driver call, no thread, no libcuda needed."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def run_python(code: str) -> str:
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_import_starts_no_thread_and_calls_no_driver_function() -> None:
    out = run_python(
        """
        import threading
        from cuda.bindings import driver

        calls = []
        for name in dir(driver):
            if name.startswith("cu") and callable(getattr(driver, name)):
                def spy(*args, _name=name, _real=getattr(driver, name)):
                    calls.append(_name)
                    return _real(*args)
                setattr(driver, name, spy)

        import aiogpu, aiogpu.testing
        print(threading.active_count(), calls)
        """
    )
    assert out == "1 []"


def test_import_does_not_import_frameworks() -> None:
    out = run_python(
        """
        import sys
        import aiogpu, aiogpu.testing
        print(sorted(name for name in ("torch", "cupy", "numba", "cuda.core", "trio", "uvloop") if name in sys.modules))
        """
    )
    assert out == "[]"
