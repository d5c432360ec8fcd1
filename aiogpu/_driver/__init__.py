"""The one door to the CUDA driver.

Rules this package keeps:

1. It is the only part of aiogpu that imports ``cuda.bindings``; nothing above it sees a
   ``CUresult``. (``aiogpu.testing`` loads and launches its own test kernels, outside the door.)
2. Every driver call goes through :func:`check` (or, on the hot query paths, the same logic
   inlined), which turns a failing ``CUresult`` into :class:`~aiogpu.CudaError` and a missing
   driver library into :class:`~aiogpu.CudaUnavailableError`.
3. ``CUDA_ERROR_NOT_READY`` from a query is the value ``False``, not an error.
4. Handles cross the door as plain ``int`` addresses, so the simulated driver in
   :mod:`aiogpu.testing` can stand in for :class:`CudaDriver` below this line unchanged.
5. Importing it calls no driver function: libcuda is loaded on the first call.
6. The :class:`Driver` interface holds only what aiogpu itself calls.

Its rooms: :mod:`._protocol` (the interface and the flag values), :mod:`._results` (results,
errors and their hints, the checked call), :mod:`._cuda` (:class:`CudaDriver`),
:mod:`._default` (the driver ``Device(n)`` uses) and :mod:`._fork` (refusing CUDA in a
forked child). This module only re-exports.
"""

from __future__ import annotations

from ._cuda import CudaDriver as CudaDriver
from ._default import default_driver as default_driver
from ._default import swap_default_driver as swap_default_driver
from ._fork import fail_every_call_after_fork as fail_every_call_after_fork
from ._fork import refuse_after_fork as refuse_after_fork
from ._protocol import DEFAULT_STREAM_HANDLES as DEFAULT_STREAM_HANDLES
from ._protocol import EVENT_BLOCKING_SYNC as EVENT_BLOCKING_SYNC
from ._protocol import EVENT_DISABLE_TIMING as EVENT_DISABLE_TIMING
from ._protocol import EVENT_INTERPROCESS as EVENT_INTERPROCESS
from ._protocol import IPC_HANDLE_SIZE as IPC_HANDLE_SIZE
from ._protocol import PER_THREAD_STREAM as PER_THREAD_STREAM
from ._protocol import STREAM_NON_BLOCKING as STREAM_NON_BLOCKING
from ._protocol import Driver as Driver
from ._results import check as check
from ._results import cuda_error as cuda_error
from ._results import result_code as result_code
from ._results import result_name as result_name
