"""Argument checks shared by the public classes: a mistake raises ``TypeError`` or
``ValueError`` naming the bad value and what was expected."""

from __future__ import annotations

import math
import operator


def check_int(what: str, value: object) -> int:
    """``value`` as an ``int`` (anything with ``__index__`` but a bool), else a ``TypeError``."""
    if not isinstance(value, bool):
        try:
            return operator.index(value)  # type: ignore[arg-type]
        except TypeError:
            pass
    raise TypeError(f"{what} must be an int, got {value!r} ({type(value).__name__})")


def check_flag(name: str, value: object) -> bool:
    """``value`` if it is a bool, else a ``TypeError``."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {value!r}")
    return value


def check_seconds(name: str, value: object) -> float:
    """``value`` as a positive finite number of seconds, else a ``TypeError`` or ``ValueError``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number of seconds, got {value!r}")
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a positive finite number of seconds, got {value!r}")
    return float(value)
