"""What other libraries' CUDA events are made of, read without importing those libraries.

``Event.adopt`` wraps an event it does not own. Each library exposes the ``CUevent`` address
differently, and only some say which device the event belongs to or how it was created:

- ``torch.cuda.Event``: ``cuda_event`` (0 until the first ``record()``: torch creates the event
  lazily), ``device`` once recorded.
- ``cupy.cuda.Event``: ``ptr``; no device (CuPy creates it on the device current at the time).
- ``cuda.core`` ``Event``: ``handle`` (a ``CUevent``), ``device.device_id``, and its flags.
- Numba's ``cuda.event()``: ``handle`` (a ``CUevent``, or a ctypes ``c_void_p`` under Numba's own
  ctypes binding); no device.
- ``cuda.bindings.driver.CUevent`` or a plain ``int``: the address only.

The driver has no call that maps an event to its context, so where the object does not say,
the caller must.

``Stream.adopt`` reads a stream's ``CUstream`` address the same way, through the
``__cuda_stream__`` protocol (``stream_handle``).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

from ._driver import EVENT_BLOCKING_SYNC, EVENT_DISABLE_TIMING, EVENT_INTERPROCESS


@dataclass(frozen=True)
class ForeignEvent:
    handle: int
    device: int | None  # ordinal, where the object says
    flags: int  # the CU_EVENT_* flags as far as known (0: assume timing, spinning)
    recorded: bool  # False only where the object shows it was never recorded


def describe_event(obj: object) -> ForeignEvent:
    """Read ``obj``'s ``CUevent`` address and what else it tells; ``TypeError`` if not an event."""
    if isinstance(obj, bool):
        raise TypeError(f"cannot adopt {obj!r} as an event")
    if isinstance(obj, int):
        return ForeignEvent(check_address(obj), None, 0, recorded=True)
    module = type(obj).__module__ or ""
    name = type(obj).__name__
    if module.startswith("torch") and hasattr(obj, "cuda_event"):
        handle = check_address(obj.cuda_event)
        device = getattr(obj, "device", None)
        ordinal = getattr(device, "index", None) if device is not None else None
        return ForeignEvent(handle, ordinal, 0, recorded=handle != 0)
    if module.startswith("cupy") and hasattr(obj, "ptr"):
        return ForeignEvent(check_address(obj.ptr), None, 0, recorded=True)
    if module.startswith("cuda.core") and hasattr(obj, "handle"):
        flags = (
            (EVENT_DISABLE_TIMING if getattr(obj, "is_timing_disabled", False) else 0)
            | (0 if getattr(obj, "is_sync_busy_waited", True) else EVENT_BLOCKING_SYNC)
            | (EVENT_INTERPROCESS if getattr(obj, "is_ipc_enabled", False) else 0)
        )
        device = getattr(obj, "device", None)
        return ForeignEvent(_address_of(obj.handle), getattr(device, "device_id", None), flags, recorded=True)
    if module.startswith("numba") and hasattr(obj, "handle"):
        return ForeignEvent(_address_of(obj.handle), None, 0, recorded=True)
    if module.startswith("cuda.bindings") and name == "CUevent":
        return ForeignEvent(_address_of(obj), None, 0, recorded=True)
    raise TypeError(
        f"cannot adopt {module}.{name} as an event: expected a torch.cuda.Event, a cupy.cuda.Event, "
        "a cuda.core Event, a Numba event, a cuda.bindings.driver.CUevent or a raw CUevent address (int)"
    )


def _address_of(handle: object) -> int:
    """The address in a handle object: a ``CUevent`` (``int()`` of it), a ctypes ``c_void_p``
    (Numba's own binding) or an int."""
    if isinstance(handle, ctypes.c_void_p):
        return check_address(handle.value or 0)
    try:
        address = int(handle)  # type: ignore[call-overload]
    except (TypeError, ValueError, OverflowError):
        raise TypeError(f"an event handle is an address (an int, a CUevent), got {handle!r}") from None
    return check_address(address)


def check_address(handle: object, what: str = "an event handle") -> int:
    if isinstance(handle, bool) or not isinstance(handle, int):
        raise TypeError(f"{what} is an int address, got {handle!r}")
    if not 0 <= handle < 2**64:
        raise ValueError(f"{what} is a 64-bit address, got {handle}")
    return handle


@dataclass(frozen=True)
class DeviceArray:
    pointer: int
    nbytes: int
    readonly: bool


def describe_array(obj: object) -> DeviceArray:
    """Where ``obj``'s bytes live on the device: any C-contiguous ``__cuda_array_interface__``
    object (torch, CuPy, Numba, ...) or a ``(device_pointer, nbytes)`` pair."""
    if isinstance(obj, tuple) and len(obj) == 2:
        pointer, nbytes = obj
        for what, value in (("device pointer", pointer), ("nbytes", nbytes)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"a raw device buffer is (device pointer, nbytes) of ints; {what} is {value!r}")
        if nbytes < 0:
            raise ValueError(f"a raw device buffer's nbytes must be non-negative, got {nbytes}")
        return DeviceArray(check_address(pointer, "a device pointer"), nbytes, readonly=False)
    interface = getattr(obj, "__cuda_array_interface__", None)
    if not isinstance(interface, dict):
        raise TypeError(
            f"expected a CUDA array (an object with __cuda_array_interface__: a torch CUDA tensor, a CuPy "
            f"or Numba device array) or a (device pointer, nbytes) pair, got {type(obj).__name__}"
        )
    try:
        pointer, readonly = interface["data"]
        shape = tuple(interface["shape"])
        typestr = interface["typestr"]
        strides = interface.get("strides")
        strides = None if strides is None else tuple(strides)
    except (KeyError, TypeError, ValueError):
        raise TypeError(
            f"{type(obj).__name__}.__cuda_array_interface__ lacks a valid 'data' (pointer, read-only), 'shape' or 'typestr'"
        ) from None
    if not all(isinstance(extent, int) and not isinstance(extent, bool) for extent in shape):
        raise TypeError(f"the CUDA array's shape must be ints, got {shape!r}")
    if any(extent < 0 for extent in shape):
        raise ValueError(f"the CUDA array's shape must be non-negative, got {shape!r}")
    if not isinstance(typestr, str):
        raise TypeError(f"the CUDA array's typestr must be a str like '<f4', got {typestr!r}")
    if not (len(typestr) >= 3 and typestr[2:].isascii() and typestr[2:].isdecimal() and int(typestr[2:]) > 0):
        raise ValueError(f"the CUDA array's typestr must look like '<f4', got {typestr!r}")
    itemsize = int(typestr[2:])
    count = 1
    for extent in shape:
        count *= extent
    if strides is not None and count > 1:
        expected, step = [], itemsize
        for extent in reversed(shape):
            expected.append(step)
            step *= extent
        if len(strides) != len(shape) or tuple(
            stride for stride, extent in zip(strides, shape, strict=True) if extent > 1
        ) != tuple(stride for stride, extent in zip(reversed(expected), shape, strict=True) if extent > 1):
            raise ValueError(f"the CUDA array is not C-contiguous (strides {strides}); make a contiguous copy first")
    return DeviceArray(check_address(pointer or 0, "a CUDA array's data pointer"), count * itemsize, bool(readonly))


def stream_handle(obj: object) -> int:
    """The ``CUstream`` address of ``obj``: an ``int`` or any ``__cuda_stream__`` object."""
    if isinstance(obj, bool):
        raise TypeError(f"cannot adopt {obj!r} as a stream")
    if isinstance(obj, int):
        return check_address(obj, "a stream handle")
    protocol = getattr(type(obj), "__cuda_stream__", None)
    if protocol is None:
        raise TypeError(
            f"cannot adopt {type(obj).__name__} as a stream: expected an object with a "
            "__cuda_stream__() method (torch, CuPy, Numba and cuda.core streams have one) "
            "or a raw CUstream handle (int)"
        )
    if not callable(protocol):
        raise TypeError(f"{type(obj).__name__}.__cuda_stream__ must be a method returning (0, handle)")
    info = obj.__cuda_stream__()  # type: ignore[attr-defined]
    if not (isinstance(info, tuple) and len(info) == 2 and all(isinstance(v, int) and not isinstance(v, bool) for v in info)):
        raise TypeError(f"{type(obj).__name__}.__cuda_stream__() must return (version, handle) ints, got {info!r}")
    if info[0] != 0:
        raise ValueError(f"{type(obj).__name__}.__cuda_stream__() has protocol version {info[0]}; aiogpu understands version 0")
    return check_address(info[1], "a stream handle")
