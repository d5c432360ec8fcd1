"""The exceptions aiogpu raises on purpose.

Few classes, grouped by what a caller would catch. Argument mistakes are plain ``TypeError``
and ``ValueError``; driver failures are ``CudaError``; a machine without a usable driver or
device gets ``CudaUnavailableError``; using a closed object raises ``ClosedResourceError``.
This module never imports ``cuda.bindings``: the driver door (``_driver/``) builds
``CudaError`` from its ``CUresult`` and hands it over.
"""

from __future__ import annotations

import anyio

__all__ = [
    "AiogpuError",
    "ClosedResourceError",
    "CudaError",
    "CudaUnavailableError",
    "EventStateError",
]


class AiogpuError(Exception):
    """Base class of every exception aiogpu raises on purpose."""


class CudaError(AiogpuError):
    """A CUDA driver call failed.

    The message reads ``"<function>: <CUDA_ERROR_NAME>: <driver's explanation>"``, followed by
    what to do about it where aiogpu knows.

    Attributes:
        result: The ``CUresult`` the driver returned (an ``int`` subclass; compare it with
            ``cuda.bindings.driver.CUresult`` members or with :attr:`name`).
        name: The result's name, for example ``"CUDA_ERROR_ILLEGAL_ADDRESS"``.
        func: The driver function that reported it, for example ``"cuEventQuery"``.
        explanation: The driver's one-line description of the result.
    """

    def __init__(self, result: int, name: str, func: str, explanation: str, hint: str = "") -> None:
        message = f"{func}: {name}: {explanation}"
        if hint:
            message = f"{message}. {hint}"
        super().__init__(message)
        self.result = result
        self.name = name
        self.func = func
        self.explanation = explanation
        self.hint = hint

    @property
    def is_context_lost(self) -> bool:
        """True if the error is sticky: the CUDA context (and every object in it) is unusable.

        Kernel faults such as ``CUDA_ERROR_ILLEGAL_ADDRESS`` corrupt the context for the rest of
        the process; only a new process can use the device again.
        """
        return self.name in STICKY_RESULTS

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (int(self.result), self.name, self.func, self.explanation, self.hint))

    def clone(self) -> CudaError:
        """A fresh copy, so each awaiter that fails raises its own exception object."""
        return type(self)(self.result, self.name, self.func, self.explanation, self.hint)


class CudaUnavailableError(AiogpuError):
    """No usable CUDA driver or device on this machine.

    Raised on first use, never at import. The message says how to fix it; to run without a
    GPU, use :class:`aiogpu.testing.SimulatedDriver`.
    """


class ClosedResourceError(AiogpuError, anyio.ClosedResourceError):
    """The event or stream was closed; it can no longer be used."""


class EventStateError(AiogpuError, RuntimeError):
    """The event is not in a state that allows the operation.

    For example: it was never recorded (CUDA would report such an event as complete, which
    hides bugs), it is not complete yet where a result is required, or it was created without
    the option the operation needs.
    """


#: Results after which the context is corrupted for the rest of the process (CUDA docs:
#: "the process must be terminated and relaunched").
STICKY_RESULTS = frozenset(
    {
        "CUDA_ERROR_ILLEGAL_ADDRESS",
        "CUDA_ERROR_ILLEGAL_INSTRUCTION",
        "CUDA_ERROR_MISALIGNED_ADDRESS",
        "CUDA_ERROR_INVALID_ADDRESS_SPACE",
        "CUDA_ERROR_INVALID_PC",
        "CUDA_ERROR_LAUNCH_FAILED",
        "CUDA_ERROR_HARDWARE_STACK_ERROR",
        "CUDA_ERROR_ASSERT",
        "CUDA_ERROR_ECC_UNCORRECTABLE",
        "CUDA_ERROR_LAUNCH_TIMEOUT",
        "CUDA_ERROR_CONTEXT_IS_DESTROYED",
        "CUDA_ERROR_TENSOR_MEMORY_LEAK",
    }
)
