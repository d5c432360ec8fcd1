"""The public surface: exactly the names in ``__all__``, each reporting its public module."""

from __future__ import annotations

import inspect

import aiogpu
import aiogpu.testing


def test_all_is_complete_and_resolves() -> None:
    for module in (aiogpu, aiogpu.testing):
        assert isinstance(module.__all__, tuple)
        public = {name for name in dir(module) if not name.startswith("_")}
        public -= {"testing", "annotations"}  # the subpackage; the __future__ import
        assert public == set(module.__all__)
        for name in module.__all__:
            assert getattr(module, name) is not None


def test_public_objects_report_the_public_module() -> None:
    for module in (aiogpu, aiogpu.testing):
        for name in module.__all__:
            obj = getattr(module, name)
            if inspect.isclass(obj) or inspect.isfunction(obj):
                assert obj.__module__ == module.__name__, name


def test_errors_are_catchable_by_meaning() -> None:
    import anyio

    assert issubclass(aiogpu.CudaError, aiogpu.AiogpuError)
    assert issubclass(aiogpu.CudaUnavailableError, aiogpu.AiogpuError)
    assert issubclass(aiogpu.ClosedResourceError, anyio.ClosedResourceError)
    assert issubclass(aiogpu.EventStateError, RuntimeError)
