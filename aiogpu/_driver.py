"""The one door to the CUDA driver.

Rules this file keeps:

1. It is the only module that imports ``cuda.bindings``; nothing above it sees a ``CUresult``.
2. Every driver call goes through :func:`check` (or, on the hot query paths, the same logic
   inlined), which turns a failing ``CUresult`` into :class:`~aiogpu.CudaError` and a missing
   driver library into :class:`~aiogpu.CudaUnavailableError`.
3. ``CUDA_ERROR_NOT_READY`` from a query is the value ``False``, not an error.
4. Handles cross the door as plain ``int`` addresses, so the simulated driver in
   :mod:`aiogpu.testing` can stand in for :class:`CudaDriver` below this line unchanged.
5. Importing this module calls no driver function: libcuda is loaded on the first call.
"""

from __future__ import annotations

import ctypes
import os
import threading
import weakref
from typing import TYPE_CHECKING, Any, Protocol

from cuda.bindings import driver as cu

from ._errors import STICKY_RESULTS, CudaError, CudaUnavailableError

if TYPE_CHECKING:
    from collections.abc import Callable

try:  # cuda-pathfinder names the "no libcuda" failure; older releases raise a bare RuntimeError
    from cuda.pathfinder import DynamicLibNotFoundError as _NoDriverLibrary
except ImportError:  # pragma: no cover - depends on the installed cuda-pathfinder
    _NoDriverLibrary = RuntimeError

# Flag values of the CUDA driver ABI, shared by every Driver implementation.
EVENT_BLOCKING_SYNC = 1
EVENT_DISABLE_TIMING = 2
EVENT_INTERPROCESS = 4
STREAM_NON_BLOCKING = 1
#: The legacy default stream of the *current* context (``CU_STREAM_LEGACY`` and
#: ``CU_STREAM_PER_THREAD`` are 1 and 2; all three resolve through the current context).
DEFAULT_STREAM_HANDLES = frozenset({0, 1, 2})
#: ``CU_STREAM_PER_THREAD``: a different stream on each thread that uses it.
PER_THREAD_STREAM = 2
IPC_HANDLE_SIZE = 64

_SUCCESS = cu.CUresult.CUDA_SUCCESS
_NOT_READY = cu.CUresult.CUDA_ERROR_NOT_READY

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


class Driver(Protocol):
    """What aiogpu needs from a CUDA driver; handles are ``int`` addresses.

    :class:`CudaDriver` implements it on ``cuda.bindings``; ``aiogpu.testing.SimulatedDriver``
    implements it in pure Python. Calls that create resources need the right context current
    on the calling thread, as in CUDA; the layers above make sure of that.
    """

    @property
    def name(self) -> str: ...
    def init(self) -> None: ...
    def device_count(self) -> int: ...
    def device_name(self, ordinal: int) -> str: ...
    def primary_context_retain(self, ordinal: int) -> int: ...
    def context_get_current(self) -> int: ...
    def context_set_current(self, context: int) -> None: ...
    def context_push(self, context: int) -> None: ...
    def context_pop(self) -> None: ...
    def context_device(self, context: int) -> int: ...
    def stream_priority_range(self) -> tuple[int, int]: ...
    def stream_create(self, flags: int, priority: int) -> int: ...
    def stream_destroy(self, stream: int) -> None: ...
    def stream_context(self, stream: int) -> int: ...
    def stream_priority(self, stream: int) -> int: ...
    def stream_flags(self, stream: int) -> int: ...
    def stream_query(self, stream: int) -> bool: ...
    def stream_synchronize(self, stream: int) -> None: ...
    def stream_wait_event(self, stream: int, event: int) -> None: ...
    def event_create(self, flags: int) -> int: ...
    def event_destroy(self, event: int) -> None: ...
    def event_record(self, event: int, stream: int) -> None: ...
    def event_query(self, event: int) -> bool: ...
    def event_synchronize(self, event: int) -> None: ...
    def event_elapsed_time(self, start: int, end: int) -> float: ...
    def ipc_get_event_handle(self, event: int) -> bytes: ...
    def ipc_open_event_handle(self, data: bytes) -> int: ...
    # Awaitable transfers: page-locked host memory, and copies ordered on a stream (unified
    # addressing: the direction follows from the pointers).
    def host_alloc(self, nbytes: int) -> int: ...
    def host_free(self, pointer: int) -> None: ...
    def memcpy_async(self, destination: int, source: int, nbytes: int, stream: int) -> None: ...
    # The callback strategy: enqueue the C function ``function(argument)`` as a host function
    # (it must not need the GIL: aiogpu passes the C library's sem_post).
    def launch_host_function(self, stream: int, function: int, argument: int) -> None: ...


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
        explanation = _describe(result)
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


def fail_every_call_after_fork(driver: object) -> None:
    """In a child created by ``fork()``: make every public call of ``driver`` raise
    ``CUDA_ERROR_NOT_INITIALIZED`` (with the hint to use ``spawn``) without entering the driver.

    CUDA cannot be used in a child of a parent that used it, and calling it there may not even
    fail: a driver lock held by one of the parent's threads at the fork (a waiter thread parked
    in ``cuEventSynchronize``) is held forever in the child, so the call can hang.
    """
    for cls in type(driver).__mro__[:-1]:  # a subclass inherits calls too (object has none)
        for name, member in vars(cls).items():
            if not name.startswith("_") and (callable(member) or isinstance(member, (staticmethod, classmethod))):
                setattr(driver, name, _fails_after_fork(name))


def _fails_after_fork(name: str) -> Callable[..., Any]:
    def call(*args: object, **kwargs: object) -> Any:
        raise cuda_error(result_code("CUDA_ERROR_NOT_INITIALIZED"), name)

    return call


def _describe(result: int) -> str:
    try:
        err, text = cu.cuGetErrorString(cu.CUresult(result))
    except (RuntimeError, ValueError):  # no driver library (simulated device), unknown value
        err, text = None, None
    if err != _SUCCESS or text is None:
        return _DESCRIPTIONS.get(result_name(result), "no description available")
    return bytes(text).decode(errors="replace")


def _no_driver(func: str) -> CudaUnavailableError:
    return CudaUnavailableError(
        f"{func}: no NVIDIA driver found: libcuda.so could not be loaded. Install the NVIDIA "
        "display driver to use a GPU, or run without one on aiogpu.testing.SimulatedDriver()"
    )


def check(func: Callable[..., Any], *args: Any) -> Any:
    """Call a ``cuda.bindings`` driver function; return its values or raise ``CudaError``."""
    try:
        err, *values = func(*args)
    except _NoDriverLibrary as exc:
        raise _no_driver(func.__name__) from exc
    if err != _SUCCESS:
        raise cuda_error(err, func.__name__)
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


class CudaDriver:
    """The real driver: ``cuda.bindings.driver`` behind the :class:`Driver` interface."""

    name = "cuda"

    def __init__(self) -> None:
        self._initialized = False
        self._libcuda_handle: Any = None

    def init(self) -> None:
        if self._initialized:
            return
        try:
            (err,) = cu.cuInit(0)
        except _NoDriverLibrary as exc:
            raise _no_driver("cuInit") from exc
        if err != _SUCCESS:
            name = result_name(err)
            if name in ("CUDA_ERROR_NO_DEVICE", "CUDA_ERROR_INSUFFICIENT_DRIVER", "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE"):
                raise CudaUnavailableError(
                    f"cuInit: {name}: {_describe(err)}. "
                    + (
                        "No CUDA device is visible: check nvidia-smi and CUDA_VISIBLE_DEVICES"
                        if name == "CUDA_ERROR_NO_DEVICE"
                        else f"The driver is older than cuda-bindings {cu.CUDA_VERSION // 1000}.x "
                        "needs: upgrade the driver, or install aiogpu[cu12]"
                    )
                )
            raise cuda_error(err, "cuInit")
        self._initialized = True
        refuse_after_fork(self)  # a child of a parent that never used CUDA may use it itself

    # -- devices and contexts -------------------------------------------------------------
    def device_count(self) -> int:
        return int(check(cu.cuDeviceGetCount))

    def device_name(self, ordinal: int) -> str:
        raw = check(cu.cuDeviceGetName, 256, check(cu.cuDeviceGet, ordinal))
        return bytes(raw).split(b"\0", 1)[0].decode(errors="replace")

    def primary_context_retain(self, ordinal: int) -> int:
        return int(check(cu.cuDevicePrimaryCtxRetain, check(cu.cuDeviceGet, ordinal)))

    def context_get_current(self) -> int:
        return int(check(cu.cuCtxGetCurrent))

    def context_set_current(self, context: int) -> None:
        check(cu.cuCtxSetCurrent, context)

    def context_push(self, context: int) -> None:
        check(cu.cuCtxPushCurrent, context)

    def context_pop(self) -> None:
        check(cu.cuCtxPopCurrent)

    def context_device(self, context: int) -> int:
        self.context_push(context)
        try:
            return int(check(cu.cuCtxGetDevice))
        finally:
            self.context_pop()

    # -- streams ----------------------------------------------------------------------------
    def stream_priority_range(self) -> tuple[int, int]:
        least, greatest = check(cu.cuCtxGetStreamPriorityRange)
        return int(least), int(greatest)

    def stream_create(self, flags: int, priority: int) -> int:
        return int(check(cu.cuStreamCreateWithPriority, flags, priority))

    def stream_destroy(self, stream: int) -> None:
        check(cu.cuStreamDestroy, stream)

    def stream_context(self, stream: int) -> int:
        return int(check(cu.cuStreamGetCtx, stream))

    def stream_priority(self, stream: int) -> int:
        return int(check(cu.cuStreamGetPriority, stream))

    def stream_flags(self, stream: int) -> int:
        return int(check(cu.cuStreamGetFlags, stream))

    def stream_query(self, stream: int) -> bool:
        (err,) = cu.cuStreamQuery(stream)
        if err == _SUCCESS:
            return True
        if err == _NOT_READY:
            return False
        raise cuda_error(err, "cuStreamQuery")

    def stream_synchronize(self, stream: int) -> None:
        check(cu.cuStreamSynchronize, stream)

    def stream_wait_event(self, stream: int, event: int) -> None:
        check(cu.cuStreamWaitEvent, stream, event, 0)

    # -- events -----------------------------------------------------------------------------
    def event_create(self, flags: int) -> int:
        return int(check(cu.cuEventCreate, flags))

    def event_destroy(self, event: int) -> None:
        check(cu.cuEventDestroy, event)

    def event_record(self, event: int, stream: int) -> None:
        check(cu.cuEventRecord, event, stream)

    def event_query(self, event: int) -> bool:
        (err,) = cu.cuEventQuery(event)
        if err == _SUCCESS:
            return True
        if err == _NOT_READY:
            return False
        raise cuda_error(err, "cuEventQuery")

    def event_synchronize(self, event: int) -> None:
        check(cu.cuEventSynchronize, event)

    def event_elapsed_time(self, start: int, end: int) -> float:
        return float(check(cu.cuEventElapsedTime, start, end))

    def host_alloc(self, nbytes: int) -> int:
        return int(check(cu.cuMemHostAlloc, nbytes, cu.CU_MEMHOSTALLOC_PORTABLE))

    def host_free(self, pointer: int) -> None:
        check(cu.cuMemFreeHost, pointer)

    def memcpy_async(self, destination: int, source: int, nbytes: int, stream: int) -> None:
        check(cu.cuMemcpyAsync, destination, source, nbytes, stream)

    def ipc_get_event_handle(self, event: int) -> bytes:
        handle = check(cu.cuIpcGetEventHandle, event)
        return ctypes.string_at(handle.getPtr(), IPC_HANDLE_SIZE)

    def ipc_open_event_handle(self, data: bytes) -> int:
        buffer = ctypes.create_string_buffer(bytes(data), IPC_HANDLE_SIZE)
        handle = cu.CUipcEventHandle(_ptr=ctypes.addressof(buffer))
        return int(check(cu.cuIpcOpenEventHandle, handle))

    def launch_host_function(self, stream: int, function: int, argument: int) -> None:
        # Straight into libcuda, not through cuda.bindings: its cuLaunchHostFunc wraps the
        # function in a trampoline that takes the GIL on the driver's thread, the known
        # GIL <-> driver-lock deadlock. ``function`` is C and never needs the GIL.
        launch = self._libcuda().cuLaunchHostFunc
        launch.argtypes = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)
        launch.restype = ctypes.c_int
        result = launch(stream, function, argument)
        if result != 0:
            raise cuda_error(result, "cuLaunchHostFunc")

    def _libcuda(self) -> Any:
        if self._libcuda_handle is None:
            self._libcuda_handle = ctypes.CDLL("libcuda.so.1")  # loaded already: cuInit succeeded
        return self._libcuda_handle


_default_lock = threading.Lock()
_default: Driver | None = None


def default_driver() -> Driver:
    """The driver ``aiogpu.Device(n)`` uses: the real one unless a test installed another."""
    global _default
    with _default_lock:
        if _default is None:
            _default = CudaDriver()
        return _default


def swap_default_driver(driver: Driver | None) -> Driver | None:
    """Install ``driver`` as the default (``None``: the real one again); return the previous."""
    global _default
    with _default_lock:
        previous, _default = _default, driver
        return previous


#: Drivers a forked child must refuse: every initialized CudaDriver, every SimulatedDriver.
_refused_after_fork: weakref.WeakSet[object] = weakref.WeakSet()


def refuse_after_fork(driver: object) -> None:
    """Make ``driver`` refuse every call in children forked from now on (see
    :func:`fail_every_call_after_fork`)."""
    _refused_after_fork.add(driver)


def _after_fork_in_child() -> None:
    for driver in list(_refused_after_fork):
        fail_every_call_after_fork(driver)


os.register_at_fork(after_in_child=_after_fork_in_child)
