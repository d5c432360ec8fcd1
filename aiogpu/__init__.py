"""aiogpu: await CUDA events and streams from asyncio, uvloop and trio.

``import aiogpu`` is inert: it calls no driver function and starts no thread; the driver is
initialized when the first :class:`Device` is created.
"""

from __future__ import annotations

from ._device import Device as Device
from ._errors import AiogpuError as AiogpuError
from ._errors import ClosedResourceError as ClosedResourceError
from ._errors import CudaError as CudaError
from ._errors import CudaUnavailableError as CudaUnavailableError
from ._errors import EventStateError as EventStateError
from ._event import Event as Event
from ._event import IpcEventHandle as IpcEventHandle
from ._hangs import PendingWait as PendingWait
from ._hangs import pending_waits as pending_waits
from ._hangs import watch_for_hangs as watch_for_hangs
from ._pinned import PinnedBuffer as PinnedBuffer
from ._pinned import PinnedPool as PinnedPool
from ._pool import StreamPool as StreamPool
from ._stream import Stream as Stream
from ._transfer import copy_to_device as copy_to_device
from ._transfer import copy_to_host as copy_to_host
from ._version import __version__ as __version__
from ._wait import WaitStrategy as WaitStrategy
from ._wait import get_default_wait_strategy as get_default_wait_strategy
from ._wait import set_default_wait_strategy as set_default_wait_strategy

__all__ = (
    "AiogpuError",
    "ClosedResourceError",
    "CudaError",
    "CudaUnavailableError",
    "Device",
    "Event",
    "EventStateError",
    "IpcEventHandle",
    "PendingWait",
    "PinnedBuffer",
    "PinnedPool",
    "Stream",
    "StreamPool",
    "WaitStrategy",
    "copy_to_device",
    "copy_to_host",
    "get_default_wait_strategy",
    "pending_waits",
    "set_default_wait_strategy",
    "watch_for_hangs",
)

# Public path in reprs, tracebacks and pickles (``aiogpu.Event``, not ``aiogpu._event.Event``).
for _name in __all__:
    if _name != "WaitStrategy":
        globals()[_name].__module__ = __name__
del _name
