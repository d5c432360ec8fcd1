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


def test_every_docstring_of_a_strategy_argument_names_every_strategy() -> None:
    """A strategy added to the engine is added to each public docstring that lists them."""
    from aiogpu._wait import STRATEGIES

    documented = []
    for module in (aiogpu, aiogpu.testing):
        for name in module.__all__:
            obj = getattr(module, name)
            members = [v for k, v in vars(obj).items() if not k.startswith("_")] if inspect.isclass(obj) else [obj]
            for member in members:
                if inspect.isroutine(member) and "strategy" in _parameters(member):
                    argument = (member.__doc__ or "").split("strategy:", 1)[-1].split(":\n", 1)[0]
                    missing = [strategy for strategy in STRATEGIES if f'"{strategy}"' not in argument]
                    assert not missing, f"{name}.{member.__name__}'s docstring does not name {missing}"
                    documented.append(member.__name__)
    assert {"wait", "wait_idle", "copy_to_host", "copy_to_device", "set_default_wait_strategy"} <= set(documented)


def _parameters(function: object) -> list[str]:
    try:
        return list(inspect.signature(function).parameters)  # type: ignore[arg-type]
    except (TypeError, ValueError):  # a builtin without a signature
        return []
