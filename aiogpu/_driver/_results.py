"""Driver results: ``CUresult`` names and codes, the errors they become, and the checked call.

Every error from the CUDA driver, real or simulated, is built here (:func:`cuda_error`), so
messages read the same everywhere: ``cuEventRecord: CUDA_ERROR_INVALID_HANDLE: <the driver's
explanation>``, then what to do where aiogpu knows (a hint). Nothing here calls the driver on
import; :func:`describe` asks it for its explanation only when an error is built.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from cuda.bindings import driver as cu

from .._errors import STICKY_RESULTS, CudaError, CudaUnavailableError

if TYPE_CHECKING:
    from collections.abc import Callable

try:  # cuda-pathfinder names the "no libcuda" failure; older releases raise a bare RuntimeError
    from cuda.pathfinder import DynamicLibNotFoundError as _NoDriverLibrary
except ImportError:  # pragma: no cover - depends on the installed cuda-pathfinder
    _NoDriverLibrary = RuntimeError
#: What a ``cuda.bindings`` call raises when libcuda cannot be loaded (no NVIDIA driver).
NoDriverLibrary: type[Exception] = _NoDriverLibrary

SUCCESS = cu.CUresult.CUDA_SUCCESS
NOT_READY = cu.CUresult.CUDA_ERROR_NOT_READY

_HINTS = {
    "CUDA_ERROR_NOT_INITIALIZED": (
        "CUDA is not initialized in this process; in a child created by fork() after the "
        "parent used CUDA it never will be: start children with the 'spawn' method"
    ),
    "CUDA_ERROR_INVALID_CONTEXT": "No CUDA context is current on this thread",
    "CUDA_ERROR_NOT_SUPPORTED": "This device or driver does not support the operation",
}
_STICKY_HINT = (
    "The CUDA context is no longer usable: every later CUDA call in this process fails; restart the process to use this GPU again"
)


def result_name(result: int) -> str:
    """The ``CUresult`` name of ``result``, without calling the driver."""
    try:
        return str(cu.CUresult(result).name)
    except ValueError:
        return f"CUresult({int(result)})"


def result_code(name: str) -> int:
    """The ``CUresult`` member called ``name`` (for example ``"CUDA_ERROR_ILLEGAL_ADDRESS"``)."""
    member = getattr(cu.CUresult, name, None) if name.startswith("CUDA_") else None
    if member is None:
        raise ValueError(f"unknown CUresult name {name!r}; expected a name like 'CUDA_ERROR_ILLEGAL_ADDRESS'")
    return member  # type: ignore[no-any-return]


def cuda_error(result: int, func: str, explanation: str | None = None) -> CudaError:
    """Build the :class:`CudaError` for ``result`` returned by driver function ``func``.

    Used by every Driver implementation so that real and simulated errors read the same.
    """
    name = result_name(result)
    if explanation is None:
        explanation = describe(result)
    hint = _STICKY_HINT if name in STICKY_RESULTS else _HINTS.get(name, "")
    try:
        code: int = cu.CUresult(result)
    except ValueError:
        code = int(result)
    return CudaError(code, name, func, explanation, hint)


# The driver's own descriptions of the results aiogpu meets most, for when it cannot be asked
# (no driver library: the simulated device on a machine without a GPU).
_DESCRIPTIONS = {
    "CUDA_ERROR_INVALID_VALUE": "invalid argument",
    "CUDA_ERROR_NOT_INITIALIZED": "initialization error",
    "CUDA_ERROR_DEINITIALIZED": "driver shutting down",
    "CUDA_ERROR_NO_DEVICE": "no CUDA-capable device is detected",
    "CUDA_ERROR_INVALID_DEVICE": "invalid device ordinal",
    "CUDA_ERROR_INVALID_CONTEXT": "invalid device context",
    "CUDA_ERROR_INVALID_HANDLE": "invalid resource handle",
    "CUDA_ERROR_NOT_READY": "device not ready",
    "CUDA_ERROR_ILLEGAL_ADDRESS": "an illegal memory access was encountered",
    "CUDA_ERROR_LAUNCH_FAILED": "unspecified launch failure",
    "CUDA_ERROR_NOT_SUPPORTED": "operation not supported",
}


def describe(result: int) -> str:
    """The driver's own explanation of ``result``, or aiogpu's copy of it without a driver."""
    try:
        err, text = cu.cuGetErrorString(cu.CUresult(result))
    except (RuntimeError, ValueError):  # no driver library (simulated device), unknown value
        err, text = None, None
    if err != SUCCESS or text is None:
        return _DESCRIPTIONS.get(result_name(result), "no description available")
    return bytes(text).decode(errors="replace")


def no_driver_error(func: str) -> CudaUnavailableError:
    """The error for ``func`` when libcuda cannot be loaded (no NVIDIA driver here)."""
    return CudaUnavailableError(
        f"{func}: no NVIDIA driver found: libcuda.so could not be loaded. Install the NVIDIA "
        "display driver to use a GPU, or run without one on aiogpu.testing.SimulatedDriver()"
    )


def check(func: Callable[..., Any], *args: Any) -> Any:
    """Call a ``cuda.bindings`` driver function; return its values or raise ``CudaError``."""
    try:
        err, *values = func(*args)
    except NoDriverLibrary as exc:
        raise no_driver_error(func.__name__) from exc
    if err != SUCCESS:
        raise cuda_error(err, func.__name__)
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)
