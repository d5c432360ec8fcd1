"""What other libraries' CUDA events are made of, read without importing those libraries.

``Event.adopt`` wraps an event it does not own. Each library exposes the ``CUevent`` address
differently, and only some say which device the event belongs to or how it was created:

- ``torch.cuda.Event``: ``cuda_event`` (0 until the first ``record()``: torch creates the event
  lazily), ``device`` once recorded.
- ``cupy.cuda.Event``: ``ptr``; no device (CuPy creates it on the device current at the time).
- ``cuda.core`` ``Event``: ``handle`` (a ``CUevent``), ``device.device_id``, and its flags.
- ``cuda.bindings.driver.CUevent`` or a plain ``int``: the address only.

The driver has no call that maps an event to its context, so where the object does not say,
the caller must.
"""

from __future__ import annotations

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
        return ForeignEvent(_check_address(obj), None, 0, recorded=True)
    module = type(obj).__module__ or ""
    name = type(obj).__name__
    if module.startswith("torch") and hasattr(obj, "cuda_event"):
        handle = _check_address(obj.cuda_event)
        device = getattr(obj, "device", None)
        ordinal = getattr(device, "index", None) if device is not None else None
        return ForeignEvent(handle, ordinal, 0, recorded=handle != 0)
    if module.startswith("cupy") and hasattr(obj, "ptr"):
        return ForeignEvent(_check_address(obj.ptr), None, 0, recorded=True)
    if module.startswith("cuda.core") and hasattr(obj, "handle"):
        flags = (
            (EVENT_DISABLE_TIMING if getattr(obj, "is_timing_disabled", False) else 0)
            | (0 if getattr(obj, "is_sync_busy_waited", True) else EVENT_BLOCKING_SYNC)
            | (EVENT_INTERPROCESS if getattr(obj, "is_ipc_enabled", False) else 0)
        )
        device = getattr(obj, "device", None)
        return ForeignEvent(_check_address(int(obj.handle)), getattr(device, "device_id", None), flags, recorded=True)
    if module.startswith("cuda.bindings") and name == "CUevent":
        return ForeignEvent(_check_address(int(obj)), None, 0, recorded=True)  # type: ignore[call-overload]
    raise TypeError(
        f"cannot adopt {module}.{name} as an event: expected a torch.cuda.Event, a cupy.cuda.Event, "
        "a cuda.core Event, a cuda.bindings.driver.CUevent or a raw CUevent address (int)"
    )


def _check_address(handle: object) -> int:
    if isinstance(handle, bool) or not isinstance(handle, int):
        raise TypeError(f"an event handle is an int address, got {handle!r}")
    if not 0 <= handle < 2**64:
        raise ValueError(f"an event handle is a 64-bit address, got {handle}")
    return handle
