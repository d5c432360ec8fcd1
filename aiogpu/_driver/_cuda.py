"""CudaDriver: the :class:`~aiogpu._driver.Driver` interface on ``cuda.bindings.driver``.

Every call is checked (:func:`~aiogpu._driver._results.check`, or on the hot query paths the
same logic inlined, where ``CUDA_ERROR_NOT_READY`` is the value ``False``). Handles are plain
``int`` addresses. Constructing it calls nothing: ``init`` is the first driver call.
"""

from __future__ import annotations

import ctypes
from typing import Any

from cuda.bindings import driver as cu

from .._errors import CudaUnavailableError
from ._fork import refuse_after_fork
from ._protocol import IPC_HANDLE_SIZE
from ._results import NOT_READY, SUCCESS, NoDriverLibrary, check, cuda_error, describe, no_driver_error, result_name


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
        except NoDriverLibrary as exc:
            raise no_driver_error("cuInit") from exc
        if err != SUCCESS:
            name = result_name(err)
            if name in ("CUDA_ERROR_NO_DEVICE", "CUDA_ERROR_INSUFFICIENT_DRIVER", "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE"):
                raise CudaUnavailableError(
                    f"cuInit: {name}: {describe(err)}. "
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
        if err == SUCCESS:
            return True
        if err == NOT_READY:
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
        if err == SUCCESS:
            return True
        if err == NOT_READY:
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
